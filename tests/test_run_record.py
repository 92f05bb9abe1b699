"""The run record (`pflower.config.record`): one typed run, written in one form where it crosses
a process or Flower's run config, and read back unchanged."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from pflower.config import RUN_CONFIG_KEY, RunRecord
from pflower.registry import ConfigError


def _fake_compose(overrides: Sequence[str]) -> DictConfig:
    """Stands for Hydra: a config that remembers what it was composed from."""
    values = dict(override.split("=", 1) for override in overrides)
    return OmegaConf.create(
        {
            "composed_from": list(overrides),
            "output_dir": values.get("output_dir"),
            "checkpoint": {"resume": values.get("checkpoint.resume") == "true"},
        }
    )


@pytest.mark.parametrize(
    "record",
    [
        RunRecord(("strategy=fedavg", "train.lr=0.05"), Path("/runs/a b"), resume=True),
        RunRecord(("dataset.path='/data/with space'", "+extra=1"), Path("runs/x")),
        RunRecord(()),
    ],
)
def test_a_record_survives_the_run_config_and_the_command_line(record: RunRecord) -> None:
    through_flower = RunRecord.from_run_config(record.to_run_config(), _fake_compose)
    assert through_flower == record
    assert through_flower.composed.composed_from == record.to_overrides()
    assert RunRecord.from_overrides(record.to_overrides()) == record


def test_the_run_config_is_the_shell_quoted_overrides_that_flwr_run_takes() -> None:
    record = RunRecord(("strategy=fliu", "dataset.path='/a b'"), Path("/out"), resume=True)
    run_config = record.to_run_config()
    assert list(run_config) == [RUN_CONFIG_KEY]
    assert shlex.split(run_config[RUN_CONFIG_KEY]) == [
        "strategy=fliu",
        "dataset.path='/a b'",
        "output_dir=/out",
        "checkpoint.resume=true",
    ]


def test_the_folder_and_resume_point_are_read_out_of_a_command_line() -> None:
    record = RunRecord.from_overrides(
        ["output_dir=/first", "rounds=3", "checkpoint.resume=YES", "++output_dir=/last"]
    )
    assert record == RunRecord(("rounds=3",), Path("/last"), resume=True)
    assert RunRecord.from_overrides(["output_dir=null", "rounds=3"]).run_dir is None
    # where the caller decided them, its folder and resume point replace the overrides'
    decided = RunRecord.from_overrides(
        ["output_dir=/given", "checkpoint.resume=true"], run_dir=Path("/mine"), resume=False
    )
    assert (decided.run_dir, decided.resume) == (Path("/mine"), False)


def test_a_composed_record_takes_its_folder_and_resume_point_from_the_configuration() -> None:
    """What the configuration composed counts (an interpolated ``output_dir``, a resume point
    set by a preset), not the override's text."""
    config = OmegaConf.create({"output_dir": "/composed", "checkpoint": {"resume": True}})
    record = RunRecord.from_overrides(["output_dir=${oc.env:RUNS}", "rounds=2"], config)
    assert record == RunRecord(("rounds=2",), Path("/composed"), resume=True)
    assert record.composed is config


def test_a_default_is_put_first_unless_the_overrides_set_its_key() -> None:
    record = RunRecord(("rounds=2",), Path("/r"))
    assert record.with_default("num_clients", 3).overrides == ("num_clients=3", "rounds=2")
    given = RunRecord(("+num_clients=5",), Path("/r"))
    assert given.with_default("num_clients", 3) is given


def test_refusals_name_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"not 'output_dir=/x': give the folder as run_dir"):
        RunRecord(("rounds=2", "output_dir=/x"))
    with pytest.raises(ConfigError, match=r"checkpoint.resume must be true or false, got 'maybe'"):
        RunRecord.from_overrides(["checkpoint.resume=maybe"])
    with pytest.raises(ConfigError, match=r"checkpoint.resume=true needs the folder to resume"):
        RunRecord.from_overrides(["checkpoint.resume=true"])
    with pytest.raises(ValueError, match="not composed in this process"):
        _ = RunRecord(()).composed


def test_the_tuning_command_carries_the_record(tmp_path: Path) -> None:
    from pflower.tuning.search import run_command

    command = run_command(["strategy=fedavg", "output_dir=/elsewhere"], tmp_path)
    assert command[3:] == [
        "checkpoint.every=0",
        "strategy=fedavg",
        f"output_dir={tmp_path}",
        f"hydra.run.dir={tmp_path}",
        "progress=false",
    ]


def test_a_composed_run_builds_a_strategy_complete_at_construction(tmp_path: Path) -> None:
    """The ServerApp's strategy is given its trainable mask and the clients' training-set sizes
    by its constructor; nothing is set on it afterwards."""
    from pflower.compose import compose_record
    from pflower.core.experiment import Experiment
    from pflower.core.training import trainable_mask
    from pflower.server.app import build_strategy

    record = compose_record(
        ["dataset=digits", "model=small_cnn", "num_clients=3", "output_dir=/ignored"],
        run_dir=tmp_path,
    )
    assert record.run_dir == tmp_path and record.composed.output_dir == str(tmp_path)
    experiment = Experiment.of(record.composed)
    strategy = build_strategy(record.composed, tmp_path)
    assert strategy.trainable_mask == trainable_mask(experiment.new_model())
    assert strategy.roster.train_sizes == [len(c.train) for c in experiment.federation.clients]


def test_the_check_composes_a_run_as_its_record_will_and_reads_values_as_hydra_does(
    tmp_path: Path,
) -> None:
    """The check before Hydra runs composes a single run as its run record gives it to the
    run's apps (the folder resolved, last), into the cache they read; the folder is read as
    Hydra reads it (quoted, with a space), and a run that resumes from ``hydra.run.dir`` or a
    run without ``output_dir`` is composed as given."""
    from pflower.compose import composed_overrides
    from pflower.precompose import check_overrides

    folder = tmp_path / "my run"
    check_overrides(["dataset=digits", "num_clients=2", f"output_dir='{folder}'"])
    assert composed_overrides()[-1] == (
        "dataset=digits",
        "num_clients=2",
        f"output_dir={folder.resolve()}",
    )
    check_overrides(["dataset=digits", "checkpoint.resume=true", f"hydra.run.dir={tmp_path}"])
    check_overrides(["dataset=digits", "num_clients=3"])
    with pytest.raises(ConfigError, match="num_clients"):
        check_overrides(["dataset=digits", "num_clients=0", f"output_dir={folder}"])
