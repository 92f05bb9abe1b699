"""The recorder of stages and bytes: what each round sent and measured, written as run rows.

- ``bytes_down``: the array bytes of each client's fit instruction, counted when it is sent and
  added to the client's stage-L2 row (``bytes_up`` is counted by the client);
- which clients measure stage L2 in an evaluation round (``eval.l2_clients``);
- the per-client rows of stages L2 (fit results), L1 and U (evaluate results), the row of stage
  G (the global model, scored on the server) and the size of a server-side client-model store.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO
from typing import Any

from flwr.common import FitIns, Scalar, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.client_proxy import ClientProxy

from pflower.core.client import MEASURE_L2
from pflower.core.policy import ClientUpdate
from pflower.core.store import ClientModelStore
from pflower.core.training import payload_bytes
from pflower.results.rows import L1, L2, Row, U, client_row
from pflower.results.rundir import Recorder


class StageLedger:
    """Counts the bytes each client is sent and writes the per-client stage rows of a round.

    Parameters
    ----------
    recorder:
        Where the rows go (the run directory, or nowhere).
    excluded:
        Partition ids never scored at L1/L2 (the Byzantine clients of ``attack``).
    unseen:
        Partition ids held out of training, scored as stage U (``eval.unseen_fraction``).
    """

    def __init__(self, recorder: Recorder, excluded: frozenset[int], unseen: frozenset[int]):
        self.recorder = recorder
        self.excluded = excluded
        self.unseen = unseen
        self.bytes_down: dict[tuple[int, int], int] = {}
        """(round, partition id) -> array bytes of the client's fit instruction."""
        self.measure_l2: dict[int, set[int] | None] = {}
        """Per evaluation round: the partitions told to measure stage L2 (None: all)."""

    # ------------------------------------------------------------------------- fit phase
    def count_bytes_down(
        self, server_round: int, instructions: list[tuple[ClientProxy, FitIns]], pids: list[int]
    ) -> None:
        """Remember the array bytes each client's fit instruction carries (``bytes_down``);
        ``pids`` are the instructions' partition ids."""
        sizes: dict[int, int] = {}
        for (_, ins), pid in zip(instructions, pids, strict=True):
            if id(ins.parameters) not in sizes:
                sizes[id(ins.parameters)] = payload_bytes(parameters_to_ndarrays(ins.parameters))
            self.bytes_down[(server_round, pid)] = sizes[id(ins.parameters)]

    @staticmethod
    def with_l2_flag(
        config: dict[str, Scalar], partition_id: int, measured: set[int] | None
    ) -> dict[str, Scalar]:
        """``config`` plus ``measure-l2: false`` for a client that does not measure stage L2."""
        if measured is None or partition_id in measured:
            return config
        return {**config, MEASURE_L2: False}

    def record_l2(self, server_round: int, updates: Iterable[ClientUpdate]) -> None:
        """Stage L2 rows of the round's accepted updates (with ``bytes_down``), for the clients
        that measured it."""
        measured = self.measure_l2.pop(server_round, None)
        self.recorder.client_stage(
            server_round,
            L2,
            [
                client_row(
                    server_round,
                    L2,
                    u.partition_id,
                    {**u.metrics, **self._bytes_down_metric(server_round, u.partition_id)},
                )
                for u in updates
                if u.partition_id not in self.excluded
                and (measured is None or u.partition_id in measured)
            ],
        )

    def forget(self, server_round: int) -> None:
        """Drop the byte counts of ``server_round`` and earlier (their rows are written)."""
        for key in [key for key in self.bytes_down if key[0] <= server_round]:
            del self.bytes_down[key]

    def _bytes_down_metric(self, server_round: int, partition_id: int) -> dict[str, Scalar]:
        """``bytes_down``: array bytes sent to the client with its fit instruction this round."""
        sent = self.bytes_down.get((server_round, partition_id))
        return {} if sent is None else {"bytes_down": sent}

    def record_store(self, server_round: int, store: ClientModelStore) -> None:
        """Log and record the size of the server's client-model store."""
        size = store.nbytes
        log(
            INFO,
            "round %s: client model store holds %s models, %s bytes",
            server_round,
            len(store),
            size,
        )
        self.recorder.server_state(
            server_round, {"client_store_models": len(store), "client_store_bytes": size}
        )

    # -------------------------------------------------------------------- evaluate phase
    def record_global(
        self, server_round: int, metrics: dict[str, float], label: str | None
    ) -> tuple[float, dict[str, Scalar]]:
        """Stage G's row (with ``model``: ``label`` when the scored model is not a trained global
        model); returns Flower's ``evaluate`` result (loss, metrics)."""
        row: dict[str, Any] = dict(metrics) if label is None else {**metrics, "model": label}
        self.recorder.global_stage(server_round, row)
        return row["loss"], dict(row)

    def record_l1(
        self, server_round: int, results: Iterable[tuple[int, dict[str, Scalar]]]
    ) -> list[Row]:
        """Stage L1 rows (and U rows of held-out clients) from the evaluate metrics of each
        (partition id, metrics) pair; returns the L1 rows."""
        rows = sorted(
            (client_row(server_round, L1, pid, metrics) for pid, metrics in results),
            key=lambda r: r["client"],
        )
        unseen = [{**r, "stage": U} for r in rows if r["client"] in self.unseen]
        rows = [r for r in rows if r["client"] not in self.unseen]
        self.recorder.client_stage(server_round, L1, rows)
        if unseen:
            self.recorder.client_stage(server_round, U, unseen)
        return rows
