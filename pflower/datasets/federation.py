"""A dataset split among clients, as every other part sees it, and the builder that makes it.

:func:`build_federation` is the single entry point the server, the clients, the partition report
and the tests use. It is a pure function of its arguments (same arguments, same federation), so a
caller may cache it per process; the simulation calls ``client_fn`` once per message, and
rebuilding there would dominate the round time.

How a federation is built (``split`` keys in brackets, see :class:`SplitConfig`):

1. The *pool* is the official train split followed by the official test split; every index below
   points into it (test sample ``i`` is at ``len(train) + i``). The samples shared among clients
   are the official train split (``pool: train``) or all of the pool (``pool: all``: FLAME,
   FedALA), optionally a stratified fraction of them (``subsample_fraction``, for CPU runs; the
   official test split is subsampled the same way where it is used).
2. The partition scheme (``conf/partition``, :mod:`pflower.datasets.partitioners`) shares those
   samples among ``num_clients`` clients.
3. Each client's test share (``client_test``) is ``holdout`` (cut from its own share,
   ``test_fraction``, ``stratify``), ``mirror`` (drawn from the official test split with the class
   proportions of its train share, disjoint across clients: FLIU, FedMPR) or ``partitioner`` (drawn
   by the scheme itself: DiversiFed).
4. ``val_fraction`` carves a validation share out of each client's train share.
5. The global test set (``global_test``) is the union of the client test shares (pflower's
   default, as in FLIU, Sec. IV-B: "an aggregate data set, constructed from the individual client
   test sets") or the official test split (FedMPR).
6. ``evaluate_on: val`` (for choosing hyperparameters) puts each client's validation share in
   place of its test share, and their union in place of the global test set: every evaluation
   stage then scores validation data, and no test sample is read.

Schemes that give one sample to several clients (``disjoint: false``, see
:class:`~pflower.datasets.partitioners.SampleSharingScheme`) change steps 2-4: the held-out
samples (``holdout`` tests, validation) are set aside in *reserves* before the scheme runs, and each
client's held-out shares are drawn from them with its train class mix (:func:`_reserve`). Cutting
them from the overlapping shares instead would make one client's test samples other clients'
training samples. Every federation is checked before it is returned: no client test sample and no
global test sample is in any client's train or validation share, and no validation sample is in
any client's train share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from pflower.datasets.base import ImageDataset, ImageSplit
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
from pflower.registry import ConfigError


@dataclass(frozen=True)
class ClientSplit:
    """One client's sample indices into :attr:`Federation.pool`."""

    train: np.ndarray
    test: np.ndarray
    val: np.ndarray


@dataclass(frozen=True)
class InputNoise:
    """Per-client Gaussian noise on normalized inputs: FLAME's quality skew (FLAME, Sec. VI-A).

    Client ``i`` adds noise of std ``std[i]`` (``sigma * i / K``; 0.0 = clean) to every normalized
    image it trains or evaluates on, test included. With ``fixed=False`` (FLAME's code) the noise is
    redrawn at every access; with ``fixed=True`` each sample's noise is drawn once, from a generator
    seeded by ``(seed, pool index)``, and so is the same in every epoch and on every machine.
    """

    std: tuple[float, ...]
    fixed: bool
    seed: int

    def apply(
        self,
        partition_id: int,
        images: torch.Tensor,
        indices: np.ndarray | torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """``images`` (a normalized batch of client ``partition_id``) plus that client's noise.

        Args:
            partition_id: the client.
            images: normalized batch ``(B, C, H, W)``.
            indices: pool indices of the batch's samples (used when ``fixed``).
            generator: source of fresh noise when not ``fixed`` (default: torch's global one).
        """
        std = self.std[partition_id]
        if std == 0.0:
            return images
        if self.fixed:
            if len(indices) != len(images):
                raise ValueError(f"{len(indices)} indices for a batch of {len(images)} images")
            noise = torch.stack([self._sample_noise(int(i), images.shape[1:]) for i in indices])
        else:
            device = generator.device if generator is not None else images.device
            noise = torch.randn(images.shape, generator=generator, device=device)
        return images + std * noise.to(device=images.device, dtype=images.dtype)

    def _sample_noise(self, index: int, shape: torch.Size) -> torch.Tensor:
        state = np.random.SeedSequence([self.seed, index]).generate_state(1, np.uint64)[0]
        return torch.randn(shape, generator=torch.Generator().manual_seed(int(state)))


@dataclass(frozen=True)
class Federation:
    """A dataset, its pool (official train followed by official test) and each client's share.

    ``input_noise`` is set when the partition scheme perturbs inputs per client (quality skew);
    the client data path applies it to normalized batches, train and test.
    """

    dataset: ImageDataset
    pool: ImageSplit
    clients: tuple[ClientSplit, ...]
    global_test: np.ndarray
    input_noise: InputNoise | None = None

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def client_train(self, partition_id: int) -> ImageSplit:
        return self.pool.subset(self.clients[partition_id].train)

    def client_test(self, partition_id: int) -> ImageSplit:
        return self.pool.subset(self.clients[partition_id].test)

    def client_val(self, partition_id: int) -> ImageSplit:
        return self.pool.subset(self.clients[partition_id].val)

    def global_test_split(self) -> ImageSplit:
        return self.pool.subset(self.global_test)


_CHOICES: dict[str, tuple[str, ...]] = {
    "pool": ("train", "all"),
    "client_test": ("holdout", "mirror", "partitioner"),
    "global_test": ("union", "official"),
    "evaluate_on": ("test", "val"),
}


@dataclass(frozen=True)
class SplitConfig:
    """The ``conf/split/*.yaml`` block: where client test/validation shares come from.

    Attributes:
        pool: ``train`` shares the official train split; ``all`` shares train and test merged.
        subsample_fraction: stratified fraction of the shared samples (and of the official test
            split where it is used) kept before partitioning, for quick runs; 1.0 keeps all.
        client_test: ``holdout``, ``mirror`` or ``partitioner`` (see the module docstring).
        test_fraction: ``holdout`` only: share of each client's samples held out for its test.
        stratify: ``holdout`` and validation: keep the client's class proportions in both parts.
        val_fraction: share of each client's train share carved out for validation (0 = none).
        global_test: ``union`` of client test shares, or the ``official`` test split.
        evaluate_on: ``test``, or ``val`` to tune hyperparameters: the validation shares (and
            their union) replace the client tests (and the global test) in every evaluation.
    """

    pool: str = "train"
    subsample_fraction: float = 1.0
    client_test: str = "holdout"
    test_fraction: float = 0.25
    stratify: bool = True
    val_fraction: float = 0.0
    global_test: str = "union"
    evaluate_on: str = "test"

    @classmethod
    def from_mapping(cls, split: Mapping[str, Any]) -> SplitConfig:
        """Validate a split block; unknown keys and bad values fail with what is allowed."""
        allowed = [field.name for field in fields(cls)]
        unknown = sorted(set(split) - set(allowed))
        if unknown:
            raise ConfigError(
                f"split does not take {', '.join(map(repr, unknown))}. "
                f"Allowed keys: {', '.join(allowed)}"
            )
        config = cls(**dict(split))
        config._validate()
        return config

    def _validate(self) -> None:
        if not isinstance(self.stratify, bool):
            raise ConfigError(f"split.stratify must be true or false, got {self.stratify!r}")
        for key in ("subsample_fraction", "test_fraction", "val_fraction"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"split.{key} must be a number, got {value!r}")
        for key, choices in _CHOICES.items():
            if getattr(self, key) not in choices:
                raise ConfigError(
                    f"split.{key} must be one of {', '.join(choices)}, got {getattr(self, key)!r}"
                )
        if not 0.0 < self.subsample_fraction <= 1.0:
            raise ConfigError(
                f"split.subsample_fraction must be in (0, 1], got {self.subsample_fraction}"
            )
        for key in ("test_fraction", "val_fraction"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"split.{key} must be in [0, 1), got {getattr(self, key)}")
        if self.evaluate_on == "val" and self.val_fraction == 0.0:
            raise ConfigError(
                "split.evaluate_on=val scores the clients' validation shares: set "
                "split.val_fraction > 0 (e.g. 0.2)"
            )
        if self.client_test == "holdout" and self.test_fraction == 0.0:
            raise ConfigError("split.test_fraction must be > 0 with client_test=holdout")
        if self.pool == "all" and (self.client_test != "holdout" or self.global_test == "official"):
            raise ConfigError(
                "split.pool=all shares the official test split among clients, so it cannot also "
                "supply client tests (client_test=mirror|partitioner) or the global test "
                "(global_test=official); use pool=train or client_test=holdout, global_test=union"
            )


def build_federation(
    dataset: ImageDataset,
    num_clients: int,
    seed: int,
    partition: Mapping[str, Any],
    split: Mapping[str, Any],
) -> Federation:
    """Share ``dataset`` among ``num_clients`` clients; pure and deterministic in its arguments.

    Args:
        dataset: the dataset with its official train/test split.
        num_clients: the number of clients.
        seed: drives the partition, the subsampling and the per-client splits.
        partition: the ``conf/partition/*.yaml`` block, ``{name: <scheme>, <option>: ...}``.
        split: the ``conf/split/*.yaml`` block (:class:`SplitConfig`).

    Raises:
        ConfigError: an invalid block, an impossible request, or a client left without
            training or test samples (the message says which and what to change).
    """
    config = SplitConfig.from_mapping(split)
    name = partition.get("name")
    pool = _concat(dataset.train, dataset.test)
    labels = pool.labels.numpy()
    groups = None if pool.groups is None else pool.groups.numpy()
    # spawn(4)[:3] equals spawn(3): adding the reserve generator changed no existing federation
    subsample_rng, test_rng, val_rng, reserve_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )
    candidates, official_test = _candidates(config, len(dataset.train), labels, subsample_rng)
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
    noise = (
        None if result.noise_std is None else InputNoise(result.noise_std, result.fixed_noise, seed)
    )
    clients = tuple(
        ClientSplit(train, test, val) for train, test, val in zip(trains, tests, vals, strict=True)
    )
    check_no_leak(clients, global_test)
    if config.evaluate_on == "val":
        _require_test_samples(vals, name, "holdout", reserves.val is not None, "validation")
        clients = tuple(ClientSplit(client.train, client.val, client.val) for client in clients)
        global_test = np.unique(np.concatenate(vals))
    return Federation(dataset, pool, clients, global_test, noise)


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
    :func:`_held_out_size`); the scheme shares out only what is left, so its overlapping draws
    can never reach a held-out sample. Each client's test (validation) share is then drawn from
    the reserve by :func:`_draw_matching`, with its train class mix, so it follows the client's
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
    """One client's held-out share (see :func:`_draw_matching`) from the reserve's classes."""
    classes, counts = np.unique(train_labels, return_counts=True)
    total = max(1, round(len(train_labels) * fraction / (1.0 - fraction)))
    wanted = largest_remainder(counts * (total / counts.sum()), total)
    parts = [np.zeros(0, dtype=np.int64)]
    for label, count in zip(classes, wanted, strict=True):
        available = by_class.get(int(label), parts[0])
        parts.append(rng.choice(available, min(int(count), len(available)), replace=False))
    return np.concatenate(parts)


def check_no_leak(clients: tuple[ClientSplit, ...], global_test: np.ndarray) -> None:
    """Refuse a federation in which a held-out sample is also trained on.

    No client's test sample and no global test sample may be in any client's train or validation
    share, and no validation sample in any client's train share. The builder guarantees this by
    construction; the check keeps it true for schemes added later.

    Raises:
        RuntimeError: the index of the first leaked sample and which shares hold it.
    """
    trained = np.concatenate([client.train for client in clients])
    validated = np.concatenate([client.val for client in clients])
    tested = np.concatenate([client.test for client in clients] + [global_test])
    for held, used, what in (
        (tested, np.concatenate([trained, validated]), "test sample is also a train/validation"),
        (validated, trained, "validation sample is also a training"),
    ):
        leaked = np.intersect1d(held, used)
        if len(leaked):
            raise RuntimeError(
                f"{len(leaked)} held-out samples leak (pool index {int(leaked[0])}: a {what} "
                "sample); a partition scheme that gives one sample to several clients must "
                "declare it (SampleSharingScheme.shares_samples) so the builder reserves "
                "held-out samples first"
            )


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
    """Every share split into ``(kept, carved)`` by :func:`_split_off`."""
    pairs = [_split_off(share, labels, fraction, config.stratify, rng, what) for share in shares]
    return [kept for kept, _ in pairs], [carved for _, carved in pairs]


def _concat(train: ImageSplit, test: ImageSplit) -> ImageSplit:
    """Train followed by test; a split without groups gets group -1 ("none") if the other has.

    Splits read from the dataset cache are consecutive views of one memory-mapped array: their
    pool is a view of it too (no copy), so every process shares the same pages.
    """
    groups = None
    if train.groups is not None or test.groups is not None:
        groups = _join(_groups_or_none(train), _groups_or_none(test))
    return ImageSplit(_join(train.images, test.images), _join(train.labels, test.labels), groups)


def _join(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """``torch.cat([first, second])``, as a view when ``second`` follows ``first`` in memory."""
    adjacent = (
        first.is_contiguous()
        and second.is_contiguous()
        and first.dtype == second.dtype
        and first.shape[1:] == second.shape[1:]
        and first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
        and first.storage_offset() + first.numel() == second.storage_offset()
    )
    if not adjacent:
        return torch.cat([first, second])
    shape = (first.shape[0] + second.shape[0], *first.shape[1:])
    return first.as_strided(
        shape, torch.empty(shape, device="meta").stride(), first.storage_offset()
    )


def _groups_or_none(split: ImageSplit) -> torch.Tensor:
    if split.groups is not None:
        return split.groups.to(torch.int64)
    return torch.full((len(split),), -1, dtype=torch.int64)


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

    The carved part has :func:`_held_out_size` samples, clamped to ``[1, n - 1]``; with
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
    tests: list[np.ndarray], scheme: Any, client_test: str, reserved: bool, what: str = "test"
) -> None:
    """Refuse a federation in which a client has no ``what`` sample, saying where they come from."""
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
        f"partition '{scheme}' leaves clients {empty} without {what} samples ({source}); "
        f"use fewer clients, a larger min_size, or {remedy}"
    )
