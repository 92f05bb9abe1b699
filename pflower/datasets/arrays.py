"""In-memory datasets from arrays: the common end of the loaders for data a user brings (LEAF
JSON, image folders, tables, Hugging Face datasets).

Those formats have no fixed size or published statistics, so the loaders decode them into numpy
arrays and `dataset_from_arrays` makes the `ImageDataset`: float32 samples kept in
memory (like ``digits``; decoded once per process, so meant for the small and cross-silo data
these formats usually hold), labels, optional group ids (the writer, user or client each sample
belongs to, which ``partition=natural`` turns into clients), and a per-channel normalization
that defaults to the train split's statistics.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from numpy.typing import ArrayLike

from pflower.datasets.base import ImageDataset, ImageSplit
from pflower.datasets.sources import Stats, resolve_stats
from pflower.registry import ConfigError


def split_of(samples: ArrayLike, labels: ArrayLike, groups: ArrayLike | None = None) -> ImageSplit:
    """An `ImageSplit` of float32 ``samples`` ``(N, C, H, W)``, labels and group ids."""
    return ImageSplit(
        torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32)),
        torch.from_numpy(np.asarray(labels, dtype=np.int64)),
        None if groups is None else torch.from_numpy(np.asarray(groups, dtype=np.int64)),
    )


def check_splits(
    name: str, train: ImageSplit, test: ImageSplit, num_classes: int, fix: str
) -> None:
    """Refuse an empty train split, or a label outside ``0..num_classes - 1`` (``fix`` says how
    to mend it)."""
    if not len(train):
        raise ConfigError(f"dataset '{name}' has no training samples")
    for split in (train, test):
        if len(split) and not 0 <= int(split.labels.min()) <= int(split.labels.max()) < num_classes:
            raise ConfigError(f"dataset '{name}' has labels outside 0..{num_classes - 1}: {fix}")


def dataset_from_arrays(
    name: str,
    train: ImageSplit,
    test: ImageSplit,
    num_classes: int,
    mean: Stats = None,
    std: Stats = None,
) -> ImageDataset:
    """The dataset of two splits of float samples, normalized per channel with ``mean``/``std``
    (default: the train split's per-channel mean and std; a constant channel gets std 1).

    Raises:
        ConfigError: an empty train split, or a label outside ``0..num_classes - 1``.
    """
    check_splits(name, train, test, num_classes, "set dataset.num_classes to the number of classes")
    channels = train.images.transpose(0, 1).reshape(train.images.shape[1], -1).double()
    default_std = channels.std(dim=1)
    default_std[default_std == 0] = 1.0
    return ImageDataset(
        name=name,
        train=train,
        test=test,
        num_classes=num_classes,
        mean=resolve_stats(mean, _floats(channels.mean(dim=1)), "mean"),
        std=resolve_stats(std, _floats(default_std), "std"),
        scale=1.0,
    )


def _floats(values: torch.Tensor) -> tuple[float, ...]:
    return tuple(float(value) for value in values)


def index_of(values: Sequence[object]) -> dict[object, int]:
    """Each distinct value's position in the sorted distinct values (class or group ids; mixed
    types sort by their text)."""
    distinct = set(values)
    try:
        ordered = sorted(distinct)  # type: ignore[type-var]
    except TypeError:
        ordered = sorted(distinct, key=str)
    return {value: position for position, value in enumerate(ordered)}
