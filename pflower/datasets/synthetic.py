"""A seeded synthetic image classification set, for tests and demos that must not touch the disk.

Every class ``c`` has a prototype image ``p_c`` with i.i.d. standard normal pixels; a sample of
class ``c`` is ``(p_c + noise * e) / sqrt(1 + noise**2)`` with ``e`` standard normal, so pixels have
mean 0 and variance 1 across the dataset (the default normalization is then the identity). The
classes are linearly separable in expectation, so even a small model beats chance within a few
steps; ``noise`` makes the task harder. Labels are balanced (``i mod num_classes``, shuffled).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from pflower.datasets.base import ImageDataset, ImageSplit
from pflower.datasets.sources import Stats, resolve_stats
from pflower.registry import ConfigError


def load_synthetic(
    image_shape: Sequence[int] = (1, 16, 16),
    num_classes: int = 10,
    num_train: int = 2000,
    num_test: int = 500,
    noise: float = 1.0,
    seed: int = 0,
    mean: Stats = None,
    std: Stats = None,
) -> ImageDataset:
    """A float32 dataset of ``num_train`` / ``num_test`` images of shape ``image_shape`` (C, H, W).

    Args:
        image_shape: ``(C, H, W)`` of one image.
        num_classes: number of classes (at least 2).
        num_train, num_test: split sizes.
        noise: standard deviation of the per-sample noise relative to the prototypes'.
        seed: generator seed; the same options always give the same tensors.
        mean, std: normalization; default 0 / 1 per channel (the data is already standardized).
    """
    shape = _check(image_shape, num_classes, num_train, num_test, noise)
    rng = np.random.default_rng(seed)
    prototypes = rng.standard_normal((num_classes, *shape)).astype(np.float32)
    train = _sample(rng, prototypes, num_train, noise)
    test = _sample(rng, prototypes, num_test, noise)
    channels = shape[0]
    return ImageDataset(
        name="synthetic",
        train=train,
        test=test,
        num_classes=num_classes,
        mean=resolve_stats(mean, (0.0,) * channels, "mean"),
        std=resolve_stats(std, (1.0,) * channels, "std"),
        scale=1.0,
    )


def _sample(
    rng: np.random.Generator, prototypes: np.ndarray, count: int, noise: float
) -> ImageSplit:
    num_classes = prototypes.shape[0]
    labels = rng.permutation(np.arange(count) % num_classes)
    noise_draw = rng.standard_normal((count, *prototypes.shape[1:])).astype(np.float32)
    images = (prototypes[labels] + noise * noise_draw) / np.float32(math.sqrt(1 + noise**2))
    return ImageSplit(torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64)))


def _check(
    image_shape: Sequence[int], num_classes: int, num_train: int, num_test: int, noise: float
) -> tuple[int, int, int]:
    shape = tuple(int(size) for size in image_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ConfigError(f"dataset option 'image_shape' must be [C, H, W], got {image_shape!r}")
    if num_classes < 2:
        raise ConfigError(f"dataset option 'num_classes' must be at least 2, got {num_classes}")
    if num_train < 1 or num_test < 1:
        raise ConfigError("dataset options 'num_train' and 'num_test' must be positive")
    if noise < 0:
        raise ConfigError(f"dataset option 'noise' must be non-negative, got {noise}")
    return shape[0], shape[1], shape[2]
