"""Schemes without label skew: random IID and stratified IID.

- ``iid``: FLIU's IID environment (FLIU paper, Sec. IV-A1; FLAME's paper has no IID setting, so
  there it serves tests) — shuffle, then cut into ``K`` nearly equal contiguous parts (Flower
  Datasets' `IidPartitioner` on a seeded shuffle of the rows).
- ``stratified_iid``: FedMPR's low shift (FedMPR, Sec. V-A; more clients in Fig. 8c; the mutually
  inclusive CelebA-Gender of Sec. V-B) — every class split into ``K`` equal disjoint parts; class
  counts per client differ by at most one, and so do sizes.
"""

from __future__ import annotations

import datasets
import numpy as np
from flwr_datasets.partitioner import IidPartitioner

from pflower.datasets.partitioners.allocation import CappedCountMatrixPartitioner
from pflower.datasets.partitioners.base import PARTITIONERS, check_num_partitions


class ShuffledIidPartitioner(IidPartitioner):
    """`IidPartitioner` on the rows shuffled with ``seed`` (it alone cuts in row order)."""

    def __init__(self, num_partitions: int, seed: int) -> None:
        check_num_partitions(num_partitions)
        super().__init__(num_partitions)
        self._seed = seed
        self._shuffled: datasets.Dataset | None = None

    def load_partition(self, partition_id: int) -> datasets.Dataset:
        """Client ``partition_id``'s contiguous block of the shuffled rows."""
        if self.dataset.num_rows < self.num_partitions:
            raise ValueError(
                f"{self.num_partitions} clients but only {self.dataset.num_rows} samples: "
                f"use at most {self.dataset.num_rows} clients"
            )
        if self._shuffled is None:
            self._shuffled = self.dataset.shuffle(seed=self._seed)
        return self._shuffled.shard(self.num_partitions, partition_id, contiguous=True)


@PARTITIONERS.register("iid")
def iid(num_partitions: int, seed: int) -> ShuffledIidPartitioner:
    """Random equal split (FLIU paper, Sec. IV-A1): sizes differ by at most one sample."""
    return ShuffledIidPartitioner(num_partitions, seed)


@PARTITIONERS.register("stratified_iid")
class StratifiedIidPartitioner(CappedCountMatrixPartitioner):
    """Each class split evenly over all clients (FedMPR's low shift, Sec. V-A).

    Args:
        samples_per_class: if set, each client keeps at most this many samples of each class
            (FedMPR's Fig. 8a sweep over samples per client); the rest stay unassigned.
    """

    def _allocation(self, class_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        share = self._capped(class_counts / self.num_partitions)
        return np.tile(share, (self.num_partitions, 1))
