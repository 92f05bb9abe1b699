"""Collapses: an algorithm at a declared neutral point computes what its base method computes,
row for row; reports name a tuned configuration at or next to one; FedBN on a model without
BatchNorm is named FedAvg while composing."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from pflower import compose
from pflower.compose import compose_config, validate
from pflower.core.algorithm import ALGORITHMS
from pflower.core.options import Collapse, collapse_of
from pflower.models import build_model
from pflower.reporting.leaderboard_runs import Entry, collapse, read_setting, same_runs
from pflower.reporting.leaderboard_table import table
from pflower.results.summary import resolved_config
from pflower.searchspace import Param, declared_space, format_value
from tests.helpers import comparable, tiny
from tests.inprocess import run_inprocess

BASE = tiny("train.lr=0.05", "train.momentum=0.5")

DECLARED = [
    (name, collapse)
    for name, algorithm in sorted(ALGORITHMS.items())
    for collapse in algorithm.options.collapses
]


@pytest.fixture(scope="module")
def base_rows(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], list[dict]]:
    """The base methods' rows, by (method, aggregation), each run once for the module."""
    return {}


@pytest.mark.parametrize(
    ("method", "collapse"), DECLARED, ids=[f"{m}-{c.describe()}" for m, c in DECLARED]
)
def test_every_declared_collapse_computes_its_base(
    method: str,
    collapse: Collapse,
    base_rows: dict[tuple[str, str], list[dict]],
    tmp_path: Path,
) -> None:
    """The method at its neutral point and the base method, with the same aggregation and
    training, write the same accuracies and losses at every stage both report."""
    aggregation = ALGORITHMS[method].options(name=method).aggregation.value
    at = [f"strategy.{key}={format_value(value)}" for key, value in collapse.at]
    rows, _ = run_inprocess([*BASE, f"strategy={method}", *at], tmp_path / "method")
    key = (collapse.base, aggregation)
    if key not in base_rows:
        overrides = [*BASE, f"strategy={collapse.base}", f"strategy.aggregation={aggregation}"]
        base_rows[key], _ = run_inprocess(overrides, tmp_path / "base")
    stages = tuple({r["stage"] for r in rows} & {"L1", "L2", "G"})
    assert comparable(rows, stages) == comparable(base_rows[key], stages) != []


def _space(method: str) -> dict[str, Param]:
    return declared_space(ALGORITHMS[method].options, "strategy")


def _collapse(method: str, **values: Any) -> tuple[str, str] | None:
    found = collapse_of(ALGORITHMS[method].options, values, _space(method))
    return None if found is None else (found[1], found[0].base)


def test_a_chosen_configuration_at_or_next_to_a_neutral_point_is_named() -> None:
    """FedMPR with nothing pruned is FedAvg; DiversiFed's λ = 1.7e-5, within 5% of the low end
    of [1e-5, 1] in log scale, is as good as local training; one option off its neutral value
    (a choice: exactly) is no collapse."""
    assert _collapse("fedmpr", prune_ratio=0.0, dropout=0.0, noise_sigma=0.0) == ("=", "fedavg")
    assert _collapse("fedmpr", prune_ratio=0.2, dropout=0.0, noise_sigma=0.0) is None
    assert _collapse("diversifed", lam=1.706264670492172e-05) == ("≈", "local")
    assert _collapse("diversifed", lam=1e-4) is None
    assert _collapse("fedprox", mu=0.0) == ("=", "fedavg")
    assert _collapse("fedprox", mu=1.2e-4) == ("≈", "fedavg")
    assert _collapse("fedprox", mu=0.01) is None
    # options that are not searched count only at their neutral value
    assert _collapse("apfl", alpha_init=0.0, adaptive_alpha=True) is None
    assert _collapse("fliu", gamma_mode="fixed", gamma=1.0) == ("=", "local")
    assert _collapse("fedavg") is None


def test_fedbn_on_a_model_without_batchnorm_is_named_fedavg_while_composing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fedbn = ALGORITHMS["fedbn"].options
    assert fedbn.collapse_on(build_model("small_cnn", {}, (1, 8, 8), 10)) == "fedavg"
    assert fedbn.collapse_on(build_model("resnet8", {}, (3, 32, 32), 10)) is None
    compose._warn_collapse.cache_clear()  # once per process: another test may have said it
    with caplog.at_level(logging.WARNING, logger="pflower"):
        validate(compose_config(["strategy=fedbn", "model=small_cnn"]))
        validate(compose_config(["strategy=fedbn", "model=small_cnn", "seed=2"]))
    lines = [r.getMessage() for r in caplog.records if "FedBN on model=small_cnn" in r.getMessage()]
    assert lines == [
        "FedBN on model=small_cnn is FedAvg: the model has none of the layers FedBN treats "
        "apart, so the run computes what strategy=fedavg computes"
    ]


def test_the_leaderboard_names_the_rows_of_collapsed_configurations() -> None:
    def named(method: str, *overrides: str, space: dict[str, str] | None = None) -> object:
        config = resolved_config(compose_config([f"strategy={method}", *overrides]))
        return collapse(method, config, {"space": space or {}})

    off = ["strategy.prune_ratio=0", "strategy.dropout=0", "strategy.noise_sigma=0"]
    assert named("fedmpr", *off) == ("= FedAvg", "at prune_ratio=0, dropout=0, noise_sigma=0")
    assert named("fedbn", "model=small_cnn") == ("= FedAvg", "on model=small_cnn")
    lam = {"strategy.lam": "log-uniform [1e-05, 1]"}
    assert named("diversifed", "strategy.lam=1.706e-05", space=lam) == (
        "≈ Local",
        "lam=1.71e-05, next to lam=0",
    )
    assert named("diversifed", "strategy.lam=0.01", space=lam) == ("", "")
    assert named("fedavg") == ("", "")
    assert table([])[0][-1] == "collapse"


def _entry(method: str, keys: list[str], runs: list[float]) -> Entry:
    """A method of a suite of one study 0 that searched ``keys``, with final runs seeds 1, ..."""
    return Entry(
        method,
        studies={0: dict(enumerate(runs, start=1))},
        study_chosen={0: {"space": dict.fromkeys(keys, "log-uniform [1e-05, 1]")}},
    )


def test_a_study_whose_runs_are_mostly_a_simpler_method_s_is_named() -> None:
    """Most of a study's final runs with a simpler method's accuracy to the last digit name it
    "≈" that method; two runs in five do not, nor runs where every client scored 100%, nor
    does a method that searched the same keys (a FedBN whose runs are FedAvg's is named by its
    model, not by its numbers)."""
    local = _entry("local", ["train.lr"], [0.91, 0.82, 0.73, 0.64, 0.55])
    ditto = _entry("ditto", ["train.lr", "strategy.lambda_"], [0.91, 0.82, 0.73, 0.65, 0.56])
    assert same_runs(ditto, 0, [local, ditto]) == (
        "≈ Local",
        "3 of 5 final runs give Local's final accuracy to the last digit",
    )
    assert same_runs(local, 0, [local, ditto]) == ("", "")  # Local searched fewer keys
    fewer = _entry("ditto", ["train.lr", "strategy.lambda_"], [0.91, 0.82, 0.7, 0.6, 0.5])
    assert same_runs(fewer, 0, [local, fewer]) == ("", "")
    fedavg = _entry("fedavg", ["train.lr"], [0.91, 0.82, 0.73, 0.64, 0.55])
    fedbn = _entry("fedbn", ["train.lr"], [0.91, 0.82, 0.73, 0.64, 0.55])
    assert same_runs(fedbn, 0, [fedavg, fedbn]) == ("", "")
    assert same_runs(ditto, 1, [local, ditto]) == ("", "")  # a study with no runs
    perfect = _entry("local", ["train.lr"], [1.0, 1.0, 1.0, 0.64, 0.55])
    learnt = _entry("ditto", ["train.lr", "strategy.lambda_"], [1.0, 1.0, 1.0, 0.6, 0.5])
    assert same_runs(learnt, 0, [perfect, learnt]) == ("", "")  # 100% is anyone's


def test_the_stored_leaderboard_names_ditto_s_study_that_is_local_training() -> None:
    """On the cpu suite's mnist_path, Ditto's study 0 (λ = 0.017, 10% into its log range, so
    not next to λ = 0 by the range rule) has 4 of 5 final runs with Local's accuracy."""
    setting = Path(__file__).resolve().parent.parent / "results" / "tuning" / "cpu" / "mnist_path"
    [ditto] = [e for e in read_setting(setting) if e.method == "ditto"]
    assert ditto.collapse == (
        "study 0 ≈ Local",
        "4 of 5 final runs give Local's final accuracy to the last digit",
    )
    assert ditto.study_chosen[0]["params"]["strategy.lambda_"] == pytest.approx(0.0171, rel=1e-2)
