"""PersonalizedStrategy: the server half every algorithm derives from.

It keeps Flower's FedAvg machinery (``Strategy`` hooks, parameters, legacy server loop) and adds
what a personalized-FL experiment needs:

- clients are known by the ``partition_id`` they report, never by node id, and sampled with a
  seeded generator, so a run is reproducible and per-client memory survives node restarts;
- per-client fit and evaluate instructions (:meth:`fit_config`, :meth:`client_parameters`);
- a failure policy: failed clients are recorded; a round with too many failures, or none that
  succeeded, stops the run with an error naming the clients and their exceptions;
- updates with NaN/Inf or wrong shapes are rejected as failures;
- stage G (the global model on the global test set, server side) and the recording of stages L1
  and L2 per client.

Algorithms override :meth:`aggregate` (the model update) and the per-client hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar, Generic

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetPropertiesIns,
    NDArrays,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from pflower.config import ExperimentConfig
from pflower.core.options import Aggregation, OptionsT
from pflower.results.rundir import L1, L2, Recorder, client_row

GlobalEvaluator = Callable[[NDArrays], dict[str, float]]
"""Evaluates a global model on the global test set; returns ``{"acc": ..., "loss": ...}``."""


class RoundFailedError(RuntimeError):
    """Too many clients of a round failed: the run stops rather than continue on too little."""


class Phase(IntEnum):
    """What a random stream is used for; each phase has its own stream per round."""

    FIT_SAMPLING = 1
    EVALUATE_SAMPLING = 2


def round_rng(seed: int, phase: Phase, server_round: int) -> np.random.Generator:
    """The random stream of ``phase`` in ``server_round``.

    Every (seed, phase, round) has its own stream, independent of every other, so changing how
    often clients are evaluated never changes which clients train, and a resumed run draws exactly
    what the uninterrupted run drew.
    """
    return np.random.default_rng([seed, int(phase), server_round])


@dataclass(frozen=True)
class ClientUpdate:
    """One client's fit result, keyed by its partition id."""

    partition_id: int
    weights: NDArrays
    num_examples: int
    metrics: dict[str, Scalar]


class PersonalizedStrategy(FedAvg, Generic[OptionsT]):
    """Flower FedAvg machinery plus the personalized-FL protocol (see module docstring)."""

    has_global_model: ClassVar[bool] = True
    """Whether the algorithm keeps a global model (evaluated at stage G)."""

    def __init__(
        self,
        options: OptionsT,
        settings: ExperimentConfig,
        initial_weights: NDArrays,
        evaluate_global: GlobalEvaluator | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        super().__init__(
            fraction_fit=settings.fraction,
            fraction_evaluate=settings.eval.fraction,
            min_fit_clients=settings.min_clients,
            min_evaluate_clients=settings.min_clients,
            min_available_clients=settings.num_clients,
            initial_parameters=ndarrays_to_parameters(initial_weights),
            accept_failures=True,
        )
        self.options = options
        self.settings = settings
        self.evaluate_global = evaluate_global
        self.recorder = recorder or Recorder()
        self._partition_of: dict[str, int] = {}
        self._num_train: dict[int, int] = {}
        self._sent: dict[str, dict[str, int]] = {}
        self._global_weights: NDArrays = list(initial_weights)

    # ------------------------------------------------------------------ hooks for algorithms
    def fit_config(self, server_round: int, partition_id: int) -> dict[str, Scalar]:
        """The config sent with client ``partition_id``'s fit instruction."""
        return {"server-round": server_round}

    def evaluate_config(self, server_round: int, partition_id: int) -> dict[str, Scalar]:
        """The config sent with client ``partition_id``'s evaluate instruction (stage L1)."""
        return {"server-round": server_round}

    def client_parameters(
        self, server_round: int, partition_id: int, global_parameters: Parameters
    ) -> Parameters:
        """The model sent to client ``partition_id`` (default: the global model)."""
        return global_parameters

    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        """The new global model from this round's updates (default: FedAvg)."""
        return self.average(updates)

    # --------------------------------------------------------------------- shared helpers
    def average(self, updates: Sequence[ClientUpdate]) -> NDArrays:
        """Mean of the updates' weights: sample-weighted or uniform (``options.aggregation``)."""
        if self.options.aggregation == Aggregation.uniform:
            weights = np.ones(len(updates))
        else:
            weights = np.array([u.num_examples for u in updates], dtype=np.float64)
        return weighted_mean([u.weights for u in updates], weights)

    @property
    def global_weights(self) -> NDArrays:
        """The current global model (after the last aggregation; Θ^0 before round 1)."""
        return list(self._global_weights)

    @property
    def client_sizes(self) -> dict[int, int]:
        """Training-set size of every connected client, by partition id (asked once per node)."""
        return dict(self._num_train)

    # -------------------------------------------------------------- Flower Strategy hooks
    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        proxies = self._sample(
            client_manager,
            self.settings.fraction,
            round_rng(self.settings.seed, Phase.FIT_SAMPLING, server_round),
        )
        self._sent[f"fit-{server_round}"] = {p.cid: self._partition_of[p.cid] for p in proxies}
        return [
            (
                proxy,
                FitIns(
                    self.client_parameters(server_round, self._partition_of[proxy.cid], parameters),
                    self.fit_config(server_round, self._partition_of[proxy.cid]),
                ),
            )
            for proxy in proxies
        ]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        current = self._global_weights
        updates, rejected = self._collect_updates(results, current)
        self._check_failures(server_round, "fit", updates, rejected, failures)
        if self.settings.is_eval_round(server_round):
            self.recorder.client_stage(
                server_round,
                L2,
                [client_row(server_round, L2, u.partition_id, u.metrics) for u in updates],
            )
        new_weights = self.aggregate(server_round, updates, current)
        self._global_weights = new_weights
        self.recorder.fit_done(server_round)
        return ndarrays_to_parameters(new_weights), {}

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        """Stage G: the global model on the global test set (server side)."""
        if not self.has_global_model or self.evaluate_global is None:
            return None
        if server_round > 0 and not self.settings.is_eval_round(server_round):
            return None
        metrics = self.evaluate_global(parameters_to_ndarrays(parameters))
        self.recorder.global_stage(server_round, metrics)
        return metrics["loss"], dict(metrics)

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        if not self.settings.is_eval_round(server_round):
            return []
        proxies = self._sample(
            client_manager,
            self.settings.eval.fraction,
            round_rng(self.settings.seed, Phase.EVALUATE_SAMPLING, server_round),
        )
        self._sent[f"evaluate-{server_round}"] = {p.cid: self._partition_of[p.cid] for p in proxies}
        return [
            (
                proxy,
                EvaluateIns(
                    self.client_parameters(server_round, self._partition_of[proxy.cid], parameters),
                    self.evaluate_config(server_round, self._partition_of[proxy.cid]),
                ),
            )
            for proxy in proxies
        ]

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        rows = [
            client_row(server_round, L1, self._partition_of[proxy.cid], res.metrics)
            for proxy, res in results
        ]
        returned = {self._partition_of[proxy.cid] for proxy, _ in results}
        self._record_missing(server_round, "evaluate", returned, failures)
        self.recorder.client_stage(server_round, L1, sorted(rows, key=lambda r: r["client"]))
        self.recorder.round_done(server_round)
        if server_round == self.settings.rounds:
            self.recorder.finish()
        if not rows:
            return None, {}
        return float(np.mean([r["loss_local"] for r in rows])), {}

    # ------------------------------------------------------------------------- internals
    def _learn_partitions(self, client_manager: ClientManager) -> None:
        """Ask newly connected nodes, all at once, which partition they hold (once per node).

        A node that cannot answer in time is left out until it can; it is recorded as a failure.
        """
        new = [p for cid, p in client_manager.all().items() if cid not in self._partition_of]
        if not new:
            return

        def ask(proxy: ClientProxy) -> dict[str, Scalar]:
            ins = GetPropertiesIns({})
            timeout = self.settings.round_timeout
            return proxy.get_properties(ins, timeout=timeout, group_id=0).properties

        with ThreadPoolExecutor(max_workers=min(32, len(new))) as pool:
            futures = {proxy.cid: pool.submit(ask, proxy) for proxy in new}
        for cid, future in futures.items():
            error = future.exception()
            if error is not None:  # a broken node must not stop the others
                self.recorder.failures(0, "connect", {f"node {cid}": _failure_text(error)})
                continue
            properties = future.result()
            partition_id = int(properties["partition_id"])
            self._partition_of[cid] = partition_id
            self._num_train[partition_id] = int(properties["num_train"])

    def _sample(
        self, client_manager: ClientManager, fraction: float, rng: np.random.Generator
    ) -> list[ClientProxy]:
        """A seeded sample of connected clients, chosen by partition id (not by node id).

        Before the first round the server waits for all ``num_clients`` nodes. Before later rounds
        it gives nodes that left up to ``round_timeout`` (else 10 minutes) to reconnect, then goes
        on with the connected ones, as long as at least ``min_clients`` of them answer.
        """
        if not self._partition_of:
            client_manager.wait_for(self.min_available_clients)
        else:
            client_manager.wait_for(self.min_available_clients, timeout=self._rejoin_timeout)
        self._learn_partitions(client_manager)
        proxies = sorted(
            (p for p in client_manager.all().values() if p.cid in self._partition_of),
            key=lambda p: self._partition_of[p.cid],
        )
        if len(proxies) < self.settings.min_clients:
            message = (
                f"only {len(proxies)} client(s) reachable, fewer than min_clients="
                f"{self.settings.min_clients}; nothing can be trained"
            )
            self.recorder.fail(message)
            raise RoundFailedError(message)
        count = max(int(len(proxies) * fraction), min(self.min_fit_clients, len(proxies)))
        if count >= len(proxies):
            return proxies
        chosen = rng.choice(len(proxies), size=count, replace=False)
        return [proxies[i] for i in sorted(chosen)]

    @property
    def _rejoin_timeout(self) -> int:
        """Seconds a round waits for missing nodes to reconnect: the round timeout, else 600."""
        timeout = self.settings.round_timeout
        return int(timeout) if timeout else 600

    def _collect_updates(
        self, results: list[tuple[ClientProxy, FitRes]], current: NDArrays
    ) -> tuple[list[ClientUpdate], dict[int, str]]:
        """Valid updates sorted by partition id, and the rejected ones with the reason."""
        updates, rejected = [], {}
        for proxy, res in results:
            pid = self._partition_of[proxy.cid]
            weights = parameters_to_ndarrays(res.parameters)
            problem = self.check_update(weights, current)
            if problem:
                rejected[pid] = problem
            else:
                updates.append(ClientUpdate(pid, weights, res.num_examples, dict(res.metrics)))
        return sorted(updates, key=lambda u: u.partition_id), rejected

    def check_update(self, weights: NDArrays, current: NDArrays) -> str | None:
        """Why an uploaded model is unusable (wrong count/shapes, NaN/Inf), or None if fine."""
        if len(weights) != len(current):
            return f"sent {len(weights)} arrays, expected {len(current)}"
        for index, (array, reference) in enumerate(zip(weights, current, strict=True)):
            if array.shape != reference.shape:
                return f"array {index} has shape {array.shape}, expected {reference.shape}"
            if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
                return f"array {index} contains NaN or Inf"
        return None

    def _check_failures(
        self,
        server_round: int,
        phase: str,
        updates: list[ClientUpdate],
        rejected: dict[int, str],
        failures: list[Any],
    ) -> None:
        returned = {u.partition_id for u in updates} | set(rejected)
        failed = self._record_missing(server_round, phase, returned, failures)
        failed.update(rejected)
        if rejected:
            self.recorder.failures(server_round, phase, dict(rejected))
        sent = len(self._sent.get(f"{phase}-{server_round}", {}))
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

    def _record_missing(
        self, server_round: int, phase: str, returned: set[int], failures: list[Any]
    ) -> dict[int | str, str]:
        """Record clients that were sent work but returned nothing; returns them with errors.

        Flower reports a failed reply without naming its node, so an error is attributed to a
        client only when one client is missing; otherwise each gets all of the round's errors.
        """
        sent = self._sent.get(f"{phase}-{server_round}", {})
        missing = sorted(pid for pid in sent.values() if pid not in returned)
        errors = [_failure_text(f) for f in failures]
        if len(missing) == 1:
            error = " | ".join(errors) or "no reply"
        else:
            error = "one of the round's errors: " + (" | ".join(errors) or "no reply")
        failed: dict[int | str, str] = dict.fromkeys(missing, error)
        if failed:
            self.recorder.failures(server_round, phase, failed)
        return failed


def weighted_mean(arrays: Sequence[NDArrays], weights: np.ndarray) -> NDArrays:
    """Elementwise ``sum_i w_i x_i / sum_i w_i`` over lists of arrays, in float64, cast back."""
    total = float(np.sum(weights))
    if total <= 0:
        raise ValueError("aggregation weights must have a positive sum")
    averaged = []
    for layer in zip(*arrays, strict=True):
        acc = np.zeros(layer[0].shape, dtype=np.float64)
        for weight, array in zip(weights, layer, strict=True):
            acc += (weight / total) * array
        averaged.append(acc.astype(layer[0].dtype))
    return averaged


def _failure_text(failure: Any) -> str:
    if isinstance(failure, BaseException):
        return f"{type(failure).__name__}: {failure}"
    _, res = failure
    return f"status {res.status.code.name}: {res.status.message}"


def _describe(failed: dict[int | str, str]) -> str:
    return "\n".join(f"  client {pid}: {error}" for pid, error in failed.items())
