"""Checkpoint state is declared: every attribute a strategy holds after a run is configuration,
``checkpointed`` (saved by a checkpoint) or ``derived`` (recomputed); nothing else.

A cache an algorithm sets lazily would otherwise be lost (or, before declared state, silently
saved) at a checkpoint without anyone deciding which.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import pflower.strategies  # noqa: F401  (registers every algorithm)
from pflower.core.algorithm import ALGORITHMS
from pflower.core.strategy import PersonalizedStrategy
from pflower.strategies.fedamp import FedAMPStrategy
from tests.inprocess import run_inprocess

TINY = ["dataset=digits", "num_clients=3", "rounds=1", "train.local_epochs=1"]
MODEL = {"fedmpr": ["model=resnet8", "strategy.reg_stages=[1,2,3]"]}  # FedMPR needs a ResNet


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_holds_only_declared_server_state(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also, with ``robust=median`` wherever the algorithm declares ``robust_aggregation``
    (elsewhere composing refuses it), that its aggregation does reach the robust aggregator."""
    robust_calls: list[int] = []
    robust_mean = PersonalizedStrategy.robust_mean

    def counted(self, arrays, weights):  # type: ignore[no-untyped-def]
        robust_calls.append(len(arrays))
        return robust_mean(self, arrays, weights)

    monkeypatch.setattr(PersonalizedStrategy, "robust_mean", counted)
    declared_robust = ALGORITHMS[name].strategy.robust_aggregation
    robust = "robust=median" if declared_robust else "robust=none"
    strategies: list[PersonalizedStrategy] = []
    model = MODEL.get(name, ["model=small_cnn"])
    run_inprocess([*TINY, *model, f"strategy={name}", robust], tmp_path, strategies=strategies)
    strategy = strategies[0]
    assert bool(robust_calls) == declared_robust, (
        f"{type(strategy).__name__}.robust_aggregation is {declared_robust}, but robust=median "
        f"{'never reached' if declared_robust else 'reached'} robust_mean"
    )
    assert strategy.undeclared_state() == set(), (
        f"{type(strategy).__name__} holds server state it does not declare: name it in the "
        "class's `checkpointed` (saved by a checkpoint) or `derived` (recomputed) tuple"
    )
    declared = set(strategy.checkpoint_state())
    assert {"_global_weights", "client_models"} <= declared


class _LazyCache(PersonalizedStrategy):
    """An algorithm that sets a cache during a round without declaring it."""

    def aggregate(self, server_round, updates, current):  # type: ignore[no-untyped-def]
        self.cache = server_round
        return super().aggregate(server_round, updates, current)


def test_an_undeclared_lazy_attribute_is_reported_and_not_checkpointed(tmp_path: Path) -> None:
    from pflower.compose import compose_config
    from pflower.server.app import build_strategy

    cfg = compose_config(["dataset=digits", "model=small_cnn", "strategy=fedavg"])
    base = build_strategy(cfg, tmp_path)
    strategy = _LazyCache(base.options, base.settings, base.global_weights)
    assert strategy.undeclared_state() == set()
    strategy.cache = 3
    assert strategy.undeclared_state() == {"cache"}
    assert "cache" not in strategy.checkpoint_state()


def test_declarations_add_up_along_the_class_hierarchy() -> None:
    names = FedAMPStrategy.__mro__
    assert any("last_mixing" in vars(k).get("checkpointed", ()) for k in names)
    declared = {a for k in names for a in vars(k).get("checkpointed", ())}
    assert {"guard_events", "last_mixing", "_global_weights", "client_models"} <= declared
