"""Search spaces declared beside the options they tune (fair comparisons: docs,
concepts).

A tunable option is an ordinary dataclass field whose default comes from
[`tunable`][pflower.searchspace.tunable], which
records the range in the field's metadata::

    @dataclass
    class FedProxOptions(AlgorithmOptions):
        mu: float = tunable(0.01, low=1e-4, high=1.0, log=True, source="FedProx, Sec. 5.2")

Hydra and OmegaConf see a plain field with its default; ``pflower tune``
([`pflower.tuning`][pflower.tuning])
reads the metadata with [`declared_space`][pflower.searchspace.declared_space] and asks Optuna for a
value of each declared
option. The shared training knobs (``train.lr``, ``train.local_epochs``, ``train.momentum``) are
declared the same way on [`pflower.config.TrainConfig`][pflower.config.TrainConfig]; a suite says
which of them it
tunes, so every method, FedAvg included, searches the same training space.

The ranges come from the papers that introduced each method (or the paper whose experiments a
method is compared in), named in ``source``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

METADATA_KEY = "pflower_tune"
"""The field-metadata key holding a [`Param`][pflower.searchspace.Param]."""

RANGE_END = 0.05
"""A value this close to an end of its range (as a fraction of the range, in log scale for a log
range) lies at that end ([`Param.end_of`][pflower.searchspace.Param.end_of]): the leaderboard lists
such chosen values, and
``pflower tune --profile ends`` profiles them."""


class Suggests(Protocol):
    """The part of an Optuna trial a [`Param`][pflower.searchspace.Param] uses (kept a protocol: no
    import here)."""

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float: ...

    def suggest_int(
        self, name: str, low: int, high: int, *, step: int = 1, log: bool = False
    ) -> int: ...

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...


@dataclass(frozen=True)
class Param:
    """The range of one tunable option.

    Attributes:
        kind: ``float``, ``int`` or ``choice``.
        low, high: the bounds (inclusive) of ``float`` and ``int`` ranges.
        log: sample uniformly in log space (both bounds > 0).
        step: a grid step of ``float``/``int`` ranges (None: continuous / 1).
        choices: the values of a ``choice`` option.
        source: where the range comes from (paper, section), shown by ``pflower tune --show``.
    """

    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind == "choice":
            if not self.choices:
                raise ValueError("a choice option needs at least one value")
            return
        if self.kind not in ("float", "int"):
            raise ValueError(f"kind must be float, int or choice, got {self.kind!r}")
        if self.low is None or self.high is None or not self.low <= self.high:
            raise ValueError(f"a {self.kind} range needs low <= high, got {self.low}, {self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0, got {self.low}")

    def suggest(self, trial: Suggests, key: str) -> Any:
        """A value for ``key`` drawn by ``trial`` (an Optuna trial)."""
        if self.kind == "choice":
            return trial.suggest_categorical(key, list(self.choices))
        assert self.low is not None and self.high is not None
        if self.kind == "int":
            step = int(self.step or 1)
            return trial.suggest_int(key, int(self.low), int(self.high), step=step, log=self.log)
        return trial.suggest_float(key, self.low, self.high, step=self.step, log=self.log)

    def with_bounds(self, changes: Mapping[str, Any]) -> Param:
        """This range with some attributes replaced (a suite narrowing a shared knob)."""
        values = dict(changes)
        if "choices" in values:  # a list replaces a range: the parameter becomes a choice
            values["choices"] = tuple(values["choices"])
            values["kind"] = "choice"
        return dataclasses.replace(self, **values)

    def describe(self) -> str:
        """E.g. ``log-uniform [0.0001, 1]`` or ``one of 0.5, 1.0``
        ([`from_description`][pflower.searchspace.Param.from_description]
        reads a range back)."""
        if self.kind == "choice":
            return _CHOICE_PREFIX + ", ".join(str(c) for c in self.choices)
        scale = "log-uniform" if self.log else "uniform"
        if self.kind == "int":
            scale = "integer" + (" (log)" if self.log else "")
        step = f" step {self.step:g}" if self.step else ""
        return f"{scale} [{_number(self.low)}, {_number(self.high)}]{step}"

    @classmethod
    def from_description(cls, description: str) -> Param | None:
        """The range or choice a [`describe`][pflower.searchspace.Param.describe] text states (as a
        chosen file records it;
        bounds to [`describe`][pflower.searchspace.Param.describe]'s 6 digits; a choice's values as
        bools or numbers where they
        read as such, else as text), None for any other text."""
        if description.startswith(_CHOICE_PREFIX):
            values = description.removeprefix(_CHOICE_PREFIX).split(", ")
            return cls("choice", choices=tuple(number_or_text(value) for value in values))
        match = _DESCRIBED_RANGE.fullmatch(description)
        if match is None:
            return None
        scale, low, high, step = match.groups()
        return cls(
            "int" if scale.startswith("integer") else "float",
            low=float(low),
            high=float(high),
            log=scale in ("log-uniform", "integer (log)"),
            step=float(step) if step else None,
        )

    def position(self, value: float) -> float | None:
        """Where ``value`` lies in this range, 0 at ``low`` and 1 at ``high`` (measured in log
        space for a log range); None for an empty range. A choice of positive numbers spanning
        a decade or more (e.g. 0.001, 0.01, 0.1) is a coarse log range from its least to its
        greatest value; any other choice (momentum 0, 0.5, 0.9; names) has no position."""
        if self.kind == "choice":
            scale = self._log_range()
            return None if scale is None else scale.position(value)
        if self.low is None or self.high is None:
            return None
        low, high, value = self.low, self.high, float(value)
        if self.log:
            if value <= 0:
                return None
            low, high, value = math.log(low), math.log(high), math.log(value)
        return None if high == low else (value - low) / (high - low)

    def end_of(self, value: Any, margin: float = RANGE_END) -> str | None:
        """``"low"`` or ``"high"`` where ``value`` lies within ``margin`` of that end of this
        range ([`position`][pflower.searchspace.Param.position]), else None (inside, or a choice
        without a position)."""
        if not isinstance(value, int | float) or isinstance(value, bool):
            return None
        position = self.position(value)
        if position is None:
            return None
        if position <= margin:
            return "low"
        return "high" if position >= 1 - margin else None

    def log_span(self) -> tuple[float, float] | None:
        """(least, greatest) of a log range, or of a choice that is a coarse log range
        ([`position`][pflower.searchspace.Param.position]); None for any other range."""
        if self.kind == "choice":
            scale = self._log_range()
            return None if scale is None else (float(scale.low or 0), float(scale.high or 0))
        if self.log and self.low is not None and self.high is not None:
            return float(self.low), float(self.high)
        return None

    def _log_range(self) -> Param | None:
        """The log range from a choice's least to its greatest value, where its values are
        positive numbers spanning a decade or more; None otherwise."""
        numbers = [
            c for c in self.choices if isinstance(c, int | float) and not isinstance(c, bool)
        ]
        if len(numbers) < max(2, len(self.choices)) or min(numbers) <= 0:
            return None
        low, high = min(numbers), max(numbers)
        return Param("float", low=low, high=high, log=True) if high >= 10 * low else None


_CHOICE_PREFIX = "one of "
"""How [`Param.describe`][pflower.searchspace.Param.describe] starts a choice."""

_DESCRIBED_RANGE = re.compile(
    r"(log-uniform|uniform|integer|integer \(log\)) \[([^,\]]+), ([^\]]+)\](?: step (\S+))?"
)
"""What [`Param.describe`][pflower.searchspace.Param.describe] writes for a range."""


def number_or_text(text: str) -> Any:
    """``text`` as a bool (``True``, ``False``), an int or a finite float where it reads as one,
    else itself."""
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        return number if math.isfinite(number) else text
    return text


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def tunable(
    default: T,
    *,
    low: float | None = None,
    high: float | None = None,
    log: bool = False,
    step: float | None = None,
    choices: Sequence[Any] = (),
    source: str = "",
) -> T:
    """A dataclass field with ``default`` whose search range is declared in its metadata.

    Give ``low``/``high`` (with ``log=True`` for a log scale; an ``int`` default, or an ``int``
    step with an ``int`` ``low``, makes an integer range) or ``choices``. Typed as ``default`` so
    the field keeps its annotation.
    """
    if choices:
        param = Param("choice", choices=tuple(choices), source=source)
    else:
        is_int = isinstance(default, int) and not isinstance(default, bool)
        is_int = is_int or (isinstance(step, int) and isinstance(low, int))
        param = Param("int" if is_int else "float", low, high, log, step, source=source)
    field: Any = dataclasses.field(default=default, metadata={METADATA_KEY: param})
    return field


def declared_space(options_class: type, prefix: str) -> dict[str, Param]:
    """``{"<prefix>.<field>": Param}`` for every field of ``options_class`` declared with
    [`tunable`][pflower.searchspace.tunable], in field order."""
    return {
        f"{prefix}.{field.name}": field.metadata[METADATA_KEY]
        for field in dataclasses.fields(options_class)
        if METADATA_KEY in field.metadata
    }


def format_value(value: Any) -> str:
    """A sampled value as a Hydra override value (floats with enough digits, enums by value)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
            return f"{value:.1f}"
        return f"{value:.6g}"
    return str(getattr(value, "value", value))
