"""Shared plumbing of the file-backed loaders: find, verify and download files; resolve mean/std.

Every loader describes its files with a [`FileSource`][pflower.datasets.sources.FileSource] (which
files, which directory layouts
under the data root are accepted, how to obtain them) and calls
[`locate`][pflower.datasets.sources.locate]. That gives all
datasets the same behaviour: a missing dataset fails with one
[`DatasetNotFoundError`][pflower.datasets.base.DatasetNotFoundError] that
names the expected files, the directory searched and how to get them; a file whose checksum or
format is wrong fails with one
[`CorruptDatasetError`][pflower.datasets.sources.CorruptDatasetError]; downloads happen only when
asked.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pflower.datasets.base import DatasetNotFoundError, ImageDataset, ImageSplit, resolve_data_root
from pflower.datasets.cache import cached_splits
from pflower.registry import ConfigError

Stats = float | Sequence[float] | None
"""A ``mean``/``std`` option: ``None`` (the dataset's default), one value, or one per channel."""


class CorruptDatasetError(ValueError):
    """A dataset file exists but is not what it should be (wrong checksum, broken format)."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(
            f"Dataset file {path} is unusable: {problem}.\n"
            "Delete it and fetch it again (`dataset.download=true` where the dataset supports it), "
            "or pass `dataset.verify=false` if it is a deliberately modified copy."
        )


@dataclass(frozen=True)
class FileSource:
    """Where a dataset's files may live under the data root and how to obtain them.

    Attributes:
        name: the dataset's config name, used in messages.
        layouts: sub-directories of the root searched in order (``"."`` is the root itself);
            the first one is where `fetch` puts the files.
        files: names that must all exist in one layout directory (files or directories).
        md5: official MD5 checksums of those files, where known.
        how_to_obtain: one or more sentences for the error message (say there why a dataset
            without ``fetch`` cannot be downloaded).
        fetch: downloads the files into ``root / layouts[0]`` given the root; ``None`` when the
            dataset cannot be downloaded automatically.
    """

    name: str
    layouts: tuple[str, ...]
    files: tuple[str, ...]
    md5: dict[str, str]
    how_to_obtain: str
    fetch: Callable[[Path], None] | None = None


@dataclass(frozen=True)
class FileLoader:
    """The loader of a dataset read from its official files, with the options every such dataset
    has (registered as the factory of its config name).

    Attributes:
        source: its files, the layouts they may be found in, how to obtain them.
        version: the decoder's version, part of the dataset cache key
            ([`pflower.datasets.cache`][pflower.datasets.cache]): bump it when decoding changes.
        decoded: the files ``decode`` reads, in the order they enter the cache key.
        decode: reads ``(train, test)`` from the folder that holds the files.
        num_classes: number of classes.
        mean: the training set's per-channel mean, the default normalization.
        std: the training set's per-channel std, the default normalization.
        check: validates a small file of the folder on every load, cached or not.
    """

    source: FileSource
    version: str
    decoded: tuple[str, ...]
    decode: Callable[[Path], tuple[ImageSplit, ImageSplit]]
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    check: Callable[[Path], None] | None = None

    def __call__(
        self,
        root: str | os.PathLike[str] | None = None,
        download: bool = False,
        verify: bool = True,
        mean: Stats = None,
        std: Stats = None,
    ) -> ImageDataset:
        """The dataset with its official train/test split.

        Args:
            root: data root (``None``: ``$PFLOWER_DATA``, else the user cache directory).
            download: fetch the files from the official source if they are missing.
            verify: check the official MD5 of each file.
            mean, std: normalization; default: the training set's statistics.
        """
        directory = locate(self.source, resolve_data_root(root), download=download, verify=verify)
        if self.check is not None:
            self.check(directory)
        return cached_dataset(
            self.source,
            directory,
            self.version,
            self.decoded,
            {},
            lambda: self.decode(directory),
            verify=verify,
            num_classes=self.num_classes,
            stats=(resolve_stats(mean, self.mean, "mean"), resolve_stats(std, self.std, "std")),
        )


def cached_dataset(
    source: FileSource,
    directory: Path,
    version: str,
    decoded: Sequence[str],
    options: Mapping[str, Any],
    decode: Callable[[], tuple[ImageSplit, ImageSplit]],
    *,
    verify: bool,
    num_classes: int,
    stats: tuple[tuple[float, ...], tuple[float, ...]],
) -> ImageDataset:
    """``source``'s dataset from the files ``decoded`` in ``directory``, through the dataset cache.

    Args:
        source: the dataset's files (its name names the dataset and its cache entries).
        directory: where [`locate`][pflower.datasets.sources.locate] found them.
        version: the decoder's version (see
            [`cached_splits`][pflower.datasets.cache.cached_splits]).
        decoded: the files ``decode`` reads, in the order they enter the cache key.
        options: the loader options that change the decoded arrays.
        decode: reads ``(train, test)``; called only when the cache has no valid entry.
        verify: the files' MD5s were just checked (so the cache need not hash them again).
        num_classes: number of classes.
        stats: the per-channel ``(mean, std)`` that normalizes a batch.
    """
    train, test = cached_splits(
        source.name,
        version,
        [directory / name for name in decoded],
        options,
        decode,
        digests=source.md5 if verify else None,
    )
    mean, std = stats
    return ImageDataset(
        name=source.name, train=train, test=test, num_classes=num_classes, mean=mean, std=std
    )


def locate(source: FileSource, root: Path, *, download: bool, verify: bool) -> Path:
    """The directory that holds all of ``source.files``; downloads first if allowed and needed.

    Raises:
        DatasetNotFoundError: the files are in no accepted layout (and were not downloaded).
        CorruptDatasetError: ``verify`` is set and a file's MD5 differs from the official one.
    """
    directory = _find(source, root)
    if directory is None and download:
        _download(source, root)
        directory = _find(source, root)
    if directory is None:
        raise _not_found(source, root, download)
    if verify:
        for filename, expected in source.md5.items():
            verify_md5(directory / filename, expected)
    return directory


def verify_md5(path: Path, expected: str) -> None:
    """Raise [`CorruptDatasetError`][pflower.datasets.sources.CorruptDatasetError] unless the MD5 of
    ``path`` is ``expected``."""
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise CorruptDatasetError(
            path, f"MD5 is {digest.hexdigest()}, the official file's is {expected}"
        )


def resolve_stats(option: Stats, default: tuple[float, ...], what: str) -> tuple[float, ...]:
    """A per-channel ``mean``/``std`` tuple from an option (``None`` keeps ``default``).

    One value is repeated for every channel, so ``mean: 0.5`` works for any dataset.
    """
    if option is None:
        return default
    values = (option,) if isinstance(option, int | float) else tuple(option)
    if len(values) == 1:
        values = values * len(default)
    if len(values) != len(default) or not all(isinstance(v, int | float) for v in values):
        raise ConfigError(
            f"dataset option '{what}' needs one number or {len(default)} numbers "
            f"(one per channel), got {option!r}"
        )
    if what == "std" and min(values) <= 0:
        raise ConfigError(f"dataset option 'std' must be positive, got {option!r}")
    return tuple(float(v) for v in values)


def _find(source: FileSource, root: Path) -> Path | None:
    for layout in source.layouts:
        directory = root / layout
        if all((directory / name).exists() for name in source.files):
            return directory
    return None


def _download(source: FileSource, root: Path) -> None:
    if source.fetch is None:
        return
    try:
        source.fetch(root)
    except (OSError, RuntimeError) as error:  # URLError is an OSError; torchvision: RuntimeError
        raise DatasetNotFoundError(
            source.name,
            root,
            _expected(source),
            f"downloading failed ({error}). {source.how_to_obtain}",
        ) from error


def _not_found(source: FileSource, root: Path, download: bool) -> DatasetNotFoundError:
    """The error for files found in no layout; a source without ``fetch`` explains why itself."""
    how = source.how_to_obtain
    if source.fetch is not None and not download:
        how += " Or set `dataset.download=true` to fetch them from the official source."
    if len(source.layouts) > 1:
        others = ", ".join(str(root / layout) for layout in source.layouts[1:])
        how += f" Also accepted in: {others}."
    return DatasetNotFoundError(source.name, root, _expected(source), how)


def _expected(source: FileSource) -> list[str]:
    layout = source.layouts[0]
    return [name if layout == "." else f"{layout}/{name}" for name in source.files]
