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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

from pflower.config import require
from pflower.registry import ConfigError


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
