"""Hugging Face datasets, through Flower Datasets' `FederatedDataset`.

``dataset.dataset`` is what ``FederatedDataset(dataset=...)`` loads: a Hub id (``ylecun/mnist``,
``flwrlabs/femnist``; downloaded into Hugging Face's cache on first use) or one of ``datasets``'
packaged builders for local files (``imagefolder`` with ``data_dir``, ``parquet``, ``csv``).
``dataset.path`` instead reads a folder written by ``datasets``' ``save_to_disk`` (a
``DatasetDict`` with the train/test splits, or one ``Dataset`` as the train split). The splits
are read whole (the partitioners of ``FederatedDataset`` are not used): pflower's partition
schemes, Flower Datasets' own partitioners among them, share the samples out, and a
``client_column`` (e.g. FEMNIST's ``writer_id``) tags each sample with its client for
``partition=natural`` (Flower Datasets' ``NaturalIdPartitioner``: one client per id).

Samples are, by the columns named:

- images (``image_column``, PIL images or arrays; the default), converted to ``channels`` and
  resized to ``image_size``;
- text (``text_column``): word ids as LEAF's Sent140 encoding makes them
  ([`pflower.datasets.text`][pflower.datasets.text]): the first ``seq_len`` words, over a
  vocabulary of ``vocab_size`` ids built from the train split only, for ``model=sent140_lstm``;
- numeric features (``feature_columns``): ``(F, 1, 1)`` samples standardized per feature, as
  ``dataset=table`` makes them, for ``model=mlp``.

Labels are ints ``0..num_classes - 1`` (a ``ClassLabel`` column).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pflower.datasets.arrays import dataset_from_arrays, index_of, split_of
from pflower.datasets.base import DatasetNotFoundError, ImageDataset, ImageSplit
from pflower.datasets.folders import to_pixels
from pflower.datasets.sources import Stats
from pflower.datasets.text import encode_lines, token_dataset, token_split, word_ids
from pflower.registry import ConfigError


def load_hf(
    dataset: str | None = None,
    path: str | None = None,
    subset: str | None = None,
    data_dir: str | None = None,
    train_split: str = "train",
    test_split: str | None = "test",
    image_column: str = "image",
    label_column: str = "label",
    client_column: str | None = None,
    num_classes: int | None = None,
    image_size: int = 28,
    channels: int = 1,
    mean: Stats = None,
    std: Stats = None,
    text_column: str | None = None,
    feature_columns: Sequence[str] | None = None,
    seq_len: int = 25,
    vocab_size: int = 10000,
) -> ImageDataset:
    """The ``train_split`` and ``test_split`` (none: an empty test split) of a Hugging Face
    dataset (see the module docstring).

    Raises:
        DatasetNotFoundError: ``path`` holds no saved dataset.
        ConfigError: a missing split or column, neither/both of ``dataset`` and ``path``, or a
            feature that is not numeric. (The ``hf`` block refuses ``text_column`` together with
            ``feature_columns`` while composing.)
    """
    inputs = [text_column] if text_column else list(feature_columns or [image_column])
    splits = _splits(dataset, path, subset, data_dir, train_split, test_split)
    for split in splits:
        for column in (*inputs, label_column, client_column):
            if column is not None and column not in split.column_names:
                raise ConfigError(
                    f"the dataset has no column {column!r}; its columns: "
                    f"{', '.join(split.column_names)} (set dataset.image_column, text_column, "
                    "feature_columns, label_column, client_column)"
                )
    clients = None
    if client_column is not None:
        clients = index_of([v for split in splits for v in split[client_column]])
    groups = [_groups(split, client_column, clients) for split in splits]
    labels = [np.asarray(split[label_column]) for split in splits]
    classes = num_classes or hf_num_classes(splits[0], label_column)
    if text_column:
        texts = [[str(text) for text in split[text_column]] for split in splits]
        ids = word_ids(texts[0], vocab_size)
        tokens = [encode_lines(lines, ids, seq_len, vocab_size) for lines in texts]
        parts = [token_split(*sample) for sample in zip(tokens, labels, groups, strict=True)]
        return token_dataset("hf", *_with_test(parts), classes, vocab_size)
    if feature_columns:
        parts = [
            split_of(_features(split, inputs), label, group)
            for split, label, group in zip(splits, labels, groups, strict=True)
        ]
    else:
        parts = [
            split_of(_pixels(split, image_column, image_size, channels), label, group)
            for split, label, group in zip(splits, labels, groups, strict=True)
        ]
    return dataset_from_arrays("hf", *_with_test(parts), classes, mean, std)


def _with_test(parts: list[ImageSplit]) -> tuple[ImageSplit, ImageSplit]:
    """The train and test split, an empty test split where the dataset has none."""
    train = parts[0]
    return train, parts[1] if len(parts) > 1 else train.subset(np.zeros(0, dtype=np.int64))


def _splits(
    name: str | None,
    path: str | None,
    subset: str | None,
    data_dir: str | None,
    train_split: str,
    test_split: str | None,
) -> list[Any]:
    """The train (and test) split as ``datasets.Dataset``s."""
    if bool(name) == bool(path):
        raise ConfigError(
            "dataset=hf needs exactly one of dataset.dataset (a Hugging Face Hub id or packaged "
            "builder, loaded by Flower Datasets' FederatedDataset) and dataset.path (a folder "
            "written by datasets' save_to_disk)"
        )
    wanted = [train_split] if test_split is None else [train_split, test_split]
    if path:
        import datasets

        folder = Path(path).expanduser()
        try:
            loaded = datasets.load_from_disk(str(folder))
        except FileNotFoundError as error:
            raise DatasetNotFoundError(
                "hf",
                folder,
                ["dataset_dict.json or dataset_info.json"],
                "write it with datasets' Dataset.save_to_disk or DatasetDict.save_to_disk",
            ) from error
        if isinstance(loaded, datasets.Dataset):
            if test_split is not None:
                raise ConfigError(
                    f"{folder} holds one split, not a DatasetDict: set dataset.test_split=null"
                )
            return [loaded]
        available = list(loaded)
    else:
        from flwr_datasets import FederatedDataset

        kwargs = {} if data_dir is None else {"data_dir": data_dir}
        federated = FederatedDataset(
            dataset=str(name), subset=subset, partitioners={}, shuffle=False, **kwargs
        )
        loaded = {split: federated.load_split(split) for split in wanted}
        available = wanted
    missing = [split for split in wanted if split not in available]
    if missing:
        raise ConfigError(
            f"the dataset has no split {missing[0]!r}; its splits: {', '.join(available)} "
            "(set dataset.train_split / dataset.test_split, or test_split=null)"
        )
    return [loaded[split] for split in wanted]


def _pixels(split: Any, column: str, size: int, channels: int) -> np.ndarray:
    """The images of ``column`` as ``(N, channels, size, size)`` floats."""
    images = np.zeros((len(split), channels, size, size), np.float32)
    for row, image in enumerate(split[column]):
        images[row] = to_pixels(image, channels, size)
    return images


def _features(split: Any, columns: list[str]) -> np.ndarray:
    """The numeric ``columns`` as ``(N, F, 1, 1)`` floats, one channel per feature."""
    try:
        values = np.array([split[column] for column in columns], dtype=np.float32).T
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"dataset.feature_columns must be numeric columns: {columns} ({error})"
        ) from error
    return values.reshape(len(values), len(columns), 1, 1)


def _groups(
    split: Any, client_column: str | None, clients: dict[object, int] | None
) -> list[int] | None:
    """Each sample's client number, where a ``client_column`` names the clients."""
    if client_column is None or clients is None:
        return None
    return [clients[value] for value in split[client_column]]


def hf_num_classes(split: Any, label_column: str) -> int:
    """The number of classes of a ``ClassLabel`` column, else its largest label plus one."""
    feature = split.features[label_column]
    if hasattr(feature, "num_classes"):
        return int(feature.num_classes)
    return int(max(split[label_column])) + 1
