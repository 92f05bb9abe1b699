"""LEAF's text datasets, Shakespeare and Sent140, written here in LEAF's exact JSON layout
(``{"users", "num_samples", "user_data": {u: {"x", "y"}}}``; Shakespeare's x 80-character
strings and y one-character strings, Sent140's x the rows ``[id, date, query, user, text,
split]`` of LEAF's ``data_to_json.py`` and y ints): encoded as LEAF's ``language_utils``
encodes them, trained with LEAF's LSTMs under FedAvg and split-model methods, and refused where
an image-only feature meets text.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pflower.cli import partition_import
from pflower.compose import compose_config
from pflower.core.experiment import Experiment
from pflower.datasets.loaders import load_dataset
from pflower.datasets.text import ALL_LETTERS
from pflower.models import build_model
from pflower.models.split import head_shape, represent
from pflower.registry import ConfigError
from tests.inprocess import run_inprocess

PASSAGE = (
    "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer "
    "The slings and arrows of outrageous fortune, Or to take arms against a sea of troubles; "
)
SPEAKERS = {
    "THE_TRAGEDY_OF_HAMLET_HAMLET": (24, 8),
    "KING_LEAR_EDGAR": (18, 6),
    "MACBETH_LADY": (30, 9),
}


def _write(folder: Path, users: dict[str, dict[str, tuple[list, list]]]) -> None:
    """LEAF's train/test JSON files: ``users[part][user] = (x, y)``."""
    for part, data in users.items():
        (folder / part).mkdir(parents=True, exist_ok=True)
        payload = {
            "users": list(data),
            "num_samples": [len(y) for _, y in data.values()],
            "user_data": {user: {"x": x, "y": y} for user, (x, y) in data.items()},
        }
        (folder / part / f"all_data_niid_0_keep_0_{part}_9.json").write_text(json.dumps(payload))


def _shakespeare(folder: Path) -> Path:
    """Next-character samples as LEAF's ``shake_utils`` cuts them: 80 characters and the next."""
    text = PASSAGE * 4
    rng = np.random.default_rng(0)
    parts: dict[str, dict[str, tuple[list, list]]] = {"train": {}, "test": {}}
    for user, counts in SPEAKERS.items():
        for part, count in zip(parts, counts, strict=True):
            starts = rng.integers(0, len(text) - 81, count)
            parts[part][user] = ([text[s : s + 80] for s in starts], [text[s + 80] for s in starts])
    _write(folder, parts)
    return folder


TWEETS = {
    0: ["I hate mondays, awful day!", "so sad and tired", "worst traffic ever ;(", "ugh rain"],
    1: ["I love this sunny day!", "so happy right now", "best coffee ever", "great game !"],
}


def _sent140(folder: Path) -> Path:
    """Sentiment140 rows as LEAF's ``data_to_json.py`` writes them: ``row[1:]`` of the CSV
    (polarity dropped), i.e. ``[id, date, query, user, text, split]``; y 1 for polarity 4."""
    parts: dict[str, dict[str, tuple[list, list]]] = {"train": {}, "test": {}}
    for number, user in enumerate(["_emma_", "bobby99", "zz_top"]):
        for part, offset in (("train", 0), ("test", 1)):
            x, y = [], []
            for index in range(6 if part == "train" else 2):
                label = (index + number + offset) % 2
                text = TWEETS[label][(index + number) % 4]
                row = [str(1467810369 + index), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", user]
                x.append([*row, text, "training" if part == "train" else "test"])
                y.append(label)
            parts[part][user] = (x, y)
    _write(folder, parts)
    return folder


# --- encoding ------------------------------------------------------------------------------------


def test_shakespeare_is_encoded_with_leafs_letter_table(tmp_path: Path) -> None:
    folder = _shakespeare(tmp_path / "shakespeare")
    dataset = load_dataset("leaf", {"path": str(folder), "kind": "shakespeare"})
    payload = json.loads(next((folder / "train").glob("*.json")).read_text())
    x, y = [], []
    for user in payload["users"]:
        x.extend(payload["user_data"][user]["x"])
        y.extend(payload["user_data"][user]["y"])
    assert len(ALL_LETTERS) == 80
    assert dataset.train.images.dtype == torch.int64
    assert dataset.train.images.shape == (len(x), 1, 1, 80)
    assert dataset.input_shape == (1, 1, 80)
    assert (dataset.num_classes, dataset.vocab_size) == (80, 80)
    expected = [[ALL_LETTERS.find(c) for c in sample] for sample in x]  # LEAF's word_to_indices
    np.testing.assert_array_equal(dataset.train.images[:, 0, 0].numpy(), expected)
    np.testing.assert_array_equal(dataset.train.labels.numpy(), [ALL_LETTERS.find(c) for c in y])
    assert torch.equal(dataset.normalize(dataset.train.images), dataset.train.images)
    users = sorted(SPEAKERS)  # groups: users numbered in sorted id order
    groups = [users.index(u) for u in payload["users"] for _ in payload["user_data"][u]["y"]]
    np.testing.assert_array_equal(dataset.train.groups.numpy(), groups)


def test_sent140_words_come_from_the_training_split_only(tmp_path: Path) -> None:
    rows = [["1", "d", "NO_QUERY", "u", "good good day", "training"], ["2", "d", "q", "u", "bad"]]
    test_rows = [["3", "d", "NO_QUERY", "u", "good unseen day , bad", "test"]]
    _write(tmp_path, {"train": {"u": (rows, [1, 0])}, "test": {"u": (test_rows, [1])}})
    dataset = load_dataset(
        "leaf", {"path": str(tmp_path), "kind": "sent140", "seq_len": 4, "vocab_size": 4}
    )
    # training words by frequency: good (2), then bad and day (1 each, by the word); the 4th id,
    # 3, is the unknown word and the padding (LEAF's len(word2id))
    assert dataset.vocab_size == 4 and dataset.num_classes == 2
    np.testing.assert_array_equal(
        dataset.train.images[:, 0, 0].numpy(), [[0, 0, 2, 3], [1, 3, 3, 3]]
    )
    np.testing.assert_array_equal(dataset.test.images[:, 0, 0].numpy(), [[0, 3, 2, 3]])
    np.testing.assert_array_equal(dataset.train.labels.numpy(), [1, 0])


def test_malformed_text_samples_name_the_fix(tmp_path: Path) -> None:
    _write(tmp_path / "a", {p: {"u": (["x" * 79], ["y"])} for p in ("train", "test")})
    with pytest.raises(ConfigError, match="not a string of 80 characters"):
        load_dataset("leaf", {"path": str(tmp_path / "a"), "kind": "shakespeare"})
    _write(tmp_path / "b", {p: {"u": (["é" * 80], ["y"])} for p in ("train", "test")})
    with pytest.raises(ConfigError, match="not in LEAF's Shakespeare letter table"):
        load_dataset("leaf", {"path": str(tmp_path / "b"), "kind": "shakespeare"})
    _write(tmp_path / "c", {p: {"u": ([["1", "d", "q"]], [0])} for p in ("train", "test")})
    with pytest.raises(ConfigError, match=r"\[id, date, query, user, text"):
        load_dataset("leaf", {"path": str(tmp_path / "c"), "kind": "sent140"})
    for kind, folder in (("shakespeare", "a"), ("sent140", "c")):  # text read as images
        with pytest.raises(ConfigError, match=f"dataset.kind={kind} and model={kind}_lstm"):
            load_dataset("leaf", {"path": str(tmp_path / folder)})


# --- models --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "shape", "classes", "vocab", "features"),
    [("shakespeare_lstm", (1, 1, 80), 80, 80, 256), ("sent140_lstm", (1, 1, 25), 2, 500, 128)],
)
def test_lstm_shapes_and_head(
    name: str, shape: tuple[int, int, int], classes: int, vocab: int, features: int
) -> None:
    torch.manual_seed(0)
    model = build_model(name, {}, shape, classes, vocab)
    tokens = torch.randint(0, vocab, (3, *shape))
    assert model(tokens).shape == (3, classes)
    assert represent(model, tokens).shape == (3, features)
    assert head_shape(model) == (features, classes)


# --- runs ----------------------------------------------------------------------------------------


def _mean(rows: list[dict], round_: int, key: str) -> float:
    return float(np.mean([r[key] for r in rows if r["round"] == round_ and r["stage"] == "L2"]))


SMALL = ["model.hidden_size=32", "train.optimizer=adam", "train.lr=0.01", "train.local_epochs=3"]


@pytest.mark.parametrize("strategy", ["fedavg", "fedrep"])
def test_shakespeare_trains_on_each_speakers_own_split(tmp_path: Path, strategy: str) -> None:
    folder = _shakespeare(tmp_path / "shakespeare")
    out = tmp_path / "split.json"
    data = ["dataset.kind=shakespeare", "model=shakespeare_lstm"]  # as the user passes them
    assert partition_import(["leaf", str(folder), *data, "--out", str(out)]) == 0
    overrides = [
        "dataset=leaf",
        f"dataset.path={folder}",
        *data,
        "partition=from_file",
        f"partition.path={out}",
        "split=file",
        "num_clients=3",
    ]
    federation = Experiment.of(compose_config(overrides)).federation
    assert [len(c.test) for c in federation.clients] == [SPEAKERS[u][1] for u in sorted(SPEAKERS)]
    rows, _ = run_inprocess(
        [*overrides, *SMALL, "rounds=2", f"strategy={strategy}", "seed=0"], tmp_path / "run"
    )
    assert {r["client"] for r in rows if r["stage"] == "L1"} == {0, 1, 2}
    assert _mean(rows, 2, "train_loss") < _mean(rows, 1, "train_loss")


def test_sent140_trains_with_a_split_model_method(tmp_path: Path) -> None:
    folder = _sent140(tmp_path / "sent140")
    overrides = [
        "dataset=leaf",
        f"dataset.path={folder}",
        "dataset.kind=sent140",
        "dataset.vocab_size=64",
        "model=sent140_lstm",
        "model.embedding_dim=16",
        "partition=natural",
        "num_clients=3",
        "strategy=fedper",
        "rounds=2",
        "seed=0",
        *SMALL,
    ]
    rows, _ = run_inprocess(overrides, tmp_path / "run")
    assert {r["client"] for r in rows if r["stage"] == "L2"} == {0, 1, 2}
    assert _mean(rows, 2, "train_loss") < _mean(rows, 1, "train_loss")


# --- refusals while composing --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=small_cnn"], "holds token sequences .text.: choose model=shakespeare_lstm"),
        (["train.augment.hflip=0.5"], "train.augment rotates and flips images"),
        (["partition=quality_skew"], "adds noise to every client's inputs"),
    ],
)
def test_image_only_features_are_refused_for_text(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    folder = _shakespeare(tmp_path / "shakespeare")
    base = ["dataset=leaf", f"dataset.path={folder}", "dataset.kind=shakespeare"]
    with pytest.raises(ConfigError, match=message):
        compose_config([*base, "model=shakespeare_lstm", "num_clients=3", *overrides])


def test_a_text_model_is_refused_for_images() -> None:
    with pytest.raises(ConfigError, match="reads token sequences, but the dataset holds images"):
        compose_config(["dataset=digits", "model=sent140_lstm"])


@pytest.mark.parametrize("strategy", ["fedbabu", "fedrod", "fedproto", "fedphp"])
def test_split_model_methods_personalize_the_lstm_head_at_every_stage(
    tmp_path: Path, strategy: str
) -> None:
    """The methods that split the model at ``fc`` (body: embedding and LSTM) run, and report
    the clients held out of training (stage U) next to the trained ones (L1, L2)."""
    folder = _shakespeare(tmp_path / "shakespeare")
    overrides = [
        "dataset=leaf",
        f"dataset.path={folder}",
        "dataset.kind=shakespeare",
        "model=shakespeare_lstm",
        "model.hidden_size=8",
        "partition=natural",
        "num_clients=3",
        "eval.unseen_fraction=0.34",
        f"strategy={strategy}",
        "rounds=1",
        "seed=0",
    ]
    rows, _ = run_inprocess(overrides, tmp_path / "run")
    clients = {stage: {r["client"] for r in rows if r["stage"] == stage} for stage in ("L2", "U")}
    assert len(clients["L2"]) == 2 and len(clients["U"]) == 1
    assert clients["L2"].isdisjoint(clients["U"])
    assert all(np.isfinite(r["loss_local"]) for r in rows if r["stage"] in ("L1", "L2", "U"))
