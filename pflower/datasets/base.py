"""Core data containers shared by every loader, partitioner and client.

Images are kept as one tensor per split, in the dtype the files store them in (uint8 for MNIST,
CIFAR, SVHN, CelebA; float32 for generated data). Normalization is applied per batch by
[`ImageDataset.normalize`][pflower.datasets.base.ImageDataset.normalize], so a client indexes
tensors directly instead of running a per-sample
``Dataset.__getitem__``: that keeps the training loop close to a bare PyTorch loop in speed.

File-backed datasets are decoded once per machine into the dataset cache
([`pflower.datasets.cache`][pflower.datasets.cache]) and their split images are read-only memory
maps of it, shared by
every process; the generated ones (``digits``, ``synthetic``) are small and live in memory.
[`ImageSplit.subset`][pflower.datasets.base.ImageSplit.subset] always returns a writable copy, which
is what clients train on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are missing; the message says which files, where, and how to get them."""

    def __init__(self, name: str, root: Path, expected: list[str], how_to_obtain: str) -> None:
        files = "\n".join(f"  - {root / item}" for item in expected)
        super().__init__(
            f"Dataset '{name}' was not found under {root}.\n"
            f"Expected these files:\n{files}\n"
            f"How to obtain them: {how_to_obtain}\n"
            f"Set the data root with `dataset.root=/path` or the PFLOWER_DATA environment variable."
        )


@dataclass(frozen=True)
class ImageSplit:
    """One split of a dataset: images ``(N, C, H, W)`` as stored, and int64 labels ``(N,)``.

    ``groups`` optionally tags each sample with an int64 group id that some partitioners split by
    (CelebA-Gender: the index of the sample's active attribute; a writer id for feature skew).
    """

    images: torch.Tensor
    labels: torch.Tensor
    groups: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.images.ndim != 4:
            raise ValueError(f"images must have shape (N, C, H, W), got {tuple(self.images.shape)}")
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(
                f"labels must have shape ({self.images.shape[0]},), got {tuple(self.labels.shape)}"
            )
        if self.groups is not None and self.groups.shape != self.labels.shape:
            raise ValueError("groups must have one entry per sample")

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices: np.ndarray) -> ImageSplit:
        """The samples at ``indices`` (a copy; ``index_select``, several times faster than
        ``images[index]`` on image tensors)."""
        index = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        groups = None if self.groups is None else self.groups.index_select(0, index)
        return ImageSplit(
            self.images.index_select(0, index), self.labels.index_select(0, index), groups
        )


@dataclass(frozen=True)
class ImageDataset:
    """A dataset with its official train/test split and how to normalize a batch of it.

    ``scale`` maps stored values to [0, 1] (255 for uint8 images, 16 for sklearn digits, 1 for
    float data); then ``(x / scale - mean) / std`` per channel gives the model's input.

    ``vocab_size > 0`` marks text ([`pflower.datasets.text`][pflower.datasets.text]): the samples
    are int64 token ids in ``0..vocab_size - 1`` laid out ``(N, 1, 1, L)``, which
    [`normalize`][pflower.datasets.base.ImageDataset.normalize] passes through unchanged and
    only a model that reads tokens takes.
    """

    name: str
    train: ImageSplit
    test: ImageSplit
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    scale: float = 255.0
    vocab_size: int = 0

    def __post_init__(self) -> None:
        channels = self.train.images.shape[1]
        if len(self.mean) != channels or len(self.std) != channels:
            raise ValueError(
                f"{self.name}: mean/std need {channels} entries, got {self.mean} / {self.std}"
            )
        if self.train.images.shape[1:] != self.test.images.shape[1:]:
            raise ValueError(f"{self.name}: train and test images differ in shape")

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one image, as the model receives it."""
        c, h, w = self.train.images.shape[1:]
        return int(c), int(h), int(w)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """Turn a batch of stored images into normalized float32 model input (token ids of a
        text dataset are the model's input as they are)."""
        if self.vocab_size:
            return images
        mean = torch.tensor(self.mean, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
        return (images.float() / self.scale - mean) / std


def resolve_data_root(root: str | os.PathLike[str] | None) -> Path:
    """The absolute data root: ``root``, else ``$PFLOWER_DATA``, else the user cache directory.

    The cache directory is ``$XDG_CACHE_HOME/pflower/data`` (default ``~/.cache/pflower/data``).
    A relative root is taken relative to the current directory *now* and made absolute (and
    normalized), so that later changes of directory, symlinks made to files under it, and error
    messages all see the same folder. This is the one place that chooses the data root.
    """
    if root:
        chosen = Path(root)
    elif env := os.environ.get("PFLOWER_DATA"):
        chosen = Path(env)
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        chosen = Path(cache) / "pflower" / "data"
    return chosen.expanduser().resolve()
