"""scikit-learn's bundled 8x8 handwritten digits: a real image dataset that needs no download.

1,797 grayscale images with values 0..16 (``scale=16``), 10 classes, from the UCI "Optical
Recognition of Handwritten Digits" test set. It has no official train/test split, so the loader
makes a fixed stratified one: per class, a seeded permutation (``numpy.random.default_rng(0)``)
sends ``round(0.2 * n_class)`` images to the test split (359 images) and the rest to train (1,438).
The split never changes with the experiment seed, so every run sees the same test set.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from pflower.datasets.base import ImageDataset, ImageSplit
from pflower.datasets.sources import Stats, resolve_stats
from pflower.registry import ConfigError

_SPLIT_SEED = 0
_TEST_FRACTION = 0.2
_SCALE = 16.0


def load_digits(image_size: int = 8, mean: Stats = None, std: Stats = None) -> ImageDataset:
    """The sklearn digits as float32 images ``1 x image_size x image_size`` with values 0..16.

    Args:
        image_size: side length; sizes above 8 upsample bilinearly (e.g. 28 for MNIST models).
        mean, std: normalization; default: the train split's pixel mean and std (digits have
            no published statistics).
    """
    if image_size < 1:
        raise ConfigError(f"dataset option 'image_size' must be positive, got {image_size}")
    from sklearn.datasets import load_digits  # scikit-learn only for this dataset

    bunch = load_digits()
    images = _resize(torch.from_numpy(bunch.images.astype(np.float32)).unsqueeze(1), image_size)
    labels = torch.from_numpy(bunch.target.astype(np.int64))
    test_mask = stratified_test_mask(bunch.target, _TEST_FRACTION, _SPLIT_SEED)
    train = ImageSplit(images[~test_mask], labels[~test_mask])
    test = ImageSplit(images[test_mask], labels[test_mask])
    pixels = train.images / _SCALE
    return ImageDataset(
        name="digits",
        train=train,
        test=test,
        num_classes=10,
        mean=resolve_stats(mean, (float(pixels.mean()),), "mean"),
        std=resolve_stats(std, (float(pixels.std()),), "std"),
        scale=_SCALE,
    )


def stratified_test_mask(labels: np.ndarray, fraction: float, seed: int) -> torch.Tensor:
    """A boolean mask selecting ``round(fraction * n_c)`` random samples of every class ``c``."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        mask[members[: round(fraction * len(members))]] = True
    return torch.from_numpy(mask)


def _resize(images: torch.Tensor, size: int) -> torch.Tensor:
    if images.shape[-1] == size:
        return images
    return F.interpolate(
        images, size=(size, size), mode="bilinear", align_corners=False, antialias=True
    )
