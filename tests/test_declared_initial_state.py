"""Server state declared with its initial value (:func:`pflower.core.declared.state`): one line
per attribute in the class body, set when the strategy is built, named in ``checkpointed`` (or,
with :func:`~pflower.core.declared.cache`, in ``derived``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pflower.strategies  # noqa: F401  (importing registers every algorithm)
from pflower.compose import compose_config
from pflower.core.algorithm import ALGORITHMS
from pflower.core.declared import DeclaredState, cache, declared_initial_values, state
from pflower.server.app import build_strategy


class _Base(DeclaredState):
    learned = state()
    store: dict[int, list[float]] = state({})
    scratch = cache(0)

    def __init__(self, size: int) -> None:
        self.size = size
        self.init_declared_state()


class _Child(_Base):
    learned = state(7)
    table = state(factory=lambda strategy: np.zeros(strategy.size))


def test_declared_attributes_are_set_at_construction_from_initial_or_factory() -> None:
    child = _Child(3)
    assert child.learned == 7  # the subclass's declaration replaces the inherited one
    assert child.store == {}
    assert child.scratch == 0
    np.testing.assert_array_equal(child.table, np.zeros(3))
    assert list(declared_initial_values(_Child)) == ["learned", "store", "scratch", "table"]
    assert _Base(1).learned is None


def test_each_instance_gets_its_own_copy_of_a_mutable_initial_value() -> None:
    first, second = _Base(1), _Base(1)
    first.store[0] = [1.0]
    assert second.store == {}
    assert _Base.store.initial == {}  # type: ignore[attr-defined]


def test_declarations_name_the_checkpointed_and_derived_attributes() -> None:
    assert vars(_Base)["checkpointed"] == ("learned", "store")
    assert vars(_Base)["derived"] == ("scratch",)
    assert vars(_Child)["checkpointed"] == ("learned", "table")


def test_initial_value_and_factory_together_are_refused() -> None:
    with pytest.raises(TypeError, match="not both"):
        state(1, factory=lambda strategy: 2)


STATEFUL = sorted(name for name, a in ALGORITHMS.items() if declared_initial_values(a.strategy))


def test_the_algorithms_that_keep_server_state_declare_it() -> None:
    assert {"scaffold", "feddc", "feddyn", "fedfomo", "fedamp", "diversifed", "flame"} <= set(
        STATEFUL
    )


@pytest.mark.parametrize("name", STATEFUL)
def test_every_declared_attribute_is_set_and_checkpointed(tmp_path: Path, name: str) -> None:
    cfg = compose_config(["dataset=digits", "model=small_cnn", f"strategy={name}"])
    strategy = build_strategy(cfg, tmp_path / name)
    checkpoint = strategy.checkpoint_state()
    for attribute, field in declared_initial_values(type(strategy)).items():
        assert attribute in vars(strategy), attribute
        if not field.derived:
            assert attribute in checkpoint, attribute
