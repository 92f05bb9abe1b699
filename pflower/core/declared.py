"""Declared server state: which attributes of a strategy a checkpoint saves.

A strategy names the attributes that hold what it has learned in :attr:`DeclaredState.checkpointed`
(the global model, a client-model store, control variates, affinities, ...) and the attributes it
sets that are recomputed instead in :attr:`DeclaredState.derived` (caches). Each class names only
its own; the tuples of its bases are added. Whatever else it sets after the base's configuration
is reported by :meth:`DeclaredState.undeclared_state`, which a test keeps empty for every
registered algorithm: state is never saved, or lost, without a decision.
"""

from __future__ import annotations

from typing import Any, ClassVar


def declared(cls: type, name: str) -> frozenset[str]:
    """The union of the ClassVar tuple ``name`` over ``cls`` and its bases."""
    return frozenset(a for klass in cls.__mro__ for a in vars(klass).get(name, ()))


class DeclaredState:
    """Checkpointing by declaration (see the module docstring)."""

    checkpointed: ClassVar[tuple[str, ...]] = ()
    """Attributes that hold what the strategy has learned, saved by :meth:`checkpoint_state`."""

    derived: ClassVar[tuple[str, ...]] = ()
    """Attributes a strategy sets that a checkpoint does not save, because they are recomputed
    from the configuration or within a round (caches)."""

    _configured: frozenset[str] = frozenset()

    def seal_configuration(self) -> None:
        """Mark every attribute set so far as configuration (neither state nor cache); called at
        the end of the base strategy's ``__init__``."""
        self._configured = frozenset(vars(self)) | {"_configured"}

    def checkpoint_state(self) -> dict[str, Any]:
        """What this strategy has learned so far, for a checkpoint: the attributes named by
        :attr:`checkpointed` in its class and bases (those already set)."""
        names = declared(type(self), "checkpointed")
        return {k: v for k, v in vars(self).items() if k in names}

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from what :meth:`checkpoint_state` returned."""
        vars(self).update(state)

    def undeclared_state(self) -> set[str]:
        """Attributes set beyond the configuration that are neither :attr:`checkpointed` nor
        :attr:`derived`: state a checkpoint would silently lose (should be empty)."""
        names = declared(type(self), "checkpointed") | declared(type(self), "derived")
        return set(vars(self)) - self._configured - names
