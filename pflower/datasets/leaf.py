"""LEAF benchmark data (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018): the
writer- and user-partitioned datasets, read from the JSON files LEAF's scripts write.

Layout (``dataset.path``): ``train/*.json`` and ``test/*.json``, each file
``{"users": [id, ...], "num_samples": [n, ...], "user_data": {id: {"x": [...], "y": [...]}}}``.
LEAF's ``preprocess.sh ... -t sample`` splits every user's samples into train and test files
(``-t user`` would put whole users in one of them). Every sample is tagged with its user as its
group (users numbered in sorted id order over both splits), so ``pflower partition import leaf``
gives each user its own train and test samples ([`
natural_shares`][pflower.datasets.partitioners.from_file.
natural_shares]), and ``partition=natural`` makes one client per user.

``dataset.kind`` says what the samples are:

- ``image`` (default): each ``x`` is a list of numbers, FEMNIST's 784 pixel values (28x28,
  written as ``image_shape: [1, 28, 28]``, 62 classes: LEAF's defaults here) or LEAF's
  ``synthetic`` feature vectors (``image_shape: [60, 1, 1]``);
- ``shakespeare``: ``x`` an 80-character string, ``y`` the next character (80 classes);
- ``sent140``: ``x`` a Sentiment140 row ``[id, date, query, user, text, ...]``, ``y`` 0 or 1.

The text kinds become token ids as LEAF's reference code encodes them
([`pflower.datasets.text`][pflower.datasets.text], with Sent140's vocabulary built from the
training split instead of GloVe's), for ``model=shakespeare_lstm`` and ``model=sent140_lstm``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pflower.datasets.arrays import dataset_from_arrays, index_of, split_of
from pflower.datasets.base import DatasetNotFoundError, ImageDataset
from pflower.datasets.sources import Stats
from pflower.datasets.text import (
    ALL_LETTERS,
    encode_characters,
    encode_letters,
    encode_lines,
    token_dataset,
    token_split,
    tweets,
    word_ids,
)
from pflower.registry import ConfigError

_SEQ_LEN = {"shakespeare": 80, "sent140": 25}
"""Tokens per sample of each text kind where ``dataset.seq_len`` is null (LEAF's: 80 characters;
Sent140's ``max_words``, 25)."""
_SENTIMENTS = 2


def text_shape(kind: str, seq_len: int | None, vocab_size: int) -> tuple[int, int, int]:
    """``(tokens per sample, classes, vocabulary)`` of LEAF text ``kind`` with the options
    ``dataset.seq_len`` and ``dataset.vocab_size``: Shakespeare's letters are its classes and its
    vocabulary; Sent140 has two sentiments and ``vocab_size`` word ids."""
    length = seq_len or _SEQ_LEN[kind]
    if kind == "shakespeare":
        return length, len(ALL_LETTERS), len(ALL_LETTERS)
    return length, _SENTIMENTS, vocab_size


_HOW = (
    "generate them with LEAF's scripts (github.com/TalwalkarLab/leaf), e.g. in data/femnist: "
    "./preprocess.sh -s niid --sf 0.05 -k 0 -t sample; then use its data/ folder"
)


def load_leaf(
    path: str = "",
    image_shape: Sequence[int] = (1, 28, 28),
    num_classes: int = 62,
    mean: Stats = None,
    std: Stats = None,
    kind: str = "image",
    seq_len: int | None = None,
    vocab_size: int = 10000,
) -> ImageDataset:
    """The LEAF dataset in ``path`` (``train/*.json``, ``test/*.json``), users as groups.

    Args:
        path: the folder holding LEAF's ``train`` and ``test`` folders.
        image_shape: ``[C, H, W]`` each flat ``x`` list is laid out as (FEMNIST: [1, 28, 28]).
        num_classes: number of classes (FEMNIST: 62; the text kinds have their own).
        mean, std: normalization; default: the train split's per-channel statistics.
        kind: ``image``, ``shakespeare`` or ``sent140`` (see the module docstring).
        seq_len: tokens per text sample (null: LEAF's, 80 characters or 25 words).
        vocab_size: Sent140's word ids, the unknown word included.

    Raises:
        DatasetNotFoundError: no JSON files in ``train`` or ``test``.
        ConfigError: text data read as images or the reverse, or samples that do not fit
            ``image_shape`` (images) or LEAF's text format.
    """
    folder = Path(path).expanduser()
    files = {part: sorted((folder / part).glob("*.json")) for part in ("train", "test")}
    if not files["train"] or not files["test"]:
        raise DatasetNotFoundError("leaf", folder, ["train/*.json", "test/*.json"], _HOW)
    parts = {part: _read(paths) for part, paths in files.items()}
    users = index_of([user for samples in parts.values() for user in samples])
    if kind != "image":
        return _text(kind, parts, users, files, *text_shape(kind, seq_len, vocab_size))
    shape = tuple(int(size) for size in image_shape)
    splits = []
    for part, samples in parts.items():
        xs, ys, groups = _gather(samples, users)
        splits.append(split_of(_samples(xs, shape, files[part][0]), np.asarray(ys), groups))
    return dataset_from_arrays("leaf", splits[0], splits[1], num_classes, mean, std)


def _read(paths: Sequence[Path]) -> dict[str, tuple[list, list]]:
    """Every user's ``(x, y)`` lists over the JSON files of one split."""
    samples: dict[str, tuple[list, list]] = {}
    for path in paths:
        payload = json.loads(path.read_text())
        if not isinstance(payload, dict) or not isinstance(payload.get("user_data"), dict):
            raise ConfigError(f"{path} has no 'user_data' (not a LEAF JSON file?)")
        for user, data in payload["user_data"].items():
            x, y = samples.setdefault(str(user), ([], []))
            x.extend(data["x"])
            y.extend(data["y"])
    return samples


def _samples(xs: list, shape: tuple[int, ...], source: Path) -> np.ndarray:
    """The ``x`` lists as an ``(N, *shape)`` float array."""
    first = xs[0] if xs else None
    if isinstance(first, str) or (isinstance(first, list) and first and isinstance(first[0], str)):
        kind = "shakespeare" if isinstance(first, str) else "sent140"
        raise ConfigError(
            f"{source} holds text samples (LEAF Shakespeare or Sent140), which need a sequence "
            f"model: set dataset.kind={kind} and model={kind}_lstm"
        )
    array = np.asarray(xs, dtype=np.float32)
    if array.ndim != 2 or array.shape[1] != math.prod(shape):
        raise ConfigError(
            f"{source}: samples of {array.shape[1:] or 'no'} values do not fit "
            f"dataset.image_shape={list(shape)} (FEMNIST: [1, 28, 28]; feature vectors of n "
            "values: [n, 1, 1])"
        )
    return array.reshape((len(array), *shape))


def _text(
    kind: str,
    parts: dict[str, dict[str, tuple[list, list]]],
    users: dict[object, int],
    files: dict[str, list[Path]],
    length: int,
    num_classes: int,
    vocab_size: int,
) -> ImageDataset:
    """Shakespeare or Sent140 as token ids, users as groups (see the module docstring)."""
    gathered = {part: _gather(samples, users) for part, samples in parts.items()}
    sources = {part: paths[0] for part, paths in files.items()}
    if kind == "shakespeare":
        splits = [
            token_split(
                encode_characters(xs, length, sources[part]),
                encode_letters(ys, sources[part]),
                groups,
            )
            for part, (xs, ys, groups) in gathered.items()
        ]
    else:
        texts = {part: tweets(xs, sources[part]) for part, (xs, _, _) in gathered.items()}
        ids = word_ids(texts["train"], vocab_size)  # the training split's words only
        splits = [
            token_split(
                encode_lines(texts[part], ids, length, vocab_size), [int(y) for y in ys], groups
            )
            for part, (_, ys, groups) in gathered.items()
        ]
    return token_dataset("leaf", splits[0], splits[1], num_classes, vocab_size)


def _gather(
    samples: dict[str, tuple[list, list]], users: dict[object, int]
) -> tuple[list, list, list[int]]:
    """One split's ``x`` and ``y`` lists over its users, and each sample's user number."""
    xs: list = []
    ys: list = []
    groups: list[int] = []
    for user, (x, y) in samples.items():
        xs.extend(x)
        ys.extend(y)
        groups.extend([users[user]] * len(y))
    return xs, ys, groups
