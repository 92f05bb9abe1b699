"""The structured configs of the named config groups: ``dataset``, ``partition``, ``model``.

Each registered dataset loader, partition scheme and model has one dataclass in this package
([`datasets`][pflower.blocks.datasets], [`partitions`][pflower.blocks.partitions],
[`models`][pflower.blocks.models]), stored in Hydra's ConfigStore as ``<group>/<name>``
([`store_blocks`][pflower.blocks.store_blocks]): its fields are the config keys of
``dataset=<name>`` (``partition=<name>``,
``model=<name>``), with their types, defaults and help text (the class's ``Attributes:``
docstring), and its ``__post_init__`` rejects values out of range with
[`ConfigError`][pflower.registry.ConfigError]. ``conf/<group>/*.yaml`` holds only named presets that
change some of these defaults (none today): Hydra composes ``dataset=mnist`` from the stored node
alone.

The keys are the keyword arguments of the factory registered under the same name
(`pflower.datasets.loaders.DATASETS`,
[`pflower.datasets.partitioners.base.PARTITIONERS`][pflower.datasets.partitioners.base.PARTITIONERS],
`pflower.models.MODELS`) minus those the caller supplies (``num_partitions``/``seed`` of a
partition scheme, ``input_shape``/``num_classes`` of a model); ``tests/test_config_schema.py``
checks that names and defaults agree with the factories' signatures. This module imports no
torch, Flower or dataset code, so a configuration can be checked before any of them is loaded.

The ``split`` group's schema is
[`pflower.datasets.split.SplitConfig`][pflower.datasets.split.SplitConfig] and the ``backend``
group's [`pflower.config.BackendConfig`][pflower.config.BackendConfig]; both are stored here too.
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Any

from pflower.blocks.base import Block
from pflower.blocks.datasets import DatasetBlock
from pflower.blocks.models import ModelBlock
from pflower.blocks.partitions import PartitionBlock
from pflower.config import (
    AttackConfig,
    AttackKind,
    BackendConfig,
    ExperimentConfig,
    RobustConfig,
    RobustKind,
    TrackingConfig,
    TrackingKind,
    plain,
    require,
)

__all__ = [
    "BACKENDS",
    "BLOCK_GROUPS",
    "SCHEMA_NAME",
    "Block",
    "DatasetBlock",
    "ModelBlock",
    "PartitionBlock",
    "block_class",
    "block_of",
    "blocks",
    "store_blocks",
    "typed_settings",
]


# ----------------------------------------------------------------------------------------------
# the ConfigStore


def _subclasses(base: type[Block]) -> list[type[Block]]:
    found: list[type[Block]] = []
    for child in base.__subclasses__():
        if child.config_name:
            found.append(child)
        found.extend(_subclasses(child))
    return found


def blocks(group: str) -> dict[str, type[Block]]:
    """The registered block classes of ``group`` (``dataset``, ``partition``, ``model``) by name."""
    base = {"dataset": DatasetBlock, "partition": PartitionBlock, "model": ModelBlock}[group]
    return {child.config_name: child for child in _subclasses(base)}


SCHEMA_NAME = "pflower_schema"
"""The ConfigStore name of the run-level schema that ``conf/config.yaml`` extends."""

BLOCK_GROUPS = ("dataset", "partition", "model")
"""The groups whose blocks are chosen by name and built by a registered factory."""

BACKENDS = ("fork", "ray")
"""The stored backends (``backend=ray_cluster`` is a preset of ``ray`` in ``conf/backend``)."""


def block_class(group: str, name: str) -> type[Block]:
    """The block class of ``<group>=<name>``.

    Raises:
        ConfigError: an unknown name (the message lists the valid ones).
    """
    classes = blocks(group)
    require(name in classes, f"Unknown {group} '{name}'. Valid names: {', '.join(sorted(classes))}")
    return classes[name]


def block_of(group: str, options: Any) -> Block:
    """The typed block of a plain ``{name: ..., key: value}`` mapping (checks run here)."""
    values = dict(options)
    return block_class(group, str(values["name"]))(**values)


def typed_settings(cfg: Any) -> ExperimentConfig:
    """The [`ExperimentConfig`][pflower.config.ExperimentConfig] of a composed configuration: every
    dataclass built (its ``__post_init__`` checks run), the named blocks and ``split`` then turned
    into plain mappings (``{name: ..., key: value}``), as the rest of pflower reads them."""
    from omegaconf import OmegaConf

    settings = OmegaConf.to_object(cfg)
    assert isinstance(settings, ExperimentConfig)
    for group in (*BLOCK_GROUPS, "split"):
        block = getattr(settings, group)
        if is_dataclass(block) and not isinstance(block, type):
            setattr(settings, group, plain(asdict(block)))
    return settings


def store_blocks() -> None:
    """Store the run-level schema (``pflower_schema``, which ``conf/config.yaml`` extends), every
    block, the split schema, the backends, the trackers, the attacks and the robust aggregators
    in the ConfigStore (the algorithms store their own options when they are registered)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from pflower.datasets.split import SplitConfig

    store = ConfigStore.instance()
    stored = store.repo.get(f"{SCHEMA_NAME}.yaml")
    if stored is not None and OmegaConf.get_type(stored.node) is ExperimentConfig:
        return  # stored once per import of pflower (the check before imports may have done it)
    for attack in AttackKind:
        store.store(group="attack", name=attack.value, node=AttackConfig(attack))
    for robust in RobustKind:
        store.store(group="robust", name=robust.value, node=RobustConfig(robust))
    for group in BLOCK_GROUPS:
        for name, cls in blocks(group).items():
            store.store(group=group, name=name, node=cls(name=name))
    store.store(group="split", name="default", node=SplitConfig)
    for backend in BACKENDS:
        store.store(group="backend", name=backend, node=BackendConfig(name=backend))
    for tracker in TrackingKind:
        store.store(group="tracking", name=tracker.value, node=TrackingConfig(name=tracker))
    store.store(name=SCHEMA_NAME, node=ExperimentConfig)  # last: marks the rest as stored
