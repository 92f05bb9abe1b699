"""Data a user brings: LEAF JSON, image folders, tables and Hugging Face datasets, each written
here in its exact on-disk format (nothing can be downloaded), loaded by its ``dataset=`` loader
and trained on for two rounds; ``partition=natural`` makes one client of each user, folder or
silo the files name, and ``pflower partition import leaf`` keeps each LEAF user's own test set.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pflower.cli import partition_import
from pflower.compose import compose_config
from pflower.core.experiment import Experiment
from pflower.datasets.loaders import load_dataset
from pflower.registry import ConfigError
from tests.inprocess import run_inprocess

RUN = ["rounds=2", "strategy=fedavg", "seed=0"]


def _trained(rows: list[dict], clients: int) -> None:
    """Both rounds ran and every client was evaluated on its own test share."""
    assert max(int(r["round"]) for r in rows) == 2
    assert len({r["client"] for r in rows if r["stage"] == "L1" and "client" in r}) == clients


# --- LEAF ----------------------------------------------------------------------------------------


def _write_leaf(folder: Path, users: dict[str, tuple[int, int]]) -> dict[str, list[int]]:
    """LEAF JSON (FEMNIST layout: 784 floats per x, int y) with ``users`` = {id: (train, test)}
    sample counts, the users spread over two train files as LEAF's scripts write them. Returns
    each user's test labels."""
    rng = np.random.default_rng(0)
    tests: dict[str, list[int]] = {}
    for part, column in (("train", 0), ("test", 1)):
        (folder / part).mkdir(parents=True, exist_ok=True)
        chunks = [list(users)[:1], list(users)[1:]] if part == "train" else [list(users)]
        for number, chunk in enumerate(chunks):
            user_data = {}
            for user in chunk:
                count = users[user][column]
                y = rng.integers(0, 62, count).tolist()
                user_data[user] = {"x": rng.random((count, 784)).round(3).tolist(), "y": y}
                if part == "test":
                    tests[user] = y
            payload = {
                "users": chunk,
                "num_samples": [users[user][column] for user in chunk],
                "user_data": user_data,
            }
            (folder / part / f"all_data_{number}_niid_05_keep_0_{part}_9.json").write_text(
                json.dumps(payload)
            )
    return tests


def test_leaf_femnist_imports_with_each_users_own_test_set_and_trains(tmp_path: Path) -> None:
    tests = _write_leaf(
        tmp_path / "femnist", {"f0003_12": (9, 3), "f0001_40": (12, 4), "f0002_7": (6, 2)}
    )
    out = tmp_path / "leaf.json"
    assert partition_import(["leaf", str(tmp_path / "femnist"), "--out", str(out)]) == 0
    overrides = [
        "dataset=leaf",
        f"dataset.path={tmp_path / 'femnist'}",
        "partition=from_file",
        f"partition.path={out}",
        "split=file",
        "num_clients=3",
        "model=small_cnn",
    ]
    federation = Experiment.of(compose_config(overrides)).federation
    labels = federation.pool.labels.numpy()
    for client, user in enumerate(sorted(tests)):  # users in sorted id order
        got = federation.clients[client]
        np.testing.assert_array_equal(labels[got.test], tests[user])
        assert len(got.train) == {"f0001_40": 12, "f0002_7": 6, "f0003_12": 9}[user]
    assert federation.dataset.input_shape == (1, 28, 28)
    rows, _ = run_inprocess([*overrides, *RUN], tmp_path / "run")
    _trained(rows, 3)


# --- image folders -------------------------------------------------------------------------------


def _png(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.full((10, 10, 3), value, dtype=np.uint8)
    pixels[value % 10] = 255 - value
    Image.fromarray(pixels).save(path)


def test_image_folders_one_per_client_train_two_rounds(tmp_path: Path) -> None:
    """``<client>/<class>/<image>.png``: each client folder becomes one client."""
    for client in ("hospital_a", "hospital_b"):
        for label, name in enumerate(("cat", "dog")):
            for i in range(4):
                _png(tmp_path / "images" / client / name / f"{i}.png", 40 * label + 7 * i)
    overrides = [
        "dataset=image_folder",
        f"dataset.path={tmp_path / 'images'}",
        "dataset.per_client=true",
        "dataset.image_size=8",
        "partition=natural",
        "num_clients=2",
        "model=small_cnn",
    ]
    federation = Experiment.of(compose_config(overrides)).federation
    assert federation.dataset.input_shape == (1, 8, 8) and federation.dataset.num_classes == 2
    groups = federation.pool.groups
    assert groups is not None
    for client in range(2):
        share = np.concatenate([federation.clients[client].train, federation.clients[client].test])
        assert set(groups[share].tolist()) == {client} and len(share) == 8
    rows, _ = run_inprocess([*overrides, *RUN], tmp_path / "run")
    _trained(rows, 2)


def test_image_folders_per_class_with_a_client_map(tmp_path: Path) -> None:
    """``train/<class>/`` and ``test/<class>/`` with a ``file,client`` CSV: RGB images, classes in
    sorted folder order, each file's client as its group."""
    mapping = []
    for part in ("train", "test"):
        for label, name in enumerate(("a", "b", "c")):
            for i in range(2):
                file = f"{part}/{name}/{i}.png"
                _png(tmp_path / file, 30 * label + i)
                mapping.append([file, f"site{i}"])
    with (tmp_path / "clients.csv").open("w", newline="") as stream:
        csv.writer(stream).writerows(mapping)
    dataset = load_dataset(
        "image_folder",
        {"path": str(tmp_path), "client_map": str(tmp_path / "clients.csv"), "channels": 3},
    )
    assert dataset.input_shape == (3, 28, 28) and dataset.num_classes == 3
    assert len(dataset.train) == len(dataset.test) == 6
    assert dataset.train.labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert dataset.train.groups is not None and dataset.train.groups.tolist() == [0, 1] * 3
    assert float(dataset.train.images.max()) <= 1.0


# --- tables --------------------------------------------------------------------------------------


def _write_table(path: Path, rows: int, silos: int) -> None:
    rng = np.random.default_rng(0)
    with path.open("w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["age", "dose", "score", "outcome", "silo"])
        for row in range(rows):
            label = ("healthy", "ill")[row % 2]
            writer.writerow([*(rng.normal(size=3) + row % 2).round(3), label, f"s{row % silos}"])


def test_a_csv_table_with_a_silo_column_trains_an_mlp(tmp_path: Path) -> None:
    _write_table(tmp_path / "train.csv", 60, 3)
    _write_table(tmp_path / "test.csv", 18, 3)
    overrides = [
        "dataset=table",
        f"dataset.path={tmp_path / 'train.csv'}",
        f"dataset.test_path={tmp_path / 'test.csv'}",
        "dataset.label=outcome",
        "dataset.client_column=silo",
        "partition=natural",
        "num_clients=3",
        "model=mlp",
        "model.hidden=[16]",
    ]
    federation = Experiment.of(compose_config(overrides)).federation
    dataset = federation.dataset
    assert dataset.input_shape == (3, 1, 1) and dataset.num_classes == 2
    assert dataset.train.labels[:4].tolist() == [0, 1, 0, 1]  # healthy < ill
    standardized = dataset.normalize(dataset.train.images)  # one channel per feature
    assert abs(float(standardized.mean())) < 1e-5
    assert [len(c.train) + len(c.test) for c in federation.clients] == [20, 20, 20]
    rows, _ = run_inprocess([*overrides, *RUN], tmp_path / "run")
    _trained(rows, 3)


def test_a_parquet_table_reads_as_its_csv(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    _write_table(tmp_path / "train.csv", 12, 2)
    csv_data = load_dataset(
        "table", {"path": str(tmp_path / "train.csv"), "label": "outcome", "client_column": "silo"}
    )
    with (tmp_path / "train.csv").open(newline="") as stream:
        rows = list(csv.DictReader(stream))
    columns = {k: [float(r[k]) for r in rows] for k in ("age", "dose", "score")}
    columns |= {k: [r[k] for r in rows] for k in ("outcome", "silo")}
    pq.write_table(pa.table(columns), tmp_path / "train.parquet")
    parquet = load_dataset(
        "table",
        {"path": str(tmp_path / "train.parquet"), "label": "outcome", "client_column": "silo"},
    )
    assert np.allclose(parquet.train.images.numpy(), csv_data.train.images.numpy())
    assert parquet.train.labels.tolist() == csv_data.train.labels.tolist()
    with pytest.raises(ConfigError, match="no column 'target'"):
        load_dataset("table", {"path": str(tmp_path / "train.csv"), "label": "target"})


# --- Hugging Face --------------------------------------------------------------------------------


def _hf_dataset(samples: int, writers: int) -> object:
    import datasets

    rng = np.random.default_rng(0)
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=["zero", "one", "two"]),
            "writer_id": datasets.Value("string"),
        }
    )
    return datasets.Dataset.from_dict(
        {
            "image": [
                Image.fromarray(rng.integers(0, 255, (12, 12), dtype=np.uint8))
                for _ in range(samples)
            ],
            "label": [i % 3 for i in range(samples)],
            "writer_id": [f"w{i % writers}" for i in range(samples)],
        },
        features=features,
    )


def test_a_saved_hf_dataset_with_a_writer_column_trains_per_writer(tmp_path: Path) -> None:
    """A ``save_to_disk`` DatasetDict (FEMNIST-like ``writer_id`` column): classes from its
    ClassLabel feature, one client per writer with ``partition=natural`` (train and test)."""
    import datasets

    datasets.DatasetDict({"train": _hf_dataset(24, 2), "test": _hf_dataset(8, 2)}).save_to_disk(
        str(tmp_path / "saved")
    )
    overrides = [
        "dataset=hf",
        f"dataset.path={tmp_path / 'saved'}",
        "dataset.client_column=writer_id",
        "dataset.image_size=8",
        "partition=natural",
        "split.pool=all",
        "num_clients=2",
        "model=small_cnn",
    ]
    federation = Experiment.of(compose_config(overrides)).federation
    assert federation.dataset.num_classes == 3 and federation.dataset.input_shape == (1, 8, 8)
    assert [len(c.train) + len(c.test) for c in federation.clients] == [16, 16]
    rows, _ = run_inprocess([*overrides, *RUN], tmp_path / "run")
    _trained(rows, 2)


def test_hf_through_federated_dataset_reads_a_packaged_builder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dataset.dataset=imagefolder`` goes through Flower Datasets' FederatedDataset (with
    ``datasets``' offline ``imagefolder`` builder instead of a Hub id)."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    for part in ("train", "test"):
        for label, name in enumerate(("a", "b")):
            for i in range(3):
                _png(tmp_path / "data" / part / name / f"{i}.png", 50 * label + i)
    dataset = load_dataset(
        "hf",
        {"dataset": "imagefolder", "data_dir": str(tmp_path / "data"), "image_size": 8},
    )
    assert len(dataset.train) == len(dataset.test) == 6 and dataset.num_classes == 2
    assert sorted(dataset.train.labels.tolist()) == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ConfigError, match="exactly one of"):
        load_dataset("hf", {})


def test_a_saved_hf_dataset_of_text_trains_an_lstm_on_word_ids(tmp_path: Path) -> None:
    """``text_column``: word ids as LEAF's Sent140 encoding makes them, the vocabulary from the
    train split only (a word seen only in test is the unknown id); one client per writer."""
    import datasets

    def part(texts: list[str], labels: list[int]) -> datasets.Dataset:
        writers = [f"w{i % 2}" for i in range(len(texts))]
        return datasets.Dataset.from_dict({"text": texts, "label": labels, "writer": writers})

    train = part(["good day", "bad day", "good good", "so bad"] * 3, [1, 0, 1, 0] * 3)
    test = part(["good news", "bad", "day", "good bad"], [1, 0, 1, 0])
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "saved"))
    data = ["dataset=hf", f"dataset.path={tmp_path / 'saved'}", "dataset.text_column=text"]
    options = {"path": str(tmp_path / "saved"), "text_column": "text", "seq_len": 3}
    dataset = load_dataset("hf", {**options, "vocab_size": 3})
    # train words by count: good 9, bad 6, day 6, so 3: ids good 0, bad 1; 2 = unknown/padding
    np.testing.assert_array_equal(dataset.test.images[:, 0, 0].numpy()[0], [0, 2, 2])
    assert dataset.vocab_size == 3 and dataset.input_shape == (1, 1, 3)
    overrides = [
        *data,
        "dataset.client_column=writer",
        "dataset.num_classes=2",
        "model=sent140_lstm",
        "model.hidden_size=8",
        "model.embedding_dim=8",
        "partition=natural",
        "num_clients=2",
    ]
    rows, _ = run_inprocess([*overrides, *RUN], tmp_path / "run")
    _trained(rows, 2)


def test_a_saved_hf_dataset_of_numeric_columns_trains_an_mlp(tmp_path: Path) -> None:
    """``feature_columns``: one feature per column, standardized as ``dataset=table`` does."""
    import datasets

    rng = np.random.default_rng(0)
    rows = 24
    columns = {"age": rng.normal(50, 10, rows).tolist(), "dose": rng.normal(2, 1, rows).tolist()}
    labels = [int(a > 50) for a in columns["age"]]
    datasets.Dataset.from_dict({**columns, "label": labels, "note": ["x"] * rows}).save_to_disk(
        str(tmp_path / "saved")
    )
    overrides = [
        "dataset=hf",
        f"dataset.path={tmp_path / 'saved'}",
        "dataset.test_split=null",
        "dataset.feature_columns=[age,dose]",
        "dataset.num_classes=2",
        "split.pool=all",
        "partition=iid",
        "num_clients=2",
        "model=mlp",
    ]
    dataset = Experiment.of(compose_config(overrides)).federation.dataset
    assert dataset.input_shape == (2, 1, 1) and len(dataset.test) == 0
    np.testing.assert_allclose(dataset.train.images[:, 0, 0, 0].numpy(), columns["age"], rtol=1e-6)
    assert dataset.mean[0] == pytest.approx(np.mean(columns["age"]), rel=1e-5)
    rows_, _ = run_inprocess([*overrides, *RUN], tmp_path / "run")
    _trained(rows_, 2)
    with pytest.raises(ConfigError, match="must be numeric columns"):
        load_dataset(
            "hf",
            {
                "path": str(tmp_path / "saved"),
                "test_split": None,
                "feature_columns": ["age", "note"],
                "num_classes": 2,
            },
        )
    with pytest.raises(ConfigError, match="not both"):
        compose_config([*overrides, "dataset.text_column=note"])
