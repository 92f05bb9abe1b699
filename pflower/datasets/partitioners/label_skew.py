"""Label-skew schemes: each client sees a different mix of classes.

======================== ==========================================================================
name                     scheme (source)
======================== ==========================================================================
``pathological``         ``classes_per_client`` classes per client (FLIU, Sec. IV-A2): ``balanced``
                         (every class held equally often, duplicates repaired) or ``random``
                         (independent draws; Flower Datasets' `PathologicalPartitioner`)
``shards``               McMahan et al.'s sorted shards (Flower Datasets' ShardPartitioner)
``dirichlet``            per-class Dir(alpha) proportions with a minimum client size and retries
                         (Flower Datasets' `DirichletPartitioner`; FedMPR, Fig. 8d)
``ls``                   FLIU label skew: Dirichlet rows, Sinkhorn to equal sizes (Sec. IV-A3)
``class_groups``         disjoint contiguous class groups, FedMPR high shift (Sec. V-A)
``q_label_skew``         FLAME "#label = q" shards (FLAME, Sec. VI-A)
``dir_label_skew``       FLAME "Dir(beta)" label imbalance, disjoint or as its code (Sec. VI-A)
``pflib_pathological``   PFLlib's pathological split with class budgets (FedALA's setting)
``pflib_practical``      PFLlib's practical Dir(beta) split with balancing (FedALA's setting)
======================== ==========================================================================
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from flwr_datasets.partitioner import (
    DirichletPartitioner,
    Partitioner,
    PathologicalPartitioner,
    ShardPartitioner,
)

from pflower.datasets.partitioners.allocation import (
    CappedCountMatrixPartitioner,
    CountMatrixPartitioner,
)
from pflower.datasets.partitioners.base import (
    LABEL,
    PARTITIONERS,
    DisjointOption,
    IndexPartitioner,
    check_concentration,
    check_count,
    check_num_partitions,
    require,
)
from pflower.datasets.partitioners.sinkhorn import sinkhorn

LOGGER = logging.getLogger(__name__)

MAX_DRAWS = 1000
"""Draws
[`DirichletLabelPartitioner`][pflower.datasets.partitioners.label_skew.DirichletLabelPartitioner]
makes before refusing a minimum-size rule (PFLlib and
NIID-Bench loop forever; MNIST with 100 clients at beta = 0.1 needs about 50-400 draws)."""


def check_classes_per_client(classes_per_client: int, num_classes: int) -> None:
    """Refuse asking for more distinct classes per client than the data has."""
    if classes_per_client > num_classes:
        raise ValueError(
            f"{classes_per_client} classes per client requested but the data has only "
            f"{num_classes} classes; allowed: 1..{num_classes}"
        )


@PARTITIONERS.register("pathological")
def pathological(
    num_partitions: int,
    seed: int,
    classes_per_client: int = 2,
    assignment: Literal["balanced", "random"] = "balanced",
) -> Partitioner:
    """``classes_per_client`` distinct classes per client (FLIU paper, Sec. IV-A2: two classes).

    ``balanced`` (default): every class is held by ``K*k/L`` clients (see
    [`BalancedPathologicalPartitioner`][pflower.datasets.partitioners.label_skew.BalancedPathologicalPartitioner]).
    ``random``: every client draws its classes
    independently; each class is split evenly among the clients that drew it and classes nobody
    drew are dropped (logged), the literal reading of the paper. ``balanced`` is pflower's default
    because it fits FLIU's Tab. II, where FedAvg's L1 Acc(L) equals its L1 Acc(G) on CIFAR-10 PATH.
    """
    check_num_partitions(num_partitions)
    check_count("classes_per_client", classes_per_client)
    if assignment == "balanced":
        return BalancedPathologicalPartitioner(num_partitions, seed, classes_per_client)
    require(
        assignment == "random",
        f"pathological assignment must be 'balanced' or 'random', got {assignment!r}",
    )
    return PathologicalPartitioner(
        num_partitions, LABEL, classes_per_client, class_assignment_mode="random", seed=seed
    )


class BalancedPathologicalPartitioner(CountMatrixPartitioner):
    """FLIU PATH (FLIU paper, Sec. IV-A2), balanced mode (pflower's default).

    A list of ``K*k`` slots holds every class equally often (``K*k/L`` times; when that is not an
    integer, randomly chosen classes get one slot more), is shuffled and cut into ``K`` clients of
    ``k`` slots. A client holding a class twice swaps one of those slots with a random slot of
    another client so that neither ends with a class twice, until no client holds a class twice.
    Each class's samples are then split evenly among its holders.
    """

    def __init__(self, num_partitions: int, seed: int, classes_per_client: int) -> None:
        super().__init__(num_partitions, seed)
        self._classes_per_client = classes_per_client

    def _allocation(self, class_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        num_classes = len(class_counts)
        check_classes_per_client(self._classes_per_client, num_classes)
        slots = self._repaired_slots(num_classes, rng)
        held = np.zeros((self.num_partitions, num_classes))
        np.put_along_axis(held, slots, 1.0, axis=1)
        holders = held.sum(axis=0)
        if (holders == 0).any():
            LOGGER.info("pathological: classes %s have no holder", np.flatnonzero(holders == 0))
        return held * (class_counts / np.maximum(holders, 1.0))

    def _repaired_slots(self, num_classes: int, rng: np.random.Generator) -> np.ndarray:
        k, total = self._classes_per_client, self.num_partitions * self._classes_per_client
        slots = np.repeat(np.arange(num_classes), total // num_classes)
        extra = rng.choice(num_classes, total % num_classes, replace=False)
        table = rng.permutation(np.concatenate([slots, extra])).reshape(-1, k)
        while (client := _first_with_duplicate(table)) is not None:
            _swap_duplicate(table, client, rng)
        return table


def _first_with_duplicate(slots: np.ndarray) -> int | None:
    ordered = np.sort(slots, axis=1)
    clients = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
    return int(clients[0]) if len(clients) else None


def _swap_duplicate(slots: np.ndarray, client: int, rng: np.random.Generator) -> None:
    """Swap one duplicated slot of ``client`` with a slot of another client, both left valid:
    drawn uniformly from the (other client, slot) pairs in row-major order."""
    row = slots[client].tolist()
    position = next(i for i, label in enumerate(row) if row.index(label) != i)
    duplicate = row[position]
    other_ok = ~(slots == duplicate).any(axis=1)
    other_ok[client] = False
    candidates = np.argwhere(other_ok[:, None] & ~np.isin(slots, row))
    if not len(candidates):
        raise ValueError("cannot give every client distinct classes; use fewer classes per client")
    other, slot = candidates[rng.integers(len(candidates))]
    slots[client, position], slots[other, slot] = slots[other, slot], duplicate


@PARTITIONERS.register("shards")
def shards(
    num_partitions: int, seed: int, shards_per_client: int = 2, shard_size: int | None = None
) -> ShardPartitioner:
    """Sort by label, cut into equal shards, give each client ``shards_per_client`` random shards.

    McMahan et al. (2017); ``shard_size`` defaults to ``N / (K * shards_per_client)``, rounded
    down, and leftover samples stay unassigned.
    """
    check_num_partitions(num_partitions)
    check_count("shards_per_client", shards_per_client)
    if shard_size is not None:
        check_count("shard_size", shard_size)
    return ShardPartitioner(
        num_partitions, LABEL, shards_per_client, shard_size, shuffle=True, seed=seed
    )


@PARTITIONERS.register("dirichlet")
def dirichlet(
    num_partitions: int,
    seed: int,
    alpha: float = 0.5,
    min_size: int = 10,
    self_balancing: bool = False,
) -> DirichletPartitioner:
    """Per class, proportions over clients ~ Dir(alpha); redraw until every client has ``min_size``.

    The classic label-skew partition (Hsu et al. 2019), which FedMPR uses for 50 and 100 clients
    (Sec. VI, Fig. 8d). Flower Datasets' implementation: samples cut at the cumulative proportions,
    at most 10 redraws, then a clear error.
    """
    check_num_partitions(num_partitions)
    check_concentration("alpha", alpha)
    check_count("min_size", min_size, minimum=0)
    return DirichletPartitioner(
        num_partitions, LABEL, float(alpha), min_size, self_balancing, shuffle=True, seed=seed
    )


@PARTITIONERS.register("ls")
class LabelSkewPartitioner(CountMatrixPartitioner):
    """FLIU label skew (FLIU paper, Sec. IV-A3): Dirichlet label mixes with equal client sizes.

    Every row of ``P`` is drawn from Dir(alpha); Sinkhorn-Knopp scales ``P`` to row sums ``n/K``
    and column sums ``N_l``. The paper's row sums "K/L" (with column sums 1) cannot hold for
    K != L; pflower uses L/K, here in sample counts, which gives the constant client sizes the
    paper states. The counts are integerized without losing a sample, so client sizes differ by
    at most one.
    """

    def __init__(self, num_partitions: int, seed: int, alpha: float = 1.0) -> None:
        super().__init__(num_partitions, seed)
        check_concentration("alpha", alpha)
        self._alpha = alpha

    def _allocation(self, class_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        k = self.num_partitions
        mixes = rng.dirichlet(np.full(len(class_counts), self._alpha), size=k)
        return sinkhorn(mixes, np.full(k, class_counts.sum() / k), class_counts)


@PARTITIONERS.register("class_groups")
class ClassGroupsPartitioner(CappedCountMatrixPartitioner):
    """FedMPR high shift (FedMPR, Sec. V-A): the sorted classes cut into ``K`` contiguous groups.

    Client ``k`` gets every sample of the classes of group ``k`` (``K = 2`` on 10 classes: 0-4 and
    5-9, as in Sec. V-A; ``K = 10``: one class each, as in App. IX-B). No class is shared.
    Contiguous groups for other ``K`` are pflower's choice. ``samples_per_class`` caps how many
    samples of each class a client keeps (the paper's samples-per-client sweep, Fig. 8b).
    """

    def _allocation(self, class_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        num_classes, k = len(class_counts), self.num_partitions
        if k > num_classes:
            raise ValueError(
                f"{k} clients but only {num_classes} classes to group; allowed: "
                f"at most {num_classes} clients (use 'dirichlet' for more clients)"
            )
        kept = self._capped(class_counts.astype(np.float64))
        allocation = np.zeros((k, num_classes))
        for client, group in enumerate(np.array_split(np.arange(num_classes), k)):
            allocation[client, group] = kept[group]
        return allocation


def q_label_shards(
    labels: np.ndarray, num_clients: int, q: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """FLAME's "#label = q" split (FLAME, Sec. VI-A) of ``labels`` into ``num_clients`` shares.

    Each class (positions in ascending order) is cut into ``ceil(q*m/C)`` contiguous shards; for
    each client in turn the shard list is shuffled and the first ``q`` shards are taken. A client
    may draw two shards of one class, so ``q`` bounds its number of labels; leftover shards stay
    unassigned. The paper gives each client "2-6 shards randomly"; the shard details follow the
    authors' code.
    """
    classes = np.unique(labels)
    check_classes_per_client(q, len(classes))
    per_class = math.ceil(q * num_clients / len(classes))
    pool: list[np.ndarray] = []
    for label in classes:
        positions = np.flatnonzero(labels == label)
        if len(positions) < per_class:
            raise ValueError(
                f"class {label} has {len(positions)} samples, fewer than the {per_class} shards "
                f"per class that q={q} with {num_clients} clients needs"
            )
        pool.extend(np.array_split(positions, per_class))
    shares = []
    for _ in range(num_clients):
        pool = [pool[i] for i in rng.permutation(len(pool))]
        shares.append(np.concatenate(pool[:q]))
        pool = pool[q:]
    return shares


@PARTITIONERS.register("q_label_skew")
class QLabelSkewPartitioner(IndexPartitioner):
    """FLAME quantity-based label imbalance "#label = q" (Sec. VI-A):
    [`q_label_shards`][pflower.datasets.partitioners.label_skew.q_label_shards]."""

    def __init__(self, num_partitions: int, seed: int, q: int = 2) -> None:
        super().__init__(num_partitions, seed)
        check_count("q", q)
        self._q = q

    def _partition(
        self, labels: np.ndarray, groups: np.ndarray | None, rng: np.random.Generator
    ) -> Sequence[np.ndarray]:
        return q_label_shards(labels, self.num_partitions, self._q, rng)


@PARTITIONERS.register("dir_label_skew")
def dir_label_skew(
    num_partitions: int, seed: int, beta: float = 0.5, disjoint: bool = True, min_size: int = 10
) -> DirichletLabelPartitioner:
    """FLAME distribution-based label imbalance "Dir(beta)" (FLAME paper, Sec. VI-A).

    ``disjoint: true`` (pflower's default, NIID-Bench practice, so that no sample is in two
    clients' data): each class is permuted and cut at cumulative Dir(beta) proportions.
    ``disjoint: false`` (FLAME's code): client ``i`` independently draws ``int(p_i * n_k)``
    samples of class ``k`` without replacement, so clients may share samples (the federation
    builder then reserves every held-out sample before the scheme runs, see
    [`pflower.datasets.federation`][pflower.datasets.federation]). Both redraw until every client
    has ``min_size`` samples
    (pflower's choice, as NIID-Bench; FLAME's code has no minimum).
    """
    check_concentration("beta", beta)
    return DirichletLabelPartitioner(num_partitions, seed, beta, min_size, False, disjoint)


class DirichletLabelPartitioner(DisjointOption, IndexPartitioner):
    """Per-class Dir(concentration) proportions over clients, the NIID-Bench/PFLlib variant.

    For each class (in label order) its proportions over clients are drawn; with ``balance``
    (PFLlib) a client already holding at least ``N/K`` samples gets proportion zero and the rest
    are renormalized. ``disjoint``: the class's shuffled samples are cut at the cumulative
    proportions; otherwise every client draws ``int(p_i * n_k)`` of them independently. Everything
    is redrawn until every client holds ``min_size`` samples, at most
    [`MAX_DRAWS`][pflower.datasets.partitioners.label_skew.MAX_DRAWS] times.
    """

    def __init__(
        self,
        num_partitions: int,
        seed: int,
        concentration: float,
        min_size: int,
        balance: bool,
        disjoint: bool,
    ) -> None:
        super().__init__(num_partitions, seed)
        check_count("min_size", min_size, minimum=0)
        self._concentration, self._min_size = concentration, min_size
        self._balance, self._disjoint = balance, disjoint

    def _partition(
        self, labels: np.ndarray, groups: np.ndarray | None, rng: np.random.Generator
    ) -> Sequence[np.ndarray]:
        by_class = [rng.permutation(np.flatnonzero(labels == label)) for label in np.unique(labels)]
        smallest = 0
        for _ in range(MAX_DRAWS):
            counts = self._draw_counts([len(positions) for positions in by_class], rng)
            smallest = int(counts.sum(axis=1).min())
            if smallest >= self._min_size:
                return self._deal(by_class, counts, rng)
        raise ValueError(
            f"no allocation in {MAX_DRAWS} draws gave every client min_size={self._min_size} "
            f"samples (the last smallest client had {smallest}); lower the minimum, raise the "
            "Dirichlet concentration or use fewer clients"
        )

    def _draw_counts(self, class_sizes: list[int], rng: np.random.Generator) -> np.ndarray:
        k = self.num_partitions
        counts = np.zeros((k, len(class_sizes)), dtype=np.int64)
        average = sum(class_sizes) / k
        for column, size in enumerate(class_sizes):
            proportions = rng.dirichlet(np.full(k, self._concentration))
            if self._balance and (open_ := counts.sum(axis=1) < average).any():
                proportions = np.where(open_, proportions, 0.0)
                total = proportions.sum()
                proportions = proportions / total if total > 0 else open_ / open_.sum()
            if self._disjoint:
                cuts = (np.cumsum(proportions)[:-1] * size).astype(np.int64)
                counts[:, column] = np.diff(np.concatenate([[0], cuts, [size]]))
            else:
                counts[:, column] = (proportions * size).astype(np.int64)
        return counts

    def _deal(
        self, by_class: list[np.ndarray], counts: np.ndarray, rng: np.random.Generator
    ) -> list[np.ndarray]:
        parts: list[list[np.ndarray]] = [[] for _ in range(self.num_partitions)]
        for column, positions in enumerate(by_class):
            bounds = np.concatenate([[0], np.cumsum(counts[:, column])])
            for client, count in enumerate(counts[:, column]):
                parts[client].append(
                    positions[bounds[client] : bounds[client + 1]]
                    if self._disjoint
                    else rng.choice(positions, count, replace=False)
                )
        return [np.concatenate(part) for part in parts]


@PARTITIONERS.register("pflib_pathological")
class PflibPathologicalPartitioner(IndexPartitioner):
    """PFLlib's pathological split with ``balance=False``, as used by FedALA.

    FedALA ("Experimental Setup") gives 2/2/10 classes of MNIST/CIFAR-10/CIFAR-100 to each client,
    with disjoint samples; the algorithm below is that of PFLlib, the authors' library.

    Every client has a budget of ``classes_per_client`` classes. Classes are visited in order;
    class ``l`` goes to the first ``int(K*c/L)`` clients (at least one) that still have budget, in
    id order, which is why clients end up in groups sharing the same classes. The class's
    samples, in pool order, are cut into consecutive blocks: every holder but the last gets a
    random size in ``[max(per/10, least_samples/L), per)`` with ``per = n_l / holders``; the last
    holder gets the rest. Classes left without a holder are dropped (logged).

    Written from a description of PFLlib's algorithm, not from its (GPL) code. Deviation: the
    lower bound of a random size is at least one sample and a size falls back to ``floor(per)``
    when the range is empty, where PFLlib would draw zero-size blocks or fail.
    """

    def __init__(
        self, num_partitions: int, seed: int, classes_per_client: int = 2, least_samples: int = 40
    ) -> None:
        super().__init__(num_partitions, seed)
        check_count("classes_per_client", classes_per_client)
        check_count("least_samples", least_samples, minimum=0)
        self._classes_per_client = classes_per_client
        self._least_samples = least_samples

    def _partition(
        self, labels: np.ndarray, groups: np.ndarray | None, rng: np.random.Generator
    ) -> Sequence[np.ndarray]:
        classes = np.unique(labels)
        check_classes_per_client(self._classes_per_client, len(classes))
        k = self.num_partitions
        budget = np.full(k, self._classes_per_client)
        holders_per_class = max(1, int(k * self._classes_per_client / len(classes)))
        parts: list[list[np.ndarray]] = [[] for _ in range(k)]
        for label in classes:
            holders = np.flatnonzero(budget > 0)[:holders_per_class]
            if not len(holders):
                LOGGER.info("pflib_pathological: class %s has no holder and is dropped", label)
                continue
            positions = np.flatnonzero(labels == label)
            sizes = self._block_sizes(len(positions), len(holders), len(classes), rng)
            blocks = np.split(positions, np.cumsum(sizes)[:-1])
            for client, block in zip(holders, blocks, strict=True):
                parts[client].append(block)
            budget[holders] -= 1
        return [np.concatenate(part) if part else np.zeros(0, np.int64) for part in parts]

    def _block_sizes(
        self, count: int, holders: int, num_classes: int, rng: np.random.Generator
    ) -> np.ndarray:
        per = count / holders
        low = max(1, int(max(per / 10, self._least_samples / num_classes)))
        high = int(per)
        sizes = rng.integers(low, high, holders - 1) if high > low else np.full(holders - 1, high)
        return np.append(sizes, count - sizes.sum())


@PARTITIONERS.register("pflib_practical")
def pflib_practical(
    num_partitions: int, seed: int, beta: float = 0.1, least_samples: int = 40
) -> DirichletLabelPartitioner:
    """PFLlib's practical Dir(beta) split, as used by FedALA ("Experimental Setup", beta = 0.1).

    Per class, proportions ~ Dir(beta); a client already holding at least ``N/K`` samples gets
    proportion zero (balancing); the class's shuffled samples are cut at the cumulative
    proportions; all is redrawn until every client holds ``least_samples`` (= batch / (1 - 0.75)
    = 40 with FedALA's batch size 10). Written from a description of PFLlib's algorithm, not from
    its (GPL) code. Deviation: after
    [`MAX_DRAWS`][pflower.datasets.partitioners.label_skew.MAX_DRAWS] draws the request is refused
    instead of
    looping forever.
    """
    check_concentration("beta", beta)
    return DirichletLabelPartitioner(num_partitions, seed, beta, least_samples, True, True)
