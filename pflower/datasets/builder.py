"""Computes a federation's index lists: the partition scheme, then test, validation and global
test shares (steps 1-5 of [`pflower.datasets.federation`][pflower.datasets.federation]'s docstring).

Imported only when a federation is not in the cache
([`pflower.datasets.federation.build_federation`][pflower.datasets.federation.build_federation]):
the partition schemes import Flower Datasets and, through it, Hugging Face
``datasets``, pandas and seaborn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pflower.datasets.partitioners import (
    TestAwarePartitioner,
    build_partitioner,
    partition_labels,
    shares_samples,
)
from pflower.datasets.partitioners.allocation import (
    deal_by_class,
    largest_remainder,
    round_matrix,
    stratified_choice,
)
from pflower.datasets.partitioners.from_file import file_tests
from pflower.datasets.split import ClientSplit, Shares, SplitConfig, check_no_leak
from pflower.registry import ConfigError


def share_out(
    labels: np.ndarray,
    groups: np.ndarray | None,
    n_train: int,
    num_clients: int,
    seed: int,
    partition: Mapping[str, Any],
    config: SplitConfig,
) -> Shares:
    """Every client's shares of a pool (official train followed by official test), checked.

    Args:
        labels: the pool's labels.
        groups: the pool's group tags (writer ids, attributes), or ``None``.
        n_train: the size of the official train split (the first ``n_train`` pool samples).
        num_clients: the number of clients.
        seed: drives the partition, the subsampling and the per-client splits.
        partition: the ``partition`` block, ``{name: <scheme>, <option>: ...}``.
        config: the validated ``split`` block.

    Raises:
        ConfigError: an impossible request, or a client left without training or test samples.
        RuntimeError: a held-out sample is also trained on
            ([`check_no_leak`][pflower.datasets.builder.check_no_leak]).
    """
    name = partition.get("name")
    # spawn(4)[:3] equals spawn(3): adding the reserve generator changed no existing federation
    subsample_rng, test_rng, val_rng, reserve_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )
    candidates, official_test = _candidates(config, n_train, labels, subsample_rng)
    partitioner = build_partitioner(partition, num_clients, seed)
    _check_test_source(isinstance(partitioner, TestAwarePartitioner), config.client_test, name)
    reserves = _reserve(config, shares_samples(partitioner), candidates, labels, reserve_rng)
    shared = reserves.shared
    result = partition_labels(
        partition,
        num_clients,
        seed,
        labels[shared],
        None if groups is None else groups[shared],
        labels[official_test] if config.pool == "train" else None,
    )
    trains = [test_rng.permutation(shared[share]) for share in result.train]

    if reserves.test is not None:
        tests = _draw_matching(trains, reserves.test, labels, config.test_fraction, test_rng)
    elif config.client_test == "holdout":
        trains, tests = _carve(trains, labels, config.test_fraction, config, test_rng, "test")
    elif config.client_test == "mirror":
        tests = _mirror(trains, official_test, labels, test_rng)
    elif config.client_test == "file":
        tests = file_tests(partition, labels)
    else:
        assert result.test is not None
        tests = [official_test[share] for share in result.test]
    _require_test_samples(tests, name, config.client_test, reserves.test is not None)
    if reserves.val is not None:
        vals = _draw_matching(trains, reserves.val, labels, config.val_fraction, val_rng)
    elif config.val_fraction > 0.0:
        trains, vals = _carve(trains, labels, config.val_fraction, config, val_rng, "validation")
    else:
        vals = [np.zeros(0, dtype=np.int64) for _ in trains]

    global_test = (
        official_test if config.global_test == "official" else np.unique(np.concatenate(tests))
    )
    clients = tuple(
        ClientSplit(train, test, val) for train, test, val in zip(trains, tests, vals, strict=True)
    )
    check_no_leak(clients, global_test)
    if result.noise_std is None:
        return Shares(clients, global_test)
    return Shares(clients, global_test, tuple(result.noise_std), bool(result.fixed_noise))


@dataclass(frozen=True)
class _Reserves:
    """The samples a scheme shares out, and the held-out reserves set aside before it runs.

    ``test``/``val`` are ``None`` where no reserve is needed: the held-out shares are then cut from
    the client shares, or drawn from the official test split, as the split says.
    """

    shared: np.ndarray
    test: np.ndarray | None = None
    val: np.ndarray | None = None


def _reserve(
    config: SplitConfig,
    sharing: bool,
    candidates: np.ndarray,
    labels: np.ndarray,
    rng: np.random.Generator,
) -> _Reserves:
    """Set held-out samples aside before a sample-sharing scheme runs.

    Why: a scheme with ``disjoint: false`` (FLAME's code for Dir(beta) label imbalance, Dir(beta)
    quantity skew and hybrid skew) draws every client's share independently from the whole pool,
    so shares overlap. Cutting each client's test share out of its own share afterwards, as the
    code does, makes a test sample of one client a training sample of others: on MNIST with 10
    clients and FLAME's 80/20 split, 48% (label), 52% (quantity) and 77% (hybrid) of the global
    test set were trained on. The FLAME paper (Section VI-A, "Datasets") states the intent: "We
    randomly select 20% of each dataset to create a testing set, leaving the remaining 80% as the
    training set", i.e. test and training samples are disjoint.

    What: for such a scheme, a stratified ``test_fraction`` of the candidates (``holdout`` only)
    and then a stratified ``val_fraction`` of the rest are reserved first (sizes by
    `_held_out_size`); the scheme shares out only what is left, so its overlapping draws
    can never reach a held-out sample. Each client's test (validation) share is then drawn from
    the reserve by `_draw_matching`, with its train class mix, so it follows the client's
    distribution as a share cut from the client's own data would. Schemes that deal every sample
    to one client keep the plain path (shares cut from the client's share, unchanged results).
    """
    if not sharing:
        return _Reserves(candidates)
    shared, test, val = candidates, None, None
    if config.client_test == "holdout":
        shared, test = _set_aside(shared, labels, config.test_fraction, rng)
    if config.val_fraction > 0.0:
        shared, val = _set_aside(shared, labels, config.val_fraction, rng)
    return _Reserves(shared, test, val)


def _set_aside(
    indices: np.ndarray, labels: np.ndarray, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(rest, reserve)``: a label-stratified ``fraction`` of ``indices`` set aside."""
    chosen = stratified_choice(labels[indices], _held_out_size(len(indices), fraction), rng)
    mask = np.zeros(len(indices), dtype=bool)
    mask[chosen] = True
    return indices[~mask], indices[mask]


def _draw_matching(
    trains: list[np.ndarray],
    reserve: np.ndarray,
    labels: np.ndarray,
    fraction: float,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Per client, held-out samples from ``reserve`` with its train class mix.

    A client with ``n`` train samples gets ``round(n * fraction / (1 - fraction))`` (at least
    one), so they make ``fraction`` of its train plus held-out data; the classes follow its
    train counts (largest remainder), each capped at what the reserve holds. Clients draw
    independently, so two clients may share a held-out sample, just as the sample-sharing scheme
    lets them share training samples; the shares are stratified whatever ``split.stratify`` says,
    since the class is all that ties a reserved sample to a client.
    """
    reserve_labels = labels[reserve]
    by_class = {int(label): reserve[reserve_labels == label] for label in np.unique(reserve_labels)}
    return [_matching_share(labels[train], by_class, fraction, rng) for train in trains]


def _matching_share(
    train_labels: np.ndarray,
    by_class: dict[int, np.ndarray],
    fraction: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """One client's held-out share (see `_draw_matching`) from the reserve's classes."""
    classes, counts = np.unique(train_labels, return_counts=True)
    total = max(1, round(len(train_labels) * fraction / (1.0 - fraction)))
    wanted = largest_remainder(counts * (total / counts.sum()), total)
    parts = [np.zeros(0, dtype=np.int64)]
    for label, count in zip(classes, wanted, strict=True):
        available = by_class.get(int(label), parts[0])
        parts.append(rng.choice(available, min(int(count), len(available)), replace=False))
    return np.concatenate(parts)


def _candidates(
    config: SplitConfig, n_train: int, labels: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Pool indices to share among clients, and the official test indices to draw tests from."""
    shared = np.arange(n_train if config.pool == "train" else len(labels))
    official_test = np.arange(n_train, len(labels))
    if config.subsample_fraction < 1.0:
        shared = _subsample(shared, labels, config.subsample_fraction, rng)
        if config.pool == "train":
            official_test = _subsample(official_test, labels, config.subsample_fraction, rng)
    return shared, official_test


def _check_test_source(scheme_draws_tests: bool, client_test: str, scheme: Any) -> None:
    """A scheme draws client tests itself exactly when ``client_test`` is ``partitioner``."""
    if scheme_draws_tests and client_test != "partitioner":
        raise ConfigError(
            f"partition '{scheme}' draws its own client test shares; "
            "set split.client_test=partitioner (split=diversifed)"
        )
    if not scheme_draws_tests and client_test == "partitioner":
        raise ConfigError(
            "split.client_test=partitioner needs a scheme that draws client test shares "
            f"(diversifed_*); '{scheme}' does not: use client_test=holdout or mirror"
        )


def _carve(
    shares: list[np.ndarray],
    labels: np.ndarray,
    fraction: float,
    config: SplitConfig,
    rng: np.random.Generator,
    what: str,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every share split into ``(kept, carved)`` by `_split_off`."""
    pairs = [_split_off(share, labels, fraction, config.stratify, rng, what) for share in shares]
    return [kept for kept, _ in pairs], [carved for _, carved in pairs]


def _subsample(
    indices: np.ndarray, labels: np.ndarray, fraction: float, rng: np.random.Generator
) -> np.ndarray:
    """A stratified ``fraction`` of ``indices`` (at least one), in their original order."""
    size = max(1, round(fraction * len(indices))) if len(indices) else 0
    return indices[stratified_choice(labels[indices], size, rng)]


def _split_off(
    indices: np.ndarray,
    labels: np.ndarray,
    fraction: float,
    stratify: bool,
    rng: np.random.Generator,
    what: str,
) -> tuple[np.ndarray, np.ndarray]:
    """``(kept, carved)``: about ``fraction`` of ``indices`` carved off, both parts non-empty.

    The carved part has `_held_out_size` samples, clamped to ``[1, n - 1]``; with
    ``stratify`` its class proportions follow the client's.
    """
    n = len(indices)
    if n < 2:
        raise ConfigError(
            f"a client has {n} sample(s), too few to split off a {what} share; "
            "use fewer clients or a scheme with larger clients"
        )
    size = min(max(_held_out_size(n, fraction), 1), n - 1)
    if stratify:
        carved = stratified_choice(labels[indices], size, rng)
    else:
        carved = np.sort(rng.choice(n, size, replace=False))
    mask = np.zeros(n, dtype=bool)
    mask[carved] = True
    return indices[~mask], indices[mask]


def _held_out_size(n: int, fraction: float) -> int:
    """``n - floor((1 - fraction) * n)``: scikit-learn's ``train_test_split`` rule (2630 samples
    at 0.25 give 1972/658, as in PFLlib, which FedALA uses)."""
    return n - math.floor((1.0 - fraction) * n + 1e-9)


def _mirror(
    trains: list[np.ndarray],
    official_test: np.ndarray,
    labels: np.ndarray,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Client test shares from the official test split, with each client's train class mix.

    Client ``k`` gets ``n_kl / n_l * M_l`` test samples of class ``l``, where ``n_kl`` is its train
    count, ``n_l`` the train samples of class ``l`` given to any client and ``M_l`` the class's
    test samples (``A_test = P / N_l * M_l`` for FLIU's LS), rounded without losing or reusing a
    sample; the shares are disjoint and together use every test sample of every class some client
    holds. The FLIU paper does not say how client test sets are drawn; this is pflower's reading,
    and it fits FLIU's Tab. II, where FedAvg's L1 Acc(L) equals its L1 Acc(G) on CIFAR-10.
    """
    classes = np.unique(labels)
    column = {label: j for j, label in enumerate(classes)}
    train_counts = np.zeros((len(trains), len(classes)))
    for client, share in enumerate(trains):
        held, counts = np.unique(labels[share], return_counts=True)
        train_counts[client, [column[label] for label in held]] = counts
    test_labels = labels[official_test]
    test_class_counts = np.array([(test_labels == label).sum() for label in classes])
    assigned = train_counts.sum(axis=0)
    real = train_counts / np.maximum(assigned, 1.0) * np.where(assigned > 0, test_class_counts, 0)
    shares = deal_by_class(test_labels, classes, round_matrix(real), rng)
    return [official_test[share] for share in shares]


def _require_test_samples(
    tests: list[np.ndarray], scheme: Any, client_test: str, reserved: bool
) -> None:
    """Refuse a federation in which a client has no test sample, saying where tests come from."""
    empty = [client for client, share in enumerate(tests) if not len(share)]
    if not empty:
        return
    if reserved:
        source, remedy = "the held-out reserve has none of their classes", "disjoint=true"
    elif client_test == "mirror":
        source = "the official test split has too few samples of their classes"
        remedy = "client_test=holdout"
    else:
        source, remedy = "the scheme drew none", "a larger test_size"
    raise ConfigError(
        f"partition '{scheme}' leaves clients {empty} without test samples ({source}); "
        f"use fewer clients, a larger min_size, or {remedy}"
    )
