"""The algorithm registry: config name -> options dataclass -> (Strategy, client) pair.

An algorithm registers its options dataclass (its fields are the config keys of
``conf/strategy/<name>.yaml``; ``__post_init__`` validates their values). The dataclass names the
server Strategy and the client class, so both sides build the matching halves from the same options.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from omegaconf import DictConfig

from pflower.config import options_of
from pflower.registry import ConfigError, Registry

if TYPE_CHECKING:
    from pflower.client.base import PersonalClient
    from pflower.strategies.base import PersonalizedStrategy


@dataclass(frozen=True)
class AlgorithmOptions:
    """Options every algorithm has; subclasses add their own fields.

    Attributes:
        aggregation: ``weighted`` averages client models by their training-set sizes (FedAvg),
            ``uniform`` gives every client the weight 1/K (FLIU's Alg. 1).
    """

    strategy_class: ClassVar[type[PersonalizedStrategy]]
    client_class: ClassVar[type[PersonalClient]]

    aggregation: Literal["weighted", "uniform"] = "weighted"

    def __post_init__(self) -> None:
        if self.aggregation not in ("weighted", "uniform"):
            raise ConfigError(
                f"strategy.aggregation must be 'weighted' or 'uniform', got {self.aggregation!r}"
            )


ALGORITHMS: Registry[AlgorithmOptions] = Registry("strategy")


_SUPPORT_MODULES = {"base", "registry"}


def load_algorithms() -> None:
    """Import every algorithm module of this package, which registers it."""
    package = importlib.import_module("pflower.strategies")
    for module in pkgutil.iter_modules(package.__path__):
        if module.name not in _SUPPORT_MODULES:
            importlib.import_module(f"pflower.strategies.{module.name}")


def build_algorithm(block: DictConfig) -> AlgorithmOptions:
    """Validated options of the algorithm a ``strategy`` config block names."""
    load_algorithms()
    return ALGORITHMS.build(block.name, options_of(block))
