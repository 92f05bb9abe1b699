"""The dataset cache: decoded once per machine, memory-mapped read-only, identical arrays.

A tiny MNIST in the original gzip IDX format is written under ``tmp_path``; ``PFLOWER_CACHE``
points at a folder of the test, so nothing is written outside it.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from pflower.datasets import cache, idx
from pflower.datasets.base import ImageSplit
from pflower.datasets.federation import build_federation

PARTITION = {"name": "pathological", "classes_per_client": 2}


def _write_idx(path: Path, array: np.ndarray) -> None:
    dims = b"".join(int(size).to_bytes(4, "big") for size in array.shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as stream:
        stream.write(bytes([0, 0, 8, array.ndim]) + dims + array.astype(np.uint8).tobytes())


def _write_mnist(root: Path, seed: int = 0, n_train: int = 40, n_test: int = 12) -> None:
    rng = np.random.default_rng(seed)
    for prefix, count in (("train", n_train), ("t10k", n_test)):
        _write_idx(
            root / "mnist" / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (count, 28, 28))
        )
        _write_idx(root / "mnist" / f"{prefix}-labels-idx1-ubyte.gz", np.arange(count) % 10)


@pytest.fixture
def cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(cache.CACHE_ENV, str(folder))
    return folder


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The IDX files decoded in this process, in order."""
    calls: list[Path] = []
    original = idx.read_idx

    def counting(path: Path) -> np.ndarray:
        calls.append(path)
        return original(path)

    monkeypatch.setattr(idx, "read_idx", counting)
    return calls


def _entries(folder: Path) -> list[Path]:
    """The dataset entries (not the federations' index lists, cached beside them)."""
    return sorted(
        path
        for path in folder.iterdir()
        if not path.name.startswith(".") and path.name != "federations"
    )


def _assert_arrays_close(first: ImageSplit, second: ImageSplit) -> None:
    for field in ("images", "labels"):
        a, b = getattr(first, field), getattr(second, field)
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), field
    assert (first.groups is None) == (second.groups is None)
    if first.groups is not None:
        assert torch.equal(first.groups, second.groups)


def _mapped_files() -> str:
    return Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""


def test_written_once_then_mapped(tmp_path: Path, cache_folder: Path, decodes: list[Path]) -> None:
    _write_mnist(tmp_path)
    first = idx.load_mnist(root=tmp_path, verify=False)
    assert len(decodes) == 4  # two image and two label files, decoded once
    (entry,) = _entries(cache_folder)
    assert entry.name.startswith("mnist-")
    meta = json.loads((entry / "meta.json").read_text())
    assert (meta["n_train"], meta["n_test"], meta["groups"]) == (40, 12, [False, False])
    second = idx.load_mnist(root=tmp_path, verify=False)
    assert len(decodes) == 4  # reused: nothing decoded again
    _assert_arrays_close(first.train, second.train)
    _assert_arrays_close(first.test, second.test)
    assert _temporary(cache_folder) == []
    if _mapped_files():  # Linux: the images are a map of the entry's file, not a copy
        assert str(entry / "images.npy") in _mapped_files()


def test_cached_arrays_identical_to_decoding_in_memory(
    tmp_path: Path, cache_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_mnist(tmp_path)
    cached = idx.load_mnist(root=tmp_path, verify=False)
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    plain = idx.load_mnist(root=tmp_path, verify=False)
    _assert_arrays_close(cached.train, plain.train)
    _assert_arrays_close(cached.test, plain.test)
    split = {"client_test": "mirror"}
    ours, theirs = (build_federation(d, 4, 3, PARTITION, split) for d in (cached, plain))
    _assert_arrays_close(ours.pool, theirs.pool)
    for a, b in zip(ours.clients, theirs.clients, strict=True):
        assert all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("train", "test", "val"))
    # the pool is a view of the mapped train+test array: no per-process copy of the dataset
    assert ours.pool.images.data_ptr() == cached.train.images.data_ptr()
    assert theirs.pool.images.data_ptr() != plain.train.images.data_ptr()


def test_invalidated_when_a_source_file_changes(
    tmp_path: Path, cache_folder: Path, decodes: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_mnist(tmp_path, seed=0)
    before = idx.load_mnist(root=tmp_path, verify=False)
    _write_mnist(tmp_path, seed=1)  # same names and sizes, other pixels
    after = idx.load_mnist(root=tmp_path, verify=False)
    assert len(decodes) == 8 and len(_entries(cache_folder)) == 2
    assert not torch.equal(before.train.images, after.train.images)
    monkeypatch.setenv(cache.CACHE_ENV, "off")  # a fresh decode in memory gives the same
    _assert_arrays_close(after.train, idx.load_mnist(root=tmp_path, verify=False).train)


def test_damaged_or_interrupted_entries_are_rebuilt(
    tmp_path: Path, cache_folder: Path, decodes: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_mnist(tmp_path)
    loaded = idx.load_mnist(root=tmp_path, verify=False)
    # copies: the entry's files are replaced below, and a map of a truncated file is unreadable
    reference = [
        ImageSplit(s.images.clone(), s.labels.clone()) for s in (loaded.train, loaded.test)
    ]
    del loaded
    (entry,) = _entries(cache_folder)
    # A writer that fails half-way leaves neither an entry nor its temporary folder.
    write = cache._write
    monkeypatch.setattr(cache, "_write", _failing_write)
    (entry / "meta.json").unlink()  # an incomplete entry is rebuilt (and here fails to write)
    with pytest.raises(RuntimeError, match="disk died"):
        idx.load_mnist(root=tmp_path, verify=False)
    assert _entries(cache_folder) == [] and _temporary(cache_folder) == []
    monkeypatch.setattr(cache, "_write", write)
    (cache_folder / f".{entry.name}.tmp-left-by-a-crash").mkdir()
    rebuilt = idx.load_mnist(root=tmp_path, verify=False)
    _assert_arrays_close(rebuilt.train, reference[0])
    del rebuilt
    assert _temporary(cache_folder) == []
    # A damaged images file is detected and the entry decoded again.
    (entry / "images.npy").write_bytes(b"\x93NUMPY garbage")
    count = len(decodes)
    _assert_arrays_close(idx.load_mnist(root=tmp_path, verify=False).test, reference[1])
    assert len(decodes) == count + 4


def _temporary(folder: Path) -> list[Path]:
    return [path for path in folder.iterdir() if ".tmp" in path.name]


def _failing_write(folder: Path, *args: object) -> None:
    (folder / "images.npy").write_bytes(b"partial")
    raise RuntimeError("disk died")


def _load_in_child(root: str, folder: str, log: str, barrier, results) -> None:
    """Load the tiny MNIST in a forked process once all are ready; log every decode."""
    os.environ[cache.CACHE_ENV] = folder
    original = idx.read_idx

    def logged(path: Path) -> np.ndarray:
        with open(log, "a") as stream:
            stream.write(f"{os.getpid()} {path.name}\n")
        return original(path)

    idx.read_idx = logged
    barrier.wait()
    dataset = idx.load_mnist(root=root, verify=False)
    images = np.concatenate([dataset.train.images.numpy(), dataset.test.images.numpy()])
    results.put(f"{images.sum()}:{dataset.train.labels.numpy().sum()}:{images.shape}")


def test_concurrent_processes_decode_once(tmp_path: Path, cache_folder: Path) -> None:
    _write_mnist(tmp_path, n_train=3000)
    log = tmp_path / "decodes.log"
    # fork: the children start at once (no imports) and race for the entry after a barrier;
    # they use numpy only, which is safe after a fork
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(4), context.Queue()
    children = [
        context.Process(
            target=_load_in_child,
            args=(str(tmp_path), str(cache_folder), str(log), barrier, results),
        )
        for _ in range(4)
    ]
    for child in children:
        child.start()
    digests = [results.get(timeout=120) for _ in children]
    for child in children:
        child.join()
    assert len(set(digests)) == 1 and all(child.exitcode == 0 for child in children)
    lines = log.read_text().splitlines()
    assert len(lines) == 4 and len({line.split()[0] for line in lines}) == 1  # one process
    assert len(_entries(cache_folder)) == 1
    assert _temporary(cache_folder) == []


def test_shared_images_are_read_only_and_client_data_are_copies(
    tmp_path: Path, cache_folder: Path
) -> None:
    _write_mnist(tmp_path)
    dataset = idx.load_mnist(root=tmp_path, verify=False)
    federation = build_federation(dataset, 4, 0, PARTITION, {})
    client = federation.client_train(0)
    before = federation.pool.images.clone()
    client.images.fill_(7)  # a client scribbling on its own data changes nothing shared
    assert torch.equal(federation.pool.images, before)
    assert torch.equal(federation.client_train(0).images, before[federation.clients[0].train])
    (entry,) = _entries(cache_folder)
    stored = (entry / "images.npy").read_bytes()
    script = textwrap.dedent(
        f"""
        import os
        os.environ[{cache.CACHE_ENV!r}] = {str(cache_folder)!r}
        from pflower.datasets import idx
        dataset = idx.load_mnist(root={str(tmp_path)!r}, verify=False)
        dataset.train.images[0, 0, 0, 0] = 1
        print("written")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode != 0 and "written" not in result.stdout  # SIGSEGV: a read-only map
    assert (entry / "images.npy").read_bytes() == stored


def test_groups_round_trip(cache_folder: Path, tmp_path: Path) -> None:
    source = tmp_path / "source.bin"
    source.write_bytes(b"x")
    train = ImageSplit(
        torch.arange(24, dtype=torch.uint8).view(6, 1, 2, 2),
        torch.arange(6),
        torch.tensor([0, 1, 1, 0, 2, 2]),
    )
    test = ImageSplit(torch.ones(2, 1, 2, 2, dtype=torch.uint8), torch.tensor([1, 0]))
    got = cache.cached_splits("toy", "1", [source], {"k": 1}, lambda: (train, test))
    again = cache.cached_splits("toy", "1", [source], {"k": 1}, _must_not_decode)
    for split, expected in zip((got, again), ((train, test), (train, test)), strict=True):
        _assert_arrays_close(split[0], expected[0])
        _assert_arrays_close(split[1], expected[1])  # groups stay None where the split had none
    other_options = cache.cached_splits("toy", "1", [source], {"k": 2}, lambda: (test, train))
    _assert_arrays_close(other_options[0], test)


def _must_not_decode() -> tuple[ImageSplit, ImageSplit]:
    raise AssertionError("decoded although a valid entry exists")


def test_unwritable_cache_falls_back_to_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(cache.CACHE_ENV, str(blocker / "cache"))
    _write_mnist(tmp_path)
    with pytest.warns(RuntimeWarning, match="dataset cache disabled"):
        dataset = idx.load_mnist(root=tmp_path, verify=False)
    assert dataset.train.images.shape == (40, 1, 28, 28)


def test_entries_of_deleted_sources_are_pruned(tmp_path: Path, cache_folder: Path) -> None:
    _write_mnist(tmp_path / "a")
    idx.load_mnist(root=tmp_path / "a", verify=False)
    (old,) = _entries(cache_folder)
    for path in (tmp_path / "a" / "mnist").iterdir():
        path.unlink()
    _write_mnist(tmp_path / "b", seed=5)
    idx.load_mnist(root=tmp_path / "b", verify=False)
    (new,) = _entries(cache_folder)
    assert new != old and not (cache_folder / f".{old.name}.lock").exists()


def test_cache_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "pflower" / "arrays"
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    assert cache.cache_dir() is None
