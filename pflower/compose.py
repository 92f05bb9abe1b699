"""Compose and validate the experiment configuration, the same way in every process.

One Hydra tree (``conf/``) over one schema describes every experiment: the run-level dataclasses
of [`pflower.config`][pflower.config] (stored as ``pflower_schema``, which ``conf/config.yaml``
extends) and
each algorithm's options dataclass (stored as ``strategy/<name>`` when
[`pflower.strategies`][pflower.strategies]
is imported). ``pflower`` composes the tree with ``@hydra.main``; the Flower apps compose it from
the Hydra overrides carried in Flower's run config under the key
[`RUN_CONFIG_KEY`][pflower.config.RUN_CONFIG_KEY], so ``pflower ...``, ``flwr run .`` and a
deployment run the
same experiment.

Validation happens once, here, for every block: Hydra checks keys and types against the schema;
[`validate`][pflower.compose.validate] builds the typed
[`ExperimentConfig`][pflower.config.ExperimentConfig] (whose
``__post_init__`` methods check ranges), rejects keys an algorithm does not have, and checks the
dataset, partition, split and model blocks against their factories.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import fields
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import pflower.strategies  # noqa: F401  (importing registers every algorithm's options)
from pflower.blocks import (
    BLOCK_GROUPS,
    DatasetBlock,
    PartitionBlock,
    block_class,
    block_of,
    blocks,
    store_blocks,
    typed_settings,
)
from pflower.config import (
    ExperimentConfig,
    RunRecord,
    conf_dir,
    overrides_from_run_config,
)
from pflower.core.algorithm import algorithm_of, get_algorithm
from pflower.core.options import check_keys
from pflower.quickcheck import explain_composition_error
from pflower.registry import ConfigError

store_blocks()  # the schema, dataset=, partition=, model=, split=, backend=, tracking=, ...


def compose_config(overrides: Sequence[str] = (), *, check_scheme: bool = True) -> DictConfig:
    """Compose ``conf/config.yaml`` with Hydra ``overrides`` and validate the result.

    Works both inside ``@hydra.main`` (Hydra already initialized on our tree) and in a fresh process
    such as a Ray worker or a SuperNode's ClientApp. ``check_scheme``: see
    [`validate`][pflower.compose.validate].

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


def settings_of(cfg: DictConfig) -> ExperimentConfig:
    """The typed settings of a composed configuration (range checks run here)."""
    try:
        return typed_settings(cfg)
    except OmegaConfBaseException as error:
        raise ConfigError(str(error)) from error


def validate(cfg: DictConfig, *, check_scheme: bool = True) -> ExperimentConfig:
    """Check every block of a composed configuration; returns its typed settings.

    Keys and types were checked by Hydra against the structured configs
    ([`pflower.config`][pflower.config],
    [`pflower.blocks`][pflower.blocks], the algorithm's options); building the typed settings runs
    every
    dataclass's ``__post_init__`` range checks; then
    [`check_compatible`][pflower.compose.check_compatible] refuses
    combinations of blocks that cannot work. ``check_scheme`` is kept for callers: the
    partition's keys and values are checked without importing the schemes either way.

    Raises:
        ConfigError: what is wrong and what is allowed.
    """
    del check_scheme
    strategy = _block(cfg, "strategy")
    check_keys(get_algorithm(str(strategy.get("name"))).options, strategy)
    for group in BLOCK_GROUPS:
        _check_block_keys(group, _block(cfg, group))
    settings = settings_of(cfg)
    check_compatible(settings)
    return settings


def _check_block_keys(group: str, block: Mapping[str, Any]) -> None:
    """Refuse keys a block's dataclass does not have (Hydra lets ``+<group>.<key>=`` add one)."""
    allowed = [f.name for f in fields(block_class(group, str(block["name"])))]
    unknown = sorted(set(block) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{group} '{block['name']}' does not take {', '.join(map(repr, unknown))}. "
            f"Allowed keys: {', '.join(key for key in allowed if key != 'name')}"
        )


def check_compatible(settings: ExperimentConfig) -> None:
    """Refuse, while composing, what only fails later: a model that cannot take the dataset's
    images, an algorithm that cannot run with the chosen model, partition or optimizer (each
    algorithm's [`check_experiment`][pflower.core.options.AlgorithmOptions.check_experiment]), and a
    robust aggregator that cannot act on the clients the algorithm aggregates per round
    ([`idle_robust`][pflower.core.hooks.StrategyHooks.idle_robust]; what it only warns
    about, the server logs).

    The model is built once per (model, input shape) on PyTorch's ``meta`` device: no memory,
    no initialization cost, the same code path as the real build.

    Raises:
        ConfigError: the combination and how to change it.
    """
    model = meta_model(settings.dataset, settings.model)
    _check_text(settings)
    settings.strategy.check_experiment(settings, model)
    idle_robust = algorithm_of(settings.strategy).strategy.idle_robust(settings)
    if idle_robust is not None and idle_robust.refused:
        raise ConfigError(idle_robust.reason)
    base = settings.strategy.collapse_on(model)
    if base is not None:
        _warn_collapse(settings.strategy.label(), str(settings.model["name"]), base)


def _check_text(settings: ExperimentConfig) -> None:
    """Refuse what acts on pixels for a text dataset (token ids): image augmentation
    (``train.augment``) and per-client input noise (``partition=quality_skew``)."""
    block = block_of("dataset", settings.dataset)
    assert isinstance(block, DatasetBlock)
    if not block.vocabulary_size():
        return
    augment = settings.train.augment
    if augment.rotation or augment.hflip or augment.vflip:
        raise ConfigError(
            "train.augment rotates and flips images, but the dataset holds token sequences "
            "(text): drop the train.augment.* overrides"
        )
    scheme = blocks("partition")[str(settings.partition["name"])]
    if issubclass(scheme, PartitionBlock) and scheme.input_noise:
        raise ConfigError(
            f"partition={settings.partition['name']} adds noise to every client's inputs, which "
            "token sequences (text) do not have: choose another partition scheme"
        )


@lru_cache(maxsize=16)
def _warn_collapse(method: str, model: str, base: str) -> None:
    """One line, once per process, where the algorithm is another method on this model
    ([`collapse_on`][pflower.core.options.AlgorithmOptions.collapse_on])."""
    name = get_algorithm(base).options.display_name
    logging.getLogger("pflower").warning(
        "%s on model=%s is %s: the model has none of the layers %s treats apart, so the run "
        "computes what strategy=%s computes",
        method,
        model,
        name,
        method,
        base,
    )


def meta_model(dataset: Mapping[str, Any], model: Mapping[str, Any]) -> Any:
    """The model of the ``model`` block for the ``dataset`` block's images, built on PyTorch's
    ``meta`` device (types and shapes only; cached per model and input shape)."""
    block = block_of("dataset", dataset)
    assert isinstance(block, DatasetBlock)
    input_shape, num_classes = block.data_shape()
    return _meta_model(_frozen(model), input_shape, num_classes, block.vocabulary_size())


def _frozen(block: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(
        (key, tuple(value) if isinstance(value, list) else value) for key, value in block.items()
    )


@lru_cache(maxsize=64)
def _meta_model(
    block: tuple[tuple[str, Any], ...],
    input_shape: tuple[int, int, int],
    num_classes: int,
    vocab_size: int,
) -> Any:
    import torch

    from pflower.models import build_model

    options = dict(block)
    name = str(options.pop("name"))
    with torch.device("meta"):
        return build_model(name, options, input_shape, num_classes, vocab_size)


def _block(cfg: DictConfig, key: str) -> Mapping[str, Any]:
    block = OmegaConf.to_container(cfg[key], resolve=True, enum_to_str=True)
    if not isinstance(block, dict) or ("name" not in block and key != "split"):
        raise ConfigError(f"the '{key}' block needs a name: choose one with {key}=<name>")
    return cast(dict[str, Any], block)


def config_from_run_config(run_config: Mapping[str, Any]) -> DictConfig:
    """The experiment configuration that a Flower run config describes (cached per process:
    Flower builds a client for every message, and composing takes tens of milliseconds).

    The partition's keys and values are checked without importing the schemes (as
    [`validate`][pflower.compose.validate] always does); the apps' processes read their
    federation from the cache where they can, and building it checks the scheme."""
    return _compose_cached(tuple(overrides_from_run_config(run_config)))


@lru_cache(maxsize=8)
def _compose_cached(overrides: tuple[str, ...]) -> DictConfig:
    cfg = compose_config(overrides, check_scheme=False)
    OmegaConf.set_readonly(cfg, True)
    if overrides not in _COMPOSED:
        _COMPOSED.append(overrides)
    return cfg


_COMPOSED: list[tuple[str, ...]] = []
"""The overrides [`config_from_run_config`][pflower.compose.config_from_run_config] composed in this
process, oldest first."""


def composed_overrides() -> list[tuple[str, ...]]:
    """The overrides [`config_from_run_config`][pflower.compose.config_from_run_config] composed in
    this process (what the
    deployment's fork server composes ahead for the ClientApp tasks it forks)."""
    return list(_COMPOSED)


def warm_config(overrides: Sequence[str]) -> DictConfig:
    """Compose ``overrides`` into this process's cache of
    [`config_from_run_config`][pflower.compose.config_from_run_config]; the
    configuration composed."""
    return _compose_cached(tuple(overrides))


def compose_record(
    overrides: Sequence[str], *, run_dir: Path | None = None, resume: bool | None = None
) -> RunRecord:
    """The run that Hydra ``overrides`` describe, composed (into this process's cache, where
    the ServerApp of a run in this process finds it). ``run_dir`` and ``resume``, where given,
    replace the overrides' ``output_dir`` and ``checkpoint.resume``
    ([`RunRecord.from_overrides`][pflower.config.record.RunRecord.from_overrides]).

    Raises:
        ConfigError: the overrides do not compose.
    """
    record = RunRecord.from_overrides(overrides, run_dir=run_dir, resume=resume)
    return record.with_config(warm_config(record.to_overrides()))


def record_from_run_config(run_config: Mapping[str, Any]) -> RunRecord:
    """The run that a Flower run config carries, composed as
    [`config_from_run_config`][pflower.compose.config_from_run_config] composes it."""
    return RunRecord.from_run_config(run_config, warm_config)


def group_options(group: str) -> list[str]:
    """Every option of config group ``group``: those stored in the ConfigStore (every dataset,
    partition scheme, model, algorithm, ...) and the presets in ``conf/<group>/``, sorted.

    ``conf/strategy/`` holds only presets (e.g. ``fliu25``); the 33 algorithms themselves are
    stored from their options dataclasses. ``pflower --help-config`` lists them all as well.
    """
    stored = ConfigStore.instance().repo.get(group, {})
    names = {name.removesuffix(".yaml") for name in stored if not isinstance(stored[name], dict)}
    names |= {path.stem for path in (conf_dir() / group).glob("*.yaml")}
    return sorted(names)


def group_block(group: str, name: str) -> dict[str, Any]:
    """The block that ``<group>=<name>`` composes (its dataclass's defaults with a preset's
    changes), as plain values; unchecked, a required key left ``???``. Composed once per
    process (a whole Hydra composition, about 0.15 s); each call returns its own copy."""
    return copy.deepcopy(_group_block(group, name))


@lru_cache(maxsize=256)
def _group_block(group: str, name: str) -> dict[str, Any]:
    overrides = [f"{group}={name}"]
    if GlobalHydra.instance().is_initialized():
        cfg = compose(config_name="config", overrides=overrides)
    else:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            cfg = compose(config_name="config", overrides=overrides)
    block = OmegaConf.to_container(cfg[group], resolve=False, enum_to_str=True)
    assert isinstance(block, dict)
    return {str(key): value for key, value in block.items()}
