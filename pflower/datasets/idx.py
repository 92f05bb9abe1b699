"""MNIST and Fashion-MNIST from their original gzip-compressed IDX files.

The IDX format (LeCun et al.): a big-endian header ``0x00 0x00 <type> <ndim>`` followed by ``ndim``
uint32 sizes and the row-major data. Both datasets use type ``0x08`` (uint8): images are
``(N, 28, 28)``, labels ``(N,)``. Parsing it with numpy is a few lines and avoids torchvision's
``processed/`` cache files.

Accepted layouts under the data root: ``mnist/`` and ``fashion-mnist/`` (flat, the original
file names) or torchvision's ``MNIST/raw/`` and ``FashionMNIST/raw/``.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import torch

from pflower.datasets.base import ImageSplit
from pflower.datasets.sources import CorruptDatasetError, FileLoader, FileSource

_TRAIN_IMAGES = "train-images-idx3-ubyte.gz"
_TRAIN_LABELS = "train-labels-idx1-ubyte.gz"
_TEST_IMAGES = "t10k-images-idx3-ubyte.gz"
_TEST_LABELS = "t10k-labels-idx1-ubyte.gz"
_FILES = (_TRAIN_IMAGES, _TRAIN_LABELS, _TEST_IMAGES, _TEST_LABELS)

# Official MD5s of the .gz files (the ones torchvision checks).
_MNIST_MD5 = {
    _TRAIN_IMAGES: "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    _TRAIN_LABELS: "d53e105ee54ea40749a09fcbcd1e9432",
    _TEST_IMAGES: "9fb629c4189551a2d022fa330f9573f3",
    _TEST_LABELS: "ec29112dd5afa0611ce80d1b7f02629c",
}
_FMNIST_MD5 = {
    _TRAIN_IMAGES: "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    _TRAIN_LABELS: "25c81989df183df01b3e8a0aad5dffbe",
    _TEST_IMAGES: "bef4ecab320f06d8554ea6380940ec79",
    _TEST_LABELS: "bb300cfdad3c16e7a12a480ee83cd310",
}
_MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
_FMNIST_MIRRORS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",)

# Training-set pixel statistics in [0, 1]: MNIST 0.1307/0.3081 (the PyTorch examples' values,
# used by FLIU and FLAME); Fashion-MNIST 0.2860/0.3530 (FedMPR spec §4).
_MNIST_STATS = ((0.1307,), (0.3081,))
_FMNIST_STATS = ((0.2860,), (0.3530,))

_IDX_UINT8 = 0x08
_DECODER_VERSION = "1"
"""Part of the dataset cache key ([`pflower.datasets.cache`][pflower.datasets.cache]): bump it when
decoding changes."""


def _decode(directory: Path) -> tuple[ImageSplit, ImageSplit]:
    return (
        _split(directory / _TRAIN_IMAGES, directory / _TRAIN_LABELS),
        _split(directory / _TEST_IMAGES, directory / _TEST_LABELS),
    )


def idx_source(name: str) -> FileSource:
    """The files of ``mnist`` or ``fmnist``: accepted layouts, checksums, how to obtain them.

    With [`locate`][pflower.datasets.sources.locate] and
    [`resolve_data_root`][pflower.datasets.base.resolve_data_root] this answers
    "are the original files under the data root, and where?" without reading them (tests use
    it to skip with a message that names the files, the folder and the remedy).
    """
    if name == "mnist":
        return _source("mnist", ("mnist", "MNIST/raw"), _MNIST_MD5, _MNIST_MIRRORS)
    if name == "fmnist":
        return _source(
            "fmnist", ("fashion-mnist", "FashionMNIST/raw"), _FMNIST_MD5, _FMNIST_MIRRORS
        )
    raise ValueError(f"no IDX dataset named {name!r}; allowed: mnist, fmnist")


def read_idx(path: Path) -> np.ndarray:
    """The uint8 array stored in a gzip-compressed IDX file.

    Raises:
        CorruptDatasetError: the file is not gzip, not uint8 IDX, or its size disagrees with
            its header.
    """
    try:
        with gzip.open(path, "rb") as stream:
            data = stream.read()
    except (OSError, EOFError, zlib.error) as error:
        raise CorruptDatasetError(path, f"not a readable gzip file ({error})") from error
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != _IDX_UINT8:
        raise CorruptDatasetError(path, "not a uint8 IDX file (bad magic number)")
    ndim = data[3]
    offset = 4 + 4 * ndim
    if ndim == 0 or len(data) < offset:
        raise CorruptDatasetError(path, "truncated IDX header")
    shape = tuple(int(size) for size in np.frombuffer(data, ">u4", count=ndim, offset=4))
    if len(data) - offset != int(np.prod(shape)):
        raise CorruptDatasetError(
            path, f"header says {shape} but the file holds {len(data) - offset} data bytes"
        )
    return np.frombuffer(data, np.uint8, offset=offset).reshape(shape).copy()


def _source(
    name: str, layouts: tuple[str, ...], md5: dict[str, str], mirrors: tuple[str, ...]
) -> FileSource:
    def fetch(root: Path) -> None:
        for filename, checksum in md5.items():
            _download_from_mirrors(mirrors, root / layouts[0], filename, checksum)

    return FileSource(
        name=name,
        layouts=layouts,
        files=tuple(md5),
        md5=md5,
        how_to_obtain=f"download the four .gz files from {mirrors[0]} into {layouts[0]}/.",
        fetch=fetch,
    )


def _download_from_mirrors(
    mirrors: tuple[str, ...], directory: Path, filename: str, md5: str
) -> None:
    """Try each mirror in turn; raise an ``OSError`` naming every failure if none works."""
    # torchvision only to download: importing it loads torchvision.models (seconds).
    from torchvision.datasets.utils import download_url

    failures = []
    for mirror in mirrors:
        try:
            download_url(mirror + filename, str(directory), filename, md5)
            return
        except (OSError, RuntimeError) as error:
            failures.append(f"{mirror}{filename}: {error}")
    raise OSError("; ".join(failures))


def _split(images_path: Path, labels_path: Path) -> ImageSplit:
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise CorruptDatasetError(images_path, f"expected (N, 28, 28) images, got {images.shape}")
    if labels.shape != images.shape[:1]:
        raise CorruptDatasetError(
            labels_path, f"{labels.shape} labels do not match {images.shape[0]} images"
        )
    if labels.size and labels.max() > 9:
        raise CorruptDatasetError(labels_path, f"label {labels.max()} is outside 0..9")
    return ImageSplit(
        images=torch.from_numpy(images).unsqueeze(1),
        labels=torch.from_numpy(labels.astype(np.int64)),
    )


load_mnist = FileLoader(idx_source("mnist"), _DECODER_VERSION, _FILES, _decode, 10, *_MNIST_STATS)
"""MNIST: 60,000 / 10,000 uint8 images ``1x28x28``, 10 classes; default normalization
0.1307 / 0.3081."""
load_fmnist = FileLoader(
    idx_source("fmnist"), _DECODER_VERSION, _FILES, _decode, 10, *_FMNIST_STATS
)
"""Fashion-MNIST: 60,000 / 10,000 uint8 images ``1x28x28``, 10 classes; default normalization
0.2860 / 0.3530."""
