"""The server's per-client model memory, for algorithms that send every client its own model."""

from __future__ import annotations

from typing import Any, overload

import numpy as np
from flwr.common import NDArrays


class ClientModelStore:
    """The latest model each client uploaded, keyed by partition id: N models on the server.

    Server-personalized algorithms (a different model sent to every client, computed from the
    other clients' models) read it; the strategy base writes every accepted upload into it before
    `PersonalizedStrategy.aggregate` runs. It is the whole of the server's per-client model
    memory: a checkpoint of the server pickles this object, the strategy's ``client_models``
    (one of its ``checkpointed`` attributes);
    [`state`][pflower.core.store.ClientModelStore.state] /
    [`from_state`][pflower.core.store.ClientModelStore.from_state] give it as a plain dict.
    """

    def __init__(self) -> None:
        self._models: dict[int, NDArrays] = {}
        self._rounds: dict[int, int] = {}

    def put(self, partition_id: int, weights: NDArrays, server_round: int) -> None:
        """Store ``weights`` (copied) as client ``partition_id``'s latest model."""
        self._models[partition_id] = [np.array(array, copy=True) for array in weights]
        self._rounds[partition_id] = server_round

    def model(self, partition_id: int) -> NDArrays:
        """Client ``partition_id``'s latest model (a copy); ``KeyError`` if it never uploaded."""
        return [array.copy() for array in self._models[partition_id]]

    @overload
    def get(self, partition_id: int) -> NDArrays | None: ...
    @overload
    def get(self, partition_id: int, default: NDArrays) -> NDArrays: ...
    def get(self, partition_id: int, default: NDArrays | None = None) -> NDArrays | None:
        """Client ``partition_id``'s latest model (a copy), or ``default`` if it never uploaded."""
        if partition_id not in self._models:
            return default
        return [array.copy() for array in self._models[partition_id]]

    def round_of(self, partition_id: int) -> int | None:
        """The round in which client ``partition_id``'s stored model was uploaded."""
        return self._rounds.get(partition_id)

    def __contains__(self, partition_id: object) -> bool:
        return partition_id in self._models

    def __len__(self) -> int:
        return len(self._models)

    @property
    def partition_ids(self) -> list[int]:
        """The clients with a stored model, ascending."""
        return sorted(self._models)

    @property
    def nbytes(self) -> int:
        """Memory held by the stored arrays, in bytes."""
        return sum(array.nbytes for model in self._models.values() for array in model)

    def state(self) -> dict[str, Any]:
        """Everything the store holds, for a checkpoint."""
        return {"models": dict(self._models), "rounds": dict(self._rounds)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ClientModelStore:
        """The store a checkpoint's [`state`][pflower.core.store.ClientModelStore.state]
        describes."""
        store = cls()
        for partition_id, weights in state["models"].items():
            store.put(int(partition_id), weights, int(state["rounds"][partition_id]))
        return store
