"""The algorithm registry: config name -> (options, Strategy, client).

An algorithm is one module in [`pflower.strategies`][pflower.strategies] with its server half, its
client half and
its options, tied together where the options are declared::

    class FedProxStrategy(PersonalizedStrategy["FedProxOptions"]): ...
    class FedProxClient(PersonalClient["FedProxOptions"]): ...

    @register_algorithm("fedprox", strategy=FedProxStrategy, client=FedProxClient)
    @dataclass
    class FedProxOptions(AlgorithmOptions):
        display_name: ClassVar[str] = "FedProx"
        mu: float = 0.01

Registering enters the options dataclass into Hydra's ConfigStore as ``strategy/<name>``, so that
``strategy=fedprox`` selects it with no YAML file, and records which Strategy and client the server
and the nodes build from those options.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from pflower.core.client import PersonalClient
from pflower.core.options import AlgorithmOptions, OptionsT, check_keys
from pflower.core.strategy import PersonalizedStrategy
from pflower.provenance import record_method_files
from pflower.registry import ConfigError


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm: its options dataclass and its two halves."""

    name: str
    options: type[AlgorithmOptions]
    strategy: type[PersonalizedStrategy[Any]]
    client: type[PersonalClient[Any]]


ALGORITHMS: dict[str, Algorithm] = {}
"""Every registered algorithm, by config name (filled by importing
[`pflower.strategies`][pflower.strategies])."""


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name``; an unknown name lists the valid ones."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ConfigError(
            f"Unknown strategy '{name}'. Valid names: {', '.join(sorted(ALGORITHMS))}"
        ) from None


def register_algorithm(
    name: str,
    *,
    strategy: type[PersonalizedStrategy[Any]],
    client: type[PersonalClient[Any]],
) -> Callable[[type[OptionsT]], type[OptionsT]]:
    """Class decorator on an options dataclass: register algorithm ``name`` (see module doc)."""

    def decorator(options: type[OptionsT]) -> type[OptionsT]:
        if name in ALGORITHMS:
            raise ValueError(f"strategy '{name}' is registered twice")
        ALGORITHMS[name] = Algorithm(name, options, strategy, client)
        record_method_files(name, _source_files(options, strategy, client))
        options.config_name = name
        ConfigStore.instance().store(group="strategy", name=name, node=options(name=name))
        return options

    return decorator


def _source_files(*classes: type) -> list[Path]:
    """The files of the modules an algorithm's code comes from: its own module (where the
    options are declared) and the modules of [`pflower.strategies`][pflower.strategies] its classes
    derive from or its modules import from (a family module such as FedProx's proximal term),
    transitively. pflower's shared machinery counts apart
    ([`pflower.provenance.COMPONENTS`][pflower.provenance.COMPONENTS])."""
    own = classes[0].__module__
    family = {c.__module__ for cls in classes for c in cls.__mro__}
    found = {own} | {m for m in family if m.startswith("pflower.strategies.")}
    todo = list(found)
    while todo:
        for value in vars(sys.modules[todo.pop()]).values():
            name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", "")
            if (
                isinstance(name, str)
                and name.startswith("pflower.strategies.")
                and name not in found
            ):
                found.add(name)
                todo.append(name)
    return [
        Path(file)
        for module in sorted(found)
        if (file := getattr(sys.modules.get(module), "__file__", None))
    ]


def algorithm_of(options: AlgorithmOptions) -> Algorithm:
    """The registered algorithm whose options ``options`` are."""
    return get_algorithm(options.config_name)


def options_from_block(block: Mapping[str, Any]) -> AlgorithmOptions:
    """The validated options object of a ``strategy`` block (e.g. read back from a run's
    ``config.yaml``); raises [`ConfigError`][pflower.registry.ConfigError] for unknown names or
    keys."""
    options_class = get_algorithm(str(block.get("name"))).options
    check_keys(options_class, block)
    options = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(options_class), dict(block)))
    assert isinstance(options, AlgorithmOptions)
    return options
