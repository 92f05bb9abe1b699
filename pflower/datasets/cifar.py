"""CIFAR-10 and CIFAR-100 from the official "python version" archives.

Each batch file is a pickled dict: ``data`` is a uint8 ``(N, 3072)`` array whose rows hold the red,
green and blue 32x32 planes one after another (so a row reshapes to ``(3, 32, 32)`` directly), and
``labels`` (CIFAR-10) or ``fine_labels`` (CIFAR-100) a list of ``N`` ints. The metadata file names
the classes. Files come from ``cifar-10-batches-py/`` and ``cifar-100-python/`` under the data root,
i.e. where the official ``.tar.gz`` archives extract to.

Pickles can run code when loaded, so batches are read with an unpickler that only builds dicts,
lists and numpy arrays.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pflower.datasets.base import ImageSplit
from pflower.datasets.sources import CorruptDatasetError, FileLoader, FileSource


@dataclass(frozen=True)
class _CifarRelease:
    """The files of one CIFAR release; MD5s and URLs are the official ones (as in torchvision)."""

    folder: str
    train: dict[str, str]
    test: dict[str, str]
    meta: tuple[str, str]
    label_key: str
    names_key: str
    num_classes: int
    url: str
    archive_md5: str
    mean: tuple[float, ...]
    std: tuple[float, ...]


# Training-set channel statistics. CIFAR-10: (0.4914, 0.4822, 0.4465) / (0.2470, 0.2435, 0.2616)
# (FedMPR spec §4; the per-pixel std over the training set). CIFAR-100: the commonly used
# (0.5071, 0.4865, 0.4409) / (0.2673, 0.2564, 0.2762), computed the same way.
_CIFAR10 = _CifarRelease(
    folder="cifar-10-batches-py",
    train={
        "data_batch_1": "c99cafc152244af753f735de768cd75f",
        "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
        "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
        "data_batch_4": "634d18415352ddfa80567beed471001a",
        "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    },
    test={"test_batch": "40351d587109b95175f43aff81a1287e"},
    meta=("batches.meta", "5ff9c542aee3614f3951f8cda6e48888"),
    label_key="labels",
    names_key="label_names",
    num_classes=10,
    url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    archive_md5="c58f30108f718f92721af3b95e74349a",
    mean=(0.4914, 0.4822, 0.4465),
    std=(0.2470, 0.2435, 0.2616),
)
_CIFAR100 = _CifarRelease(
    folder="cifar-100-python",
    train={"train": "16019d7e3df5f24257cddd939b257f8d"},
    test={"test": "f0ef6b0ae62326f3e7ffdfab6717acfc"},
    meta=("meta", "7973b15100ade9c7d40fb424638fde48"),
    label_key="fine_labels",
    names_key="fine_label_names",
    num_classes=100,
    url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    archive_md5="eb9058c3a382ffc7106e4002c42a8d85",
    mean=(0.5071, 0.4865, 0.4409),
    std=(0.2673, 0.2564, 0.2762),
)

_PIXELS = 3 * 32 * 32
_DECODER_VERSION = "1"
"""Part of the dataset cache key ([`pflower.datasets.cache`][pflower.datasets.cache]): bump it when
decoding changes."""

# What a CIFAR pickle may reference: numpy's array reconstruction helpers (under their numpy 1 and
# numpy 2 module names) and the codec Python 3 uses for bytes in protocol-2 pickles.
_SAFE_GLOBALS = frozenset(
    {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("_codecs", "encode"),
    }
)


def _loader(name: str, release: _CifarRelease) -> FileLoader:
    def decode(directory: Path) -> tuple[ImageSplit, ImageSplit]:
        return (
            _concatenate([_read_batch(directory / f, release) for f in release.train]),
            _concatenate([_read_batch(directory / f, release) for f in release.test]),
        )

    return FileLoader(
        source=_source(name, release),
        version=_DECODER_VERSION,
        decoded=(*release.train, *release.test),
        decode=decode,
        num_classes=release.num_classes,
        mean=release.mean,
        std=release.std,
        check=lambda directory: _check_meta(directory / release.meta[0], release),
    )


def _source(name: str, release: _CifarRelease) -> FileSource:
    md5 = {**release.train, **release.test, release.meta[0]: release.meta[1]}

    def fetch(root: Path) -> None:
        # torchvision only to download: importing it loads torchvision.models (seconds).
        from torchvision.datasets.utils import download_and_extract_archive

        download_and_extract_archive(release.url, str(root), md5=release.archive_md5)

    return FileSource(
        name=name,
        layouts=(release.folder,),
        files=tuple(md5),
        md5=md5,
        how_to_obtain=f"download {release.url} and extract it into the data root.",
        fetch=fetch,
    )


def _read_batch(path: Path, release: _CifarRelease) -> ImageSplit:
    """One batch file as an [`ImageSplit`][pflower.datasets.base.ImageSplit], after checking its
    layout strictly."""
    entry = _unpickle(path)
    data, labels = entry.get("data"), entry.get(release.label_key)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise CorruptDatasetError(path, "'data' is not a 2-D uint8 array")
    if data.shape[1] != _PIXELS:
        raise CorruptDatasetError(path, f"rows have {data.shape[1]} values, not {_PIXELS}")
    if labels is None or len(labels) != data.shape[0]:
        raise CorruptDatasetError(path, f"'{release.label_key}' does not have one label per row")
    targets = np.asarray(labels, dtype=np.int64)
    if targets.size and (targets.min() < 0 or targets.max() >= release.num_classes):
        raise CorruptDatasetError(path, f"labels outside 0..{release.num_classes - 1}")
    images = torch.from_numpy(np.ascontiguousarray(data).reshape(-1, 3, 32, 32))
    return ImageSplit(images=images, labels=torch.from_numpy(targets))


def _check_meta(path: Path, release: _CifarRelease) -> None:
    names = _unpickle(path).get(release.names_key)
    if names is None or len(names) != release.num_classes:
        raise CorruptDatasetError(
            path, f"'{release.names_key}' does not list {release.num_classes} classes"
        )


def _unpickle(path: Path) -> dict[str, Any]:
    """A CIFAR pickle as a dict with ``str`` keys (the originals are Python 2 pickles)."""
    try:
        with path.open("rb") as stream:
            entry = _SafeUnpickler(stream, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as error:
        raise CorruptDatasetError(path, f"not a CIFAR pickle ({error})") from error
    if not isinstance(entry, dict):
        raise CorruptDatasetError(path, f"holds a {type(entry).__name__}, not a dict")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in entry.items()}


def _concatenate(splits: list[ImageSplit]) -> ImageSplit:
    return ImageSplit(
        images=torch.cat([split.images for split in splits]),
        labels=torch.cat([split.labels for split in splits]),
    )


class _SafeUnpickler(pickle.Unpickler):
    """Refuses every global except numpy's array builders (a pickle can otherwise run code)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _SAFE_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


load_cifar10 = _loader("cifar10", _CIFAR10)
"""CIFAR-10: 50,000 / 10,000 uint8 images ``3x32x32``, 10 classes; default normalization
(0.4914, 0.4822, 0.4465) / (0.2470, 0.2435, 0.2616)."""
load_cifar100 = _loader("cifar100", _CIFAR100)
"""CIFAR-100 with its 100 fine labels: 50,000 / 10,000 uint8 images ``3x32x32``; default
normalization (0.5071, 0.4865, 0.4409) / (0.2673, 0.2564, 0.2762)."""
