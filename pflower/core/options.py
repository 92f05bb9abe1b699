"""Algorithm options: the config schema of the ``strategy`` block.

Every algorithm's options dataclass derives from
[`AlgorithmOptions`][pflower.core.options.AlgorithmOptions] and is the single
source of truth for the algorithm's config keys: registering it
([`register_algorithm`][pflower.core.algorithm.register_algorithm]) stores it in Hydra's ConfigStore
as
``strategy/<name>``, so ``strategy=fedprox strategy.mu=0.1`` composes
against its fields and types (a typo'd key or a wrong type fails while composing, an enum lists its
allowed values), and ``__post_init__`` rejects out-of-range values. Presets are YAML files in
``conf/strategy/`` whose defaults list extends the registered node (``conf/strategy/fliu10.yaml``).

An algorithm also declares its *collapses* (`Collapse`): the option values at which it
computes what another method computes (FedProx with μ = 0 is FedAvg), so that a tuned
configuration at or next to such a point is named rather than ranked as a method of its own
(`collapse_of`; the leaderboard's ``collapse`` column), and one that collapses whatever its
options, on the experiment's model (FedBN on a model without BatchNorm), is named while
composing (`AlgorithmOptions.collapse_on`). ``tests/test_collapses.py`` runs every
declared collapse against its base and requires the same metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

from pflower.config import require
from pflower.registry import ConfigError
from pflower.searchspace import RANGE_END, Param


@dataclass(frozen=True)
class Collapse:
    """A neutral point of an algorithm: with every option of ``at`` at its value the algorithm
    computes what the method ``base`` (a config name) computes, with the same ``aggregation``
    and shared ``train.*`` settings: the rows of ``metrics.jsonl`` are the same to the last
    digit (``tests/test_collapses.py`` checks each one)."""

    base: str
    at: tuple[tuple[str, Any], ...]

    def describe(self) -> str:
        """E.g. ``mu=0``."""
        return ", ".join(f"{key}={_shown(value)}" for key, value in self.at)


def _shown(value: Any) -> str:
    """An option value as reports show it (``0`` for 0.0, enums by value)."""
    value = getattr(value, "value", value)
    return f"{value:.3g}" if isinstance(value, float) else str(value)


class Aggregation(StrEnum):
    """How the server averages client models."""

    weighted = "weighted"
    """By the clients' training-set sizes n_k (FedAvg)."""
    uniform = "uniform"
    """Every client weighs 1/K (FLIU, Alg. 1)."""


@dataclass
class AlgorithmOptions:
    """Options every algorithm has; subclasses add their own fields (all with defaults).

    Class attributes (set by each algorithm):
        display_name: the method's name in reports and tables (e.g. ``FedAvg``).
        display_rank: where the method comes in a report (baselines first, then the papers'
            methods, local training last).

    Attributes:
        name: the registered config name (set by ``strategy=<name>``; not to be overridden).
        aggregation: ``weighted`` by training-set sizes or ``uniform``.
    """

    display_name: ClassVar[str]
    display_rank: ClassVar[int] = 50
    config_name: ClassVar[str] = ""
    """The registered config name (set by
    [`register_algorithm`][pflower.core.algorithm.register_algorithm])."""

    collapses: ClassVar[tuple[Collapse, ...]] = ()
    """The algorithm's neutral points (`Collapse`), none by default."""

    name: str = ""
    aggregation: Aggregation = Aggregation.weighted

    def __post_init__(self) -> None:
        require(
            self.name == self.config_name,
            f"strategy.name is {self.name!r} but the options are those of "
            f"{self.config_name!r}; choose an algorithm with strategy=<name>, e.g. "
            f"strategy={self.name}",
        )

    def check_experiment(self, settings: Any, model: Any) -> None:
        """Refuse, while composing, an experiment this algorithm cannot run (a model it cannot
        train, a partition or optimizer it does not support); nothing by default.

        Args:
            settings: the typed [`ExperimentConfig`][pflower.config.ExperimentConfig] (its named
                blocks as
                plain mappings).
            model: the experiment's model, built on PyTorch's ``meta`` device (types and
                shapes only, no weights).

        Raises:
            ConfigError: what cannot work and which setting to change.
        """

    @classmethod
    def collapse_on(cls, model: Any) -> str | None:
        """The method (a config name) this algorithm is on ``model`` (built on the ``meta``
        device), whatever its options; None (the default) where it is itself. Composing warns where
        it is another ([`pflower.compose.check_compatible`][pflower.compose.check_compatible])."""
        del model
        return None

    def label(self) -> str:
        """The method's name in reports; algorithms with variants extend it (e.g. FLIU25)."""
        return self.display_name

    def label_keys(self) -> tuple[str, ...]:
        """The options that [`label`][pflower.core.options.AlgorithmOptions.label] accounts for
        (reports add the others where they vary)."""
        return ()

    def variant_rank(self) -> float:
        """Order among the variants of one algorithm (e.g. FLIU's γ); 0 if it has none."""
        return 0.0

    def sort_key(self) -> tuple[int, float, str]:
        """Report order among methods: by ``display_rank``, then variant, then label."""
        return (self.display_rank, self.variant_rank(), self.label())


OptionsT = TypeVar("OptionsT", bound=AlgorithmOptions)


def option_names(options_class: type[AlgorithmOptions]) -> list[str]:
    """The config keys of an algorithm (its dataclass fields)."""
    return [f.name for f in fields(options_class)]


def check_keys(options_class: type[AlgorithmOptions], block: Mapping[str, Any]) -> None:
    """Reject keys of a ``strategy`` block that the algorithm does not have, naming those it has.

    Hydra refuses ``strategy.gama=0.3`` itself; this also catches keys appended with ``+``.
    """
    unknown = sorted(set(block) - set(option_names(options_class)))
    if unknown:
        raise ConfigError(
            f"strategy '{options_class.config_name}' does not take "
            f"{', '.join(map(repr, unknown))}. Allowed keys: "
            f"{', '.join(option_names(options_class))}"
        )


def _at_neutral(value: Any, neutral: Any, param: Param | None) -> str | None:
    """``"="`` where ``value`` is ``neutral``, ``"≈"`` where it is numerically next to it (see
    `collapse_of`), else None."""
    if getattr(value, "value", value) == getattr(neutral, "value", neutral):
        return "="
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if not numeric or param is None or param.kind == "choice":
        return None
    position = param.position(value)
    if position is None:
        return None
    if param.log and neutral <= 0 < float(param.low or 0):
        return "≈" if position <= RANGE_END else None
    neutral_position = param.position(neutral)
    if neutral_position is None or not 0.0 <= neutral_position <= 1.0:
        return None
    return "≈" if abs(position - neutral_position) <= RANGE_END else None


def collapse_of(
    options_class: type[AlgorithmOptions],
    values: Mapping[str, Any],
    space: Mapping[str, Param],
) -> tuple[Collapse, str] | None:
    """The declared collapse that the options ``values`` (a strategy block) sit on, with
    ``"="`` (every option at its neutral value) or ``"≈"`` (some only next to it); None if none.

    Next to a neutral value, in the range ``space[<key>]`` it was searched in (keys
    ``strategy.<option>``): a log range whose neutral value is 0, below the range, within
    [`RANGE_END`][pflower.searchspace.RANGE_END] of the range's low end in log scale (DiversiFed's
    λ = 1.7e-5 in [1e-5, 1] is 4.8 decades below the range's top, where the search put the
    term's weight as far toward 0 as it could: the method's own term has all but vanished); a
    linear range holding the neutral value, within ``RANGE_END`` of it as a fraction of the
    range. A choice, and an option that was not searched, count only at the neutral value
    itself, since nothing says how close is close for them.
    """
    for collapse in options_class.collapses:
        marks = [
            _at_neutral(values.get(key), neutral, space.get(f"strategy.{key}"))
            for key, neutral in collapse.at
        ]
        if all(mark is not None for mark in marks):
            return collapse, "=" if all(mark == "=" for mark in marks) else "≈"
    return None
