"""The update policy: what the server accepts from a client, and when a round has failed.

Everything a client sends is checked before it is aggregated or recorded:

- arrays ([`UpdatePolicy.check_arrays`][pflower.core.policy.UpdatePolicy.check_arrays]): the number
  of arrays, their shapes and dtypes must
  match what the algorithm expects (so an oversized array is refused by its shape), and floating
  arrays must be finite;
- metrics ([`metric_problem`][pflower.core.policy.metric_problem]): finite numbers; accuracies in
  [0, 1], losses >= 0, counts
  non-negative integers; text only where the algorithm declares a text metric;
- the sample count: a non-negative integer no larger than the training-set size the server knows
  for the client's partition (in a simulation, from its own copy of the federation; in a
  deployment, what the node reported when it registered);
- the ``partition_id`` a client reports with its results: the partition its node registered.

A reply that fails a check is rejected: one WARNING line on the console and in ``run.log``
(client, round, reason), a ``failure`` row in ``metrics.jsonl``, and the round's summary line
counts it; a rejected fit update is not aggregated, a rejected evaluation is not recorded. A
rejected client counts as a failed one. Clients that were sent work but returned nothing are
recorded with Flower's errors. A round with no usable update, or with more failed clients than
``failures.max_failed_fraction`` of those sent work, stops the run with an error naming the
clients and their errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from logging import WARNING
from typing import Any

import numpy as np
from flwr.common import EvaluateRes, FitRes, NDArrays, Scalar, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.client_proxy import ClientProxy

from pflower.config import ExperimentConfig
from pflower.core.errors import RoundFailedError
from pflower.core.roster import failure_text
from pflower.results.rundir import Recorder

COUNT_METRICS = frozenset({"partition_id", "num_test", "bytes_up", "bytes_down"})
"""Metrics that are counts: non-negative integers."""


def metric_problem(name: str, value: object, empty_split: bool = False) -> str | None:
    """Why the metric ``name`` = ``value`` cannot be recorded, or None if it can.

    Every metric is a finite number; counts ([`COUNT_METRICS`][pflower.core.policy.COUNT_METRICS])
    are non-negative integers,
    accuracies (``acc*``) lie in [0, 1], losses (``loss*``, ``*_loss``) are >= 0. An accuracy or
    loss of an empty test split (``empty_split``: the client reported ``num_test`` 0) is NaN.
    """
    if not isinstance(value, int | float | np.integer | np.floating):
        return f"metric {name}={value!r:.40} is not a number"
    if name in COUNT_METRICS:
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            return f"metric {name}={value!r} is not a count (a non-negative integer)"
        return None
    number = float(value)
    scored = name.startswith(("acc", "loss")) or name.endswith("_loss")
    if math.isnan(number) and scored and empty_split:
        return None
    if not math.isfinite(number):
        return f"metric {name}={number} is not finite"
    if name.startswith("acc") and not 0.0 <= number <= 1.0:
        return f"metric {name}={number:.4g} is outside [0, 1]"
    if (name.startswith("loss") or name.endswith("_loss")) and number < 0.0:
        return f"metric {name}={number:.4g} is negative"
    return None


def count_problem(num_examples: object, bound: int | None) -> str | None:
    """Why a reported sample count is unusable (not a non-negative integer, or above ``bound``,
    the partition's training-set size as the server knows it), or None."""
    if isinstance(num_examples, bool) or not isinstance(num_examples, int | np.integer):
        return f"num_examples={num_examples!r:.40} is not an integer"
    if num_examples < 0:
        return f"num_examples={num_examples} is negative"
    if bound is not None and num_examples > bound:
        return f"num_examples={num_examples} exceeds the partition's {bound} training examples"
    return None


def metrics_problem(
    metrics: Mapping[str, Scalar], partition_id: int, text: frozenset[str] = frozenset()
) -> str | None:
    """Why a reply's metrics are unusable (see
    [`metric_problem`][pflower.core.policy.metric_problem]; names in ``text`` must be
    strings), or a ``partition_id`` other than the one the node registered; None if fine."""
    claimed = metrics.get("partition_id", partition_id)
    if claimed != partition_id:
        return (
            f"reports partition_id={claimed!r:.40}, but its node registered partition "
            f"{partition_id}"
        )
    empty = metrics.get("num_test") == 0
    for name, value in metrics.items():
        if name in text:
            problem = None if isinstance(value, str) else f"metric {name} is not text"
        else:
            problem = metric_problem(name, value, empty)
        if problem:
            return problem
    return None


UpdateCheck = Callable[[NDArrays, NDArrays], "str | None"]
"""Why an upload is unusable given the arrays expected, or None
([`pflower.core.strategy.PersonalizedStrategy.check_update`][pflower.core.strategy.PersonalizedStrategy.check_update])."""


@dataclass(frozen=True)
class ClientUpdate:
    """One client's fit result, keyed by its partition id."""

    partition_id: int
    weights: NDArrays
    num_examples: int
    metrics: dict[str, Scalar]

    def model_part(self, size: int) -> ClientUpdate:
        """This update with only its first ``size`` arrays: the model, for an algorithm whose
        clients upload more after it (control variates, masks)."""
        return replace(self, weights=self.weights[:size])


class UpdatePolicy:
    """Validates uploads, records failed and rejected clients, and decides when a round fails.

    Parameters
    ----------
    settings:
        The run's configuration (``failures.max_failed_fraction``).
    recorder:
        Where failed and rejected clients and a failed run are recorded.
    on_missing:
        Called with the partitions that were sent work and did not reply.
    """

    def __init__(
        self,
        settings: ExperimentConfig,
        recorder: Recorder,
        on_missing: Callable[[set[int], str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.recorder = recorder
        self.on_missing = on_missing
        """Told which partitions were sent work and did not reply (the node roster marks them
        absent)."""
        self.sent: dict[str, dict[str, int]] = {}
        """Per ``"{phase}-{round}"``: node id -> partition id of every client sent work."""

    def expect(self, phase: str, server_round: int, sent: dict[str, int]) -> None:
        """Remember which clients (node id -> partition id) were sent ``phase`` work."""
        self.sent[f"{phase}-{server_round}"] = sent

    @staticmethod
    def check_arrays(weights: NDArrays, expected: NDArrays, partial: bool = False) -> str | None:
        """Why an upload is unusable (wrong count/shapes/dtypes, NaN/Inf), or None if it is fine.

        With ``partial`` an empty array may stand for a personal array the client keeps.
        """
        if len(weights) != len(expected):
            return f"sent {len(weights)} arrays, expected {len(expected)}"
        for index, (array, reference) in enumerate(zip(weights, expected, strict=True)):
            if partial and array.size == 0 and reference.size > 0:
                continue  # a personal array the client keeps (``partial_uploads``)
            if array.shape != reference.shape:
                return f"array {index} has shape {array.shape}, expected {reference.shape}"
            if array.dtype != reference.dtype:
                return f"array {index} has dtype {array.dtype}, expected {reference.dtype}"
            if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
                return f"array {index} contains NaN or Inf"
        return None

    def collect(
        self,
        results: list[tuple[ClientProxy, FitRes]],
        partition_of: dict[str, int],
        expected: NDArrays,
        check: UpdateCheck,
        bounds: Mapping[int, int],
        text: frozenset[str] = frozenset(),
    ) -> tuple[list[ClientUpdate], dict[int, str]]:
        """Valid updates sorted by partition id, and the rejected ones with the reason.

        ``check`` judges the arrays; ``bounds`` are the training-set sizes the server knows, by
        partition id; ``text`` names the metrics that are text (see
        [`metrics_problem`][pflower.core.policy.metrics_problem]).
        """
        updates, rejected = [], {}
        for proxy, res in results:
            pid = partition_of[proxy.cid]
            weights = parameters_to_ndarrays(res.parameters)
            problem = (
                check(weights, expected)
                or count_problem(res.num_examples, bounds.get(pid))
                or metrics_problem(res.metrics, pid, text)
            )
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
        failed.update(rejected.items())
        self.reject(server_round, phase, rejected)
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

    def screen(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        partition_of: dict[str, int],
        text: frozenset[str] = frozenset(),
    ) -> tuple[list[tuple[int, dict[str, Scalar]]], set[int]]:
        """The evaluation results whose metrics pass
        [`metrics_problem`][pflower.core.policy.metrics_problem], as (partition id,
        metrics), and every partition that replied; the others are rejected (logged, recorded)."""
        accepted, rejected = [], {}
        for proxy, res in results:
            pid = partition_of[proxy.cid]
            problem = metrics_problem(res.metrics, pid, text)
            if problem:
                rejected[pid] = problem
            else:
                accepted.append((pid, dict(res.metrics)))
        self.reject(server_round, "evaluate", rejected)
        return accepted, {partition_of[proxy.cid] for proxy, _ in results}

    def reject(self, server_round: int, phase: str, rejected: dict[int, str]) -> None:
        """Log one WARNING line per rejected reply and record them (``failure`` rows)."""
        for pid, reason in rejected.items():
            log(
                WARNING,
                "round %s: rejected the %s reply of client %s: %s",
                server_round,
                phase,
                pid,
                reason,
            )
        if rejected:
            self.recorder.rejected(server_round, phase, dict(rejected))

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
            if self.on_missing is not None:
                self.on_missing(set(missing), f"no {phase} reply in round {server_round}")
        return failed


def _describe(failed: dict[int | str, str]) -> str:
    return "\n".join(f"  client {pid}: {error}" for pid, error in failed.items())
