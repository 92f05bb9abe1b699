"""SVHN (cropped digits, format 2) from the official ``train_32x32.mat`` and ``test_32x32.mat``.

Each file is a MATLAB file with ``X``, a uint8 array ``(32, 32, 3, N)`` (height, width, channel,
sample), and ``y``, labels ``(N, 1)`` in 1..10 where 10 stands for the digit 0. The loader maps
10 to 0 so labels equal digits, as torchvision does. The ``extra`` split is not used (FedMPR §4).
Files are read from ``svhn/`` under the data root, or from the root itself (torchvision's layout).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pflower.datasets.base import ImageSplit
from pflower.datasets.sources import CorruptDatasetError, FileLoader, FileSource

_URL = "http://ufldl.stanford.edu/housenumbers/"
# Official MD5s (as in torchvision).
_MD5 = {
    "train_32x32.mat": "e26dedcc434d2e4c54c9b2d4a06d8373",
    "test_32x32.mat": "eb5a983be6a315427106f1b164d9cef3",
}
# Training-set channel statistics (FedMPR spec §4).
_MEAN = (0.4377, 0.4438, 0.4728)
_STD = (0.1980, 0.2010, 0.1970)
_DECODER_VERSION = "1"
"""Part of the dataset cache key ([`pflower.datasets.cache`][pflower.datasets.cache]): bump it when
decoding changes."""


def read_svhn_mat(path: Path) -> ImageSplit:
    """One SVHN .mat file as ``(N, 3, 32, 32)`` uint8 images and labels 0..9."""
    import scipy.io  # here, not at import: every run imports this module, few read SVHN

    try:
        content = scipy.io.loadmat(path, variable_names=("X", "y"))
    except (scipy.io.matlab.MatReadError, ValueError, OSError, TypeError) as error:
        raise CorruptDatasetError(path, f"not a readable MATLAB file ({error})") from error
    images, labels = content.get("X"), content.get("y")
    if images is None or labels is None:
        raise CorruptDatasetError(path, "it lacks the variables 'X' and 'y'")
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[:3] != (32, 32, 3):
        found = f"{images.dtype} {images.shape}"
        raise CorruptDatasetError(path, f"'X' is {found}, not a uint8 (32, 32, 3, N) array")
    labels = labels.reshape(-1).astype(np.int64)
    if labels.shape[0] != images.shape[3]:
        raise CorruptDatasetError(path, f"{labels.shape[0]} labels for {images.shape[3]} images")
    if labels.size and (labels.min() < 1 or labels.max() > 10):
        raise CorruptDatasetError(path, "labels outside 1..10")
    chw = np.ascontiguousarray(images.transpose(3, 2, 0, 1))
    return ImageSplit(images=torch.from_numpy(chw), labels=torch.from_numpy(labels % 10))


def _fetch(root: Path) -> None:
    # torchvision only to download: importing it loads torchvision.models (seconds).
    from torchvision.datasets.utils import download_url

    for filename, md5 in _MD5.items():
        download_url(_URL + filename, str(root / "svhn"), filename, md5)


_SOURCE = FileSource(
    name="svhn",
    layouts=("svhn", "."),
    files=tuple(_MD5),
    md5=_MD5,
    how_to_obtain=f"download train_32x32.mat and test_32x32.mat from {_URL} into svhn/.",
    fetch=_fetch,
)


def _decode(directory: Path) -> tuple[ImageSplit, ImageSplit]:
    return read_svhn_mat(directory / "train_32x32.mat"), read_svhn_mat(directory / "test_32x32.mat")


load_svhn = FileLoader(_SOURCE, _DECODER_VERSION, _SOURCE.files, _decode, 10, _MEAN, _STD)
"""SVHN: 73,257 / 26,032 uint8 images ``3x32x32``, labels 0..9 (digit 0 is label 0); default
normalization (0.4377, 0.4438, 0.4728) / (0.1980, 0.2010, 0.1970)."""
