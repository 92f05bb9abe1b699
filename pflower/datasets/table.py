"""Tabular data: a CSV or Parquet file with one row per sample, for cross-silo work with ``mlp``.

Every column but the label (and the optional client column) is a numeric feature. A sample is
laid out as ``(F, 1, 1)``, one *channel* per feature, so the default normalization (the train
split's per-channel mean and std) standardizes each feature, and ``mlp`` takes the F values.
Labels may be numbers or strings: the distinct labels, sorted, become classes ``0..K-1`` (over
the train and test files together). A ``client_column`` tags each row with its silo (group), so
``partition=natural`` gives each silo's rows to one client.

CSV is read with the standard library; Parquet (``.parquet``) with pyarrow, which Flower
Datasets already installs.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from pflower.datasets.arrays import dataset_from_arrays, index_of, split_of
from pflower.datasets.base import DatasetNotFoundError, ImageDataset
from pflower.datasets.sources import Stats
from pflower.registry import ConfigError

Columns = dict[str, list]


def load_table(
    path: str = "",
    label: str = "label",
    test_path: str | None = None,
    client_column: str | None = None,
    mean: Stats = None,
    std: Stats = None,
) -> ImageDataset:
    """The rows of ``path`` (train) and ``test_path`` (test; none: an empty test split, use
    ``split.pool=all``) as samples of shape ``(F, 1, 1)``.

    Raises:
        DatasetNotFoundError: a file does not exist.
        ConfigError: the label or client column is missing, or a feature is not numeric.
    """
    tables = [read_columns(path)]
    if test_path:
        tables.append(read_columns(test_path))
    for table, source in zip(tables, (path, test_path), strict=False):
        for column in (label, client_column):
            if column is not None and column not in table:
                raise ConfigError(
                    f"{source} has no column {column!r}; its columns: {', '.join(table)}"
                )
    features = [c for c in tables[0] if c not in (label, client_column)]
    classes = index_of([value for table in tables for value in table[label]])
    clients = (
        None
        if client_column is None
        else index_of([value for table in tables for value in table[client_column]])
    )
    splits = []
    for table, source in zip(tables, (path, test_path), strict=False):
        try:
            values = np.array([table[c] for c in features], dtype=np.float32).T
        except (KeyError, ValueError) as error:
            raise ConfigError(f"{source}: features must be numeric columns ({error})") from error
        labels = [classes[value] for value in table[label]]
        groups = None if clients is None else [clients[v] for v in table[client_column or ""]]
        splits.append(split_of(values.reshape(len(values), len(features), 1, 1), labels, groups))
    if len(splits) == 1:
        empty = np.zeros((0, len(features), 1, 1), np.float32)
        splits.append(split_of(empty, np.zeros(0), None if clients is None else np.zeros(0)))
    return dataset_from_arrays("table", splits[0], splits[1], len(classes), mean, std)


def read_columns(path: str | Path) -> Columns:
    """A CSV (header row) or Parquet file as ``{column: values}``; CSV cells that parse as
    numbers are numbers."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise DatasetNotFoundError(
            "table", file.parent, [file.name], "point dataset.path at a CSV or Parquet file"
        )
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        return dict(pq.read_table(file).to_pydict())
    with file.open(newline="") as stream:
        rows = list(csv.reader(stream))
    if not rows:
        raise ConfigError(f"{file} is empty (expected a header row)")
    header, body = rows[0], rows[1:]
    return {name: [_number(row[i]) for row in body] for i, name in enumerate(header)}


def _number(cell: str) -> float | str:
    try:
        return float(cell)
    except ValueError:
        return cell
