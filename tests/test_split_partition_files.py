"""Partitions from files: ``partition=from_file``, the writer behind ``pflower partition`` and the
PFLlib importer (FedALA's experiments ran on PFLlib-generated client data)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pflower.compose import compose_config
from pflower.core.experiment import Experiment
from pflower.datasets.partitioners.from_file import import_pflib, write_federation
from pflower.registry import ConfigError
from tests.inprocess import run_inprocess

BASE = ["dataset=digits", "model=small_cnn", "num_clients=4", "split=fedala"]


def _federation(overrides: list[str]):
    return Experiment.of(compose_config([*BASE, *overrides])).federation


def _owned(federation) -> list[set[int]]:
    return [set(np.concatenate([c.train, c.test, c.val]).tolist()) for c in federation.clients]


def test_a_written_partition_reads_back_as_the_same_client_samples(tmp_path: Path) -> None:
    original = _federation(["partition=pathological"])
    path = write_federation(tmp_path / "indices.json", original, "all")
    again = _federation(["partition=from_file", f"partition.path={path}"])
    assert _owned(again) == _owned(original)
    for client in again.clients:  # the split config carves 25% test shares, disjoint from train
        assert not set(client.train.tolist()) & set(client.test.tolist())
    rows, _ = run_inprocess(
        [*BASE, "partition=from_file", f"partition.path={path}", "rounds=1", "strategy=fedala"],
        tmp_path / "run",
    )
    assert len([r for r in rows if r["stage"] == "L1"]) == 4


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


def test_pflib_folders_map_back_to_the_pool_samples(tmp_path: Path) -> None:
    """A PFLlib-style folder (normalized x, y per client, 75/25 train/test files) built from known
    pool samples imports back to samples with exactly those pixels and labels."""
    federation = _federation(["partition=pathological"])
    images = federation.pool.images.numpy()
    labels = federation.pool.labels.numpy()
    rng = np.random.default_rng(0)
    chosen = np.split(rng.permutation(len(labels))[:300], 3)
    for client, indices in enumerate(chosen):
        cut = int(0.75 * len(indices))
        for part, rows in (("train", indices[:cut]), ("test", indices[cut:])):
            (tmp_path / part).mkdir(exist_ok=True)
            x = ((images[rows] / 16.0 - 0.5) / 0.5).astype(np.float32)
            data = {"x": x, "y": labels[rows]}
            np.savez_compressed(tmp_path / part / f"{client}.npz", data=data)
    imported = import_pflib(tmp_path, images, labels, pixel_max=16.0)
    assert len(imported) == 3
    for got, want in zip(imported, chosen, strict=True):
        assert len(got) == len(want) == len(set(got.tolist()))

        def content(rows: np.ndarray) -> list[bytes]:
            return sorted(images[r].tobytes() + bytes([labels[r]]) for r in rows)

        assert content(got) == content(want)
