"""Typed access to a client's memory across rounds (Flower's ``context.state``).

Flower re-creates a NumPyClient for every message; what a personalized client must remember (its
local model, a mixing weight, a control variate...) lives in ``context.state``, a RecordDict that
persists per node for the whole run, in simulation and on a SuperNode alike. All algorithms go
through this one helper so that the storage layout is uniform and inspectable.
"""

from __future__ import annotations

from typing import cast

from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.common import NDArrays

Scalar = bool | int | float | str


class ClientState:
    """Named arrays and scalar records stored in a client's ``context.state``."""

    def __init__(self, records: RecordDict) -> None:
        self._records = records

    def has(self, key: str) -> bool:
        """Whether anything is stored under ``key``."""
        return key in self._records

    def get_arrays(self, key: str) -> NDArrays | None:
        """The arrays stored under ``key``, or None if nothing was stored yet."""
        if key not in self._records:
            return None
        record = self._records[key]
        if not isinstance(record, ArrayRecord):
            raise TypeError(f"state '{key}' holds {type(record).__name__}, not arrays")
        return record.to_numpy_ndarrays()

    def put_arrays(self, key: str, arrays: NDArrays) -> None:
        """Store ``arrays`` under ``key``, replacing what was there."""
        self._records[key] = ArrayRecord(list(arrays))

    def get_scalars(self, key: str) -> dict[str, Scalar]:
        """The scalars stored under ``key`` (empty if nothing was stored yet)."""
        if key not in self._records:
            return {}
        record = self._records[key]
        if not isinstance(record, ConfigRecord):
            raise TypeError(f"state '{key}' holds {type(record).__name__}, not scalars")
        return {name: cast(Scalar, value) for name, value in record.items()}

    def put_scalars(self, key: str, values: dict[str, Scalar]) -> None:
        """Store ``values`` under ``key``, replacing what was there."""
        self._records[key] = ConfigRecord(dict(values))
