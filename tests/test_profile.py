"""``pflower tune --profile`` (pflower.tuning.profile): one knob varied at the chosen values.

- the grid spans a log range by its decades and a decade past each end, a linear range by five
  points from end to end (nothing past them), a choice by its values, the chosen value always;
- a real profile on a tiny setting repeats the chosen trial's run exactly (same objective), runs
  every point on validation with the tuning seed and the one key changed, and a second command
  runs nothing;
- ``--profile ends`` profiles only the keys chosen at an end of their range, and the leaderboard
  puts each profile under the end it explains; once the study is searched again a profile
  made at the old chosen values is named, not shown, and none of its runs is reused;
- in a suite of several studies each study's choice is profiled with its own tuning seed, into
  its own folder, and shown under its own end;
- bad requests are refused with a message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from pflower.provenance import CODE_FINGERPRINT, KERNEL_CAPS, numerics
from pflower.registry import ConfigError
from pflower.reporting.leaderboard_notes import range_end_notes
from pflower.reporting.leaderboard_runs import Entry
from pflower.searchspace import Param
from pflower.tuning import cli, finals, search
from pflower.tuning.profile import (
    chosen_at_ends,
    current_profiles,
    describe_profile,
    profile_grid,
    read_profiles,
    run_profile,
)
from pflower.tuning.runner import RunInterrupted, RunRefused, TrialFailed
from pflower.tuning.search import Layout
from pflower.tuning.suite import load_suite
from tests.helpers import tiny_suite

SUITE = tiny_suite(1, 3, "[1]")


def test_the_grid_spans_a_log_range_and_a_decade_past_its_ends() -> None:
    eta = Param("choice", choices=(0.01, 0.1, 1.0, 10.0, 100.0))
    assert profile_grid(eta, 100.0) == [0.001, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0]
    lam = Param("float", low=1e-4, high=1.0, log=True)
    assert profile_grid(lam, 1.53e-4) == [1e-5, 1e-4, 1.53e-4, 1e-3, 0.01, 0.1, 1.0, 10.0]
    ditto = Param("float", low=0.01, high=2.0, log=True)  # the greatest value is no decade
    assert profile_grid(ditto, 1.7) == [0.001, 0.01, 0.1, 1.0, 1.7, 2.0, 20.0]
    # linear ranges: five points on the step, end to end, never past an end
    percent = Param("float", low=5.0, high=100.0, step=5.0)
    assert profile_grid(percent, 100.0) == [5.0, 30.0, 55.0, 75.0, 100.0]
    epochs = Param("int", low=1, high=10)
    assert profile_grid(epochs, 7) == [1, 3, 6, 7, 8, 10]
    momentum = Param("choice", choices=(0.0, 0.5, 0.9))  # no log range: its values
    assert profile_grid(momentum, 0.5) == [0.0, 0.5, 0.9]


def _tiny(tmp_path: Path) -> tuple[Any, Any, Layout]:
    path = tmp_path / "tiny.yaml"
    path.write_text(SUITE)
    suite = load_suite(str(path))
    return suite, suite.settings[0], Layout(tmp_path / "out")


@pytest.mark.slow
def test_a_profile_repeats_the_chosen_trial_and_varies_one_key_on_validation(
    tmp_path: Path,
) -> None:
    suite, setting, layout = _tiny(tmp_path)
    study = search.tune(suite, setting, "fedprox", layout, rounds=2)
    chosen = finals.write_chosen(study, suite, setting, "fedprox", layout)
    mu = chosen["params"]["strategy.mu"]
    lines: list[str] = []
    record = run_profile(
        suite, setting, "fedprox", "strategy.mu", layout, [mu, 0.5], workers=2, log=lines.append
    )
    # the point at the chosen value is the chosen trial's run again: the same objective
    assert record["reproduced"] == 0.0
    assert record["chosen_objective"] == chosen["value"]
    assert [p["value"] for p in record["points"]] == [mu, 0.5]
    assert all("objective" in p for p in record["points"]), record
    for value in (mu, 0.5):
        run_dir = layout.profile_run_dir(setting.name, "fedprox", "strategy.mu", value)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["scored_on"] == "val" and summary["config"]["seed"] == suite.tune_seed
        assert summary["config"]["strategy"]["mu"] == pytest.approx(value, rel=1e-5)
        assert summary["config"]["train"]["lr"] == pytest.approx(
            chosen["params"]["train.lr"], rel=1e-5
        )
    assert record["points"][1]["inside"] is True  # 0.5 lies in FedProx's [1e-4, 1]
    assert {p["code"] for p in record["points"]} == {CODE_FINGERPRINT}
    assert {p["kernels"] for p in record["points"]} == {numerics()["cpu_capability"]}
    saved = yaml.safe_load(layout.profile_file(setting.name, "fedprox", "strategy.mu").read_text())
    assert saved == record
    assert len(lines) == 2

    def no_run(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("a completed point ran again")

    again = run_profile(
        suite, setting, "fedprox", "strategy.mu", layout, [mu, 0.5], runner=no_run, log=print
    )
    assert again["points"] == record["points"]


def _fake_runner(objective: Callable[[float], float]) -> Callable[..., dict[str, Any]]:
    """A runner that writes a completed summary whose objective is ``objective(eta)``, the
    value of ``strategy.eta`` in the command (a failed run for eta < 0.05)."""

    def runner(command: Sequence[str], run_dir: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        eta = float(next(c for c in command if c.startswith("strategy.eta=")).split("=")[1])
        run_dir.mkdir(parents=True, exist_ok=True)
        if eta < 0.05:
            summary: dict[str, Any] = {"status": "failed", "error": "loss is NaN\nmore"}
            (run_dir / "summary.json").write_text(json.dumps(summary))
            raise TrialFailed("loss is NaN")
        summary = {"status": "completed", "last10": {"L1": {"acc_local": {"mean": objective(eta)}}}}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        return summary

    return runner


def test_profile_ends_runs_only_the_keys_at_an_end_and_the_leaderboard_shows_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite, setting, layout = _tiny(tmp_path)
    space = {
        "train.lr": Param("float", low=1e-3, high=0.3, log=True),
        "strategy.eta": Param("choice", choices=(0.1, 1.0, 10.0)),
    }
    chosen = {
        "method": "fedala",
        "value": 0.80,
        "best_trial": 2,
        "space": {key: param.describe() for key, param in space.items()},
        "params": {"train.lr": 0.02, "strategy.eta": 10.0},
    }
    path = layout.chosen_file(setting.name, "fedala")
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(chosen))
    assert [key for key, *_ in chosen_at_ends(chosen)] == ["strategy.eta"]
    # the objective rises past the high end (100 beats 10); 0.01 fails
    runner = _fake_runner(lambda eta: 0.80 + 0.01 * eta / 100.0)
    cli.run_profiles(suite, ["fedala"], [setting], layout.root, ["ends"], None, 1, None, runner)
    profiles = read_profiles(layout.setting_dir(setting.name), "fedala")
    assert list(profiles) == ["strategy.eta"]  # train.lr (0.02) is inside its range
    record = profiles["strategy.eta"]
    assert [p["value"] for p in record["points"]] == [0.01, 0.1, 1.0, 10.0, 100.0]
    assert [p["inside"] for p in record["points"]] == [False, True, True, True, False]
    assert record["points"][0]["error"] == "loss is NaN"
    assert record["best"] == {"value": 100.0, "objective": 0.81, "where": "past the high end"}
    assert record["reproduced"] == pytest.approx(0.001)  # the fake's 0.801 against 0.80
    line = describe_profile(record)
    assert "best 100.0 (81.00 %), past the high end" in line
    assert "past the ends 0.01: failed, 100.0: 81.00 %" in line
    assert "chosen 10.0: 80.10 %, the chosen trial's run again: +0.0010" in line
    assert f"fedala: {line}" in capsys.readouterr().out
    entry = Entry("fedala", final=[0.9, 0.91], chosen=chosen, profiles={None: profiles})
    notes = range_end_notes([entry])
    position = notes.index("- FedALA: strategy.eta = 10, high end of one of 0.1, 1.0, 10.0")
    assert notes[position + 1] == f"    - {line}"
    # a key the study did not search takes the values it is given
    fixed = run_profile(
        suite, setting, "fedala", "strategy.layer_idx", layout, [1, 2], runner=runner, log=print
    )
    assert [(p["value"], p["inside"]) for p in fixed["points"]] == [(1, None), (2, None)]
    assert fixed["space"] == "not searched" and fixed["reproduced"] is None
    assert fixed["best"]["where"] == "a key the study did not search"
    # the study searched again chose another trial: both profiles describe other runs now, the
    # leaderboard says so instead of showing them, and a new profile reuses none of their runs
    chosen = {**chosen, "value": 0.82, "best_trial": 5}
    path.write_text(yaml.safe_dump(chosen))
    current, stale = current_profiles(layout.setting_dir(setting.name), "fedala", chosen)
    assert current == {} and stale == ["strategy.eta", "strategy.layer_idx"]
    entry = Entry("fedala", final=[0.9, 0.91], chosen=chosen, stale_profiles={None: stale})
    notes = range_end_notes([entry])
    assert notes[position + 1].startswith("    - its profile of strategy.eta was made at the ")
    ran: list[Path] = []

    def counting(command: Sequence[str], run_dir: Path, *args: Any, **kw: Any) -> dict[str, Any]:
        ran.append(run_dir)
        return runner(command, run_dir, *args, **kw)

    again = run_profile(suite, setting, "fedala", "strategy.eta", layout, runner=counting)
    assert len(ran) == len(again["points"]) == 5  # the failed point 0.01 too: not reused
    assert again["chosen_objective"] == 0.82 and again["reproduced"] == pytest.approx(-0.019)
    current, stale = current_profiles(layout.setting_dir(setting.name), "fedala", chosen)
    assert list(current) == ["strategy.eta"] and stale == ["strategy.layer_idx"]


def test_each_study_of_a_suite_is_profiled_at_its_own_choice_and_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a suite of several studies each study chose its own values with its own tuning seed:
    ``--profile`` profiles each study's choice (a study without one is named and skipped),
    with that study's seed, into the study's folder, and the leaderboard puts each profile
    under its study's end."""
    path = tmp_path / "studies.yaml"
    path.write_text(SUITE + "studies: 3\n")
    suite = load_suite(str(path))
    setting, layout = suite.settings[0], Layout(tmp_path / "out")
    eta = Param("choice", choices=(0.1, 1.0, 10.0))
    chosen = {}
    for study, value in ((0, 10.0), (2, 0.1)):  # study 1 has chosen nothing yet
        chosen[study] = {
            "method": "fedala",
            "value": 0.80,
            "best_trial": 3,
            "space": {"strategy.eta": eta.describe()},
            "params": {"strategy.eta": value},
        }
        file = layout.chosen_file(setting.name, "fedala", study)
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(yaml.safe_dump(chosen[study]))
    seeds: dict[Path, str] = {}
    fake = _fake_runner(lambda eta: 0.80 + 0.01 * eta / 100.0)

    def runner(command: Sequence[str], run_dir: Path, *args: Any, **kw: Any) -> dict[str, Any]:
        seeds[run_dir] = next(c for c in command if c.startswith("seed="))
        return fake(command, run_dir, *args, **kw)

    cli.run_profiles(suite, ["fedala"], [setting], layout.root, ["ends"], None, 1, None, runner)
    assert "[digits] fedala (study 1) has no chosen values yet: not profiled" in (
        capsys.readouterr().out
    )
    setting_dir = layout.setting_dir(setting.name)
    assert read_profiles(setting_dir, "fedala") == {}
    for study in (0, 2):
        (record,) = read_profiles(setting_dir, "fedala", study).values()
        assert record["study"] == study and record["seed"] == suite.study_seed(study)
        assert record["chosen"] == chosen[study]["params"]["strategy.eta"]
        runs = layout.profile_runs_dir(setting.name, "fedala", "strategy.eta", study)
        assert {seeds[r] for r in seeds if r.parent == runs} == {f"seed={suite.study_seed(study)}"}
    entry = Entry("fedala", final=[0.9, 0.91], chosen=chosen[0], study_chosen=chosen)
    for study in (0, 2):
        entry.profiles[study], entry.stale_profiles[study] = current_profiles(
            setting_dir, "fedala", chosen[study], study
        )
    notes = range_end_notes([entry])
    position = notes.index(
        "- FedALA: study 0: strategy.eta = 10, high end of one of 0.1, 1.0, 10.0; "
        "study 2: strategy.eta = 0.1, low end of one of 0.1, 1.0, 10.0"
    )
    assert notes[position + 1].startswith("    - study 0: profile of strategy.eta")
    assert notes[position + 2].startswith("    - study 2: profile of strategy.eta")


def test_a_point_the_option_refuses_is_recorded_and_the_profile_goes_on(tmp_path: Path) -> None:
    """A grid goes a decade past a range's ends, where an option may refuse the value (a fraction
    of 5): pflower refuses that run before it starts, and the profile records the point as
    refused, with pflower's line, instead of stopping (a trial's refusal stops a study)."""
    suite, setting, layout = _tiny(tmp_path)
    chosen = {"value": 0.8, "best_trial": 0, "space": {}, "params": {"strategy.mu": 0.5}}
    path = layout.chosen_file(setting.name, "fedprox")
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(chosen))

    def runner(command: Sequence[str], run_dir: Path, *args: Any, **kw: Any) -> dict[str, Any]:
        mu = float(next(c for c in command if c.startswith("strategy.mu=")).split("=")[1])
        if mu > 1:
            log = f"INFO: starting\nconfiguration error: strategy.mu must be <= 1, got {mu}"
            raise RunRefused(log, command)
        return {"status": "completed", "last10": {"L1": {"acc_local": {"mean": 0.8}}}}

    record = run_profile(
        suite, setting, "fedprox", "strategy.mu", layout, [0.1, 0.5, 5.0], runner=runner, log=print
    )
    assert [p.get("objective") for p in record["points"]] == [0.8, 0.8, None]
    refused = record["points"][2]
    assert refused["error"] == "refused: configuration error: strategy.mu must be <= 1, got 5.0"
    # every point scored the same: the tie goes to the chosen value, not to the first one
    assert record["best"]["value"] == 0.5


def test_an_interrupted_point_says_it_runs_again_and_does(tmp_path: Path) -> None:
    """A point whose run a signal ended (not the option's doing) is recorded as interrupted,
    saying that the next ``--profile`` runs it again, and the next one does."""
    suite, setting, layout = _tiny(tmp_path)
    chosen = {"value": 0.8, "best_trial": 0, "space": {}, "params": {"strategy.mu": 0.5}}
    path = layout.chosen_file(setting.name, "fedprox")
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(chosen))
    ran: list[float] = []

    def runner(command: Sequence[str], run_dir: Path, *args: Any, **kw: Any) -> dict[str, Any]:
        mu = float(next(c for c in command if c.startswith("strategy.mu=")).split("=")[1])
        ran.append(mu)
        if mu == 0.1 and ran.count(mu) == 1:
            summary = {"status": "failed", "error": "interrupted by SIGTERM"}
            run_dir.mkdir(parents=True)  # as run_pflower does, and the run writes its summary
            (run_dir / "summary.json").write_text(json.dumps(summary))
            raise RunInterrupted("interrupted by SIGTERM (see tune_stdout.log)")
        return {"status": "completed", "last10": {"L1": {"acc_local": {"mean": 0.8}}}}

    def profile() -> dict[str, Any]:
        return run_profile(
            suite, setting, "fedprox", "strategy.mu", layout, [0.1, 0.5], runner=runner
        )

    first = profile()
    said = "interrupted by SIGTERM (it runs again at the next --profile)"
    assert [p.get("error") for p in first["points"]] == [said, None]
    again = profile()
    assert [p.get("objective") for p in again["points"]] == [0.8, 0.8]
    assert ran.count(0.1) == 2


def test_bad_profile_requests_are_refused_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite, setting, layout = _tiny(tmp_path)
    with pytest.raises(ConfigError, match="fedprox has no chosen values on digits: tune it"):
        run_profile(suite, setting, "fedprox", "strategy.mu", layout)
    path = layout.chosen_file(setting.name, "fedprox")
    path.parent.mkdir(parents=True)
    chosen = {"space": {"train.lr": "log-uniform [0.001, 0.3]"}, "params": {"train.lr": 0.01}}
    path.write_text(yaml.safe_dump(chosen))
    with pytest.raises(ConfigError, match=r"did not search strategy.mu .* --profile-values"):
        run_profile(suite, setting, "fedprox", "strategy.mu", layout)
    suite_file = str(tmp_path / "tiny.yaml")
    code = cli.main(
        ["fedprox", "--suite", suite_file, "--profile", "ends", "--profile-values", "1,2"]
    )
    assert code == 2
    assert "--profile-values goes with exactly one --profile KEY" in capsys.readouterr().err


def test_the_commands_log_names_the_caps_on_the_cpu_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel caps change what the runs compute, so the recorded command carries them (and,
    copied from the log, repeats the runs)."""
    for name in KERNEL_CAPS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    cli._record_invocation(tmp_path, ["fedala", "--profile", "ends"])
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    cli._record_invocation(tmp_path, ["fedala"])
    commands = [json.loads(line)["command"] for line in (tmp_path / "commands.log").open()]
    assert commands == [
        "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 pflower tune fedala --profile ends",
        "pflower tune fedala",
    ]
