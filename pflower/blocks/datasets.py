"""The ``dataset`` group: one structured config per dataset loader."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import MISSING

from pflower.blocks.base import Block
from pflower.config import (
    require,
)

# ----------------------------------------------------------------------------------------------
# datasets


def _check_declared_shape(image_shape: Sequence[int], num_classes: int) -> None:
    """A block that declares its samples' shape: ``[C, H, W]`` and at least 2 classes."""
    require(
        len(image_shape) == 3 and min(image_shape) >= 1,
        f"dataset.image_shape must be [C, H, W], got {list(image_shape)}",
    )
    require(num_classes >= 2, f"dataset.num_classes must be >= 2, got {num_classes}")


def _declared_shape(
    image_shape: Sequence[int], num_classes: int
) -> tuple[tuple[int, int, int], int]:
    channels, height, width = (int(size) for size in image_shape)
    return (channels, height, width), num_classes


@dataclass
class DatasetBlock(Block):
    """Options every dataset has.

    Attributes:
        mean: per-channel normalization mean (a number or a list, one per channel); null: the
            dataset's own statistics.
        std: per-channel normalization std, as ``mean``; null: the dataset's own.
    """

    mean: Any = None
    std: Any = None

    @classmethod
    def group(cls) -> str:
        return "dataset"

    def data_shape(self) -> tuple[tuple[int, int, int], int]:
        """The (C, H, W) of every image and the number of classes, known from the options."""
        raise NotImplementedError

    def vocabulary_size(self) -> int:
        """The token vocabulary of a text dataset (its samples are ``(1, 1, L)`` token ids:
        [`pflower.datasets.text`][pflower.datasets.text]); 0 for images and feature vectors."""
        return 0


@dataclass
class DigitsDataset(DatasetBlock):
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, no download).

    Attributes:
        image_size: side of the square images (8: the original; larger sizes are upsampled).
    """

    config_name: ClassVar[str] = "digits"
    image_size: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.image_size >= 1, f"dataset.image_size must be >= 1, got {self.image_size}")

    def data_shape(self) -> tuple[tuple[int, int, int], int]:
        return (1, self.image_size, self.image_size), 10


@dataclass
class SyntheticDataset(DatasetBlock):
    """Seeded class prototypes plus Gaussian noise, for tests (no files).

    Attributes:
        image_shape: [C, H, W] of the images.
        num_classes: number of classes (>= 2).
        num_train: training images.
        num_test: test images.
        noise: std of the noise added to the class prototypes (>= 0).
        seed: seed of the prototypes and the noise.
    """

    config_name: ClassVar[str] = "synthetic"
    image_shape: list[int] = field(default_factory=lambda: [1, 16, 16])
    num_classes: int = 10
    num_train: int = 2000
    num_test: int = 500
    noise: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_declared_shape(self.image_shape, self.num_classes)
        require(
            self.num_train >= 1 and self.num_test >= 1,
            "dataset.num_train and dataset.num_test must be >= 1",
        )
        require(self.noise >= 0, f"dataset.noise must be >= 0, got {self.noise}")

    def data_shape(self) -> tuple[tuple[int, int, int], int]:
        return _declared_shape(self.image_shape, self.num_classes)


@dataclass
class FileDataset(DatasetBlock):
    """A dataset read from its original files under a data root.

    Attributes:
        root: the data root (null: ``$PFLOWER_DATA``, else a user cache directory).
        download: let torchvision download missing files (checksums are verified).
        verify: check the files' checksums before decoding them.
    """

    root: str | None = None
    download: bool = False
    verify: bool = True
    shape: ClassVar[tuple[int, int, int]] = (1, 28, 28)
    classes: ClassVar[int] = 10

    def data_shape(self) -> tuple[tuple[int, int, int], int]:
        return self.shape, self.classes


@dataclass
class MnistDataset(FileDataset):
    """MNIST (LeCun et al.): 28x28 grey digits, original IDX files."""

    config_name: ClassVar[str] = "mnist"


@dataclass
class FmnistDataset(FileDataset):
    """Fashion-MNIST (Xiao et al.): 28x28 grey clothing images, original IDX files."""

    config_name: ClassVar[str] = "fmnist"


@dataclass
class Cifar10Dataset(FileDataset):
    """CIFAR-10: 32x32 colour images of 10 classes (cifar-10-batches-py)."""

    config_name: ClassVar[str] = "cifar10"
    shape: ClassVar[tuple[int, int, int]] = (3, 32, 32)


@dataclass
class Cifar100Dataset(FileDataset):
    """CIFAR-100 (fine labels): 32x32 colour images of 100 classes."""

    config_name: ClassVar[str] = "cifar100"
    shape: ClassVar[tuple[int, int, int]] = (3, 32, 32)
    classes: ClassVar[int] = 100


@dataclass
class SvhnDataset(FileDataset):
    """SVHN: 32x32 colour house-number digits (train_32x32.mat, test_32x32.mat)."""

    config_name: ClassVar[str] = "svhn"
    shape: ClassVar[tuple[int, int, int]] = (3, 32, 32)


class CelebaShift(StrEnum):
    """How CelebA-Gender's attributes differ between clients (FedMPR, Sec. V-B)."""

    low = "low"
    high = "high"


@dataclass
class CelebaGenderDataset(FileDataset):
    """CelebA gender classification with attribute groups (FedMPR, Sec. V-B).

    Attributes:
        num_attributes: how many mutually exclusive attributes make the groups (3..7).
        shift: ``low`` or ``high`` covariate shift between the attribute groups.
        image_size: side of the square images (64 reduced scale, 128 full scale).
        test_size: images in the test split (null: the loader's choice; >= 2).
        seed: seed of the balanced subsampling.
    """

    config_name: ClassVar[str] = "celeba_gender"
    num_attributes: int = 5
    shift: CelebaShift = CelebaShift.low
    image_size: int = 64
    test_size: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            3 <= self.num_attributes <= 7,
            f"dataset.num_attributes must be 3..7, got {self.num_attributes}",
        )
        require(self.image_size >= 1, f"dataset.image_size must be >= 1, got {self.image_size}")
        require(
            self.test_size is None or self.test_size >= 2,
            f"dataset.test_size must be null or >= 2, got {self.test_size}",
        )

    def data_shape(self) -> tuple[tuple[int, int, int], int]:
        return (3, self.image_size, self.image_size), 2


# ----------------------------------------------------------------------------------------------
# data a user brings: decoded in memory, shape and class count from the options or the files


class _ResizedImages:
    """Mixin of the blocks whose images are resized on loading to ``channels`` x ``image_size``
    x ``image_size`` (the block declares both fields): checks them and gives the shape."""

    image_size: int
    channels: int

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        require(self.image_size >= 1, f"dataset.image_size must be >= 1, got {self.image_size}")
        require(
            self.channels in (1, 3),
            f"dataset.channels must be 1 (grey) or 3 (RGB), got {self.channels}",
        )

    def _image_shape(self) -> tuple[int, int, int]:
        return self.channels, self.image_size, self.image_size


class LeafKind(StrEnum):
    """What a LEAF dataset's samples are."""

    image = "image"
    """Flat numeric ``x`` lists (FEMNIST, LEAF's synthetic data)."""
    shakespeare = "shakespeare"
    """80-character strings, the next character as the label (80 classes)."""
    sent140 = "sent140"
    """Sentiment140 rows ``[id, date, query, user, text, ...]``, sentiment 0/1 as the label."""


@dataclass
class LeafDataset(DatasetBlock):
    """LEAF JSON data (FEMNIST by default; ``pflower partition import leaf`` keeps each user's
    train/test split).

    Attributes:
        path: the folder with LEAF's ``train/*.json`` and ``test/*.json`` (required).
        image_shape: [C, H, W] each flat sample is laid out as (FEMNIST: [1, 28, 28]; n
            features: [n, 1, 1]); images only.
        num_classes: number of classes (FEMNIST: 62); images only.
        kind: ``image``, ``shakespeare`` or ``sent140`` (see
            [`LeafKind`][pflower.blocks.datasets.LeafKind]).
        seq_len: tokens per text sample (null: 80 characters for Shakespeare, 25 words for
            Sent140, as LEAF).
        vocab_size: Sent140's word ids: the most frequent training words and one id for
            unknown words and padding.
    """

    config_name: ClassVar[str] = "leaf"
    path: str = MISSING
    image_shape: list[int] = field(default_factory=lambda: [1, 28, 28])
    num_classes: int = 62
    kind: LeafKind = LeafKind.image
    seq_len: int | None = None
    vocab_size: int = 10000

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_declared_shape(self.image_shape, self.num_classes)
        require(
            self.seq_len is None or self.seq_len >= 1,
            f"dataset.seq_len must be >= 1 or null, got {self.seq_len}",
        )
        require(self.vocab_size >= 2, f"dataset.vocab_size must be >= 2, got {self.vocab_size}")

    def data_shape(self) -> tuple[tuple[int, int, int], int]:
        if self.kind == LeafKind.image:
            return _declared_shape(self.image_shape, self.num_classes)
        length, classes, _ = self._text_shape()
        return (1, 1, length), classes

    def vocabulary_size(self) -> int:
        return 0 if self.kind == LeafKind.image else self._text_shape()[2]

    def _text_shape(self) -> tuple[int, int, int]:
        from pflower.datasets.leaf import text_shape

        return text_shape(str(self.kind), self.seq_len, self.vocab_size)


@dataclass
class ImageFolderDataset(_ResizedImages, DatasetBlock):
    """Image files, one folder per class (optionally inside one folder per client).

    Attributes:
        path: the folder (required); ``train/`` and ``test/`` inside it give the official split.
        per_client: the layout is ``<client>/<class>/<image>`` (each client's own images).
        client_map: a CSV of ``file,client`` rows tagging the images with their clients.
        image_size: side the images are resized to.
        channels: 1 (grey) or 3 (RGB).
    """

    config_name: ClassVar[str] = "image_folder"
    path: str = MISSING
    per_client: bool = False
    client_map: str | None = None
    image_size: int = 28
    channels: int = 1

    def data_shape(self) -> tuple[tuple[int, int, int], int]:
        from pflower.datasets.folders import class_names

        classes = len(class_names(self.path, self.per_client))
        return self._image_shape(), max(classes, 2)


@dataclass
class TableDataset(DatasetBlock):
    """A CSV or Parquet table, one row per sample, numeric features (for ``model=mlp``).

    Attributes:
        path: the file of training rows (required).
        label: the label column (numbers or strings).
        test_path: a file of test rows with the same columns (null: no official test split).
        client_column: a column naming each row's client (silo), for ``partition=natural``.
    """

    config_name: ClassVar[str] = "table"
    path: str = MISSING
    label: str = "label"
    test_path: str | None = None
    client_column: str | None = None

    def data_shape(self) -> tuple[tuple[int, int, int], int]:
        from pflower.datasets.table import read_columns

        if not Path(self.path).expanduser().is_file():
            return (1, 1, 1), 2  # the loader reports the missing file
        columns = read_columns(self.path)
        features = [c for c in columns if c not in (self.label, self.client_column)]
        classes = set(columns.get(self.label, []))
        if self.test_path:
            classes |= set(read_columns(self.test_path).get(self.label, []))
        return (len(features), 1, 1), max(len(classes), 2)


@dataclass
class HfDataset(_ResizedImages, DatasetBlock):
    """A Hugging Face dataset of images, text or numeric features through Flower Datasets'
    ``FederatedDataset``, or a folder written by ``datasets``' ``save_to_disk``.

    Attributes:
        dataset: a Hub id or packaged builder (``imagefolder``), as
            ``FederatedDataset(dataset=...)`` takes it.
        path: instead of ``dataset``: a folder written by ``save_to_disk``.
        subset: the Hub dataset's configuration (``FederatedDataset(subset=...)``).
        data_dir: ``data_dir`` for a packaged builder (``name=imagefolder``).
        train_split: the split shared among clients.
        test_split: the official test split (null: none).
        image_column: the column of images.
        label_column: the column of int labels.
        client_column: a column naming each sample's client, for ``partition=natural``.
        num_classes: number of classes (null: from a saved folder's ``ClassLabel`` feature).
        image_size: side the images are resized to.
        channels: 1 (grey) or 3 (RGB).
        text_column: instead of images: a column of text, read as word ids (for
            ``model=sent140_lstm``).
        feature_columns: instead of images: numeric columns, one feature each (for
            ``model=mlp``).
        seq_len: words per text sample (the first ones; shorter texts are padded).
        vocab_size: word ids of text: the train split's most frequent words and one id for
            unknown words and padding.
    """

    config_name: ClassVar[str] = "hf"
    dataset: str | None = None
    path: str | None = None
    subset: str | None = None
    data_dir: str | None = None
    train_split: str = "train"
    test_split: str | None = "test"
    image_column: str = "image"
    label_column: str = "label"
    client_column: str | None = None
    num_classes: int | None = None
    image_size: int = 28
    channels: int = 1
    text_column: str | None = None
    feature_columns: list[str] | None = None
    seq_len: int = 25
    vocab_size: int = 10000

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.text_column is None or not self.feature_columns,
            "dataset=hf reads text (dataset.text_column) or numeric features "
            "(dataset.feature_columns), not both: set one of them to null",
        )
        require(self.seq_len >= 1, f"dataset.seq_len must be >= 1, got {self.seq_len}")
        require(self.vocab_size >= 2, f"dataset.vocab_size must be >= 2, got {self.vocab_size}")

    def data_shape(self) -> tuple[tuple[int, int, int], int]:
        classes = self.num_classes or self._saved_num_classes()
        require(
            classes is not None,
            "dataset=hf cannot tell the number of classes before downloading: set "
            "dataset.num_classes",
        )
        assert classes is not None
        if self.text_column is not None:
            return (1, 1, self.seq_len), classes
        if self.feature_columns:
            return (len(self.feature_columns), 1, 1), classes
        return self._image_shape(), classes

    def vocabulary_size(self) -> int:
        return 0 if self.text_column is None else self.vocab_size

    def _saved_num_classes(self) -> int | None:
        """The ``ClassLabel`` size recorded in a ``save_to_disk`` folder, if any."""
        if not self.path:
            return None
        folder = Path(self.path).expanduser()
        for info in (folder / self.train_split / "dataset_info.json", folder / "dataset_info.json"):
            if info.is_file():
                feature = json.loads(info.read_text()).get("features", {}).get(self.label_column)
                if isinstance(feature, dict) and feature.get("names"):
                    return len(feature["names"])
        return None
