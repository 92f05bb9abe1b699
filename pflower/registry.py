"""Name -> factory registries that turn a config block into an object, with clear errors.

Every configurable family (datasets, partitioners, models, strategies) is chosen the same way: a
config block ``{name: <registered name>, <key>: <value>, ...}``. The registry checks the name and
the keys against the factory's signature, so a typo fails with the list of what is allowed instead
of a ``TypeError`` from deep inside a constructor.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is wrong; the message says what is wrong and what is allowed."""


def did_you_mean(word: str, names: Sequence[str]) -> str:
    """``" (did you mean 'x'?)"``, naming the names nearest to a mistyped ``word`` (at most
    three, by `difflib.get_close_matches`), or ``""`` when none is near."""
    near = [repr(name) for name in difflib.get_close_matches(word, list(names), n=3)]
    if not near:
        return ""
    listed = near[0] if len(near) == 1 else f"{', '.join(near[:-1])} or {near[-1]}"
    return f" (did you mean {listed}?)"


class Registry(Generic[T]):
    """A named collection of factories of one kind (e.g. all dataset loaders)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: register ``factory`` under ``name``."""

        def decorator(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._factories[name] = factory
            return factory

        return decorator

    @property
    def names(self) -> list[str]:
        """All registered names, sorted."""
        return sorted(self._factories)

    def get(self, name: str) -> Callable[..., T]:
        """The factory registered under ``name``."""
        try:
            return self._factories[name]
        except KeyError:
            raise ConfigError(
                f"Unknown {self.kind} '{name}'{did_you_mean(name, self.names)}. "
                f"Valid names: {', '.join(self.names)}"
            ) from None

    def accepted_keys(self, name: str) -> list[str]:
        """The keyword arguments the factory registered under ``name`` accepts."""
        parameters = inspect.signature(self.get(name)).parameters.values()
        return [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]

    def check(self, name: str, options: Mapping[str, Any], context: Sequence[str] = ()) -> None:
        """Check ``name`` and the keys of ``options`` without building anything.

        Args:
            name: the registered name.
            options: the config block's keys (without ``name``).
            context: keys the caller supplies itself, which config may not set.

        Raises:
            ConfigError: the name is unknown, or ``options`` holds a key the factory does not take.
        """
        accepted = self.accepted_keys(name)
        settable = [key for key in accepted if key not in context]
        unknown = sorted(set(options) - set(settable))
        if unknown:
            raise ConfigError(
                f"{self.kind} '{name}' does not take {', '.join(map(repr, unknown))}. "
                f"Allowed keys: {', '.join(settable) or '(none)'}"
            )

    def build(self, name: str, options: Mapping[str, Any], **context: Any) -> T:
        """Call the factory with ``options`` (from config) plus ``context`` (from the caller).

        Raises:
            ConfigError: as [`check`][pflower.registry.Registry.check].
        """
        self.check(name, options, tuple(context))
        return self.get(name)(**dict(options), **context)

    def build_block(self, block: Mapping[str, Any], **context: Any) -> T:
        """[`build`][pflower.registry.Registry.build] from a config block ``{name: <registered
        name>, <key>: <value>, ...}``."""
        name, options = name_and_options(block)
        return self.build(name, options, **context)


def name_and_options(block: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """A config block ``{name: ..., <key>: <value>, ...}`` split into its name and its options."""
    options = dict(block)
    return str(options.pop("name")), options
