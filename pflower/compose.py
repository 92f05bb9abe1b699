"""Compose and validate the experiment configuration, the same way in every process.

One Hydra tree (``conf/``) over one schema describes every experiment: the run-level dataclasses
of :mod:`pflower.config` (stored as ``pflower_schema``, which ``conf/config.yaml`` extends) and
each algorithm's options dataclass (stored as ``strategy/<name>`` when :mod:`pflower.strategies`
is imported). ``pflower`` composes the tree with ``@hydra.main``; the Flower apps compose it from
the Hydra overrides carried in Flower's run config under the key
:data:`~pflower.config.RUN_CONFIG_KEY`, so ``pflower ...``, ``flwr run .`` and a deployment run the
same experiment.

Validation happens once, here, for every block: Hydra checks keys and types against the schema;
:func:`validate` builds the typed :class:`~pflower.config.ExperimentConfig` (whose
``__post_init__`` methods check ranges), rejects keys an algorithm does not have, and checks the
dataset, partition, split and model blocks against their factories.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import fields, is_dataclass
from functools import lru_cache
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import pflower.strategies  # noqa: F401  (importing registers every algorithm's options)
from pflower.config import (
    AttackConfig,
    AttackKind,
    ExperimentConfig,
    RobustConfig,
    RobustKind,
    conf_dir,
    overrides_from_run_config,
)
from pflower.core.algorithm import get_algorithm
from pflower.core.options import check_keys
from pflower.datasets.loaders import DATASETS
from pflower.datasets.split import SplitConfig
from pflower.models import MODELS
from pflower.registry import ConfigError, Registry, name_and_options

SCHEMA_NAME = "pflower_schema"
"""The ConfigStore name of the run-level schema that ``conf/config.yaml`` extends."""

ConfigStore.instance().store(name=SCHEMA_NAME, node=ExperimentConfig)
for _attack in AttackKind:  # attack=<name>: the run-level attack group
    ConfigStore.instance().store(group="attack", name=_attack.value, node=AttackConfig(_attack))
for _robust in RobustKind:  # robust=<name>: the run-level robust-aggregation group
    ConfigStore.instance().store(group="robust", name=_robust.value, node=RobustConfig(_robust))

_MODEL_CONTEXT = ("input_shape", "num_classes")
_PARTITION_CONTEXT = ("num_partitions", "seed")
_NAMED_BLOCKS = ("dataset", "partition", "model")
"""Config blocks chosen by name whose keys are a factory's arguments (less those the caller
supplies, see :func:`_registry_of`)."""


def _registry_of(block: str) -> tuple[Registry[Any], tuple[str, ...]]:
    """The registry of a named block, and the factory arguments the caller supplies.

    The partition schemes are imported only here, when a partition block is checked or
    explained: they bring Flower Datasets (about 3 s and 200 MB per process).
    """
    if block == "partition":
        from pflower.datasets.partitioners.base import PARTITIONERS

        return PARTITIONERS, _PARTITION_CONTEXT
    return {"dataset": (DATASETS, ()), "model": (MODELS, _MODEL_CONTEXT)}[block]


def compose_config(overrides: Sequence[str] = (), *, check_scheme: bool = True) -> DictConfig:
    """Compose ``conf/config.yaml`` with Hydra ``overrides`` and validate the result.

    Works both inside ``@hydra.main`` (Hydra already initialized on our tree) and in a fresh process
    such as a Ray worker or a SuperNode's ClientApp. ``check_scheme``: see :func:`validate`.

    Raises:
        ConfigError: an unknown key, a value of the wrong type or out of range, an unknown name.
    """
    try:
        if GlobalHydra.instance().is_initialized():
            cfg = compose(config_name="config", overrides=list(overrides))
        else:
            with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
                cfg = compose(config_name="config", overrides=list(overrides))
    except HydraException as error:
        raise ConfigError(explain_composition_error(error)) from error
    validate(cfg, check_scheme=check_scheme)
    return cfg


def explain_composition_error(error: BaseException) -> str:
    """Hydra's message, plus the keys the block has when the cause is an unknown key."""
    cause = error.__cause__
    message = str(error)
    if isinstance(cause, OmegaConfBaseException) and cause.__cause__ is None:
        message = f"{message}\n{cause}"
    if not isinstance(cause, OmegaConfBaseException) or "not in" not in str(cause):
        return message
    message = re.sub(r"\nTo append to your config use \+\S*", "", message)
    object_type = cause.object_type
    block = str(cause.full_key).split(".")[0]
    if is_dataclass(object_type):
        allowed = [f.name for f in fields(object_type)]
    elif block in _NAMED_BLOCKS:
        registry, context = _registry_of(block)
        parent = getattr(cause, "parent_node", None)
        name = str(parent.get("name", "")) if isinstance(parent, DictConfig) else ""
        accepted = registry.accepted_keys(name) if name in registry.names else []
        allowed = [key for key in accepted if key not in context]
    else:
        return message
    return f"{message}\nAllowed keys: {', '.join(allowed)}"


def settings_of(cfg: DictConfig) -> ExperimentConfig:
    """The typed settings of a composed configuration (range checks run here)."""
    try:
        settings = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as error:
        raise ConfigError(str(error)) from error
    assert isinstance(settings, ExperimentConfig)
    return settings


def validate(cfg: DictConfig, *, check_scheme: bool = True) -> ExperimentConfig:
    """Check every block of a composed configuration; returns its typed settings.

    ``check_scheme=False`` leaves out the partition scheme's name and options: checking them
    imports every scheme (with Flower Datasets, about 3 s and 200 MB), which a process that reads
    its federation from the cache never needs. The federation builder checks them whenever it runs
    a scheme; the command line builds (or reads) the federation before a run starts.

    Raises:
        ConfigError: what is wrong and what is allowed.
    """
    strategy = _block(cfg, "strategy")
    check_keys(get_algorithm(str(strategy.get("name"))).options, strategy)
    settings = settings_of(cfg)
    for key in _NAMED_BLOCKS:
        if key != "partition" or check_scheme:
            registry, context = _registry_of(key)
            registry.check(*name_and_options(_block(cfg, key)), context=context)
    SplitConfig.from_mapping(_block(cfg, "split"))
    return settings


def _block(cfg: DictConfig, key: str) -> Mapping[str, Any]:
    block = OmegaConf.to_container(cfg[key], resolve=True, enum_to_str=True)
    if not isinstance(block, dict) or ("name" not in block and key != "split"):
        raise ConfigError(f"the '{key}' block needs a name: choose one with {key}=<name>")
    return block


def config_from_run_config(run_config: Mapping[str, Any]) -> DictConfig:
    """The experiment configuration that a Flower run config describes (cached per process:
    Flower builds a client for every message, and composing takes tens of milliseconds).

    The partition scheme is not checked here (``check_scheme=False``): the apps' processes read
    their federation from the cache where they can, and building it checks the scheme."""
    return _compose_cached(tuple(overrides_from_run_config(run_config)))


@lru_cache(maxsize=8)
def _compose_cached(overrides: tuple[str, ...]) -> DictConfig:
    cfg = compose_config(overrides, check_scheme=False)
    OmegaConf.set_readonly(cfg, True)
    if overrides not in _COMPOSED:
        _COMPOSED.append(overrides)
    return cfg


_COMPOSED: list[tuple[str, ...]] = []
"""The overrides :func:`config_from_run_config` composed in this process, oldest first."""


def composed_overrides() -> list[tuple[str, ...]]:
    """The overrides :func:`config_from_run_config` composed in this process (what the
    deployment's fork server composes ahead for the ClientApp tasks it forks)."""
    return list(_COMPOSED)


def warm_config(overrides: Sequence[str]) -> DictConfig:
    """Compose ``overrides`` into this process's cache of :func:`config_from_run_config`; the
    configuration composed."""
    return _compose_cached(tuple(overrides))
