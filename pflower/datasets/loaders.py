"""Dataset loaders by config name, and the cached entry point the rest of pflower calls.

A ``dataset`` block is ``{name: <registered name>, <option>: <value>, ...}``; its options are the
keyword arguments of the loader registered under that name, declared with their types and
defaults by the block's dataclass ([`pflower.blocks`][pflower.blocks]), which rejects a misspelt
option with the
list of valid ones while composing. Every loader returns an
[`ImageDataset`][pflower.datasets.base.ImageDataset] with the official train/test split in stored
dtype and its default
normalization (overridable with ``mean``/``std``).

============== ============================================== =====================
name           source                                         loader
============== ============================================== =====================
digits         scikit-learn's bundled 8x8 digits              `load_digits`
synthetic      seeded class prototypes plus noise             `load_synthetic`
mnist          original IDX .gz files                         `load_mnist`
fmnist         original IDX .gz files                         `load_fmnist`
cifar10        cifar-10-batches-py pickles                    `load_cifar10`
cifar100       cifar-100-python pickles (fine labels)         `load_cifar100`
svhn           train_32x32.mat / test_32x32.mat               `load_svhn`
celeba_gender  img_align_celeba + attribute/partition lists   `load_celeba_gender`
leaf           LEAF JSON (FEMNIST), users as groups           `load_leaf`
image_folder   image files, one folder per class (and client) `load_image_folder`
table          CSV or Parquet rows with a label column        `load_table`
hf             Hugging Face data via Flower Datasets          `load_hf`
============== ============================================== =====================

The file-backed datasets are decoded once per machine into the dataset cache and memory-mapped
from it ([`pflower.datasets.cache`][pflower.datasets.cache]: ``$PFLOWER_CACHE``, default
``~/.cache/pflower/arrays``),
so every worker process shares one copy of the images.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from pflower.datasets.base import ImageDataset, resolve_data_root
from pflower.datasets.celeba import load_celeba_gender
from pflower.datasets.cifar import load_cifar10, load_cifar100
from pflower.datasets.digits import load_digits
from pflower.datasets.folders import load_image_folder
from pflower.datasets.hf import load_hf
from pflower.datasets.idx import load_fmnist, load_mnist
from pflower.datasets.leaf import load_leaf
from pflower.datasets.svhn import load_svhn
from pflower.datasets.synthetic import load_synthetic
from pflower.datasets.table import load_table
from pflower.registry import ConfigError, Registry

DATASETS: Registry[ImageDataset] = Registry("dataset")
_LOADERS: dict[str, Callable[..., ImageDataset]] = {
    "digits": load_digits,
    "synthetic": load_synthetic,
    "mnist": load_mnist,
    "fmnist": load_fmnist,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "svhn": load_svhn,
    "celeba_gender": load_celeba_gender,
    "leaf": load_leaf,
    "image_folder": load_image_folder,
    "table": load_table,
    "hf": load_hf,
}
for _name, _loader in _LOADERS.items():
    DATASETS.register(_name)(_loader)

_CACHE_SIZE = 4
"""Datasets kept per process; a run uses one, sweeps in one process rarely more than a few."""


def load_dataset(name: str, options: Mapping[str, Any]) -> ImageDataset:
    """The dataset registered as ``name`` built with ``options``, cached per process.

    Clients call this on every Flower message, so equal arguments return the same object
    (do not modify its tensors in place). List values, e.g. Hydra ``ListConfig``, become tuples.
    For a loader that reads files, ``root`` is resolved first
    ([`resolve_data_root`][pflower.datasets.base.resolve_data_root]), so the
    cache is keyed by the absolute folder actually read: a relative root, a changed
    ``$PFLOWER_DATA`` or another working directory never returns another folder's dataset.

    Raises:
        ConfigError: unknown name, unknown option, or an invalid option value.
        DatasetNotFoundError: the dataset's files are missing.
        CorruptDatasetError: a file has the wrong checksum or format.
    """
    options = _with_resolved_root(name, options)
    frozen = tuple(sorted((str(key), _freeze(key, value)) for key, value in options.items()))
    return _load_cached(name, frozen)


def _with_resolved_root(name: str, options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``options`` with ``root`` made absolute, for loaders that take a ``root``."""
    if "root" not in DATASETS.accepted_keys(name):
        return options
    return {**options, "root": str(resolve_data_root(options.get("root")))}


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _load_cached(name: str, options: tuple[tuple[str, Hashable], ...]) -> ImageDataset:
    return DATASETS.build(name, dict(options))


def _freeze(key: Any, value: Any) -> Hashable:
    """A hashable copy of an option value: sequences become tuples."""
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return tuple(_freeze(key, item) for item in value)
    if isinstance(value, Hashable):
        return value
    raise ConfigError(f"dataset option '{key}' must be a number, string or list, got {value!r}")
