"""``pflower reproduce``: a recorded run, rerun from its record alone, matches to the last digit;
a changed value is found and named; a bad record exits 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

import pflower.strategies  # noqa: F401  (registers the methods: their modules count)
from pflower.compose import compose_config
from pflower.provenance import KERNEL_CAPS, code_version
from pflower.reproduce import (
    Record,
    compare_runs,
    config_overrides,
    main,
    read_record,
    recorded_numerics,
    version_notes,
)
from pflower.results.summary import resolved_config
from pflower.tuning.baselines import StoredRunsChanged, check_stored_runs, load_verified
from pflower.tuning.suite import load_suite
from tests.inprocess import run_inprocess

SMALL = ["dataset=digits", "num_clients=4", "rounds=2", "strategy=fedavg", "seed=3"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("recorded") / "run"
    run_inprocess(SMALL, run_dir)
    return run_dir


@pytest.mark.slow
def test_a_recorded_run_reproduces_to_the_last_digit(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rerun (a new ``pflower`` process, forked workers, the recorded numerics) writes the
    same metrics.jsonl values as the record, which was made in this process."""
    assert main([str(recorded / "summary.json"), "--out", str(tmp_path / "rerun")]) == 0
    out = capsys.readouterr().out
    assert "MATCH: all" in out and "metrics.jsonl rows agree to the last digit" in out
    assert json.loads((tmp_path / "rerun" / "summary.json").read_text())["config"]["seed"] == 3


def test_a_changed_value_is_a_mismatch_that_names_its_row(recorded: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(recorded, copy)
    lines = (copy / "metrics.jsonl").read_text().splitlines()
    index, row = next((i, json.loads(line)) for i, line in enumerate(lines) if '"L2"' in line)
    row["acc_local"] = row["acc_local"] + 1e-12  # the last digits only
    lines[index] = json.dumps(row)
    (copy / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert compare_runs(recorded, recorded).differences == []
    comparison = compare_runs(recorded, copy)
    assert len(comparison.differences) == 1
    assert comparison.differences[0].startswith(
        f"row {index + 1} (round {row['round']}, stage L2, client {row['client']}): acc_local"
    )


def test_without_metrics_jsonl_the_summaries_are_compared(recorded: Path, tmp_path: Path) -> None:
    """The tuning results keep only summary.json: its final and last-10% values are compared."""
    copy = tmp_path / "copy"
    shutil.copytree(recorded, copy)
    (copy / "metrics.jsonl").unlink()
    summary = json.loads((copy / "summary.json").read_text())
    assert compare_runs(copy, recorded).differences == []
    summary["final"]["L2"]["acc_local"]["mean"] += 1e-12
    (recorded.parent / "changed").mkdir(exist_ok=True)
    (recorded.parent / "changed" / "summary.json").write_text(json.dumps(summary))
    comparison = compare_runs(copy, recorded.parent / "changed")
    assert "summary.json" in comparison.what
    assert [d.split(":")[0] for d in comparison.differences] == ["final.L2.acc_local.mean"]


def test_a_failed_run_reproduces_where_its_rerun_fails_alike(
    recorded: Path, tmp_path: Path
) -> None:
    """A failed run's record (``status: failed`` and its error, as the stored APPLE run that
    diverged keeps) reproduces where the rerun fails with the same error: the summaries'
    status and error are compared with their values."""
    failed = json.loads((recorded / "summary.json").read_text())
    failed.update(status="failed", error="Round 2: all 4 clients failed.\n  client 0: NaN")
    for name, error in (("record", failed["error"]), ("same", failed["error"]), ("other", "E")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({**failed, "error": error}))
    assert compare_runs(tmp_path / "record", tmp_path / "same").differences == []
    (difference,) = compare_runs(tmp_path / "record", tmp_path / "other").differences
    assert difference.startswith("error: 'Round 2: all 4 clients failed.")


def test_a_rerun_refused_before_it_starts_is_no_mismatch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rerun the run refuses before it starts (here: MNIST under an empty data root) computed
    nothing: exit 2 with its reason, not a MISMATCH."""
    empty = tmp_path / "data"
    empty.mkdir()
    overrides = [*SMALL[1:], "dataset=mnist", f"dataset.root={empty}"]
    config = resolved_config(compose_config(overrides, check_scheme=False))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(config))
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "rerun")]) == 2
    out = capsys.readouterr().out
    assert "cannot reproduce: the rerun was refused before it started" in out
    assert "MISMATCH" not in out


def test_the_overrides_compose_the_recorded_configuration(recorded: Path) -> None:
    """Every recorded value, strings that read as numbers and lists included, comes back."""
    config = read_record(recorded).config
    config["client_state"]["dir"] = "/state/it's 1.0"
    composed = resolved_config(compose_config(config_overrides(config), check_scheme=False))
    for key in ("output_dir", "progress"):
        composed.pop(key), config.pop(key)
    assert composed == config


def test_bad_records_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing")]) == 2
    assert main([str(tmp_path)]) == 2
    (tmp_path / "summary.json").write_text("{")
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().out.count("cannot reproduce:") == 3


def test_the_record_decides_the_numerics_and_says_when_it_cannot() -> None:
    def numerics_of(
        record: dict[str, object] | None, asked: str | None = None
    ) -> tuple[str, dict[str, str], list[str]]:
        return recorded_numerics(Record(Path("."), {}, numerics=record), asked)

    mode, caps, notes = numerics_of(None)
    assert (mode, caps) == ("avx2", {}) and "predates the record of numerics" in notes[0]
    assert numerics_of({"cpu_capability": "AVX2", "caps": KERNEL_CAPS}) == ("avx2", {}, [])
    mode, caps, notes = numerics_of({"cpu_capability": "AVX2", "cpu_capability_env": "avx2"})
    assert (mode, caps) == ("native", {"ATEN_CPU_CAPABILITY": "avx2"}) and notes
    assert numerics_of({"mode": "avx2", "caps": KERNEL_CAPS}, "native")[:2] == ("native", {})


def test_a_record_of_other_code_says_which_parts_changed() -> None:
    """Where the record's whole-code fingerprint differs, the warning names the parts that
    decide the numbers and changed, says none did, or that the record cannot tell (its part
    fingerprints read the files' bytes)."""
    now = code_version("fedavg")
    other = {**now, "fingerprint": "f" * 16, "commit": "c" * 40}

    def warning(code: dict[str, object]) -> str:
        notes = version_notes(Record(Path("."), {"strategy": {"name": "fedavg"}}, code=code))
        assert notes[0].startswith(f"the record ran pflower code {'f' * 16} (commit cccccccccccc)")
        return notes[0]

    assert "none of the parts that decide the numbers changed since" in warning(other)
    model = {**other, "components": {**now["components"], "model": "0" * 16}}
    assert "changed since in model, which may change the numbers" in warning(model)
    of_bytes = {k: v for k, v in other.items() if k != "parts_read"}
    assert "the record cannot say which parts changed" in warning(of_bytes)


@pytest.mark.slow
def test_stored_runs_of_changed_code_are_verified_by_rerunning_one(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pflower reproduce --stored``: a stored final run whose recorded code differs in a part
    is rerun by this code; where every value matches, ``verified.yaml`` records it and ``pflower
    tune`` ranks against that method's runs; where one differs, its method stays refused."""
    suite_file = tmp_path / "suite.yaml"
    suite_file.write_text(
        "name: tiny\ntrials: 2\nfinal_seeds: [3]\nmethods: [fedavg, local]\n"
        f"settings:\n  - name: digits\n    overrides: [{', '.join(SMALL[:3])}]\n"
    )
    out = tmp_path / "out"
    for method, shift in (("fedavg", 0.0), ("local", 1e-12)):
        run = out / "digits" / "final" / method / "seed_3"
        shutil.copytree(recorded, run, ignore=shutil.ignore_patterns("metrics.jsonl"))
        summary = json.loads((run / "summary.json").read_text())
        components = {**summary["code"]["components"], "training and evaluation": "0" * 16}
        summary["code"] = {**summary["code"], "components": components}
        summary["final"]["L1"]["acc_local"]["mean"] += shift  # a record that does not reproduce
        (run / "summary.json").write_text(json.dumps(summary))
    suite = load_suite(str(suite_file))
    with pytest.raises(StoredRunsChanged, match=r"changed code: fedavg .*local"):
        check_stored_runs(out, suite, str(suite_file), suite.settings, ["fedprox"])
    assert main(["--stored", str(out), "--suite", str(suite_file)]) == 1
    said = capsys.readouterr().out
    assert "MATCH digits fedavg/seed_3: all " in said
    assert "MISMATCH digits local/seed_3: final.L1.acc_local.mean" in said
    assert "1 stored runs reproduced by this code" in said and "1 did not" in said
    assert [e["method"] for e in load_verified(out)] == ["fedavg"]
    with pytest.raises(StoredRunsChanged) as refusal:
        check_stored_runs(out, suite, str(suite_file), suite.settings, ["fedprox"])
    assert "changed code: local (method, training and evaluation)." in str(refusal.value)
    assert main(["--stored", str(out)]) == 2  # --stored needs the suite
    assert main(["--stored", str(tmp_path / "none"), "--suite", str(suite_file)]) == 2
