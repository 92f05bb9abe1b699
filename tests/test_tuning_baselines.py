"""Before ``pflower tune <method>`` adds a method to stored runs, it checks that they are what the
installed code makes under the suite's protocol (:mod:`pflower.tuning.baselines`).

Stored runs are hand-written ``summary.json`` files here: the check reads only their ``code``
records and the folder's ``suite.yaml``, so nothing trains.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pflower.provenance import CODE_FINGERPRINT, code_version
from pflower.tuning.baselines import (
    BYTES_READ,
    VERIFIED,
    StoredRunsChanged,
    check_protocol,
    check_stored_runs,
    compare_code,
    load_verified,
    record_verified,
    stored_methods,
)
from pflower.tuning.cli import main as tune_main
from pflower.tuning.suite import Suite, load_suite

SUITE = """\
name: tiny
trials: 2
tune_seed: 0
final_seeds: [1, 2]
val_fraction: 0.25
train_knobs: [lr]
methods: [fedavg, fedprox]
settings:
  - name: digits
    overrides: [dataset=digits, num_clients=2, rounds=2]
"""


def _suite(tmp_path: Path) -> Suite:
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE)
    return load_suite(str(path))


def _store(
    out: Path, suite: Suite, runs: dict[str, dict[str, Any]], study: str | None = None
) -> None:
    """A folder as ``pflower tune`` leaves it: the suite's record and, per method, completed final
    runs (seeds 1 and 2; in folder ``study`` where given) whose ``summary.json`` holds ``code``."""
    out.mkdir(parents=True, exist_ok=True)
    settings = {s.name: list(s.overrides) for s in suite.settings}
    record = {
        "name": suite.name,
        "trials": suite.trials,
        "tune_seed": suite.tune_seed,
        "final_seeds": list(suite.final_seeds),
        "val_fraction": suite.val_fraction,
        "train_knobs": list(suite.train_knobs),
        "settings": settings,
    }
    (out / "suite.yaml").write_text(yaml.safe_dump(record))
    for method, code in runs.items():
        for seed in suite.final_seeds:
            run_dir = out / "digits" / "final" / method / (study or "") / f"seed_{seed}"
            run_dir.mkdir(parents=True)
            (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "code": code}))


def test_runs_of_the_installed_code_are_accepted_and_a_changed_part_is_named(
    tmp_path: Path,
) -> None:
    suite = _suite(tmp_path)
    out = tmp_path / "out"
    changed = code_version("fedprox")
    changed = {**changed, "components": {**changed["components"], "partition": "0" * 16}}
    _store(out, suite, {"fedavg": code_version("fedavg")})
    check_stored_runs(out, suite, "suite.yaml", suite.settings, ["fedprox"])
    # a method's own module counts for that method alone
    assert compare_code("fedprox", code_version("fedavg")) == ({"method"}, True)

    _store(out, suite, {"fedprox": changed})
    with pytest.raises(StoredRunsChanged) as refusal:
        check_stored_runs(out, suite, "suite.yaml", suite.settings, ["fliu"], True)
    message = str(refusal.value)
    assert "fliu cannot be ranked against the stored runs" in message
    assert "[digits] changed code: fedprox (partition)" in message
    assert "fedavg" not in message.split("Refresh")[0]  # its runs are this code's
    assert message.endswith(
        f"Refresh them with: rm -r {out}/digits/final/{{fedprox}} && pflower tune fedprox "
        f"--suite suite.yaml --setting digits --out {out}; or, where the change left their "
        "numbers as they were, verify that by rerunning one run of each: pflower reproduce "
        f"--stored {out} --suite suite.yaml --setting digits"
    )


def test_old_records_are_checked_whole_and_refused_unless_trusted(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    out = tmp_path / "out"
    same = {"fingerprint": CODE_FINGERPRINT, "commit": None, "dirty": None}
    other = {"fingerprint": "0123456789abcdef", "commit": None, "dirty": None}
    _store(out, suite, {"fedavg": same, "fedprox": other})
    with pytest.raises(StoredRunsChanged) as refusal:
        check_stored_runs(out, suite, "suite.yaml", suite.settings, ["fliu"])
    message = str(refusal.value)
    assert "before pflower kept per-part code fingerprints, by other code (0123456789abcdef)" in (
        message
    )
    assert "cannot be checked: fedprox (--trust-unchecked ranks against them)" in message
    check_stored_runs(out, suite, "suite.yaml", suite.settings, ["fliu"], trust_unchecked=True)


def test_another_protocol_is_refused(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    out = tmp_path / "out"
    _store(out, suite, {"fedavg": code_version("fedavg")})
    record = yaml.safe_load((out / "suite.yaml").read_text())
    record["trials"] = 8
    record["settings"]["digits"] = ["dataset=digits", "num_clients=4"]
    (out / "suite.yaml").write_text(yaml.safe_dump(record))
    with pytest.raises(StoredRunsChanged) as refusal:
        check_stored_runs(out, suite, "suite.yaml", suite.settings, ["fedprox"])
    message = str(refusal.value)
    assert "trials 8 -> 2" in message
    assert "the setting's overrides ['dataset=digits', 'num_clients=4'] -> " in message


def test_pflower_tune_refuses_before_anything_runs_or_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = _suite(tmp_path)
    out = tmp_path / "out"
    other = {"fingerprint": "0123456789abcdef", "commit": None, "dirty": None}
    _store(out, suite, {"fedavg": other})
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    argv = ["fedprox", "--suite", str(tmp_path / "suite.yaml"), "--out", str(out)]
    assert tune_main(argv) == 2
    assert "fedprox cannot be ranked against the stored runs" in capsys.readouterr().err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # no commands.log


def test_runs_of_several_studies_are_checked_too(tmp_path: Path) -> None:
    """A suite of several studies keeps its final runs in ``final/<method>/study_<k>/seed_<s>``."""
    suite = _suite(tmp_path)
    out = tmp_path / "out"
    changed = code_version("fedprox")
    changed = {**changed, "components": {**changed["components"], "model": "0" * 16}}
    _store(out, suite, {"fedavg": code_version("fedavg"), "fedprox": changed}, study="study_1")
    with pytest.raises(StoredRunsChanged, match=r"changed code: fedprox \(model\)"):
        check_stored_runs(out, suite, "suite.yaml", suite.settings, ["fliu"])


def test_a_whole_suite_is_not_run_into_another_protocols_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pflower tune --suite S --out F`` without methods runs every method of S into F: where F
    holds final runs of another protocol, the leaderboard of F would mix the two, so it refuses
    before anything runs; under the same protocol the runs accumulate."""
    suite = _suite(tmp_path)
    out = tmp_path / "out"
    _store(out, suite, {"fedavg": code_version("fedavg")})
    check_protocol(out, suite, suite.settings)  # the same protocol: runs accumulate
    record = yaml.safe_load((out / "suite.yaml").read_text())
    (out / "suite.yaml").write_text(yaml.safe_dump({**record, "final_seeds": [1, 2, 3]}))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert tune_main(["--suite", str(tmp_path / "suite.yaml"), "--out", str(out)]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "holds final runs of digits made under another protocol" in error
    assert "final_seeds [1, 2, 3] -> [1, 2]" in error and "give another --out" in error
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_a_verified_code_is_accepted_for_its_method_and_setting_only(tmp_path: Path) -> None:
    """``verified.yaml`` (written by ``pflower reproduce --stored`` after a rerun matched) vouches
    for the runs of one method, setting and recorded code under the installed code: another
    method's runs of the same code, or the same method's after a further change, stay refused;
    the stale runs are one per method and recorded code."""
    suite = _suite(tmp_path)
    out = tmp_path / "out"
    runs = {}
    for method in ("fedavg", "fedprox"):
        code = code_version(method)
        runs[method] = {**code, "components": {**code["components"], "partition": "0" * 16}}
    _store(out, suite, runs)
    (stale,) = [s for s in stored_methods(out / "digits", ["fedprox"])]
    assert stale.changed == {"partition"}
    assert [r.name for r in stale.stale_runs] == ["seed_1"]  # seed 2 has the same code
    record_verified(out, "digits", "fedavg", stale.stale_runs[0], "126 values")
    entry = yaml.safe_load((out / VERIFIED).read_text())[0]
    assert entry["run"] == "digits/final/fedavg/seed_1" and entry["compared"] == "126 values"
    assert entry["recorded"]["partition"] == "0" * 16 != entry["installed"]["partition"]
    with pytest.raises(StoredRunsChanged) as refusal:
        check_stored_runs(out, suite, "suite.yaml", suite.settings, ["fliu"])
    assert "changed code: fedprox (partition)." in str(refusal.value)  # fedavg's are verified
    check_stored_runs(out, suite, "suite.yaml", suite.settings, ["fedprox"])
    entries = load_verified(out)
    (out / VERIFIED).write_text(yaml.safe_dump([{**entries[0], "setting": "other"}]))
    with pytest.raises(StoredRunsChanged, match=r"changed code: fedavg \(partition\)"):
        check_stored_runs(out, suite, "suite.yaml", suite.settings, ["fedprox"])
    installed = {**entries[0]["installed"], "model": "1" * 16}  # made by yet other code
    (out / VERIFIED).write_text(yaml.safe_dump([{**entries[0], "installed": installed}]))
    with pytest.raises(StoredRunsChanged, match=r"changed code: fedavg \(partition\)"):
        check_stored_runs(out, suite, "suite.yaml", suite.settings, ["fedprox"])


def test_runs_recorded_with_fingerprints_of_bytes_are_refused_until_verified(
    tmp_path: Path,
) -> None:
    """A record made before part fingerprints read code (no ``parts_read``) cannot tell an
    unchanged part from a changed one, even where its values happen to equal today's: it is
    refused as changed everywhere, and accepted once a rerun verified it."""
    suite = _suite(tmp_path)
    out = tmp_path / "out"
    old = {k: v for k, v in code_version("fedavg").items() if k != "parts_read"}
    assert compare_code("fedavg", old) == ({BYTES_READ}, True)
    _store(out, suite, {"fedavg": old})
    with pytest.raises(StoredRunsChanged) as refusal:
        check_stored_runs(out, suite, "suite.yaml", suite.settings, ["fedprox"])
    assert f"changed code: fedavg ({BYTES_READ})" in str(refusal.value)
    (stale,) = stored_methods(out / "digits", ["fedprox"])
    record_verified(out, "digits", "fedavg", stale.stale_runs[0], "126 values")
    check_stored_runs(out, suite, "suite.yaml", suite.settings, ["fedprox"])
