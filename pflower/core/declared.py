"""Declared server state: which attributes of a strategy a checkpoint saves.

A strategy names the attributes that hold what it has learned in
[`DeclaredState.checkpointed`][pflower.core.declared.DeclaredState.checkpointed]
(the global model, a client-model store, control variates, affinities, ...) and the attributes it
sets that are recomputed instead in
[`DeclaredState.derived`][pflower.core.declared.DeclaredState.derived] (caches). Each class names
only
its own; the tuples of its bases are added. Whatever else it sets after the base's configuration
is reported by
[`DeclaredState.undeclared_state`][pflower.core.declared.DeclaredState.undeclared_state], which a
test keeps empty for every
registered algorithm: state is never saved, or lost, without a decision.

An attribute a strategy sets up before round 1 is declared in one line of its class body, with
that initial value, and needs no constructor of its own::

    class FedDynStrategy(ClientAverageScoring, PersonalizedStrategy["FedDynOptions"]):
        server_h: NDArrays | None = state()
        '''h: one array per trainable parameter (None = zero, before the first update).'''

    class FedFomoStrategy(PersonalizedStrategy["FedFomoOptions"]):
        affinity: np.ndarray = state(factory=lambda s: np.zeros((s.settings.num_clients,) * 2))
        chosen: dict[int, list[int]] = state({})

[`state`][pflower.core.declared.state] enters the name in the class's
[`checkpointed`][pflower.core.declared.DeclaredState.checkpointed],
[`cache`][pflower.core.declared.cache]
in its [`derived`][pflower.core.declared.DeclaredState.derived]. The base strategy's constructor
calls
[`DeclaredState.init_declared_state`][pflower.core.declared.DeclaredState.init_declared_state] last,
after its configuration, which sets each
declared attribute to a copy of its ``initial`` value (so ``state({})`` gives every strategy its
own dict) or to ``factory(strategy)`` (which may read ``options``, ``settings`` and the initial
global model). A subclass may redeclare an inherited attribute with another initial value.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, ClassVar


def declared(cls: type, name: str) -> frozenset[str]:
    """The union of the ClassVar tuple ``name`` over ``cls`` and its bases."""
    return frozenset(a for klass in cls.__mro__ for a in vars(klass).get(name, ()))


class ServerState:
    """One attribute declared with its initial value (made by [`state`][pflower.core.declared.state]
    or [`cache`][pflower.core.declared.cache])."""

    def __init__(
        self, initial: Any, factory: Callable[[Any], Any] | None, *, derived: bool
    ) -> None:
        if factory is not None and initial is not None:
            raise TypeError("give an initial value or a factory, not both")
        self.initial = initial
        self.factory = factory
        self.derived = derived

    def __set_name__(self, owner: type, name: str) -> None:
        key = "derived" if self.derived else "checkpointed"
        setattr(owner, key, (*vars(owner).get(key, ()), name))

    def value_for(self, strategy: Any) -> Any:
        """The attribute's value when ``strategy`` is built."""
        if self.factory is None:
            return copy.deepcopy(self.initial)
        return self.factory(strategy)


def state(initial: Any = None, *, factory: Callable[[Any], Any] | None = None) -> Any:
    """Declare a checkpointed attribute: a copy of ``initial`` (default None) or
    ``factory(strategy)`` when the strategy is built (see the module docstring)."""
    return ServerState(initial, factory, derived=False)


def cache(initial: Any = None, *, factory: Callable[[Any], Any] | None = None) -> Any:
    """Declare a derived attribute (recomputed when needed, not saved by a checkpoint), set when
    the strategy is built as [`state`][pflower.core.declared.state] sets one."""
    return ServerState(initial, factory, derived=True)


def declared_initial_values(cls: type) -> dict[str, ServerState]:
    """The attributes declared with [`state`][pflower.core.declared.state] or
    [`cache`][pflower.core.declared.cache] on ``cls`` and its bases, by
    name, bases first (a subclass's declaration replaces an inherited one)."""
    fields: dict[str, ServerState] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, ServerState):
                fields[name] = value
    return fields


class DeclaredState:
    """Checkpointing by declaration (see the module docstring)."""

    checkpointed: ClassVar[tuple[str, ...]] = ()
    """Attributes that hold what the strategy has learned, saved by
    [`checkpoint_state`][pflower.core.declared.DeclaredState.checkpoint_state]."""

    derived: ClassVar[tuple[str, ...]] = ()
    """Attributes a strategy sets that a checkpoint does not save, because they are recomputed
    from the configuration or within a round (caches)."""

    _configured: frozenset[str] = frozenset()

    def seal_configuration(self) -> None:
        """Mark every attribute set so far as configuration (neither state nor cache); called at
        the end of the base strategy's ``__init__``."""
        self._configured = frozenset(vars(self)) | {"_configured"}

    def init_declared_state(self) -> None:
        """Set every attribute declared with [`state`][pflower.core.declared.state] or
        [`cache`][pflower.core.declared.cache] to its value before
        round 1; called by the base strategy's ``__init__`` after
        [`seal_configuration`][pflower.core.declared.DeclaredState.seal_configuration]."""
        for name, field in declared_initial_values(type(self)).items():
            setattr(self, name, field.value_for(self))

    def checkpoint_state(self) -> dict[str, Any]:
        """What this strategy has learned so far, for a checkpoint: the attributes named by
        [`checkpointed`][pflower.core.declared.DeclaredState.checkpointed] in its class and bases
        (those already set)."""
        names = declared(type(self), "checkpointed")
        return {k: v for k, v in vars(self).items() if k in names}

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from what
        [`checkpoint_state`][pflower.core.declared.DeclaredState.checkpoint_state] returned."""
        vars(self).update(state)

    def undeclared_state(self) -> set[str]:
        """Attributes set beyond the configuration that are neither
        [`checkpointed`][pflower.core.declared.DeclaredState.checkpointed] nor
        [`derived`][pflower.core.declared.DeclaredState.derived]: state a checkpoint would silently
        lose (should be empty)."""
        names = declared(type(self), "checkpointed") | declared(type(self), "derived")
        return set(vars(self)) - self._configured - names
