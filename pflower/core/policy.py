"""The update policy: what the server accepts from a client, and when a round has failed.

Every upload is checked before it is aggregated (:meth:`UpdatePolicy.check_arrays`): the number
of arrays and their shapes must match what the algorithm expects, and floating arrays must be
finite. A rejected upload counts as a failed client. Clients that were sent work but returned
nothing are recorded with Flower's errors. A round with no usable update, or with more failed
clients than ``failures.max_failed_fraction`` of those sent work, stops the run with an error
naming the clients and their errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.common import FitRes, NDArrays, Scalar, parameters_to_ndarrays
from flwr.server.client_proxy import ClientProxy

from pflower.config import ExperimentConfig
from pflower.core.errors import RoundFailedError
from pflower.core.roster import failure_text
from pflower.results.rundir import Recorder

UpdateCheck = Callable[[NDArrays, NDArrays], "str | None"]
"""Why an upload is unusable given the arrays expected, or None
(:meth:`pflower.core.strategy.PersonalizedStrategy.check_update`)."""


@dataclass(frozen=True)
class ClientUpdate:
    """One client's fit result, keyed by its partition id."""

    partition_id: int
    weights: NDArrays
    num_examples: int
    metrics: dict[str, Scalar]


class UpdatePolicy:
    """Validates uploads, records failed and rejected clients, and decides when a round fails.

    Parameters
    ----------
    settings:
        The run's configuration (``failures.max_failed_fraction``).
    recorder:
        Where failed and rejected clients and a failed run are recorded.
    """

    def __init__(self, settings: ExperimentConfig, recorder: Recorder) -> None:
        self.settings = settings
        self.recorder = recorder
        self.sent: dict[str, dict[str, int]] = {}
        """Per ``"{phase}-{round}"``: node id -> partition id of every client sent work."""

    def expect(self, phase: str, server_round: int, sent: dict[str, int]) -> None:
        """Remember which clients (node id -> partition id) were sent ``phase`` work."""
        self.sent[f"{phase}-{server_round}"] = sent

    @staticmethod
    def check_arrays(weights: NDArrays, expected: NDArrays, partial: bool = False) -> str | None:
        """Why an upload is unusable (wrong count/shapes, NaN/Inf), or None if it is fine.

        With ``partial`` an empty array may stand for a personal array the client keeps.
        """
        if len(weights) != len(expected):
            return f"sent {len(weights)} arrays, expected {len(expected)}"
        for index, (array, reference) in enumerate(zip(weights, expected, strict=True)):
            if partial and array.size == 0 and reference.size > 0:
                continue  # a personal array the client keeps (``partial_uploads``)
            if array.shape != reference.shape:
                return f"array {index} has shape {array.shape}, expected {reference.shape}"
            if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
                return f"array {index} contains NaN or Inf"
        return None

    def collect(
        self,
        results: list[tuple[ClientProxy, FitRes]],
        partition_of: dict[str, int],
        expected: NDArrays,
        check: UpdateCheck,
    ) -> tuple[list[ClientUpdate], dict[int, str]]:
        """Valid updates sorted by partition id, and the rejected ones with the reason."""
        updates, rejected = [], {}
        for proxy, res in results:
            pid = partition_of[proxy.cid]
            weights = parameters_to_ndarrays(res.parameters)
            problem = check(weights, expected)
            if problem:
                rejected[pid] = problem
            else:
                updates.append(ClientUpdate(pid, weights, res.num_examples, dict(res.metrics)))
        return sorted(updates, key=lambda u: u.partition_id), rejected

    def check_failures(
        self,
        server_round: int,
        phase: str,
        updates: list[ClientUpdate],
        rejected: dict[int, str],
        failures: list[Any],
    ) -> None:
        """Record the round's failed and rejected clients; stop the run if too many failed."""
        returned = {u.partition_id for u in updates} | set(rejected)
        failed = self.record_missing(server_round, phase, returned, failures)
        failed.update(rejected)
        if rejected:
            self.recorder.failures(server_round, phase, dict(rejected))
        sent = len(self.sent.get(f"{phase}-{server_round}", {}))
        problem = None
        if not updates:
            problem = f"Round {server_round}: all {sent} clients failed, nothing to aggregate.\n"
        elif len(failed) > self.settings.failures.max_failed_fraction * sent:
            problem = (
                f"Round {server_round}: {len(failed)} of {sent} clients failed, more than "
                f"failures.max_failed_fraction={self.settings.failures.max_failed_fraction}.\n"
            )
        if problem:
            self.recorder.fail(problem + _describe(failed))
            raise RoundFailedError(problem + _describe(failed))

    def record_missing(
        self, server_round: int, phase: str, returned: set[int], failures: list[Any]
    ) -> dict[int | str, str]:
        """Record clients that were sent work but returned nothing; returns them with errors.

        Flower reports a failed reply without naming its node, so an error is attributed to a
        client only when one client is missing; otherwise each gets all of the round's errors.
        """
        sent = self.sent.get(f"{phase}-{server_round}", {})
        missing = sorted(pid for pid in sent.values() if pid not in returned)
        errors = [failure_text(f) for f in failures]
        if len(missing) == 1:
            error = " | ".join(errors) or "no reply"
        else:
            error = "one of the round's errors: " + (" | ".join(errors) or "no reply")
        failed: dict[int | str, str] = dict.fromkeys(missing, error)
        if failed:
            self.recorder.failures(server_round, phase, failed)
        return failed


def _describe(failed: dict[int | str, str]) -> str:
    return "\n".join(f"  client {pid}: {error}" for pid, error in failed.items())
