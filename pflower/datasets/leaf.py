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

Each ``x`` must be a list of numbers: FEMNIST's 784 pixel values (28x28, written as
``image_shape: [1, 28, 28]``, 62 classes: LEAF's defaults here) or LEAF's ``synthetic`` feature
vectors (``image_shape: [60, 1, 1]``). Shakespeare and Sent140 hold text (``x`` an 80-character
string, ``y`` the next character), a next-character task for a recurrent model that pflower's
image models do not cover; they are refused with that message.
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
from pflower.registry import ConfigError

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
) -> ImageDataset:
    """The LEAF dataset in ``path`` (``train/*.json``, ``test/*.json``), users as groups.

    Args:
        path: the folder holding LEAF's ``train`` and ``test`` folders.
        image_shape: ``[C, H, W]`` each flat ``x`` list is laid out as (FEMNIST: [1, 28, 28]).
        num_classes: number of classes (FEMNIST: 62).
        mean, std: normalization; default: the train split's per-channel statistics.

    Raises:
        DatasetNotFoundError: no JSON files in ``train`` or ``test``.
        ConfigError: text data (Shakespeare, Sent140), or samples that do not fit ``image_shape``.
    """
    folder = Path(path).expanduser()
    files = {part: sorted((folder / part).glob("*.json")) for part in ("train", "test")}
    if not files["train"] or not files["test"]:
        raise DatasetNotFoundError("leaf", folder, ["train/*.json", "test/*.json"], _HOW)
    parts = {part: _read(paths) for part, paths in files.items()}
    users = index_of([user for samples in parts.values() for user in samples])
    shape = tuple(int(size) for size in image_shape)
    splits = []
    for part, samples in parts.items():
        xs, ys, groups = [], [], []
        for user, (x, y) in samples.items():
            xs.extend(x)
            ys.extend(y)
            groups.extend([users[user]] * len(y))
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
    if xs and isinstance(xs[0], str):
        raise ConfigError(
            f"{source} holds text samples (LEAF Shakespeare or Sent140: predict the next "
            "character or the sentiment of a string), which need a sequence model; pflower's "
            "models classify fixed-size numeric samples. Use FEMNIST or LEAF's synthetic data"
        )
    array = np.asarray(xs, dtype=np.float32)
    if array.ndim != 2 or array.shape[1] != math.prod(shape):
        raise ConfigError(
            f"{source}: samples of {array.shape[1:] or 'no'} values do not fit "
            f"dataset.image_shape={list(shape)} (FEMNIST: [1, 28, 28]; feature vectors of n "
            "values: [n, 1, 1])"
        )
    return array.reshape((len(array), *shape))
