"""Partitions from files: ``partition=from_file``, the writer behind ``pflower partition`` and the
PFLlib importer (FedALA's experiments ran on PFLlib-generated client data), with
``pflower partition import`` and ``split=file`` keeping each client's own test set."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pflower.cli import partition_import
from pflower.compose import compose_config
from pflower.core.experiment import Experiment
from pflower.datasets.base import resolve_data_root
from pflower.datasets.partitioners.from_file import import_pflib, write_federation
from pflower.registry import ConfigError
from tests.inprocess import run_inprocess

BASE = ["dataset=digits", "model=small_cnn", "num_clients=4", "split=fedala"]


def _federation(overrides: list[str]):
    return Experiment.of(compose_config([*BASE, *overrides])).federation


def _owned(federation) -> list[set[int]]:
    return [set(np.concatenate([c.train, c.test, c.val]).tolist()) for c in federation.clients]


def _assert_fedala_trains_on(overrides: list[str], tmp_path: Path) -> None:
    """A round of FedALA on the federation of ``overrides`` evaluates its 4 clients."""
    rows, _ = run_inprocess([*overrides, "rounds=1", "strategy=fedala"], tmp_path / "run")
    assert len([r for r in rows if r["stage"] == "L1"]) == 4


def test_a_written_partition_reads_back_as_the_same_client_samples(tmp_path: Path) -> None:
    original = _federation(["partition=pathological"])
    path = write_federation(tmp_path / "indices.json", original, "all")
    again = _federation(["partition=from_file", f"partition.path={path}"])
    assert _owned(again) == _owned(original)
    for client in again.clients:  # the split config carves 25% test shares, disjoint from train
        assert not set(client.train.tolist()) & set(client.test.tolist())
    _assert_fedala_trains_on([*BASE, "partition=from_file", f"partition.path={path}"], tmp_path)


def test_a_file_for_another_pool_or_client_count_is_rejected(tmp_path: Path) -> None:
    original = _federation(["partition=pathological"])
    path = write_federation(tmp_path / "indices.json", original, "all")
    with pytest.raises(ConfigError, match="lists 4 clients but num_clients=3"):
        _federation(["partition=from_file", f"partition.path={path}", "num_clients=3"])
    with pytest.raises(ConfigError, match="subsample_fraction"):
        _federation(
            ["partition=from_file", f"partition.path={path}", "split.subsample_fraction=0.5"]
        )
    payload = json.loads(path.read_text())
    payload["labels"][0][0] = (payload["labels"][0][0] + 1) % 10
    path.write_text(json.dumps(payload))
    with pytest.raises(ConfigError, match="labels differ"):
        _federation(["partition=from_file", f"partition.path={path}"])


def _write_pflib(
    folder: Path, images: np.ndarray, labels: np.ndarray, clients: list[np.ndarray], scale: float
) -> dict[str, list[np.ndarray]]:
    """A PFLlib dataset folder of ``clients`` (pool indices), as PFLlib's generators write it:
    per client a shuffled 75/25 train/test cut saved as ``{train,test}/<i>.npz`` (a pickled dict
    ``data`` with images normalized to [-1, 1] and labels), and ``config.json``. Returns the pool
    indices of every client's train and test file."""
    rng = np.random.default_rng(1)
    written: dict[str, list[np.ndarray]] = {"train": [], "test": []}
    for client, indices in enumerate(clients):
        rows = rng.permutation(indices)
        cut = int(0.75 * len(rows))
        for part, chosen in (("train", rows[:cut]), ("test", rows[cut:])):
            (folder / part).mkdir(parents=True, exist_ok=True)
            x = ((images[chosen] / scale - 0.5) / 0.5).astype(np.float32)
            np.savez_compressed(folder / part / f"{client}.npz", data={"x": x, "y": labels[chosen]})
            written[part].append(chosen)
    sizes = [[[int(c), int((labels[i] == c).sum())] for c in np.unique(labels[i])] for i in clients]
    config = {
        "num_clients": len(clients),
        "num_classes": 10,
        "non_iid": True,
        "balance": False,
        "partition": "dir",
        "Size of samples for labels in clients": sizes,
        "alpha": 0.1,
        "batch_size": 10,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return written


def _dirichlet_clients(labels: np.ndarray, clients: int, alpha: float, size: int) -> list:
    """Dir(alpha) label skew over ``size`` random pool samples (PFLlib's ``dir`` partition, made
    small), every client with at least 8 samples."""
    rng = np.random.default_rng(0)
    sample = rng.permutation(len(labels))[:size]
    while True:
        owner = np.empty(size, dtype=np.int64)
        for label in np.unique(labels[sample]):
            members = np.flatnonzero(labels[sample] == label)
            owner[members] = rng.choice(clients, len(members), p=rng.dirichlet([alpha] * clients))
        if np.bincount(owner, minlength=clients).min() >= 8:
            return [sample[owner == client] for client in range(clients)]


def test_pflib_folders_map_back_to_the_pool_samples(tmp_path: Path) -> None:
    """A PFLlib-style folder (normalized x, y per client, 75/25 train/test files) built from known
    pool samples imports back to samples with exactly those pixels and labels, train and test."""
    federation = _federation(["partition=pathological"])
    images = federation.pool.images.numpy()
    labels = federation.pool.labels.numpy()
    rng = np.random.default_rng(0)
    chosen = np.split(rng.permutation(len(labels))[:300], 3)
    written = _write_pflib(tmp_path, images, labels, chosen, 16.0)
    imported = import_pflib(tmp_path, images, labels, pixel_max=16.0)
    assert len(imported.trains) == len(imported.tests) == 3

    def content(rows: np.ndarray) -> list[bytes]:
        return sorted(images[r].tobytes() + bytes([labels[r]]) for r in rows)

    got_all, want_all = imported.trains + imported.tests, written["train"] + written["test"]
    for got, want in zip(got_all, want_all, strict=True):
        assert len(got) == len(want) == len(set(got.tolist()))
        assert content(got) == content(want)


DATASETS_FOR_PFLIB = [
    pytest.param(["dataset=digits"], True, id="digits"),
    pytest.param(
        ["dataset=mnist"],
        False,
        id="mnist",
        marks=pytest.mark.skipif(
            not (resolve_data_root(None) / "mnist").is_dir(), reason="MNIST files not present"
        ),
    ),
]


@pytest.mark.parametrize(("dataset", "run"), DATASETS_FOR_PFLIB)
def test_an_imported_pflib_partition_keeps_every_clients_own_test_set(
    tmp_path: Path, dataset: list[str], run: bool
) -> None:
    """FedALA's MNIST Dir(0.1) setting in PFLlib's format, small: `pflower partition import pflib`
    writes a from_file partition, and with split=file every client's test share is exactly the
    samples of its test/<i>.npz (same size, same pixels and labels), its train share those of
    train/<i>.npz; a run trains on it (on digits, the fast dataset)."""
    federation = _federation([*dataset, "partition=iid"])
    images, labels = federation.pool.images.numpy(), federation.pool.labels.numpy()
    scale = federation.dataset.scale
    clients = _dirichlet_clients(labels, 4, 0.1, 400)
    written = _write_pflib(tmp_path / "MNIST", images, labels, clients, scale)
    out = tmp_path / "fedala_mnist_dir01.json"
    code = partition_import(["pflib", str(tmp_path / "MNIST"), *dataset, "--out", str(out)])
    assert code == 0
    overrides = [*dataset, "partition=from_file", f"partition.path={out}", "split=file"]
    imported = Experiment.of(
        compose_config([*overrides, "model=small_cnn", "num_clients=4"])
    ).federation

    def content(rows: np.ndarray) -> list[bytes]:
        return sorted(images[r].tobytes() + bytes([labels[r]]) for r in rows)

    for client, (train, test) in enumerate(zip(written["train"], written["test"], strict=True)):
        got = imported.clients[client]
        assert len(got.test) == len(test)
        np.testing.assert_array_equal(np.sort(labels[got.test]), np.sort(labels[test]))
        assert content(got.test) == content(test)
        assert content(got.train) == content(train)
    again = write_federation(tmp_path / "again.json", imported, "all", own_tests=True)
    assert json.loads(again.read_text()) == json.loads(out.read_text())  # `pflower partition`'s
    if not run:
        return
    _assert_fedala_trains_on([*overrides, "model=small_cnn", "num_clients=4"], tmp_path)


def test_split_file_needs_a_file_with_tests(tmp_path: Path) -> None:
    """split=file takes tests only from a from_file file that lists them."""
    original = _federation(["partition=pathological"])
    path = write_federation(tmp_path / "indices.json", original, "all")
    with pytest.raises(ConfigError, match="lists no client test shares"):
        _federation(["partition=from_file", f"partition.path={path}", "split=file"])
    with pytest.raises(ConfigError, match="partition=from_file"):
        _federation(["partition=iid", "split=file"])
    with pytest.raises(ConfigError, match=r"split\.pool=all"):
        _federation(["partition=iid", "split=file", "split.pool=train"])
    assert partition_import(["leaf", str(tmp_path / "nothing")]) == 2
