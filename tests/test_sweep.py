"""Hydra multirun sweeps end to end: ``pflower -m ...`` runs every combination in its own run
directory, a failed job is recorded and the sweep goes on, and ``pflower report`` summarizes it.

The sweeps go through the real ``pflower`` entry point (Hydra multirun, ``_simulate``, the
failure handling) with the Flower apps run in-process (tests/inprocess.py) instead of on Ray,
so a four-job sweep takes seconds. (On Ray, Flower's simulation shuts its RayBackend down at the
end of every job, so the next job starts a fresh Ray; a two-job Ray sweep takes minutes on two
busy cores, too slow for this suite.)
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from hydra.core.global_hydra import GlobalHydra

from pflower import cli, simulation
from pflower.config import ExperimentConfig, RunRecord
from pflower.reporting.stats import over_seeds
from pflower.reporting.tables import format_cell
from tests.inprocess import run_inprocess

TINY = [
    "dataset=synthetic",
    "dataset.num_train=400",
    "dataset.num_test=100",
    "model=mlp",
    "num_clients=3",
    "rounds=2",
    "train.local_epochs=1",
    "progress=false",
]

Cli = Callable[..., None]


@pytest.fixture
def pflower(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    """Call ``pflower <args>`` in this process, with experiments run in-process (no Ray)."""

    def run_in_process(settings: ExperimentConfig, record: RunRecord) -> None:
        assert record.run_dir is not None
        run_inprocess(record.overrides, record.run_dir)

    monkeypatch.setattr(simulation, "run_experiment", run_in_process)

    def call(*args: str) -> None:
        monkeypatch.setattr(sys, "argv", ["pflower", *args])
        cli.main()

    yield call
    GlobalHydra.instance().clear()


def _job_dirs(sweep: Path) -> list[Path]:
    return sorted((p for p in sweep.iterdir() if p.is_dir()), key=lambda p: int(p.name))


def _strategy(run_dir: Path) -> str:
    return yaml.safe_load((run_dir / "config.yaml").read_text())["strategy"]["name"]


def _final_l1_acc_local(run_dir: Path) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = max(r["round"] for r in rows)
    return float(
        np.mean([r["acc_local"] for r in rows if r["stage"] == "L1" and r["round"] == final])
    )


def test_sweep_runs_every_combination_and_reports_it(tmp_path: Path, pflower: Cli) -> None:
    sweep = tmp_path / "sweep"
    pflower("-m", "strategy=fedavg,fliu", "seed=0,1", *TINY, f"hydra.sweep.dir={sweep}")

    jobs = _job_dirs(sweep)
    assert len(jobs) == 4
    combos = set()
    for job in jobs:
        config = yaml.safe_load((job / "config.yaml").read_text())
        assert json.loads((job / "summary.json").read_text())["final_round"] == 2
        combos.add((config["strategy"]["name"], config["seed"]))
    assert combos == {("fedavg", 0), ("fedavg", 1), ("fliu", 0), ("fliu", 1)}

    with pytest.raises(SystemExit) as done:
        pflower("report", str(sweep))
    assert done.value.code == 0
    report = (sweep / "report.md").read_text()
    for strategy, label in (("fedavg", "FedAvg"), ("fliu", "FLIU")):
        runs = [j for j in jobs if _strategy(j) == strategy]
        expected = format_cell(over_seeds([_final_l1_acc_local(r) for r in runs]), "percent")
        assert expected.endswith("(2)")
        assert f"| {label} | {expected} |" in report
    assert "| `strategy.name` | fedavg, fliu |" in report
    assert "Seeds: 0, 1." in report
    assert (sweep / "report.csv").read_text().startswith("section,method,PATH L1 Acc(L)")
    assert (sweep / "plots" / "accuracy_rounds.png").stat().st_size > 0
    assert (sweep / "plots" / "client_accuracy.png").stat().st_size > 0


def test_a_failed_job_is_recorded_and_the_sweep_goes_on(tmp_path: Path, pflower: Cli) -> None:
    sweep = tmp_path / "sweep"
    # 11 classes per client is impossible with 10 classes: job 0 fails inside the experiment.
    pflower("-m", "partition.classes_per_client=11,2", *TINY, f"hydra.sweep.dir={sweep}")
    failed, ok = _job_dirs(sweep)
    summary = json.loads((failed / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "11 classes per client" in summary["error"]
    assert "Traceback" in (failed / "error.txt").read_text()
    completed = json.loads((ok / "summary.json").read_text())
    assert completed["final_round"] == 2
    assert set(summary) == set(completed)  # one shape for failed and completed runs
    assert summary["config"]["partition"]["classes_per_client"] == 11

    with pytest.raises(SystemExit):
        pflower("report", str(sweep))
    report = (sweep / "report.md").read_text()
    assert "1 completed, 1 failed" in report
    assert "| `partition.classes_per_client` | 2, 11 |" in report
    assert "ConfigError: partition 'pathological'" in report


def test_a_failed_single_run_exits_non_zero(tmp_path: Path, pflower: Cli) -> None:
    with pytest.raises(SystemExit) as failed:
        pflower("partition.classes_per_client=11", *TINY, f"hydra.run.dir={tmp_path}")
    assert failed.value.code != 0
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ("num_clients=abc,3", "could not be converted to Integer"),
        ("num_clients=3,0", "num_clients must be an integer >= 1"),
        ("seed=0,1 strategy=fedavg,nosuchmethod", "nosuchmethod"),
    ],
    ids=["wrong-type", "out-of-range", "unknown-name"],
)
def test_a_sweep_with_a_bad_value_exits_2_and_creates_nothing(
    tmp_path: Path, pflower: Cli, monkeypatch: pytest.MonkeyPatch, capsys, sweep: str, message: str
) -> None:
    """Issue 61, item 5: Hydra used to write ``multirun/<date>/<time>/multirun.yaml`` first and
    then exit 1 (or run the jobs, each failing alone); every swept value is composed first."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as refused:
        pflower("-m", *TINY, *sweep.split())
    assert refused.value.code == 2
    assert message in " ".join(capsys.readouterr().out.split())
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_into_another_sweeps_folder_is_refused(
    tmp_path: Path, pflower: Cli, capsys
) -> None:
    """Its jobs' folders hold the first sweep's runs: exit code 2, nothing written or deleted."""
    sweep = tmp_path / "sweep"
    pflower("-m", "seed=0,1", *TINY, "rounds=1", f"hydra.sweep.dir={sweep}")
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as refused:
        pflower("-m", "seed=2", *TINY, "rounds=1", f"hydra.sweep.dir={sweep}")
    assert refused.value.code == 2
    assert "holds another sweep" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == before
    pflower("-m", "seed=1", *TINY, "rounds=1", "overwrite=true", f"hydra.sweep.dir={sweep}")
    assert yaml.safe_load((sweep / "0" / "config.yaml").read_text())["seed"] == 1
    assert [job.name for job in _job_dirs(sweep)] == ["0"]  # the earlier sweep's 2nd job is gone


def test_runs_without_output_dir_started_in_one_second_get_a_folder_each(
    tmp_path: Path, pflower: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default folder, ``runs/<date>/<time>``, is taken: the next run's is ``<time>-2``."""

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz: datetime.tzinfo | None = None) -> Frozen:
            return cls(2026, 12, 5, 9, 30, 0)

    monkeypatch.setattr(cli, "datetime", Frozen)
    monkeypatch.chdir(tmp_path)
    pflower(*TINY, "rounds=1")
    pflower(*TINY, "rounds=1", "seed=1")
    day = tmp_path / "runs" / "2026-12-05"
    assert sorted(p.name for p in day.iterdir()) == ["09-30-00", "09-30-00-2"]
    seeds = [
        yaml.safe_load((day / name / "config.yaml").read_text())["seed"]
        for name in ("09-30-00", "09-30-00-2")
    ]
    assert seeds == [0, 1]
