"""The public API: what a method, dataset, model or partitioner needs, from one stable module.

Code outside pflower imports from here, and only from here; these names keep their meaning
across releases (``tests/test_plugins.py`` fails when one disappears). pflower's own algorithms
register through the same names.

A method (a FedAvg variant whose clients shrink their update; two classes and an options
dataclass, the same shape as every algorithm in [`pflower.strategies`][pflower.strategies])::

    from dataclasses import dataclass
    from typing import ClassVar

    from pflower.api import (
        AlgorithmOptions, PersonalClient, PersonalizedStrategy, register_algorithm, tunable,
    )

    class ShrinkStrategy(PersonalizedStrategy["ShrinkOptions"]):
        "Averages as FedAvg does."

    class ShrinkClient(PersonalClient["ShrinkOptions"]): ...

    @register_algorithm("shrink_avg", strategy=ShrinkStrategy, client=ShrinkClient)
    @dataclass
    class ShrinkOptions(AlgorithmOptions):
        display_name: ClassVar[str] = "ShrinkAvg"
        factor: float = tunable(1.0, low=0.1, high=1.0, source="my paper, Sec. 3")

A dataset, model or partition scheme is a factory (a loader returning an `ImageDataset`
of two `ImageSplit`,
a function returning a ``torch.nn.Module``, a function returning a Flower Datasets
``Partitioner``, typically an `IndexPartitioner`) and the config block that declares its
options (a dataclass subclass of `DatasetBlock`, `ModelBlock` or
`PartitionBlock` whose fields are the factory's keyword arguments)::

    @dataclass
    class TinyMlpBlock(ModelBlock):
        hidden: int = 32

    @register_model("tiny_mlp", TinyMlpBlock)
    def tiny_mlp(input_shape, num_classes, hidden=32): ...

Each ``register_*`` enters the block (or the options) into Hydra's ConfigStore, so that
``dataset=<name>``, ``model=<name>``, ``partition=<name>`` and ``strategy=<name>`` select it with no
YAML file, and records the factory under the name; a name registered twice is an error.

Put the module on the Python path and name it in ``PFLOWER_PLUGINS``, or install it with an entry
point in the group ``pflower.plugins``: every pflower process then imports it
([`pflower.plugins`][pflower.plugins]). The tutorials "Adding an algorithm" and "Rank your method
against the tuned baselines" walk through both.

`IndexPartitioner` is imported on first use (it comes with Flower Datasets, which a run
that reads a cached federation never loads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from hydra.core.config_store import ConfigStore

from pflower.blocks import Block, DatasetBlock, ModelBlock, PartitionBlock
from pflower.config import require
from pflower.core.algorithm import register_algorithm
from pflower.core.client import PersonalClient
from pflower.core.options import AlgorithmOptions, Collapse
from pflower.core.strategy import PersonalizedStrategy
from pflower.core.training import Regularizer
from pflower.datasets.base import ImageDataset, ImageSplit
from pflower.registry import ConfigError, Registry
from pflower.searchspace import tunable

if TYPE_CHECKING:
    from pflower.datasets.partitioners.base import IndexPartitioner

__all__ = [
    "AlgorithmOptions",
    "Collapse",
    "ConfigError",
    "DatasetBlock",
    "ImageDataset",
    "ImageSplit",
    "IndexPartitioner",
    "ModelBlock",
    "PartitionBlock",
    "PersonalClient",
    "PersonalizedStrategy",
    "Regularizer",
    "register_algorithm",
    "register_dataset",
    "register_model",
    "register_partitioner",
    "require",
    "tunable",
]

FactoryT = TypeVar("FactoryT", bound=Callable[..., Any])


def __getattr__(name: str) -> Any:
    """`IndexPartitioner`, imported on first use (see the module docstring)."""
    if name == "IndexPartitioner":
        from pflower.datasets.partitioners.base import IndexPartitioner

        return IndexPartitioner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register_block(
    registry: Registry[Any], name: str, block: type[Block]
) -> Callable[[FactoryT], FactoryT]:
    """Register a factory in ``registry`` under ``name``, and ``block`` (its options) in the
    ConfigStore under ``<group>/<name>``."""

    def decorator(factory: FactoryT) -> FactoryT:
        registry.register(name)(factory)
        block.config_name = name
        ConfigStore.instance().store(group=block.group(), name=name, node=block(name=name))
        return factory

    return decorator


def register_dataset(name: str, block: type[DatasetBlock]) -> Callable[[FactoryT], FactoryT]:
    """Decorator on a loader ``(**options) -> ImageDataset``: ``dataset=<name>`` chooses it,
    with the options ``block`` declares (its ``data_shape()`` gives the images' shape and class
    count from the options, before anything is loaded)."""
    from pflower.datasets.loaders import DATASETS

    return _register_block(DATASETS, name, block)


def register_model(name: str, block: type[ModelBlock]) -> Callable[[FactoryT], FactoryT]:
    """Decorator on a model factory ``(input_shape, num_classes, **options) -> nn.Module``:
    ``model=<name>`` chooses it, with the options ``block`` declares. The classification layer
    is the ``nn.Linear`` attribute ``fc`` ([`pflower.models.split`][pflower.models.split]). A
    factory with a ``vocab_size`` parameter reads token ids and is built only for text datasets
    ([`pflower.datasets.text`][pflower.datasets.text]), every other one only for images."""
    from pflower.models.zoo import MODELS

    return _register_block(MODELS, name, block)


def register_partitioner(name: str, block: type[PartitionBlock]) -> Callable[[FactoryT], FactoryT]:
    """Decorator on a scheme factory ``(num_partitions, seed, **options) -> Partitioner``:
    ``partition=<name>`` chooses it, with the options ``block`` declares."""
    from pflower.datasets.partitioners.base import PARTITIONERS

    return _register_block(PARTITIONERS, name, block)
