"""Whole-sample integerization of real allocations, and the schemes defined by a count matrix.

FLIU's Dirichlet environments (FLIU paper, Sec. IV-A3 to IV-A5) define a real allocation
``A[k, l]`` (client ``k``, class ``l``, column sums = class sizes); the paper does not say how it
becomes sample counts. pflower uses the largest-remainder rule per column: floor every entry, then
give the samples left over one each to the largest fractional parts (ties to the lower client).
That uses every sample exactly once, but a client's total can drift from its real total by up to
``L - 1`` samples. [`round_matrix`][pflower.datasets.partitioners.allocation.round_matrix] therefore
follows it with a *controlled rounding* repair:
single samples move between clients along augmenting paths until every client's total is the
floor or ceiling of its real total too, while every entry stays the floor or ceiling of its real
value and every column sum stays exact (such a rounding always exists: Bacharach, 1966). For
FLIU's label skew this is what makes client sizes equal up to one sample, as the paper claims.

[`CountMatrixPartitioner`][pflower.datasets.partitioners.allocation.CountMatrixPartitioner] is the
base of every scheme that is fully described by such a
matrix (FLIU's PATH-balanced, LS, QS and LSQS, FedMPR's stratified IID and class groups, and the
builder's mirrored test shares): it rounds the matrix, then deals each class's shuffled samples out
in consecutive blocks.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import numpy as np

from pflower.datasets.partitioners.base import IndexPartitioner, check_count

_EPS = 1e-9
"""Tolerance for values that are integers up to floating-point error (e.g. after Sinkhorn)."""


def largest_remainder(values: np.ndarray, total: int) -> np.ndarray:
    """Integers that sum to ``total``, each the floor or ceiling of its entry of ``values``.

    ``values`` must sum to ``total`` up to less than one. Floors first; the remaining units go to
    the largest fractional parts, ties to the lower index (so the result is deterministic).
    """
    values = np.asarray(values, dtype=np.float64)
    floors = np.floor(values + _EPS)
    extra = int(total - floors.sum())
    if not 0 <= extra <= len(values):
        raise ValueError(f"cannot round {values.sum():.6f} to {total} by largest remainder")
    order = np.argsort(-(values - floors), kind="stable")
    counts = floors.astype(np.int64)
    counts[order[:extra]] += 1
    return counts


def round_matrix(real: np.ndarray) -> np.ndarray:
    """Controlled rounding of a ``clients x classes`` allocation whose column sums are integers.

    Returns integer counts with the same column sums, every entry and every row sum equal to the
    floor or ceiling of the real one.
    """
    real = np.asarray(real, dtype=np.float64)
    column_totals = np.rint(real.sum(axis=0)).astype(np.int64)
    counts = np.zeros(real.shape, dtype=np.int64)
    for column, total in enumerate(column_totals):
        counts[:, column] = largest_remainder(real[:, column], int(total))
    _repair_rows(counts, real)
    return counts


def _repair_rows(counts: np.ndarray, real: np.ndarray) -> None:
    """Move single samples along augmenting paths until every row total is rounded correctly."""
    targets = real.sum(axis=1)
    low, high = np.floor(targets + _EPS), np.ceil(targets - _EPS)
    floors, ceilings = np.floor(real + _EPS), np.ceil(real - _EPS)
    while True:
        totals = counts.sum(axis=1)
        over, under = np.flatnonzero(totals > high), np.flatnonzero(totals < low)
        if not len(over) and not len(under):
            return
        if len(over):  # push one sample from this row to any row below its real total
            sources, sinks = over[:1], totals < targets - _EPS
        else:  # pull one sample into this row from any row above its real total
            sources, sinks = np.flatnonzero(totals > targets + _EPS), np.zeros_like(totals, bool)
            sinks[under[0]] = True
        path = _augmenting_path(counts > floors, counts < ceilings, sources, sinks)
        if path is None:
            raise RuntimeError("no controlled rounding found; this is a bug, please report it")
        for giver, column, taker in path:
            counts[giver, column] -= 1
            counts[taker, column] += 1


def _augmenting_path(
    can_give: np.ndarray, can_take: np.ndarray, sources: np.ndarray, sinks: np.ndarray
) -> list[tuple[int, int, int]] | None:
    """Shortest chain of (giver row, column, taker row) moves from a source row to a sink row.

    A row can give in a column where it was rounded up (``can_give``) and take where it was
    rounded down (``can_take``), so every entry stays the floor or ceiling of its real value.
    Breadth-first over rows in index order; a row is reached from the first row of the frontier
    that can give it a sample, in that row's first such column.
    """
    rows = len(can_give)
    giver = np.full(rows, -1, dtype=np.int64)
    via = np.full(rows, -1, dtype=np.int64)
    visited = np.zeros(rows, dtype=bool)
    visited[sources] = True
    frontier: list[int] = sources.tolist()
    while frontier:
        next_frontier: list[int] = []
        for row in frontier:
            columns = np.flatnonzero(can_give[row])
            reachable = can_take[:, columns]
            takers = np.flatnonzero(reachable.any(axis=1) & ~visited)
            if not len(takers):
                continue
            visited[takers] = True
            giver[takers] = row
            via[takers] = columns[np.argmax(reachable[takers], axis=1)]
            reached = takers[sinks[takers]]
            if len(reached):
                return _unwind(giver, via, int(reached[0]))
            next_frontier.extend(takers.tolist())
        frontier = next_frontier
    return None


def _unwind(giver: np.ndarray, via: np.ndarray, sink: int) -> list[tuple[int, int, int]]:
    path, row = [], sink
    while giver[row] >= 0:
        path.append((int(giver[row]), int(via[row]), row))
        row = int(giver[row])
    return path


def deal_by_class(
    labels: np.ndarray, classes: np.ndarray, counts: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """Per client, positions of ``counts[k, j]`` samples of class ``classes[j]``, disjoint.

    Each class's positions are shuffled and handed out in consecutive blocks, client 0 first
    (pflower's rule). A class may have more samples than its column sum; the rest stay unassigned.
    """
    shares: list[list[np.ndarray]] = [[] for _ in range(counts.shape[0])]
    for column, label in enumerate(classes):
        positions = rng.permutation(np.flatnonzero(labels == label))
        if counts[:, column].sum() > len(positions):
            raise ValueError(
                f"class {label} has {len(positions)} samples, fewer than the "
                f"{int(counts[:, column].sum())} the allocation needs"
            )
        bounds = np.concatenate([[0], np.cumsum(counts[:, column])])
        for client in range(counts.shape[0]):
            shares[client].append(positions[bounds[client] : bounds[client + 1]])
    return [np.concatenate(parts) if parts else np.zeros(0, np.int64) for parts in shares]


def stratified_choice(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted positions of ``size`` random samples with the class proportions of ``labels``.

    Each class contributes the largest-remainder rounding of its share of ``size``.
    """
    classes, inverse, class_counts = np.unique(labels, return_inverse=True, return_counts=True)
    if not 0 <= size <= len(labels):
        raise ValueError(f"cannot draw {size} of {len(labels)} samples")
    keep = largest_remainder(class_counts * (size / max(len(labels), 1)), size)
    chosen = [
        rng.choice(np.flatnonzero(inverse == column), keep[column], replace=False)
        for column in range(len(classes))
    ]
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, np.int64)


class CountMatrixPartitioner(IndexPartitioner):
    """A scheme given by a real ``clients x classes`` allocation, rounded and dealt out.

    Subclasses implement `_allocation`. With ``max_draws > 1`` a random allocation is
    redrawn until every client holds at least ``min_size`` samples (pflower's small-client guard
    for FLIU's QS and LSQS, Sec. IV-A4 and IV-A5, where the paper does not say what happens to tiny
    clients); after ``max_draws`` failures the request is refused.
    """

    def __init__(
        self, num_partitions: int, seed: int, min_size: int = 0, max_draws: int = 1
    ) -> None:
        super().__init__(num_partitions, seed)
        check_count("min_size", min_size, minimum=0)
        check_count("max_draws", max_draws)
        self._min_size = min_size
        self._max_draws = max_draws

    def _partition(
        self, labels: np.ndarray, groups: np.ndarray | None, rng: np.random.Generator
    ) -> Sequence[np.ndarray]:
        if self._min_size * self.num_partitions > len(labels):
            raise ValueError(
                f"{self.num_partitions} clients of at least min_size={self._min_size} need "
                f"{self._min_size * self.num_partitions} samples, only {len(labels)} are "
                "available; lower min_size or use fewer clients"
            )
        classes, class_counts = np.unique(labels, return_counts=True)
        smallest = 0
        for _ in range(self._max_draws):
            counts = round_matrix(self._allocation(class_counts, rng))
            smallest = int(counts.sum(axis=1).min())
            if smallest >= self._min_size:
                return deal_by_class(labels, classes, counts, rng)
        raise ValueError(
            f"no allocation in {self._max_draws} draws gave every client at least "
            f"min_size={self._min_size} samples (the last smallest client had {smallest}); "
            "lower min_size, use fewer clients or a larger Dirichlet concentration"
        )

    @abstractmethod
    def _allocation(self, class_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Real ``clients x classes`` allocation whose column ``j`` sums to ``class_counts[j]``."""


class CappedCountMatrixPartitioner(CountMatrixPartitioner):
    """A count-matrix scheme whose ``samples_per_class`` option caps how many samples of each
    class a client keeps (the rest stay unassigned; null: no cap)."""

    def __init__(
        self, num_partitions: int, seed: int, samples_per_class: int | None = None
    ) -> None:
        super().__init__(num_partitions, seed)
        if samples_per_class is not None:
            check_count("samples_per_class", samples_per_class)
        self._samples_per_class = samples_per_class

    def _capped(self, counts: np.ndarray) -> np.ndarray:
        """``counts`` with every entry at most ``samples_per_class``."""
        if self._samples_per_class is None:
            return counts
        return np.minimum(counts, self._samples_per_class)
