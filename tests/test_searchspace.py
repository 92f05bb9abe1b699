"""Search spaces declared beside the options (pflower.searchspace): every declared range is
valid, holds the option's default, and Optuna draws values inside it that the options accept."""

from __future__ import annotations

import dataclasses

import optuna
import pytest

import pflower.strategies  # noqa: F401  (registers every algorithm)
from pflower.config import TrainConfig
from pflower.core.algorithm import ALGORITHMS
from pflower.searchspace import Param, declared_space, format_value, tunable


def test_tunable_records_the_range_and_keeps_the_default() -> None:
    @dataclasses.dataclass
    class Options:
        mu: float = tunable(0.01, low=1e-4, high=1.0, log=True, source="FedProx")
        k: int = tunable(5, low=1, high=10)
        tau: float = tunable(1.0, choices=(0.5, 1.0))
        plain: float = 2.0

    assert Options().mu == 0.01 and Options().k == 5
    space = declared_space(Options, "strategy")
    assert list(space) == ["strategy.mu", "strategy.k", "strategy.tau"]
    assert space["strategy.mu"] == Param("float", 1e-4, 1.0, True, source="FedProx")
    assert space["strategy.k"].kind == "int" and space["strategy.tau"].kind == "choice"
    assert space["strategy.mu"].describe() == "log-uniform [0.0001, 1]"
    with pytest.raises(ValueError, match="low > 0"):
        Param("float", 0.0, 1.0, log=True)


def test_the_shared_training_space_is_declared_on_train_config() -> None:
    assert set(declared_space(TrainConfig, "train")) >= {"train.lr", "train.local_epochs"}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_declared_range_holds_its_default_and_draws_valid_options(name: str) -> None:
    options_class = ALGORITHMS[name].options
    fields = {f.name: f for f in dataclasses.fields(options_class)}
    space = declared_space(options_class, "strategy")
    for key, param in space.items():
        default = fields[key.removeprefix("strategy.")].default
        if default is None:  # "same as train.lr" defaults
            continue
        if param.kind == "choice":
            assert default in param.choices, key
        else:
            assert param.low <= default <= param.high, key
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(3):
        trial = study.ask()
        values = {k.removeprefix("strategy."): p.suggest(trial, k) for k, p in space.items()}
        options_class(name=name, **values)  # __post_init__ accepts every drawn value
        assert all(format_value(v) for v in values.values())


def test_every_method_with_options_beyond_the_base_declares_a_space() -> None:
    """Methods without a declared option are those with nothing to tune or whose options are
    structural (FLIU's adaptive γ is the method itself; SCAFFOLD's η_g = 1 as in its paper)."""
    untuned = {n for n, a in ALGORITHMS.items() if not declared_space(a.options, "strategy")}
    assert untuned == {
        "centralized",
        "fedavg",
        "fedbn",
        "fedper",
        "fedrod",
        "fliu",
        "local",
        "scaffold",
    }


@pytest.mark.parametrize(
    "param",
    [
        Param("float", low=1e-4, high=1e-2, log=True),
        Param("float", low=0.05, high=0.5),
        Param("float", low=0.1, high=0.9, step=0.1),
        Param("int", low=1, high=10),
        Param("int", low=2, high=64, log=True),
    ],
    ids=["log", "uniform", "step", "int", "int-log"],
)
def test_a_described_range_reads_back_as_the_same_range(param: Param) -> None:
    read = Param.from_description(param.describe())
    assert read is not None
    assert (read.kind, read.low, read.high, read.log, read.step) == (
        param.kind,
        param.low,
        param.high,
        param.log,
        param.step,
    )


def test_a_described_choice_reads_back_with_its_numbers_as_numbers() -> None:
    for choices in [(0.001, 0.01, 0.1), (1, 10, 100), ("uniform", "weighted"), (True, False)]:
        param = Param("choice", choices=choices)
        assert Param.from_description(param.describe()) == param
    mixed = Param.from_description("one of 1, nan, inf, 2.5, x")
    assert mixed is not None and mixed.choices == (1, "nan", "inf", 2.5, "x")
    assert Param.from_description("uniform from 1 to 2") is None


def test_position_is_measured_in_the_ranges_own_scale() -> None:
    log = Param("float", low=1e-4, high=1e-2, log=True)
    assert log.position(1e-4) == 0.0 and log.position(1e-2) == pytest.approx(1.0)
    assert log.position(1e-3) == pytest.approx(
        0.5
    )  # the middle of a log range is its geometric mean
    assert Param("float", low=0.0, high=2.0).position(0.5) == pytest.approx(0.25)


def test_a_choice_spanning_a_decade_is_a_coarse_log_range() -> None:
    """FedDyn's α in 0.001, 0.01, 0.1 has a position, as log-uniform [0.001, 0.1] would; a choice
    spanning less than a decade, holding zero, or not numbers has none."""
    scale = Param("choice", choices=(0.01, 0.1, 0.001))
    assert [scale.position(v) for v in (0.001, 0.01, 0.1)] == pytest.approx([0.0, 0.5, 1.0])
    assert Param("choice", choices=(1, 10)).position(10) == pytest.approx(1.0)
    for no_scale in [(1, 2), (0.25, 0.5, 0.75), (0.0, 0.5, 0.9), ("a", "b"), (True, False), (5,)]:
        assert Param("choice", choices=no_scale).position(no_scale[0]) is None, no_scale
