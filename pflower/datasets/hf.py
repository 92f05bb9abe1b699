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

Samples are images (``image_column``, PIL images or arrays), converted to ``channels`` and
resized to ``image_size``; labels are ints ``0..num_classes - 1`` (a ``ClassLabel`` column).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pflower.datasets.arrays import dataset_from_arrays, index_of, split_of
from pflower.datasets.base import DatasetNotFoundError, ImageDataset, ImageSplit
from pflower.datasets.folders import to_pixels
from pflower.datasets.sources import Stats
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
) -> ImageDataset:
    """The ``train_split`` and ``test_split`` (none: an empty test split) of a Hugging Face
    dataset (see the module docstring).

    Raises:
        DatasetNotFoundError: ``path`` holds no saved dataset.
        ConfigError: a missing split or column, or neither/both of ``dataset`` and ``path``.
    """
    splits = _splits(dataset, path, subset, data_dir, train_split, test_split)
    for split in splits:
        for column in (image_column, label_column, client_column):
            if column is not None and column not in split.column_names:
                raise ConfigError(
                    f"the dataset has no column {column!r}; its columns: "
                    f"{', '.join(split.column_names)} (set dataset.image_column, label_column, "
                    "client_column)"
                )
    clients = None
    if client_column is not None:
        clients = index_of([v for split in splits for v in split[client_column]])
    decoded = [
        _decode(s, image_column, label_column, client_column, clients, image_size, channels)
        for s in splits
    ]
    if len(decoded) == 1:
        empty = np.zeros((0, channels, image_size, image_size), np.float32)
        decoded.append(split_of(empty, np.zeros(0), None if clients is None else np.zeros(0)))
    classes = num_classes or hf_num_classes(splits[0], label_column)
    return dataset_from_arrays("hf", decoded[0], decoded[1], classes, mean, std)


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


def _decode(
    split: Any,
    image_column: str,
    label_column: str,
    client_column: str | None,
    clients: dict[object, int] | None,
    size: int,
    channels: int,
) -> ImageSplit:
    images = np.zeros((len(split), channels, size, size), np.float32)
    for row, image in enumerate(split[image_column]):
        images[row] = to_pixels(image, channels, size)
    groups = None
    if client_column is not None and clients is not None:
        groups = [clients[value] for value in split[client_column]]
    return split_of(images, np.asarray(split[label_column]), groups)


def hf_num_classes(split: Any, label_column: str) -> int:
    """The number of classes of a ``ClassLabel`` column, else its largest label plus one."""
    feature = split.features[label_column]
    if hasattr(feature, "num_classes"):
        return int(feature.num_classes)
    return int(max(split[label_column])) + 1
