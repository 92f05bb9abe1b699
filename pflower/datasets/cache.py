"""Decoded datasets cached as ``.npy`` files and memory-mapped, so a machine holds one copy.

Every process that runs clients (each Ray worker, each ClientApp) and the server builds the same
federation from the same files. Decoding them in each process would hold one copy of the dataset
per process. Instead, the first process to need a dataset decodes it once into a cache entry, and
every process maps the entry's image file read-only (``np.load(mmap_mode="r")``): all of them then
read the same pages of the operating system's page cache, so the images are in memory once per
machine however many workers there are. Labels and group tags are small and are read into each
process.

Entry layout (a folder ``<name>-<key>`` under [`cache_dir`][pflower.datasets.cache.cache_dir])::

    images.npy   the official train split followed by the official test split, stored dtype
    labels.npy   int64 labels, same order
    groups.npy   int64 group tags (only for datasets with groups; -1 in a split without them)
    meta.json    what the entry holds: split sizes, which splits have groups, the source paths

The train and test splits are views of one array, so the federation's pool (train followed by
test) joins them without a copy.

The key hashes the dataset name, the decoder's ``version``, the options that change the decoded
arrays, and each source file's absolute path and content (its MD5; the official one when the
loader has just verified it, so nothing is hashed twice). A changed, replaced or moved source file
therefore gives a new entry; an old entry is never read again (delete the cache folder to reclaim
the space). Bump a loader's ``version`` when its decoding changes. Entries whose source files no
longer exist are deleted whenever a new entry is written.

Writes are atomic: an entry is written into a temporary folder and renamed into place only when
complete (``meta.json`` last), so a reader never sees a partial entry, and a crashed writer leaves
only a temporary folder, removed by the next writer. Concurrent processes serialize on a lock
file (``fcntl.flock``), so one decodes and the others wait for it and then map its entry.

Where: ``$PFLOWER_CACHE`` when set (``off`` disables the cache: every process decodes into its own
memory, as without it), else ``$XDG_CACHE_HOME/pflower/arrays`` (default
``~/.cache/pflower/arrays``). Deleting the folder clears the cache; it is refilled on the next run.
If the folder cannot be written, the dataset is decoded in memory with a warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from pflower.datasets.base import ImageSplit

try:  # POSIX; elsewhere concurrent writers rely on the atomic rename alone
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]  # the module or None, tested before use

CACHE_ENV = "PFLOWER_CACHE"
"""Environment variable naming the cache folder; ``off`` (or ``0``, ``false``, ``none``) disables
the cache."""

_FORMAT = 1
"""Version of the entry layout; part of every key."""

_OFF = frozenset({"off", "0", "false", "no", "none"})
_META = "meta.json"
_READ_ERRORS = (OSError, ValueError, KeyError, TypeError)
"""What reading a missing, incomplete or damaged entry raises."""

_KEPT_ARRAY_FILES = 512
"""Files kept per [`cached_arrays`][pflower.datasets.cache.cached_arrays] kind; the least recently
used beyond that are deleted."""

Decode = Callable[[], tuple[ImageSplit, ImageSplit]]
"""Decodes a dataset's source files into its official ``(train, test)`` splits."""


class CacheUnavailableError(OSError):
    """No cache folder can be written (the caller decodes in memory instead)."""


def cache_dir() -> Path | None:
    """The cache folder, or ``None`` when caching is off.

    ``$PFLOWER_CACHE`` when set, else ``$XDG_CACHE_HOME/pflower/arrays`` (default
    ``~/.cache/pflower/arrays``). Not the data root: data folders are often shared or read-only.
    """
    configured = os.environ.get(CACHE_ENV)
    if configured is not None and configured.strip().lower() in _OFF:
        return None
    if configured:
        return Path(configured).expanduser().resolve()
    home_cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(home_cache).expanduser().resolve() / "pflower" / "arrays"


def cached_splits(
    name: str,
    version: str,
    sources: Sequence[Path],
    options: Mapping[str, Any],
    decode: Decode,
    digests: Mapping[str, str] | None = None,
) -> tuple[ImageSplit, ImageSplit]:
    """The ``(train, test)`` splits of a dataset, decoded once per machine and memory-mapped.

    Args:
        name: the dataset's config name (the entry's folder starts with it).
        version: the decoder's version; change it when the decoded arrays would change.
        sources: every file or folder the decoder reads (see
            [`entry_key`][pflower.datasets.cache.entry_key]).
        options: the loader options that change the decoded arrays (JSON-serializable).
        decode: reads the source files; called only when no valid entry exists.
        digests: MD5s of source files (by file name) that the caller has just verified, so
            that they need not be hashed again.

    Returns the splits with images on a read-only memory map of the entry (see the module
    docstring), or decoded in memory when caching is off or impossible. An entry that cannot be
    read (damaged after it was written) is decoded again.
    """
    directory = cache_dir()
    if directory is None:
        return decode()
    entry = directory / f"{name}-{entry_key(name, version, sources, options, digests)}"
    try:
        if _complete(entry):
            with contextlib.suppress(*_READ_ERRORS):
                return read_entry(entry)
        with _locked(entry):
            with contextlib.suppress(*_READ_ERRORS):  # another process may have written it
                return read_entry(entry)
            _write_entry(entry, decode, sources)
        return read_entry(entry)
    except CacheUnavailableError as error:
        warnings.warn(
            f"dataset cache disabled for {name}: {error}. Each process decodes its own copy; "
            f"set {CACHE_ENV} to a writable folder to share one copy per machine.",
            RuntimeWarning,
            stacklevel=2,
        )
        return decode()


T = TypeVar("T")


def cached_arrays(
    kind: str,
    identity: Mapping[str, Any],
    build: Callable[[], dict[str, np.ndarray]],
    parse: Callable[[Mapping[str, np.ndarray]], T],
) -> T:
    """``parse(arrays)``, the arrays computed by ``build`` once per machine for ``identity``.

    For small derived arrays, such as a federation's index lists: stored as
    ``<cache folder>/<kind>/<key>.npz`` (``key`` hashes ``identity``, which must name everything
    the arrays depend on). A file is written to a temporary name and renamed, so a reader never
    sees a partial one; two processes that miss at once both build (the same arrays) and the
    last rename wins. A file that cannot be read or parsed is built again; whatever ``build``
    or ``parse`` raises on fresh arrays propagates, and nothing is stored when ``build`` fails.
    Beyond `_KEPT_ARRAY_FILES` files of a kind, the least recently used are deleted.
    Caching off, or a folder that cannot be written, only costs the build.
    """
    directory = cache_dir()
    if directory is None:
        return parse(build())
    text = json.dumps({"format": _FORMAT, "identity": identity}, sort_keys=True, default=_plain)
    path = directory / kind / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.npz"
    # a file that cannot be read, or whose arrays parse refuses (even as leaking), is built again
    with contextlib.suppress(*_READ_ERRORS, zipfile.BadZipFile, EOFError, RuntimeError):
        with np.load(path) as stored:
            parsed = parse({name: stored[name] for name in stored.files})
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: kept by the pruning below
        return parsed
    arrays = build()
    parsed = parse(arrays)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.stem}.", dir=path.parent)
        try:
            with os.fdopen(handle, "wb") as stream:
                np.savez(stream, **arrays)  # type: ignore[arg-type]  # stub: ** may hold allow_pickle
            os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide a shared cache from others
            os.replace(temporary, path)
        finally:
            Path(temporary).unlink(missing_ok=True)
        _prune_least_recent(path.parent, _KEPT_ARRAY_FILES)
    except OSError as error:
        warnings.warn(f"not cached: {path} ({error})", RuntimeWarning, stacklevel=2)
    return parsed


def _plain(value: Any) -> Any:
    """JSON for the few non-JSON values a cache identity may hold; anything else is refused, so
    that no key depends on a lossy or address-bearing ``str``."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a cache identity cannot hold {type(value).__name__} ({value!r:.80})")


def _prune_least_recent(folder: Path, keep: int) -> None:
    """Keep the ``keep`` most recently used ``.npz`` files; delete temporaries older than an hour
    (left by writers that crashed)."""

    def last_used(path: Path) -> int:
        try:
            return path.stat().st_mtime_ns
        except OSError:  # deleted by another process meanwhile
            return 0

    for stale in sorted(folder.glob("*.npz"), key=last_used, reverse=True)[keep:]:
        stale.unlink(missing_ok=True)
    hour_ago = (time.time() - 3600) * 1e9
    for temporary in folder.glob(".*"):
        if 0 < last_used(temporary) < hour_ago:
            temporary.unlink(missing_ok=True)


def entry_key(
    name: str,
    version: str,
    sources: Sequence[Path],
    options: Mapping[str, Any],
    digests: Mapping[str, str] | None = None,
) -> str:
    """The hex key of an entry: a hash of the name, versions, options and source contents.

    A source file counts by the MD5 of its content: ``digests[file name]`` when the caller already
    verified it against that checksum, else computed here. A source folder (CelebA's images)
    counts by its path, modification time and number of entries, which change when files are
    added, removed or renamed in it.
    """
    known = digests or {}
    identities = []
    for source in sources:
        identity: list[int] | str
        if source.is_dir():
            status = source.stat()
            identity = [status.st_mtime_ns, sum(1 for _ in os.scandir(source))]
        else:
            identity = known.get(source.name) or _md5(source)
        identities.append([str(source.resolve()), identity])
    payload = {
        "format": _FORMAT,
        "name": name,
        "version": version,
        "options": {str(key): options[key] for key in sorted(options)},
        "sources": identities,
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_entry(entry: Path) -> tuple[ImageSplit, ImageSplit]:
    """The splits of a complete entry: images memory-mapped read-only, labels and groups read.

    Raises:
        OSError, ValueError, KeyError: the entry is missing, incomplete or inconsistent.
    """
    meta = json.loads((entry / _META).read_text())
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{entry} has format {meta.get('format')}, not {_FORMAT}")
    images = np.load(entry / "images.npy", mmap_mode="r")
    labels = np.load(entry / "labels.npy")
    has_groups = tuple(meta["groups"])
    groups = torch.from_numpy(np.load(entry / "groups.npy")) if any(has_groups) else None
    n_train, n_test = int(meta["n_train"]), int(meta["n_test"])
    if (
        images.ndim != 4
        or labels.ndim != 1
        or not images.shape[0] == len(labels) == n_train + n_test
    ):
        raise ValueError(f"{entry} does not hold {n_train} + {n_test} images and labels")
    pool_images, pool_labels = _read_only_tensor(images), torch.from_numpy(labels)
    splits = []
    for part, tagged in zip((slice(0, n_train), slice(n_train, None)), has_groups, strict=True):
        tags = groups[part] if tagged and groups is not None else None
        splits.append(ImageSplit(pool_images[part], pool_labels[part], tags))
    return splits[0], splits[1]


def _read_only_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over a read-only memory map, without copying it.

    torch has no read-only tensors: it warns that writing would be undefined. Here a write cannot
    change the file or another process's data: the mapping is read-only, so an in-place write
    stops the process with SIGSEGV. pflower never writes to these tensors;
    [`ImageSplit.subset`][pflower.datasets.base.ImageSplit.subset]
    and every per-client split are copies.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def _complete(entry: Path) -> bool:
    return (entry / _META).is_file()


def _write_entry(entry: Path, decode: Decode, sources: Sequence[Path]) -> None:
    """Decode into a temporary folder and rename it to ``entry`` (the caller holds the lock);
    then remove the entries whose sources are gone."""
    directory = entry.parent
    try:
        for stale in directory.glob(f".{entry.name}.tmp*"):  # left by a writer that crashed
            shutil.rmtree(stale, ignore_errors=True)
        if entry.exists():  # damaged after it was written: processes that map it keep their map
            shutil.rmtree(entry)
    except OSError as error:
        raise CacheUnavailableError(f"cannot replace {entry} ({error})") from error
    train, test = decode()
    try:
        temporary = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp", dir=directory))
        try:
            temporary.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
            _write(temporary, train, test, sources)
            os.rename(temporary, entry)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
    except OSError as error:
        raise CacheUnavailableError(f"cannot write {entry} ({error})") from error
    _prune_orphans(directory)


def _prune_orphans(directory: Path) -> None:
    """Delete entries built from files that no longer exist (a moved or deleted dataset, a test's
    temporary folder): no key can lead to them again. Processes that map one keep their map."""
    for meta in directory.glob(f"*/{_META}"):
        try:
            sources = json.loads(meta.read_text())["sources"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not all(Path(source).exists() for source in sources):
            shutil.rmtree(meta.parent, ignore_errors=True)
            (directory / f".{meta.parent.name}.lock").unlink(missing_ok=True)


def _write(folder: Path, train: ImageSplit, test: ImageSplit, sources: Sequence[Path]) -> None:
    """The entry's files, ``meta.json`` last, each flushed to disk before the rename."""
    if train.images.shape[1:] != test.images.shape[1:] or train.images.dtype != test.images.dtype:
        raise ValueError("train and test images differ in shape or dtype")
    images = np.lib.format.open_memmap(
        folder / "images.npy",
        mode="w+",
        dtype=train.images.numpy().dtype,
        shape=(len(train) + len(test), *train.images.shape[1:]),
    )
    images[: len(train)] = train.images.numpy()
    images[len(train) :] = test.images.numpy()
    images.flush()
    del images
    has_groups = [train.groups is not None, test.groups is not None]
    arrays = {"labels": torch.cat([train.labels, test.labels]).to(torch.int64).numpy()}
    if any(has_groups):
        arrays["groups"] = torch.cat([_groups(train), _groups(test)]).to(torch.int64).numpy()
    for stem, array in arrays.items():
        with open(folder / f"{stem}.npy", "wb") as stream:
            np.save(stream, array)
    meta = {
        "format": _FORMAT,
        "n_train": len(train),
        "n_test": len(test),
        "groups": has_groups,
        "sources": [str(source.resolve()) for source in sources],
    }
    (folder / _META).write_text(json.dumps(meta))
    for path in folder.iterdir():
        with open(path, "rb") as stream:
            os.fsync(stream.fileno())


def _groups(split: ImageSplit) -> torch.Tensor:
    if split.groups is not None:
        return split.groups
    return torch.full((len(split),), -1, dtype=torch.int64)


@contextlib.contextmanager
def _locked(entry: Path) -> Iterator[None]:
    """Held by one process at a time per entry, across processes (a no-op without fcntl)."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        handle = open(entry.parent / f".{entry.name}.lock", "a+b")  # noqa: SIM115 (closed below)
    except OSError as error:
        raise CacheUnavailableError(f"cannot write to {entry.parent} ({error})") from error
    try:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield
    finally:
        handle.close()  # closing releases the lock
