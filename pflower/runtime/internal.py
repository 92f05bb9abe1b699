"""An entry of the fence ([`pflower.runtime.fence`][pflower.runtime.fence]): one Flower, Ray or
Optuna symbol outside its API reference that pflower uses, checked against the parameters
pflower was written for before it is read or replaced, and the error that names it when it
changed."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


class FlowerChanged(RuntimeError):
    """A Flower, Ray or Optuna internal that pflower relies on is not what pflower was written
    for."""


def parameters_of(function: Any) -> str:
    """``function``'s parameters as ``(a, b=..., *, c=..., **kwargs)``: names and kinds, and
    which have defaults, without annotations or default values (these may change freely)."""
    parts: list[str] = []
    starred = False
    for parameter in inspect.signature(function).parameters.values():
        kind = parameter.kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            parts.append(f"*{parameter.name}")
            starred = True
            continue
        if kind is inspect.Parameter.VAR_KEYWORD:
            parts.append(f"**{parameter.name}")
            continue
        if kind is inspect.Parameter.KEYWORD_ONLY and not starred:
            parts.append("*")
            starred = True
        default = "" if parameter.default is inspect.Parameter.empty else "=..."
        parts.append(f"{parameter.name}{default}")
    return f"({', '.join(parts)})"


@dataclass(frozen=True)
class Internal:
    """One Flower (or Ray, or Optuna) symbol outside its API reference that pflower uses."""

    module: str
    name: str
    """Attribute of ``module``; ``Class.method`` for a method."""
    parameters: str | None
    """What [`parameters_of`][pflower.runtime.internal.parameters_of] gives for the symbol in Flower
    1.39; None for a module."""
    why: str
    written_for: str = "Flower 1.39 (flwr[simulation]>=1.39,<1.40)"
    """The package and versions pflower was written against (Ray: the one Flower pins)."""
    measured: str = ""
    """For a symbol pflower replaces: what the replacement saves (seconds, or a failure it
    prevents), measured side by side with the symbol as it is (``python
    benchmarks/fence_patches.py --pairs 3 --ray``, medians of 3 alternating pairs, on the 2-core
    development VM at load 23-27, 2026-12-05); empty for a symbol pflower only calls or implements.
    A replacement whose saving no longer justifies it is dropped."""
    defaults: tuple[tuple[str, Any], ...] = ()
    """Default values pflower relies on: its replacement repeats them, or its measured saving
    rests on them (checked by
    [`check_defaults`][pflower.runtime.internal.Internal.check_defaults])."""

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"

    def _owner(self) -> tuple[Any, str]:
        try:
            owner: Any = importlib.import_module(self.module)
            *path, attribute = self.name.split(".")
            for step in path:
                owner = getattr(owner, step)
        except (ImportError, AttributeError) as error:
            raise self._changed(f"cannot be found ({error})") from error
        if not hasattr(owner, attribute):
            raise self._changed("cannot be found")
        return owner, attribute

    def current(self) -> Any:
        """The symbol as it is now in this process."""
        owner, attribute = self._owner()
        return getattr(owner, attribute)

    def _changed(self, what: str) -> FlowerChanged:
        return FlowerChanged(
            f"{self.qualified} {what}: pflower.runtime was written against {self.written_for}, "
            f"where pflower uses it because {self.why}"
        )

    def check(self) -> None:
        """Raise [`FlowerChanged`][pflower.runtime.internal.FlowerChanged] unless the symbol exists
        with the recorded parameters."""
        value = self.current()
        if self.parameters is None:
            if not isinstance(value, types.ModuleType):
                raise self._changed(f"is {value!r}, not a module")
            return
        found = parameters_of(value)
        if found != self.parameters:
            raise self._changed(f"takes {found}, not {self.parameters}")

    def check_defaults(self) -> None:
        """Raise [`FlowerChanged`][pflower.runtime.internal.FlowerChanged] unless the symbol's
        parameters have the recorded `defaults`."""
        if not self.defaults:
            return
        parameters = inspect.signature(self.current()).parameters
        for name, value in self.defaults:
            found = parameters[name].default if name in parameters else inspect.Parameter.empty
            if found != value or type(found) is not type(value):
                raise self._changed(f"has {name}={found!r}, not {value!r}")

    @contextlib.contextmanager
    def replaced(self, replacement: Any) -> Iterator[Any]:
        """While active, ``replacement`` stands where the symbol is; yields the original, which
        is put back at the end (also when the block raised)."""
        self.check()
        owner, attribute = self._owner()
        own = attribute in vars(owner)
        original = vars(owner)[attribute] if own else getattr(owner, attribute)
        setattr(owner, attribute, replacement)
        try:
            yield original
        finally:
            if own:
                setattr(owner, attribute, original)
            else:
                delattr(owner, attribute)

    @contextlib.contextmanager
    def module_stands_in(self, replacement: Any, imported_by: Internal) -> Iterator[None]:
        """While active, importing the symbol's module gives a module of that name whose symbol
        is ``replacement``, and the real module is not imported (Ray's backend module imports
        Ray); the real module's entry in ``sys.modules`` (or its absence) comes back at the end.

        ``imported_by`` is the function that imports the symbol from the module when it runs;
        it is checked, and so is that its source still says ``<module> import <symbol>``."""
        imported_by.check()
        leaf = self.module.rpartition(".")[2]
        try:
            source = inspect.getsource(imported_by.current())
        except (OSError, TypeError):  # no source to read: nothing says it imports the symbol
            source = ""
        if f"{leaf} import {self.name}" not in source:
            raise imported_by._changed(f"no longer imports {self.name} from {self.module}")
        stand_in = types.ModuleType(self.module)
        setattr(stand_in, self.name, replacement)
        real = sys.modules.get(self.module)
        sys.modules[self.module] = stand_in
        try:
            yield
        finally:
            if real is None:
                sys.modules.pop(self.module, None)
            else:
                sys.modules[self.module] = real

    def replace_for_process(self, replacement: Any) -> Any:
        """Put ``replacement`` where the symbol is for the rest of this process; the original.

        Only for processes that exist for pflower's sake and end with their work (a fork server
        and its children, a SuperNode or SuperExec started by pflower's launcher)."""
        self.check()
        owner, attribute = self._owner()
        original = getattr(owner, attribute)
        setattr(owner, attribute, replacement)
        return original
