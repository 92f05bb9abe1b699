"""The partitioner interface every scheme shares, the scheme registry, and how a scheme is run.

Every scheme is a `flwr_datasets.partitioner.Partitioner`: either one of Flower Datasets'
own partitioners (``iid``, ``dirichlet``, ``shards``, ...) or a subclass of
[`IndexPartitioner`][pflower.datasets.partitioners.base.IndexPartitioner] below. A scheme sees a
local `datasets.Dataset` with the
columns ``index`` (the sample's position in the arrays it was built from), ``label`` and, when the
data has them, ``group`` (e.g. a writer id or CelebA attribute index); it never touches images and
never reaches the hub.

Two optional capabilities extend the plain interface:

- [`TestAwarePartitioner`][pflower.datasets.partitioners.base.TestAwarePartitioner] draws each
  client's *test* share from a second dataset (the
  official test split) as well, for schemes whose test shares are part of the scheme (DiversiFed).
  Schemes without it only split the pool; the federation builder derives the test shares.
- [`InputNoiseScheme`][pflower.datasets.partitioners.base.InputNoiseScheme] is a scheme that also
  perturbs inputs per client (FLAME's quality
  skew): it exposes one Gaussian noise std per client, which the federation carries to the clients.
- [`SampleSharingScheme`][pflower.datasets.partitioners.base.SampleSharingScheme] is a scheme that
  may give one sample to several clients (the
  ``disjoint: false`` variants that reproduce FLAME's and Fling's code). The federation builder
  must know this *before* it runs the scheme: it then reserves the held-out samples first, so that
  no client's test sample can be another client's training sample.

[`partition_labels`][pflower.datasets.partitioners.base.partition_labels] is the one place that
builds a scheme from its config block, runs it and
turns whatever goes wrong into a [`ConfigError`][pflower.registry.ConfigError] naming the scheme.
"""

from __future__ import annotations

import logging
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import datasets
import numpy as np
from flwr_datasets.partitioner import Partitioner

from pflower.registry import ConfigError, Registry

LOGGER = logging.getLogger(__name__)

INDEX, LABEL, GROUP = "index", "label", "group"
"""Column names of the datasets a partitioner sees."""

PARTITIONERS: Registry[Partitioner] = Registry("partition scheme")
"""Scheme name -> factory ``(num_partitions, seed, **options) -> Partitioner``."""

_CONTEXT_KEYS = ("num_partitions", "seed")


def to_hf_dataset(labels: np.ndarray, groups: np.ndarray | None = None) -> datasets.Dataset:
    """An in-memory dataset with ``index`` = row position, ``label`` and optionally ``group``."""
    columns: dict[str, np.ndarray] = {
        INDEX: np.arange(len(labels), dtype=np.int64),
        LABEL: np.asarray(labels, dtype=np.int64),
    }
    if groups is not None:
        columns[GROUP] = np.asarray(groups, dtype=np.int64)
    return datasets.Dataset.from_dict(columns)


def require(condition: bool, message: str) -> None:
    """Raise [`ConfigError`][pflower.datasets.partitioners.base.ConfigError] with ``message`` unless
    ``condition`` holds."""
    if not condition:
        raise ConfigError(message)


def check_num_partitions(num_partitions: int) -> None:
    """Refuse a client count below one."""
    require(num_partitions >= 1, f"num_clients must be at least 1, got {num_partitions}")


def check_concentration(name: str, value: float) -> None:
    """Refuse a Dirichlet concentration that is not strictly positive."""
    require(value > 0, f"{name} must be > 0 (a Dirichlet concentration), got {value}")


def check_count(name: str, value: int, minimum: int = 1) -> None:
    """Refuse an integer option below ``minimum``."""
    require(value >= minimum, f"{name} must be an integer >= {minimum}, got {value}")


class IndexPartitioner(Partitioner, ABC):
    """A scheme that computes every client's share at once from the label (and group) columns.

    Subclasses implement `_partition`, a pure function of the labels, the groups and a
    generator seeded with ``seed``; it returns one array of row positions per client. The result
    is computed on first use and kept, so ``load_partition`` is cheap for every client.
    """

    def __init__(self, num_partitions: int, seed: int) -> None:
        super().__init__()
        check_num_partitions(num_partitions)
        self._num_partitions = num_partitions
        self._seed = seed
        self._train_shares: tuple[np.ndarray, ...] | None = None
        self._test_shares: tuple[np.ndarray, ...] | None = None

    @property
    def num_partitions(self) -> int:
        """Total number of partitions (clients)."""
        return self._num_partitions

    def load_partition(self, partition_id: int) -> datasets.Dataset:
        """The rows of client ``partition_id``."""
        return self.dataset.select(self.partition_indices(partition_id))

    def partition_indices(self, partition_id: int) -> np.ndarray:
        """Row positions of client ``partition_id`` (what
        [`load_partition`][pflower.datasets.partitioners.base.IndexPartitioner.load_partition]
        selects)."""
        return self._shares()[0][partition_id]

    def _shares(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...] | None]:
        if self._train_shares is None:
            self._train_shares, self._test_shares = self._compute()
        return self._train_shares, self._test_shares

    def _compute(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...] | None]:
        labels, groups = columns_of(self.dataset)
        if len(labels) < self._num_partitions:
            raise ConfigError(
                f"{self._num_partitions} clients but only {len(labels)} samples to share: "
                f"use at most {len(labels)} clients"
            )
        shares = self._partition(labels, groups, np.random.default_rng(self._seed))
        return as_index_arrays(shares, self._num_partitions), None

    @abstractmethod
    def _partition(
        self, labels: np.ndarray, groups: np.ndarray | None, rng: np.random.Generator
    ) -> Sequence[np.ndarray]:
        """One array of row positions per client."""


class TestAwarePartitioner(IndexPartitioner, ABC):
    """A scheme that also draws each client's test share, from a second (official test) dataset.

    The builder assigns
    [`test_dataset`][pflower.datasets.partitioners.base.TestAwarePartitioner.test_dataset] (same
    columns as `dataset`) before loading
    anything;
    [`load_test_partition`][pflower.datasets.partitioners.base.TestAwarePartitioner.load_test_partition]
    then returns client ``partition_id``'s test rows.
    """

    def __init__(self, num_partitions: int, seed: int) -> None:
        super().__init__(num_partitions, seed)
        self._test_dataset: datasets.Dataset | None = None

    @property
    def test_dataset(self) -> datasets.Dataset:
        """The dataset test shares are drawn from."""
        if self._test_dataset is None:
            raise AttributeError("assign test_dataset before loading partitions")
        return self._test_dataset

    @test_dataset.setter
    def test_dataset(self, value: datasets.Dataset) -> None:
        if self._test_dataset is not None:
            raise ValueError("test_dataset can be assigned only once")
        self._test_dataset = value

    def load_test_partition(self, partition_id: int) -> datasets.Dataset:
        """The test rows of client ``partition_id``."""
        return self.test_dataset.select(self.test_partition_indices(partition_id))

    def test_partition_indices(self, partition_id: int) -> np.ndarray:
        """Row positions of client ``partition_id`` in
        [`test_dataset`][pflower.datasets.partitioners.base.TestAwarePartitioner.test_dataset]."""
        test_shares = self._shares()[1]
        assert test_shares is not None
        return test_shares[partition_id]

    def _compute(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...] | None]:
        labels, _ = columns_of(self.dataset)
        test_labels, _ = columns_of(self.test_dataset)
        train, test = self._partition_with_test(
            labels, test_labels, np.random.default_rng(self._seed)
        )
        k = self._num_partitions
        return as_index_arrays(train, k), as_index_arrays(test, k)

    def _partition(
        self, labels: np.ndarray, groups: np.ndarray | None, rng: np.random.Generator
    ) -> Sequence[np.ndarray]:
        raise NotImplementedError("a test-aware scheme partitions train and test together")

    @abstractmethod
    def _partition_with_test(
        self, labels: np.ndarray, test_labels: np.ndarray, rng: np.random.Generator
    ) -> tuple[Sequence[np.ndarray], Sequence[np.ndarray]]:
        """Per client, row positions into the train dataset and into the test dataset."""


@runtime_checkable
class InputNoiseScheme(Protocol):
    """A scheme whose clients add Gaussian noise to their normalized inputs (quality skew)."""

    @property
    def noise_std(self) -> tuple[float, ...]:
        """Noise std per client (0.0 = clean)."""
        ...

    @property
    def fixed_noise(self) -> bool:
        """True: one draw per sample, reused; False: a fresh draw at every access."""
        ...


@runtime_checkable
class SampleSharingScheme(Protocol):
    """A scheme whose clients may receive the same sample (overlapping shares)."""

    @property
    def shares_samples(self) -> bool:
        """True when two clients' shares may intersect (as configured)."""
        ...


class DisjointOption:
    """Mixin of the schemes with a ``disjoint`` option (the scheme sets ``_disjoint``).

    ``disjoint: false`` lets clients' shares intersect: such a scheme is a
    [`SampleSharingScheme`][pflower.datasets.partitioners.base.SampleSharingScheme].
    """

    _disjoint: bool

    @property
    def shares_samples(self) -> bool:
        """True with ``disjoint: false``: clients' shares may intersect."""
        return not self._disjoint


def shares_samples(partitioner: Partitioner) -> bool:
    """Whether ``partitioner`` may give one sample to several clients.

    Schemes that do not implement
    [`SampleSharingScheme`][pflower.datasets.partitioners.base.SampleSharingScheme] (all of Flower
    Datasets' own, and
    every scheme without a ``disjoint`` option) deal each sample to at most one client.
    """
    return isinstance(partitioner, SampleSharingScheme) and partitioner.shares_samples


def columns_of(dataset: datasets.Dataset) -> tuple[np.ndarray, np.ndarray | None]:
    """The ``label`` column and, if present, the ``group`` column as int64 arrays."""
    labels = column(dataset, LABEL)
    groups = column(dataset, GROUP) if GROUP in dataset.column_names else None
    return labels, groups


def column(dataset: datasets.Dataset, name: str) -> np.ndarray:
    """One column as an int64 array, read through Arrow (not row by row)."""
    table = dataset.with_format("arrow")[:]
    return np.asarray(table[name].to_numpy(), dtype=np.int64).reshape(-1)


def as_index_arrays(shares: Sequence[np.ndarray], num_partitions: int) -> tuple[np.ndarray, ...]:
    """Shares as a tuple of int64 arrays, checked to be one per client."""
    if len(shares) != num_partitions:
        raise RuntimeError(f"scheme produced {len(shares)} shares for {num_partitions} clients")
    return tuple(np.asarray(share, dtype=np.int64).reshape(-1) for share in shares)


@dataclass(frozen=True)
class Partition:
    """What a scheme produced, as row positions into the label arrays it was given.

    ``test`` is set only by test-aware schemes (positions into the test labels); ``noise_std`` only
    by input-noise schemes.
    """

    train: tuple[np.ndarray, ...]
    test: tuple[np.ndarray, ...] | None = None
    noise_std: tuple[float, ...] | None = None
    fixed_noise: bool = False


def build_partitioner(partition: Mapping[str, Any], num_partitions: int, seed: int) -> Partitioner:
    """The partitioner described by a ``partition`` block (``name`` plus options).

    Raises:
        ConfigError: no or unknown name, an unknown option, a run-level key in the block, or an
            option value the scheme refuses.
    """
    options = dict(partition)
    name = options.pop("name", None)
    if not isinstance(name, str):
        raise ConfigError(
            f"partition block needs a 'name' (one of {', '.join(PARTITIONERS.names)})"
        )
    misplaced = sorted(set(options) & set(_CONTEXT_KEYS))
    if misplaced:
        raise ConfigError(
            f"partition '{name}': {', '.join(misplaced)} are run-level keys "
            "(num_clients, seed), not partition options"
        )
    try:
        return PARTITIONERS.build(name, options, num_partitions=num_partitions, seed=seed)
    except (ValueError, TypeError) as error:  # ConfigError is a ValueError
        raise ConfigError(f"partition '{name}': {error}") from error


def partition_labels(
    partition: Mapping[str, Any],
    num_partitions: int,
    seed: int,
    labels: np.ndarray,
    groups: np.ndarray | None = None,
    test_labels: np.ndarray | None = None,
) -> Partition:
    """Run the scheme of ``partition`` on ``labels`` (and ``groups``; ``test_labels`` if needed).

    Args:
        partition: ``{name: <scheme>, <option>: <value>, ...}``.
        num_partitions: the number of clients.
        seed: drives every random choice of the scheme.
        labels: int labels of the samples to share out.
        groups: optional per-sample group ids (writers, attributes).
        test_labels: labels of the official test split; needed by test-aware schemes only.

    Raises:
        ConfigError: the block is invalid, or the request is impossible on these labels (the
            message says what is wrong and what is allowed).
    """
    name = partition.get("name")
    partitioner = build_partitioner(partition, num_partitions, seed)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = _run(partitioner, labels, groups, test_labels)
    except ConfigError as error:
        raise ConfigError(f"partition '{name}': {error}") from error
    except ValueError as error:
        raise ConfigError(
            f"partition '{name}' with {num_partitions} clients is impossible on "
            f"{len(labels)} samples: {error}"
        ) from error
    for warning in caught:
        LOGGER.info("partition '%s': %s", name, warning.message)
    return result


def _run(
    partitioner: Partitioner,
    labels: np.ndarray,
    groups: np.ndarray | None,
    test_labels: np.ndarray | None,
) -> Partition:
    partitioner.dataset = to_hf_dataset(labels, groups)
    test: tuple[np.ndarray, ...] | None = None
    if isinstance(partitioner, TestAwarePartitioner):
        if test_labels is None:
            raise ConfigError("this scheme draws test shares itself and needs the test labels")
        partitioner.test_dataset = to_hf_dataset(test_labels)
    clients = range(partitioner.num_partitions)
    if isinstance(partitioner, IndexPartitioner):  # row positions directly, no Dataset.select
        train = tuple(partitioner.partition_indices(pid) for pid in clients)
    else:
        train = tuple(column(partitioner.load_partition(pid), INDEX) for pid in clients)
    empty = [pid for pid in clients if not len(train[pid])]
    if empty:
        raise ValueError(
            f"clients {empty} receive no samples; use fewer clients or other scheme options"
        )
    if isinstance(partitioner, TestAwarePartitioner):
        test = tuple(partitioner.test_partition_indices(pid) for pid in clients)
    if isinstance(partitioner, InputNoiseScheme):
        return Partition(train, test, partitioner.noise_std, partitioner.fixed_noise)
    return Partition(train, test)
