"""Quantity-skew schemes: clients differ in how much data they hold (and possibly its labels).

===================== ========================================================================
name                  scheme (source)
===================== ========================================================================
``qs``                FLIU quantity skew: sizes ~ Dir(alpha), classes in global proportions
                      (FLIU, Sec. IV-A4)
``lsqs``              FLIU label + quantity skew: Dirichlet sizes and label mixes, Sinkhorn
                      (FLIU, Sec. IV-A5)
``dir_quantity_skew`` FLAME "Dir(beta)" quantity skew with a size floor (FLAME, Sec. VI-A)
``hybrid_skew``       FLAME hybrid: half the clients "#label = q", half quantity skew
                      (FLAME, Sec. VI-A)
===================== ========================================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pflower.datasets.partitioners.allocation import CountMatrixPartitioner, largest_remainder
from pflower.datasets.partitioners.base import (
    PARTITIONERS,
    DisjointOption,
    IndexPartitioner,
    check_concentration,
    check_count,
    require,
)
from pflower.datasets.partitioners.label_skew import q_label_shards
from pflower.datasets.partitioners.sinkhorn import sinkhorn

_TINY = 1e-12
"""Floor for client proportions, so that a Dirichlet underflow never gives a zero target."""


def _client_proportions(num_clients: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """q ~ Dir(alpha * 1_K), floored at a tiny positive value and renormalized."""
    q = np.maximum(rng.dirichlet(np.full(num_clients, alpha)), _TINY)
    return q / q.sum()


@PARTITIONERS.register("qs")
class QuantitySkewPartitioner(CountMatrixPartitioner):
    """FLIU quantity skew (Sec. IV-A4): ``A[k, l] = q_k * N_l`` with ``q ~ Dir(alpha * 1_K)``.

    Each client's classes are in global proportions while its size is about ``q_k * n``. The
    small-client guard redraws ``q`` up to ``max_draws`` times until every client holds
    ``min_size`` samples (pflower's choice: the paper does not say what happens to tiny or empty
    clients); the "at least one test sample" half of that guard is the federation builder's check
    on the test shares.
    """

    def __init__(
        self,
        num_partitions: int,
        seed: int,
        alpha: float = 1.0,
        min_size: int = 10,
        max_draws: int = 1000,
    ) -> None:
        super().__init__(num_partitions, seed, min_size, max_draws)
        check_concentration("alpha", alpha)
        self._alpha = alpha

    def _allocation(self, class_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.outer(_client_proportions(self.num_partitions, self._alpha, rng), class_counts)


@PARTITIONERS.register("lsqs")
class LabelQuantitySkewPartitioner(QuantitySkewPartitioner):
    """FLIU label + quantity skew (FLIU paper, Sec. IV-A5): quantity skew's sizes with a label
    mix of each client's own (same arguments).

    ``q ~ Dir(alpha * 1_K)`` gives the sizes and rows of ``P ~ Dir(alpha * 1_L)`` the label mixes;
    Sinkhorn-Knopp scales ``P`` to row sums ``q_k * n`` and column sums ``N_l``; both are redrawn
    until every client holds ``min_size`` samples (at most ``max_draws`` draws). The paper says
    only that both draws are Dirichlet; combining them in one Sinkhorn fit is pflower's choice.
    """

    def _allocation(self, class_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        k = self.num_partitions
        sizes = _client_proportions(k, self._alpha, rng) * class_counts.sum()
        mixes = rng.dirichlet(np.full(len(class_counts), self._alpha), size=k)
        return sinkhorn(mixes, sizes, class_counts)


def dirichlet_size_shares(
    num_samples: int,
    num_clients: int,
    beta: float,
    min_size: int,
    disjoint: bool,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """FLAME quantity skew (FLAME, Sec. VI-A): positions ``0..n-1`` shared by Dir(beta) sizes.

    ``disjoint``: the positions are permuted and cut at the sizes ``q_i * n`` (largest remainder),
    after raising every client below ``min_size`` to it by taking from the largest client.
    Otherwise (FLAME's code) client ``i`` draws ``max(min_size, int(q_i * n))`` positions of the
    whole pool independently, so clients overlap (the federation builder then reserves every
    held-out sample before the scheme runs, see
    [`pflower.datasets.federation`][pflower.datasets.federation]). The size
    floor comes from FLAME's code; the paper does not mention one.
    """
    q = rng.dirichlet(np.full(num_clients, beta))
    if not disjoint:
        require(
            num_samples >= min_size,
            f"min_size={min_size} exceeds the {num_samples} samples available",
        )
        sizes = np.maximum(min_size, (q * num_samples).astype(int))
        return [rng.choice(num_samples, size, replace=False) for size in sizes]
    if num_clients * min_size > num_samples:
        raise ValueError(
            f"{num_clients} clients of at least min_size={min_size} need "
            f"{num_clients * min_size} samples, only {num_samples} are available; "
            "lower min_size or use fewer clients"
        )
    sizes = largest_remainder(q * num_samples, num_samples)
    while (short := np.flatnonzero(sizes < min_size)).size:
        donor = int(np.argmax(sizes))
        sizes[donor] -= min_size - sizes[short[0]]
        sizes[short[0]] = min_size
    return np.split(rng.permutation(num_samples), np.cumsum(sizes)[:-1])


@PARTITIONERS.register("dir_quantity_skew")
class DirQuantitySkewPartitioner(DisjointOption, IndexPartitioner):
    """FLAME quantity skew "Dir(beta)" (FLAME, Sec. VI-A); see
    [`dirichlet_size_shares`][pflower.datasets.partitioners.quantity_skew.dirichlet_size_shares].

    ``disjoint: true`` is pflower's default, so that no sample is in two clients' data;
    ``disjoint: false`` is FLAME's code.
    """

    def __init__(
        self,
        num_partitions: int,
        seed: int,
        beta: float = 0.5,
        min_size: int = 100,
        disjoint: bool = True,
    ) -> None:
        super().__init__(num_partitions, seed)
        check_concentration("beta", beta)
        check_count("min_size", min_size)
        self._beta, self._min_size, self._disjoint = beta, min_size, disjoint

    def _partition(
        self, labels: np.ndarray, groups: np.ndarray | None, rng: np.random.Generator
    ) -> Sequence[np.ndarray]:
        return dirichlet_size_shares(
            len(labels), self.num_partitions, self._beta, self._min_size, self._disjoint, rng
        )


@PARTITIONERS.register("hybrid_skew")
class HybridSkewPartitioner(DisjointOption, IndexPartitioner):
    """FLAME hybrid skew "#label = q, Dir(beta)" (FLAME paper, Sec. VI-A: half the clients each).

    Clients ``0 .. ceil(K/2)-1`` get the "#label = q" split
    ([`q_label_shards`][pflower.datasets.partitioners.label_skew.q_label_shards]), clients
    ``ceil(K/2) .. K-1`` the Dir(beta) quantity skew
    ([`dirichlet_size_shares`][pflower.datasets.partitioners.quantity_skew.dirichlet_size_shares]).
    ``disjoint: true`` (pflower's default, so that no sample is in two clients' data) gives each
    half its own random half of the pool; ``disjoint: false`` (FLAME's code) runs both halves on
    the whole pool, so a sample can be in both halves (and, in the quantity half, in several
    clients); the federation builder then reserves every held-out sample before the scheme runs
    (see [`pflower.datasets.federation`][pflower.datasets.federation]).
    """

    def __init__(
        self,
        num_partitions: int,
        seed: int,
        q: int = 2,
        beta: float = 0.5,
        min_size: int = 100,
        disjoint: bool = True,
    ) -> None:
        super().__init__(num_partitions, seed)
        require(num_partitions >= 2, f"hybrid_skew needs at least 2 clients, got {num_partitions}")
        check_count("q", q)
        check_concentration("beta", beta)
        check_count("min_size", min_size)
        self._q, self._beta, self._min_size, self._disjoint = q, beta, min_size, disjoint

    def _partition(
        self, labels: np.ndarray, groups: np.ndarray | None, rng: np.random.Generator
    ) -> Sequence[np.ndarray]:
        label_clients = math.ceil(self.num_partitions / 2)
        if self._disjoint:
            order = rng.permutation(len(labels))
            label_half = np.sort(order[: math.ceil(len(labels) / 2)])
            size_half = np.sort(order[math.ceil(len(labels) / 2) :])
        else:
            label_half = size_half = np.arange(len(labels))
        label_shares = q_label_shards(labels[label_half], label_clients, self._q, rng)
        size_shares = dirichlet_size_shares(
            len(size_half),
            self.num_partitions - label_clients,
            self._beta,
            self._min_size,
            self._disjoint,
            rng,
        )
        return [label_half[share] for share in label_shares] + [
            size_half[share] for share in size_shares
        ]
