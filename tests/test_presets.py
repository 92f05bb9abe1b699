"""The experiment presets (``conf/experiment/*.yaml``, ``pflower -m +experiment=<name>``): every
job of every preset's sweep composes and validates, so a preset cannot name a strategy, a
partition or a key that does not exist (the runs are not started here)."""

from __future__ import annotations

import itertools

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from pflower.compose import compose_config
from pflower.config import conf_dir

PRESETS = sorted(path.stem for path in (conf_dir() / "experiment").glob("*.yaml"))


def sweep_of(preset: str) -> dict[str, list[str]]:
    """The preset's sweep (``hydra.sweeper.params``): each key's values."""
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose(
            config_name="config",
            overrides=[f"+experiment={preset}"],
            return_hydra_config=True,
        )
    return {key: str(values).split(",") for key, values in cfg.hydra.sweeper.params.items()}


def test_every_paper_has_its_presets() -> None:
    papers = {"fliu_table1", "fedala_table2", "flame_table3", "fedmpr_table2", "diversifed_table2"}
    for paper in papers | {
        "fedmpr_table3",
        "fedmpr_ablation",
        "flame_robustness",
        "diversifed_table1",
    }:
        assert {f"{paper}_cpu", f"{paper}_paper"} <= set(PRESETS), paper


@pytest.mark.parametrize(
    "preset",
    # a paper-scale preset sweeps what its cpu twin sweeps, with more values: the slow tier
    [pytest.param(p, marks=pytest.mark.slow) if p.endswith("_paper") else p for p in PRESETS],
)
def test_every_job_of_a_preset_composes(preset: str) -> None:
    sweep = sweep_of(preset)
    assert sweep, f"{preset} sweeps nothing"
    assert "seed" in sweep, f"{preset} does not say which seeds it runs"
    varied = {key: values for key, values in sweep.items() if key != "seed"}
    for values in itertools.product(*varied.values()):
        job = dict(zip(varied, values, strict=True))
        cfg = compose_config([f"+experiment={preset}", *(f"{k}={v}" for k, v in job.items())])
        for key, value in job.items():
            if (conf_dir() / key).is_dir():  # a preset file of a config group: named otherwise
                continue
            selected = OmegaConf.select(cfg, key)
            if isinstance(selected, DictConfig):  # a group registered in code: chosen by name
                selected = selected.name
            assert str(selected) == value, f"{preset} {job}: {key}"
