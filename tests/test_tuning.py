"""``pflower tune`` (pflower.tuning) and ``pflower report --leaderboard``.

- a tuning trial reads no test sample: its run, driven in-process, has the federation's pool
  replaced by a sentinel that raises when any client-test or global-test sample is read (and the
  same run scored on test does raise, so the sentinel is live);
- a study resumes: a trial left running by a stopped ``pflower tune`` is failed by Optuna's
  heartbeat check and retried with the same values, finished trials count, and a second
  invocation with the budget spent runs nothing; 2 workers run trials at the same time;
- a trial that diverges is failed with its error and counts toward the budget;
- the leaderboard ranks with ties by paired t-tests over the seeds and shows the chosen values
  and provenance.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

import pflower.core.experiment as experiment_module
from pflower.compose import compose_config
from pflower.datasets.base import ImageSplit
from pflower.registry import ConfigError
from pflower.reporting.leaderboard import codes_line, load_setting, render
from pflower.reporting.leaderboard_notes import inversion_notes, range_end_notes, range_ends
from pflower.reporting.leaderboard_ranks import (
    fdr_better_counts,
    paired_test,
    rank_with_ties,
    ranked_above_higher_means,
    significantly_better,
)
from pflower.reporting.leaderboard_runs import Entry
from pflower.results.failures import failed_by_itself
from pflower.searchspace import Param
from pflower.tuning import finals, schedule, search
from pflower.tuning import runner as trial_runner
from pflower.tuning.ledger import budget_counts
from pflower.tuning.search import Layout, open_study, trial_overrides
from pflower.tuning.suite import Setting, load_suite
from tests.helpers import fake_final_run, tiny_suite
from tests.inprocess import run_inprocess

TINY = ["dataset=digits", "num_clients=4", "rounds=2", "train.local_epochs=1"]

SUITE = tiny_suite(2, 0, "[1, 2]")


class ReadOfATestSample(AssertionError):
    """A test sample was read."""


class SentinelPool(ImageSplit):
    """The federation's pool, raising when a subset touches a forbidden (test) index."""

    forbidden: np.ndarray = np.zeros(0, dtype=np.int64)

    def subset(self, indices: np.ndarray) -> ImageSplit:
        touched = np.intersect1d(np.asarray(indices), self.forbidden)
        if len(touched):
            raise ReadOfATestSample(
                f"{len(touched)} test samples read, e.g. pool index {touched[0]}"
            )
        return super().subset(indices)


def _guard_test_samples(monkeypatch: pytest.MonkeyPatch, overrides: list[str]) -> None:
    """Every federation built from now on has a pool that refuses the test samples of the
    ``evaluate_on=test`` federation of ``overrides`` (client test shares and global test)."""
    test_cfg = compose_config([*overrides, "split.evaluate_on=test"])
    real = experiment_module.Experiment(test_cfg).federation
    forbidden = np.unique(np.concatenate([*(c.test for c in real.clients), real.global_test]))
    assert len(forbidden) > 0
    build = experiment_module.build_federation

    def guarded(*args, **kwargs):
        federation = build(*args, **kwargs)
        pool = SentinelPool(federation.pool.images, federation.pool.labels, federation.pool.groups)
        object.__setattr__(pool, "forbidden", forbidden)
        return dataclasses.replace(federation, pool=pool)

    monkeypatch.setattr(experiment_module, "build_federation", guarded)
    monkeypatch.setattr(experiment_module, "_EXPERIMENTS", {})


@pytest.mark.parametrize("method", ["fedavg", "ditto"])
def test_no_trial_reads_a_test_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    suite = load_suite(_suite_file(tmp_path))
    setting = suite.settings[0]
    overrides = trial_overrides(suite, setting, method, {"train.lr": 0.05})
    assert "split.evaluate_on=val" in overrides and "split.val_fraction=0.25" in overrides
    _guard_test_samples(monkeypatch, overrides)
    rows, _ = run_inprocess(overrides, tmp_path / "trial")
    assert any(r["stage"] == "L1" for r in rows)
    # the sentinel is live: the same run scored on test reads test samples and is stopped
    with pytest.raises(ReadOfATestSample):
        run_inprocess([*overrides, "split.evaluate_on=test"], tmp_path / "on_test")


def _suite_file(tmp_path: Path) -> str:
    path = tmp_path / "tiny.yaml"
    path.write_text(SUITE)
    return str(path)


@pytest.mark.slow
def test_study_resumes_retries_an_interrupted_trial_and_runs_two_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite = load_suite(_suite_file(tmp_path))
    setting: Setting = suite.settings[0]
    layout = Layout(tmp_path / "out")
    # heartbeats every ~0.5 s, stale after 4 s: the test waits seconds, not minutes
    monkeypatch.setattr(search, "HEARTBEAT_S", 1)
    monkeypatch.setattr(search, "POLL_S", 0.25)
    monkeypatch.setattr(search, "GRACE_S", 4)
    monkeypatch.setattr(trial_runner, "HEARTBEAT_S", 1)
    monkeypatch.setattr(trial_runner, "POLL_S", 0.25)
    # a pflower tune that was stopped while its trial ran: a RUNNING trial with a heartbeat
    study = open_study(layout, setting.name, "fedprox", 0, parallel=True)
    stale = study.ask()
    stale_values = {k: p.suggest(stale, k) for k, p in suite.space_for("fedprox").items()}
    study._storage.record_heartbeat(stale._trial_id)
    import time

    time.sleep(5)
    lines: list[str] = []
    study = search.tune(suite, setting, "fedprox", layout, rounds=2, workers=2, log=lines.append)
    from optuna.trial import TrialState

    trials = study.get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert budget_counts(study) == (2, 0), lines
    assert len(complete) == 2 and len(trials) == 3, lines  # never more than the budget
    assert len(list((layout.setting_dir("digits") / "trials" / "fedprox").iterdir())) == 2
    assert trials[0].state == TrialState.FAIL  # the interrupted one, retried with its values
    assert any(t.params == stale_values for t in complete)
    first, second = complete
    assert first.datetime_start < second.datetime_complete
    assert second.datetime_start < first.datetime_complete, "the 2 workers did not overlap"
    for trial in complete:
        config = yaml.safe_load((Path(trial.user_attrs["run_dir"]) / "config.yaml").read_text())
        assert config["split"]["evaluate_on"] == "val" and config["seed"] == 0
    # a second invocation with the budget spent runs nothing and chooses the same values
    again = search.tune(suite, setting, "fedprox", layout, rounds=2, workers=2)
    assert len(again.get_trials()) == len(trials)
    chosen = finals.write_chosen(again, suite, setting, "fedprox", layout)
    assert chosen["budget"] == {"trials": 2, "complete": 2, "interrupted": 1}
    best = max(complete, key=lambda t: t.value)
    assert chosen["params"] == best.params and chosen["overrides"][0] == "strategy=fedprox"
    printed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pflower",
            "tune",
            "--overrides",
            str(layout.chosen_file("digits", "fedprox")),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert printed == chosen["overrides"]


def _instant_runner(command, run_dir, on_round=None, heartbeat=None, timeout_s=None):
    """A runner that returns at once, with an objective made from the run's values."""
    lr = next(float(c.split("=")[1]) for c in command if c.startswith("train.lr="))
    return {"status": "completed", "last10": {"L1": {"acc_local": {"mean": lr}}}}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_resumed_study_draws_new_values_and_a_new_one_the_same(
    tmp_path: Path, workers: int
) -> None:
    """Each trial's draw is seeded with the tuning seed and the trial's number: a study resumed
    by another ``pflower tune`` (its budget raised here, as a stopped command's is not yet
    spent) draws new values, and a study run from scratch draws the same ones again. A
    sampler seeded once per process drew the first trials' values again after a resume."""
    suite = load_suite(_suite_file(tmp_path))
    setting = suite.settings[0]
    first, again = Layout(tmp_path / "first"), Layout(tmp_path / "again")
    for layout in (first, again):
        for trials in (2, 4):  # two commands: the second resumes the study with 2 more trials
            grown = dataclasses.replace(suite, trials=trials)
            search.tune(grown, setting, "fedprox", layout, 2, workers, runner=_instant_runner)
    drawn = [
        sorted(
            tuple(sorted(t.params.items()))
            for t in open_study(layout, "digits", "fedprox", 0, False).trials
        )
        for layout in (first, again)
    ]
    assert len(set(drawn[0])) == 4, drawn[0]  # four distinct points, none drawn twice
    assert drawn[0] == drawn[1]  # the same study again from scratch: the same values


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Fixed parameter train.lr:UserWarning")  # 1e6, enqueued
def test_a_diverging_trial_is_failed_with_its_error_and_spends_the_budget(tmp_path: Path) -> None:
    """A trial whose run diverges (every client's update NaN) is recorded FAIL with the run's
    error and folder, counts toward the budget like any other trial (it is not retried: only
    interrupted trials are), and the chosen values come from the trial that completed."""
    from optuna.trial import TrialState

    suite = load_suite(_suite_file(tmp_path))
    setting = dataclasses.replace(suite.settings[0], extra=("rounds=2",))
    layout = Layout(tmp_path / "out")
    study = open_study(layout, setting.name, "fedprox", 0, parallel=False)
    study.enqueue_trial({"train.lr": 1.0e6, "strategy.mu": 0.01}, skip_if_exists=False)
    study = search.tune(suite, setting, "fedprox", layout, rounds=2, workers=1)
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    failed = trials[0]
    assert failed.params["train.lr"] == 1.0e6
    assert "NaN" in failed.user_attrs["error"] and "tune_stdout.log" in failed.user_attrs["error"]
    assert (Path(failed.user_attrs["run_dir"]) / "tune_stdout.log").is_file()
    assert budget_counts(study) == (2, 0)
    chosen = finals.write_chosen(study, suite, setting, "fedprox", layout)
    assert chosen["params"] == trials[1].params
    assert chosen["budget"] == {"trials": 2, "complete": 1, "fail": 1}


@pytest.mark.slow
def test_a_run_refused_before_it_starts_stops_the_command_and_spends_no_trial(
    tmp_path: Path,
) -> None:
    """A data root without the dataset makes pflower refuse every run before it starts (exit
    code 2, no summary): ``pflower tune`` stops with the run's message and exit code 2 instead
    of failing the budget's trials one by one, and the trials it started are retried with their
    values, uncounted, once the data is there."""
    from optuna.trial import TrialState

    missing = tmp_path / "no-data"
    missing.mkdir()
    suite_file = tmp_path / "tiny.yaml"
    suite_file.write_text(
        SUITE.replace(
            "overrides: [dataset=digits,", f"overrides: [dataset=fmnist, dataset.root={missing},"
        )
    )
    out = tmp_path / "out"
    command = [sys.executable, "-m", "pflower", "tune", "fedprox", "--suite", str(suite_file)]
    result = subprocess.run(
        [*command, "--workers", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "dataset error: Dataset 'fmnist' was not found" in result.stderr, result.stderr
    assert "configuration error: dataset error" not in result.stderr  # one prefix, the run's
    assert "Traceback" not in result.stderr, result.stderr
    assert not (out / "digits" / "chosen").exists()  # no final runs, no chosen values
    layout = Layout(out)
    study = open_study(layout, "digits", "fedprox", 0, parallel=True)
    refused = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert refused and all("refused before it started" in t.user_attrs["error"] for t in refused)
    assert budget_counts(study) == (0, 0)
    # the data is there now (the embedded digits): the refused draws run first, and count once
    suite = load_suite(_suite_file(tmp_path))
    study = search.tune(suite, suite.settings[0], "fedprox", layout, rounds=2, workers=1)
    complete = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert budget_counts(study) == (2, 0)
    assert {str(t.params) for t in refused} <= {str(t.params) for t in complete}


def test_a_refusal_names_its_reason_and_survives_pickling() -> None:
    """A refused run's reason is pflower's error line, and the error pickles whole (a Ray task's
    error reaches the driver pickled)."""
    import pickle

    log = "INFO: composing\ndataset error: Dataset 'fmnist' was not found under /x.\n  - a.gz"
    error = trial_runner.RunRefused(log, ["pflower", "dataset=fmnist"])
    assert error.reason == "dataset error: Dataset 'fmnist' was not found under /x."
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.reason) == (str(error), error.reason)
    assert str(error).endswith("(the command: pflower dataset=fmnist)")


def test_show_prints_the_space_with_its_sources(capsys: pytest.CaptureFixture[str]) -> None:
    from pflower.tuning import cli as tune_cli

    assert tune_cli.main(["--show", "fedprox", "--suite", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "strategy.mu" in out and "log-uniform [0.0001, 1]" in out and "FedProx" in out
    assert "train.lr" in out
    # a named setting shows its own knobs and ranges
    assert tune_cli.main(["--show", "fliu", "--suite", "claims", "--setting", "fliu_path"]) == 0
    out = capsys.readouterr().out
    assert "setting fliu_path" in out and "log-uniform [0.0001, 0.01]" in out
    assert re.search(r"train\.local_epochs\s+one of 1, 2, 5", out)


@pytest.mark.parametrize("name", ["cpu", "claims", pytest.param("paper", marks=pytest.mark.slow)])
def test_suites_cover_every_method_with_new_final_seeds(name: str) -> None:
    from pflower.core.algorithm import ALGORITHMS

    suite = load_suite(name)
    if name == "claims":  # the contested claims' methods only
        assert {"fedavg", "fliu", "local", "fedmpr"} <= set(suite.methods) <= set(ALGORITHMS)
    else:
        assert set(suite.methods) == set(ALGORITHMS)
    assert suite.tune_seed not in suite.final_seeds and len(suite.final_seeds) >= 3
    assert suite.budget
    for setting in suite.settings:  # every setting composes with each of its methods
        for method in suite.methods_of(setting):
            compose_config(
                [
                    *setting.overrides_for(method),
                    f"strategy={method}",
                    "split.val_fraction=0.2",
                    "split.evaluate_on=val",
                ],
                check_scheme=False,
            )


PER_METHOD = """\
name: adam
trials: 1
final_seeds: [1]
methods: [fedavg, scaffold, feddc]
settings:
  - name: digits_adam
    overrides: [dataset=digits, num_clients=4, rounds=2, train.optimizer=adam]
    space: {train.lr: {low: 1.0e-4, high: 1.0e-2}}
    per_method:
      scaffold:
        overrides: [train.optimizer=sgd]
        space: {train.lr: {low: 1.0e-3, high: 0.3}}
        reason: control variates assume SGD
"""


def test_per_method_changes_reach_every_run_and_refusals_are_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import optuna

    from pflower.tuning import cli
    from pflower.tuning.finals import final_overrides, write_chosen

    path = tmp_path / "adam.yaml"
    path.write_text(PER_METHOD)
    suite = load_suite(str(path))
    setting = dataclasses.replace(suite.settings[0], extra=("rounds=3",))
    # SCAFFOLD's runs get SGD after the setting's Adam, SGD's lr range, the command line last
    trial = trial_overrides(suite, setting, "scaffold", {"train.lr": 0.05})
    assert trial.index("train.optimizer=sgd") > trial.index("train.optimizer=adam")
    assert trial[-1] == "rounds=3" and "train.lr=0.05" in trial
    assert suite.space_for("scaffold", setting)["train.lr"].describe() == "log-uniform [0.001, 0.3]"
    assert "train.optimizer=sgd" not in trial_overrides(suite, setting, "fedavg", {})
    assert suite.space_for("fedavg", setting)["train.lr"].low == 1.0e-4
    # the chosen file carries the change (with its reason), so it reproduces the runs
    study = optuna.create_study(direction="maximize")
    lr = optuna.distributions.FloatDistribution(1e-3, 0.3, log=True)
    study.add_trial(
        optuna.trial.create_trial(
            params={"train.lr": 0.02}, distributions={"train.lr": lr}, value=0.7
        )
    )
    chosen = write_chosen(study, suite, setting, "scaffold", Layout(tmp_path / "chosen"))
    assert chosen["overrides"] == ["train.optimizer=sgd", "strategy=scaffold", "train.lr=0.02"]
    assert chosen["reason"] == "control variates assume SGD"
    final = final_overrides(suite, setting, chosen["overrides"], 1)
    assert final.index("train.optimizer=sgd") > final.index("train.optimizer=adam")
    assert final[-1] == "rounds=3" and "split.evaluate_on=test" in final
    # FedDC, which the setting refuses and no per_method entry changes, is reported, not run
    calls: list[list[str]] = []
    out = tmp_path / "out"
    run_suite = cli.run_suite
    run_suite(suite, ["feddc"], [setting], out, 1, True, None, lambda c, *a, **k: calls.append(c))
    assert not calls
    refusal = (out / "digits_adam" / "refused" / "feddc.txt").read_text()
    assert "train.optimizer=adam" in refusal
    fake_final_run(out / "digits_adam" / "final" / "fedavg" / "seed_1", 0.9, 0.9)
    text, _ = render(out)
    assert "- scaffold: `train.optimizer=sgd`: control variates assume SGD" in text
    assert "Methods this setting refuses (not run):" in text and "- feddc: " in text
    assert "1 of 3 methods are ranked; not yet: scaffold." in text
    # a typo in the setting is an error, not a refusal of every method
    typo = dataclasses.replace(setting, extra=("rounds=three",))
    with pytest.raises(ConfigError, match="rounds"):
        run_suite(suite, ["fedavg"], [typo], tmp_path / "typo", 1, True, None, None)
    assert not (tmp_path / "typo" / "digits_adam" / "refused").exists()
    # `pflower tune <some methods>` on a suite with per_method entries for others runs them
    seen: dict[str, object] = {}
    monkeypatch.setattr(
        cli, "run_suite", lambda *a, **k: seen.update(methods=a[1], settings=a[2], **k)
    )
    assert cli.main(["fedavg", "--suite", str(path), "rounds=3", "--out", str(tmp_path / "o")]) == 0
    assert seen["methods"] == ["fedavg"] and seen["retry_failed"] is False
    assert [s.extra for s in seen["settings"]] == [("rounds=3",)]  # type: ignore[attr-defined]
    assert cli.main(["fedavg", "--suite", str(path), "--retry-failed", "--out", str(tmp_path)]) == 0
    assert seen["retry_failed"] is True
    # a change needs its reason, names the suite's methods and keys its method searches
    path.write_text(PER_METHOD.replace("        reason: control variates assume SGD\n", ""))
    with pytest.raises(ConfigError, match="say why"):
        load_suite(str(path))
    path.write_text(PER_METHOD.replace("methods: [fedavg, scaffold, feddc]", "methods: [fedavg]"))
    with pytest.raises(ConfigError, match=r"changes methods \['scaffold'\]"):
        load_suite(str(path))
    path.write_text(
        PER_METHOD.replace("space: {train.lr: {low: 1.0e-3", "space: {train.lrr: {low: 1.0e-3")
    )
    with pytest.raises(ConfigError, match=r"per_method.scaffold.space names \['train.lrr'\]"):
        load_suite(str(path))


def test_a_study_resumes_only_the_search_it_started(tmp_path: Path) -> None:
    from pflower.searchspace import Param
    from pflower.tuning.ledger import check_study_space, search_record

    suite = load_suite(_suite_file(tmp_path))
    setting = suite.settings[0]
    layout = Layout(tmp_path / "out")
    space = suite.space_for("fedprox", setting)
    record = search_record(space, setting, "fedprox")
    check_study_space(open_study(layout, setting.name, "fedprox", 0, False), record, "digits")
    again = open_study(layout, setting.name, "fedprox", 0, False)
    check_study_space(again, record, "digits")  # the same search resumes
    narrower = {**space, "train.lr": space["train.lr"].with_bounds({"high": 0.1})}
    with pytest.raises(ConfigError, match="delete the study"):
        check_study_space(again, search_record(narrower, setting, "fedprox"), "digits")
    # a list of choices replaces a range: the parameter becomes a choice
    fixed = space["train.lr"].with_bounds({"choices": [0.05]})
    assert isinstance(fixed, Param) and fixed.describe() == "one of 0.05"


def test_final_runs_keep_failed_runs_and_rerun_interrupted_ones(tmp_path: Path) -> None:
    """A final run that failed by itself (diverged) fails again when rerun, so `pflower tune`
    keeps it (the leaderboard reports it) unless asked to retry; one stopped by a signal
    (Ctrl-C, `kill`) or with no summary has not run yet and runs."""
    from pflower.tuning.finals import final_runs

    path = tmp_path / "suite.yaml"
    path.write_text(SUITE.replace("final_seeds: [1, 2]", "final_seeds: [1, 2, 3, 4, 5]"))
    suite = load_suite(str(path))
    setting, layout = suite.settings[0], Layout(tmp_path / "out")
    chosen = layout.chosen_file(setting.name, "fedprox")
    chosen.parent.mkdir(parents=True)
    chosen.write_text(yaml.safe_dump({"overrides": ["strategy=fedprox", "train.lr=0.05"]}))
    fake_final_run(layout.final_dir(setting.name, "fedprox", 1), 0.9, 0.9)
    for seed, error in [
        (2, "Round 3: 4 of 4 clients failed.\n  NaN"),
        (3, "interrupted by SIGTERM"),
    ]:
        run_dir = layout.final_dir(setting.name, "fedprox", seed)
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({"status": "failed", "error": error}))
    layout.final_dir(setting.name, "fedprox", 4).mkdir(parents=True)  # killed: no summary

    ran: list[int] = []

    def runner(command: list[str], run_dir: Path, **_: object) -> dict[str, object]:
        assert not run_dir.exists() or not any(run_dir.iterdir())  # an attempt starts clean
        ran.append(int(run_dir.name.removeprefix("seed_")))
        summary = {"status": "completed", "final": {"L1": {"acc_local": {"mean": 0.9}}}}
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").write_text(json.dumps(summary))
        return summary

    logged: list[str] = []
    final_runs(suite, setting, "fedprox", layout, log=logged.append, runner=runner)
    assert sorted(ran) == [3, 4, 5]
    assert (
        "digits fedprox final seed 2 failed before, kept (--retry-failed runs it again): "
        "Round 3: 4 of 4 clients failed." in logged
    )
    ran.clear()
    final_runs(suite, setting, "fedprox", layout, log=logged.append, runner=runner)
    assert ran == []
    final_runs(suite, setting, "fedprox", layout, runner=runner, retry_failed=True)
    assert ran == [2]


def test_a_final_run_of_values_no_longer_chosen_runs_again(tmp_path: Path) -> None:
    """A study that resumes may choose anew (a retried configuration did better): the final
    runs of the values it chose before are not kept under the new choice. A run whose recorded
    configuration holds the chosen values is kept, whether it completed or failed by itself."""
    from pflower.tuning.finals import final_runs, holds_chosen

    path = tmp_path / "suite.yaml"
    path.write_text(SUITE.replace("final_seeds: [1, 2]", "final_seeds: [1, 2, 3]"))
    suite = load_suite(str(path))
    setting, layout = suite.settings[0], Layout(tmp_path / "out")
    chosen = {
        "params": {"train.lr": 0.0621924193, "strategy.mu": 0.01},
        "overrides": ["strategy=fedprox", "train.lr=0.0621924", "strategy.mu=0.01"],
    }
    path = layout.chosen_file(setting.name, "fedprox")
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(chosen))
    recorded = {1: (0.0621924, "completed"), 2: (0.0621924, "failed"), 3: (0.03, "completed")}
    for seed, (lr, status) in recorded.items():
        run_dir = layout.final_dir(setting.name, "fedprox", seed)
        run_dir.mkdir(parents=True)
        config = {"train": {"lr": lr, "momentum": 0.0}, "strategy": {"name": "fedprox", "mu": 0.01}}
        error = "Round 3: 4 of 4 clients failed." if status == "failed" else None
        summary = {"status": status, "error": error, "config": config}
        (run_dir / "summary.json").write_text(json.dumps(summary))
    assert holds_chosen({"config": config}, {"params": {"train.lr": 0.03}})
    assert not holds_chosen({"config": config}, {"params": {"train.lr": 0.0300001}})
    assert not holds_chosen({"config": config}, {"params": {"strategy.lam": 0.1}})  # not in it
    ran: list[int] = []

    def runner(command: list[str], run_dir: Path, **_: object) -> dict[str, object]:
        assert "train.lr=0.0621924" in command
        ran.append(int(run_dir.name.removeprefix("seed_")))
        return {"status": "completed", "final": {"L1": {"acc_local": {"mean": 0.9}}}}

    logged: list[str] = []
    final_runs(suite, setting, "fedprox", layout, log=logged.append, runner=runner)
    assert ran == [3]
    assert "digits fedprox final seed 3 ran values the study no longer chooses: it runs again" in (
        logged
    )


def test_a_final_run_that_times_out_is_recorded_as_failed_not_interrupted(tmp_path: Path) -> None:
    """`--timeout` stops a run with SIGTERM, which the run records as "interrupted by SIGTERM"
    (not run yet: rerun by the next command). A run stopped for taking too long did run and
    would time out again, so the runner records it as failed with the reason: kept and reported
    like a diverged run, as a trial that times out counts as failed."""
    run_dir = tmp_path / "run"
    # a run that, like pflower, records its interruption when SIGTERM arrives
    script = (
        "import json, signal, sys, time\n"
        "def stop(*_):\n"
        f"    open({str(run_dir / 'summary.json')!r}, 'w').write(json.dumps("
        "{'status': 'failed', 'error': 'interrupted by SIGTERM', 'rounds': 5}))\n"
        "    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "time.sleep(120)\n"
    )
    with pytest.raises(trial_runner.TrialFailed, match="took longer than 1 s"):
        trial_runner.run_pflower([sys.executable, "-c", script], run_dir, timeout_s=1)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary == {"status": "failed", "error": "the run took longer than 1 s", "rounds": 5}
    assert failed_by_itself(summary)


def test_the_runner_sees_a_run_end_at_once_not_at_its_next_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner looks at a run's rounds every ``POLL_S``, but returns as soon as the run
    ends: a trial's time is the run's, not rounded up to the next look."""
    monkeypatch.setattr(trial_runner, "POLL_S", 30.0)
    run_dir = tmp_path / "run"
    summary = str(run_dir / "summary.json")
    script = f"import json; open({summary!r}, 'w').write(json.dumps({{'status': 'completed'}}))"
    began = time.monotonic()
    assert trial_runner.run_pflower([sys.executable, "-c", script], run_dir) == {
        "status": "completed"
    }
    assert time.monotonic() - began < 20.0, "the runner waited for its next look"


class _Trial:
    """What `schedule.pruned_at` uses of an Optuna trial, with a pruner that always stops."""

    def __init__(self) -> None:
        self.reported: list[tuple[float, int]] = []

    def report(self, value: float, step: int) -> None:
        self.reported.append((value, step))

    def should_prune(self) -> bool:
        return True


def test_a_trial_is_never_pruned_at_its_last_round() -> None:
    """The runner gives the pruner every complete round, the last one too (the run is still
    writing its summary then): that round is reported, but never stops the run, which would
    lose its objective (the median pruner judges every round past its warm-up)."""
    trial = _Trial()
    assert schedule.pruned_at(trial, 3, 0.5, rounds=4)
    assert not schedule.pruned_at(trial, 4, 0.6, rounds=4)
    assert trial.reported == [(0.5, 3), (0.6, 4)]


ROUNDS_SCRIPT = """\
import json, pathlib, sys, time
run_dir = pathlib.Path(sys.argv[1])
for server_round, acc in ((1, 0.5), (2, 0.25)):
    with (run_dir / "metrics.jsonl").open("a") as out:  # the round's rows, then its mark
        for client in (0, 1):
            row = {"round": server_round, "stage": "L1", "client": client, "acc_local": acc}
            out.write(json.dumps(row) + "\\n")
    (run_dir / ".round_done").write_text(str(server_round))
    time.sleep(0.5)
time.sleep(600)
"""


def test_a_pruned_run_stops_when_its_round_is_marked_not_at_the_next_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose rounds go to the pruner is looked at every ``ROUND_POLL_S``: the round that
    prunes it reaches the pruner when the run marks it complete, not at the runner's next
    every-``POLL_S`` look (nor when the next round's rows appear), and the run is stopped."""
    monkeypatch.setattr(trial_runner, "POLL_S", 300.0)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    seen: list[int] = []

    def on_round(server_round: int, value: float) -> bool:
        seen.append(server_round)
        return server_round == 2

    began = time.monotonic()
    with pytest.raises(trial_runner.Pruned, match="pruned after round 2"):
        trial_runner.run_pflower(
            [sys.executable, "-c", ROUNDS_SCRIPT, str(run_dir)], run_dir, on_round
        )
    assert seen == [1, 2]
    assert time.monotonic() - began < 120.0, "the round waited for the runner's next look"


def test_the_pruner_gets_a_round_once_and_only_when_it_is_marked_complete(
    tmp_path: Path,
) -> None:
    """Rows of a round the run has not marked complete (``.round_done``) are not a result yet:
    its clients may still be evaluating. Each marked round goes to the pruner once, with its
    mean over clients."""
    rows = [
        {"round": r, "stage": "L1", "client": c, "acc_local": a}
        for r, c, a in [(1, 0, 0.5), (1, 1, 0.7), (2, 0, 0.2), (2, 1, 0.4), (3, 0, 0.9)]
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    seen: list[tuple[int, float]] = []

    def on_round(server_round: int, value: float) -> bool:
        seen.append((server_round, round(value, 6)))
        return server_round == 3

    watch = trial_runner.RoundWatch(tmp_path, on_round)
    watch.look()
    assert seen == []  # no mark yet
    (tmp_path / ".round_done").write_text("2")
    watch.look()
    watch.look()
    assert seen == [(1, 0.6), (2, 0.3)]
    (tmp_path / ".round_done").write_text("3")
    with pytest.raises(trial_runner.Pruned, match="pruned after round 3"):
        watch.look()


DRIVER = """\
import sys
from pathlib import Path
from pflower.tuning import runner
from pflower.tuning.finals import final_runs
from pflower.tuning.search import Layout
from pflower.tuning.suite import load_suite

suite_file, out = sys.argv[1:]
suite = load_suite(suite_file)
sleeper = "import os, pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))"
sleeper += "; time.sleep(600)"

def run(command, run_dir, **kw):
    return runner.run_pflower([sys.executable, "-c", sleeper, str(run_dir / "pid")], run_dir, **kw)

final_runs(suite, suite.settings[0], "fedprox", Layout(Path(out)), workers=2, runner=run)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_and_sigterm_stop_the_runs_of_worker_threads(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """Ctrl-C reaches the driver's main thread only, and its runs are processes of their own
    sessions: the driver stops the runs its worker threads are running (2 final runs at once)
    and starts none of those still queued, instead of waiting for them all. SIGTERM (``kill``,
    ``timeout``) does the same; it used to end the driver alone and leave its runs running."""
    suite_file = tmp_path / "suite.yaml"
    suite_file.write_text(SUITE.replace("final_seeds: [1, 2]", "final_seeds: [1, 2, 3]"))
    out = tmp_path / "out"
    chosen = Layout(out).chosen_file("digits", "fedprox")
    chosen.parent.mkdir(parents=True)
    chosen.write_text(yaml.safe_dump({"overrides": ["strategy=fedprox"]}))
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(suite_file), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        # as from a terminal: a background job of a non-interactive shell starts with SIGINT
        # ignored, and Python keeps an ignored SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        pid_files = [out / "digits" / "final" / "fedprox" / f"seed_{s}" / "pid" for s in (1, 2)]
        deadline = time.monotonic() + 300
        while not all(p.exists() and p.read_text() for p in pid_files):
            assert driver.poll() is None and time.monotonic() < deadline, "the runs never started"
            time.sleep(0.5)
        sleepers = [int(p.read_text()) for p in pid_files]
        driver.send_signal(signum)
        driver.wait(timeout=120)  # the old driver waited for its runs (600 s each)
    finally:
        driver.kill()
        output = driver.communicate()[0].decode()
    assert driver.returncode != 0 and "KeyboardInterrupt" in output, output[-2000:]
    for pid in sleepers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not (out / "digits" / "final" / "fedprox" / "seed_3" / "pid").exists()


# ---------------------------------------------------------------------------- leaderboard
def test_leaderboard_ranks_with_ties_and_records_provenance(tmp_path: Path) -> None:
    root = tmp_path / "suite"
    accuracies = {
        "fedavg": [0.90, 0.91, 0.92],
        "fedprox": [0.905, 0.915, 0.90],  # within fedavg's noise: tied
        "local": [0.50, 0.51, 0.52],  # beaten by both
    }
    for method, values in accuracies.items():
        for seed, value in enumerate(values, start=1):
            fake_final_run(root / "digits" / "final" / method / f"seed_{seed}", value, value - 0.01)
    chosen = root / "digits" / "chosen"
    chosen.mkdir(parents=True)
    (chosen / "fedprox.yaml").write_text(
        yaml.safe_dump(
            {
                "params": {"strategy.mu": 0.01, "train.lr": 0.05},
                "space": {"strategy.mu": "log-uniform", "train.lr": "log-uniform"},
                "value": 0.8,
                "budget": {"trials": 3, "complete": 2, "pruned": 1, "interrupted": 1},
            }
        )
    )
    # a setting's shared knobs: the train.* keys every method searched (not its own options)
    (chosen / "fedavg.yaml").write_text(
        yaml.safe_dump(
            {
                "params": {"train.lr": 0.1, "train.local_epochs": 2},
                "space": {"train.lr": "log-uniform", "train.local_epochs": "one of 1, 2"},
            }
        )
    )
    (root / "suite.yaml").write_text(yaml.safe_dump({"name": "tiny", "trials": 3}))
    (root / "commands.log").write_text(
        json.dumps({"date": "2026-01-01", "command": "pflower tune --suite tiny", "machine": "box"})
        + "\n"
    )
    entries = {e.method: e for e in load_setting(root / "digits")}
    assert entries["fedavg"].rank == entries["fedprox"].rank == 1
    assert entries["local"].rank == entries["local"].rank_fdr == 3
    assert entries["fedavg"].seconds_per_round == [3.0] * 3
    assert entries["fedavg"].mb_per_client_round == [1.5] * 3
    text, rows = render(root)
    assert "| 1 | 1 | FedProx | 90.67 ± 0.76 |" in text
    assert "mu=0.01, lr=0.05" in text and "3 (2 complete, 1 pruned; 1 interrupted, retried)" in text
    assert "Shared knobs searched for every method: train.lr." in text
    assert "pflower tune --suite tiny" in text and "abc123" in text and "box" in text
    assert rows[0][0] == "setting" and len(rows) == 4
    assert "![digits: final accuracy by method](leaderboard_digits.png)" in text
    assert (root / "leaderboard_digits.png").stat().st_size > 0
    # samples that vary, with a difference constant up to rounding: separated
    assert significantly_better({1: 0.9, 2: 0.95, 3: 0.93}, {1: 0.8, 2: 0.85, 3: 0.83})
    assert not significantly_better({1: 0.95, 2: 0.9}, {2: 0.8, 3: 0.81})  # one common seed
    # twins one ulp apart on every seed are not separated
    assert not significantly_better({1: 0.1 + 0.2, 2: 0.6}, {1: 0.3, 2: 0.6})


def test_the_provenance_names_each_settings_code_where_the_settings_ran_different_code() -> None:
    """A suite whose settings ran at different times may hold two codes, one per setting: the
    page says which setting ran which; one list where they agree."""
    assert codes_line({"a": {"x1"}, "b": {"x1"}}) == "x1"
    assert codes_line({"a": {"x1"}, "b": {"y2"}}) == "a: x1; b: y2"
    assert codes_line({"a": {"y2", "x1"}}) == "x1, y2"
    assert codes_line({}) == "-"


def test_leaderboard_costs_come_from_the_summary_then_the_rows_then_the_wall_time(
    tmp_path: Path,
) -> None:
    """A run's recorded ``cost`` wins; a run made before pflower recorded it falls back to its
    ``metrics.jsonl``; with neither, s / round is the wall time over the rounds and the traffic
    is unknown, not zero."""
    setting = tmp_path / "digits"
    for method, seed in (("fedavg", 1), ("fedavg", 2), ("fedprox", 1), ("fedprox", 2)):
        fake_final_run(setting / "final" / method / f"seed_{seed}", 0.9 + seed / 100, 0.9)
    recorded = {"seconds_per_round": 7.0, "mb_down_per_client_round": 0.25}
    for seed in (1, 2):
        summary_path = setting / "final" / "fedavg" / f"seed_{seed}" / "summary.json"
        summary = json.loads(summary_path.read_text())
        summary_path.write_text(json.dumps({**summary, "cost": recorded}))
    (setting / "final" / "fedprox" / "seed_2" / "metrics.jsonl").unlink()
    entries = {e.method: e for e in load_setting(setting)}
    assert entries["fedavg"].seconds_per_round == [7.0, 7.0]
    assert entries["fedavg"].mb_per_client_round == [0.25, 0.25]
    # seed 1 from its rows (gap 13 - 10 s; 1 + 0.5 MB), seed 2 from its wall time (4 s / 2)
    assert entries["fedprox"].seconds_per_round == [3.0, 2.0]
    mb = entries["fedprox"].mb_per_client_round
    assert mb[0] == 1.5 and math.isnan(mb[1])


def test_ranks_pair_the_seeds_because_a_seed_fixes_the_partition() -> None:
    """A final seed gives every method the same partition, so a hard partition lowers all of
    them at once: a lead of 0.3-0.5 points on every seed under a 3-point swing between seeds is
    separated (a paired test on the differences), where an unpaired test would call it noise.
    Pairs are matched by seed, not by position; seeds only one method ran are left out."""
    easy_hard = {1: 0.96, 2: 0.955, 3: 0.958, 4: 0.93, 5: 0.925}
    leader = Entry("fedphp", final=[v + 0.004 + 0.001 * (s % 2) for s, v in easy_hard.items()])
    follower = Entry("local", final=list(easy_hard.values()))
    rank_with_ties([leader, follower])
    assert (leader.rank, follower.rank) == (1, 2)
    assert stats.ttest_ind(leader.final, follower.final, equal_var=False).pvalue > 0.5
    # the same values listed in another seed order, and a sixth seed the follower lacks
    shuffled = Entry("fedphp", final=[*leader.final[::-1], 0.5], seeds=[5, 4, 3, 2, 1, 6])
    assert shuffled.by_seed[5] == leader.by_seed[5]
    assert significantly_better(shuffled.by_seed, follower.by_seed)
    assert not significantly_better(follower.by_seed, shuffled.by_seed)
    # equal runs (FedBN is FedAvg on a model without BatchNorm) separate from nobody
    twin = Entry("fedbn", final=list(follower.final))
    rank_with_ties([follower, twin])
    assert follower.rank == twin.rank == 1


def test_fdr_rank_keeps_the_separations_that_survive_all_the_pairs() -> None:
    """The plain rank tests each pair at p < 0.05, so among many methods some separate by chance;
    the FDR rank adjusts the p-values of all pairs together (Benjamini-Hochberg). Among 17 peers
    tied with it, a method is below a 1-point lead that varies from seed to seed (p = 0.012) in
    the plain rank only, and below a 10-point lead that holds on every seed in both."""
    base = [0.900, 0.880, 0.910, 0.870, 0.895]

    def entry(method: str, offsets: list[float]) -> Entry:
        final = [b + o for b, o in zip(base, offsets, strict=True)]
        return Entry(method, final=final, seeds=[1, 2, 3, 4, 5])

    entries = [
        entry("method", [0.0] * 5),
        entry("leader", [0.004, 0.016, 0.006, 0.014, 0.010]),
        entry("strong", [0.100, 0.101, 0.099, 0.100, 0.102]),
    ]
    # peers: differences to the method and to each other that cancel out (mean 0, p = 1)
    entries += [entry(f"peer{k}", [c := 0.001 * (k % 3 + 1), -c, c, -c, 0.0]) for k in range(17)]
    rank_with_ties(entries)
    by = {e.method: e for e in entries}
    lead = paired_test(by["leader"].by_seed, by["method"].by_seed)
    assert lead is not None and 0.01 < lead[1] < 0.05
    assert (by["method"].rank, by["method"].rank_fdr) == (3, 2)
    assert (by["strong"].rank, by["strong"].rank_fdr) == (1, 1)
    assert by["leader"].rank_fdr == 2  # strong is above it on every seed
    assert fdr_better_counts(entries[:2]) == {"method": 1, "leader": 0}  # one pair: unadjusted


def test_chosen_values_at_an_end_of_their_range_are_listed() -> None:
    """A chosen value within 5% of an end of its range (log scale for a log range) is named
    under the table, read from the chosen file's record of the space (``Param.describe``):
    the range, not the budget, may hold that method back. A choice counts only as a coarse log
    range (positive numbers spanning a decade): momentum's 0.9 of 0, 0.9 is not listed."""
    space = {
        "train.lr": Param("float", low=1e-4, high=1e-2, log=True),
        "strategy.mu": Param("float", low=0.0, high=1.0),
        "strategy.epochs": Param("int", low=1, high=5),
        "train.momentum": Param("choice", choices=(0.0, 0.9)),
        "strategy.alpha": Param("choice", choices=(0.001, 0.01, 0.1)),
    }
    chosen = {
        "space": {key: param.describe() for key, param in space.items()},
        "params": {
            "train.lr": 1.2e-4,
            "strategy.mu": 0.5,
            "strategy.epochs": 5,
            "train.momentum": 0.9,
            "strategy.alpha": 0.1,
        },
    }
    assert range_ends(chosen) == [
        "train.lr = 0.00012, low end of log-uniform [0.0001, 0.01]",  # 4% of the log range
        "strategy.epochs = 5, high end of integer [1, 5]",
        "strategy.alpha = 0.1, high end of one of 0.001, 0.01, 0.1",
    ]
    inside = {
        **chosen,
        "params": {"train.lr": 1.3e-4, "strategy.epochs": 4, "strategy.alpha": 0.01},
    }  # 5.7% of the log range
    assert range_ends(inside) == []
    notes = range_end_notes([Entry("fedprox", final=[0.9, 0.91], chosen=chosen), Entry("local")])
    assert [line for line in notes if line.startswith("- ")] == [
        "- FedProx: " + "; ".join(range_ends(chosen))
    ]


def test_a_failed_final_run_is_listed_not_dropped(tmp_path: Path) -> None:
    """A final run that diverged is in no mean and no test, but the table counts it and a note
    under it names the seed and the error, since the mean over the other seeds flatters the
    method; a method whose every final run failed is said to have failed, not to be pending."""
    setting = tmp_path / "suite" / "digits"
    for seed, value in enumerate([0.90, 0.91, 0.92], start=1):
        fake_final_run(setting / "final" / "fedavg" / f"seed_{seed}", value, value)
    fake_final_run(setting / "final" / "scaffold" / "seed_1", 0.85, 0.85)
    fake_final_run(setting / "final" / "scaffold" / "seed_2", 0.86, 0.86)
    (setting / "final" / "fedavg" / "seed_1.bak").mkdir()  # not a run folder: skipped
    for method, seed in [("scaffold", 3), ("feddc", 1)]:
        failed = setting / "final" / method / f"seed_{seed}"
        failed.mkdir(parents=True)
        error = "Round 14: 15 of 20 clients failed.\n  client 4: array 0 contains NaN or Inf"
        (failed / "summary.json").write_text(json.dumps({"status": "failed", "error": error}))
    # stopped by a signal: not run yet, so neither failed nor counted
    for method, seed in [("scaffold", 4), ("fedprox", 1)]:
        stopped = setting / "final" / method / f"seed_{seed}"
        stopped.mkdir(parents=True)
        summary = {"status": "failed", "error": "interrupted by SIGINT"}
        (stopped / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "suite" / "suite.yaml").write_text(
        yaml.safe_dump({"name": "tiny", "methods": ["fedavg", "scaffold", "feddc", "fedprox"]})
    )
    entries = {e.method: e for e in load_setting(setting)}
    assert set(entries) == {"fedavg", "scaffold"}
    assert entries["scaffold"].by_seed == {1: 0.85, 2: 0.86}
    assert entries["scaffold"].failed == {3: "Round 14: 15 of 20 clients failed."}
    text, _ = render(tmp_path / "suite")
    assert "| SCAFFOLD | 85.50 ± 0.71 | 85.50 ± 0.71 | 2 (+1 failed) |" in text
    assert "- SCAFFOLD, seed 3: Round 14: 15 of 20 clients failed." in text
    assert "feddc (every final run so far failed, seeds 1; seed 1: Round 14: 15 of 20" in text
    assert "not yet: feddc (every final run so far failed" in text and ", fedprox." in text


def test_a_run_that_went_on_without_a_diverged_client_is_named(tmp_path: Path) -> None:
    """A completed final run whose client diverged (its replies rejected as not finite) is in
    the means with the client left out scored 0, where its own summary averages the clients
    that replied: the seeds column counts such runs and a note names the seed, the replies, the
    clients left out and the score in the means."""
    setting = tmp_path / "suite" / "digits"
    for method in ("fedavg", "fedfomo"):
        for seed in (1, 2):
            fake_final_run(setting / "final" / method / f"seed_{seed}", 0.9 + seed / 100, 0.9)
    nan = "array 0 contains NaN or Inf"
    failures = [
        {"round": r, "stage": "failure", "phase": phase, "client": 7, "error": error}
        for r in (1, 2)
        for phase, error in (("fit", nan), ("evaluate", "metric loss_local=nan is not finite"))
    ]
    path = setting / "final" / "fedfomo" / "seed_2" / "summary.json"
    summary = json.loads(path.read_text())
    summary["failures"] = failures
    summary["final"]["L1"]["num_clients"] = 19
    path.write_text(json.dumps(summary))
    # one lost fit reply before the last round: noted, but every client is in the final mean
    path = setting / "final" / "fedavg" / "seed_1" / "summary.json"
    summary = json.loads(path.read_text())
    summary["failures"] = [failures[0]]
    path.write_text(json.dumps(summary))
    entries = {e.method: e for e in load_setting(setting)}
    # in the means over all 20 clients: 19 at a mean of 0.92 and the one left out at 0
    assert entries["fedfomo"].by_seed == pytest.approx({1: 0.91, 2: 0.92 * 19 / 20})
    rejected = entries["fedfomo"].rejected[None, 2]
    assert (rejected.replies, rejected.fit, rejected.evaluate) == (4, 2, 2)
    assert (rejected.missing_at_end, rejected.evaluated_at_end) == (1, 19)
    text, _ = render(tmp_path / "suite")
    assert (
        "| 2 (1 short of clients) |" in text
        and "| FedAvg | 91.50 ± 0.71 | 90.00 ± 0.00 | 2 |" in text
    )
    assert (
        "- FedFomo, seed 2: 4 client replies rejected or lost in rounds 1-2 (2 fit, 2 evaluate; "
        f"first: client 7, {nan}); its final accuracy is the mean of the 19 clients that "
        "replied, 1 left out; in the means 87.40%"
    ) in text
    assert (
        "- FedAvg, seed 1: 1 client reply rejected or lost in round 1 (1 fit, 0 evaluate; "
        f"first: client 7, {nan})\n" in text
    )
    assert "FedFomo, seed 1" not in text and "FedAvg, seed 2" not in text


def test_a_widely_spread_method_ranked_above_higher_means_is_named() -> None:
    """A rank counts the methods significantly better: with three seeds, one bad seed (as
    SCAFFOLD's on mnist_path) leaves a method tied with the leader far below it, above a tight
    method with a higher mean. The leaderboard names such methods under the table."""
    entries = [
        Entry("fedphp", final=[0.993, 0.994, 0.992]),
        Entry("apple", final=[0.985, 0.984, 0.986]),
        Entry("scaffold", final=[0.738, 0.873, 0.880]),
    ]
    rank_with_ties(entries)
    assert [e.rank for e in entries] == [1, 2, 1]
    inversions = ranked_above_higher_means(entries)
    assert [(e.method, [h.method for h in higher]) for e, higher in inversions] == [
        ("scaffold", ["apple"])
    ]
    notes = "\n".join(inversion_notes(entries))
    assert (
        "- SCAFFOLD (rank 1, 83.03 ± 8.00) is ranked above 1 method(s) with a higher mean: APPLE"
        in notes
    )
    ordered = [Entry("a", final=[0.9, 0.91]), Entry("b", final=[0.8, 0.81])]
    rank_with_ties(ordered)
    assert ranked_above_higher_means(ordered) == [] and inversion_notes(ordered) == []


# ------------------------------------------------------------------ Hydra's joblib launcher
def test_the_hydra_task_function_pickles_by_reference() -> None:
    """loky sends the task function to its workers with cloudpickle: a closure went by value
    with the CLI's rich console (an RLock) and failed; the module-level task pickles."""
    import cloudpickle

    from pflower.cli import GuardedTask, _simulate

    task = cloudpickle.loads(cloudpickle.dumps(GuardedTask(_simulate)))
    assert task.task is _simulate


@pytest.mark.slow
def test_joblib_launcher_runs_two_jobs_in_parallel(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep = tmp_path / "sweep"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pflower",
            "-m",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            *TINY,
            "rounds=1",
            "seed=0,1",
            "progress=false",
            f"hydra.sweep.dir={sweep}",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    for job in ("0", "1"):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["status"] == "completed"


@pytest.mark.slow
def test_trials_run_as_ray_tasks(tmp_path: Path) -> None:
    """``pflower tune --ray``: each trial is one Ray task (a fresh local Ray instance here)."""
    import tempfile

    import ray

    suite = load_suite(_suite_file(tmp_path))
    setting = dataclasses.replace(suite.settings[0], overrides=(*TINY, "rounds=1"))
    layout = Layout(tmp_path / "out")
    temp = tempfile.mkdtemp(prefix="pftune", dir="/tmp")  # Ray's sockets need a short path
    ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=temp)
    try:
        study = search.tune(
            suite, setting, "fedprox", layout, rounds=1, workers=2, runner=trial_runner.RayRunner()
        )
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    from optuna.trial import TrialState

    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 2
    for trial in complete:
        log = (Path(trial.user_attrs["run_dir"]) / "tune_stdout.log").read_text()
        assert "pflower" in log


@pytest.mark.slow
def test_tune_command_then_leaderboard(tmp_path: Path) -> None:
    """The documented commands end to end: one trial, one final seed, the leaderboard."""
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "pflower",
        "tune",
        "fedavg",
        "--suite",
        _suite_file(tmp_path),
        "--trials",
        "1",
        "--final-seeds",
        "5",
        "rounds=1",
        "--out",
        str(out),
    ]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=900)
    chosen = yaml.safe_load((out / "digits" / "chosen" / "fedavg.yaml").read_text())
    assert chosen["budget"] == {"trials": 1, "complete": 1}
    assert list(chosen["params"]) == ["train.lr"]
    final = json.loads(
        (out / "digits" / "final" / "fedavg" / "seed_5" / "summary.json").read_text()
    )
    assert final["status"] == "completed" and final["scored_on"] == "test"
    assert final["config"]["seed"] == 5 and final["config"]["rounds"] == 1
    assert final["config"]["train"]["lr"] == pytest.approx(chosen["params"]["train.lr"], rel=1e-5)
    # never resumed (an interrupted run starts afresh), so no run keeps resume state on disk
    assert final["config"]["checkpoint"]["every"] == 0
    assert [p.name for p in out.rglob("*") if p.name in ("checkpoint.pkl", "client_state")] == []
    # the summary carries the run's cost, so a results folder of summaries (what a repository
    # keeps of its runs) renders the traffic column without the runs' metrics.jsonl
    megabytes = final["cost"]["mb_down_per_client_round"] + final["cost"]["mb_up_per_client_round"]
    assert megabytes > 0
    (out / "digits" / "final" / "fedavg" / "seed_5" / "metrics.jsonl").unlink()
    report = subprocess.run(
        [sys.executable, "-m", "pflower", "report", "--leaderboard", str(out)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert "| 1 | 1 | FedAvg |" in report and "pflower tune fedavg --suite" in report
    (row,) = [line for line in report.splitlines() if line.startswith("| 1 | 1 | FedAvg |")]
    assert row.endswith(f"| {megabytes:.3f} |  |")  # FedAvg collapses into nothing
    assert (out / "leaderboard.csv").exists()
