"""CONTRACT (to be implemented): a dataset split among clients, as every other part sees it.

`build_federation` is the single entry point the server, the clients, the partition report and the
tests use. It must be deterministic in ``seed`` and cached per process (the simulation calls
``client_fn`` once per message, so rebuilding would dominate the round time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pflower.datasets.base import ImageDataset, ImageSplit


@dataclass(frozen=True)
class ClientSplit:
    """One client's sample indices into :attr:`Federation.pool`."""

    train: np.ndarray
    test: np.ndarray
    val: np.ndarray


@dataclass(frozen=True)
class Federation:
    """A dataset, its pool (official train followed by official test) and each client's share."""

    dataset: ImageDataset
    pool: ImageSplit
    clients: tuple[ClientSplit, ...]
    global_test: np.ndarray

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
