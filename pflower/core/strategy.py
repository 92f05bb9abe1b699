"""PersonalizedStrategy: the server half every algorithm derives from.

It keeps Flower's FedAvg machinery (``Strategy`` methods, parameters, legacy server loop), the
hooks an algorithm overrides ([`aggregate`][pflower.core.strategy.PersonalizedStrategy.aggregate]
here; the per-client hooks and the class attributes an algorithm declares in its base
[`StrategyHooks`][pflower.core.hooks.StrategyHooks]), and delegates the rest of the
personalized-FL protocol to named collaborators:

- [`ModelAveraging`][pflower.core.averaging.ModelAveraging] (``averaging``): the FedAvg mean,
  sample-weighted or uniform, or the ``robust`` aggregate in its place, over partial uploads
  where the algorithm allows them;
- [`NodeRoster`][pflower.core.roster.NodeRoster] (``roster``): clients are known by the
  ``partition_id`` they report, never by node id, so per-client memory survives node restarts;
  no unbounded wait for nodes (``connect_timeout``);
- [`UpdatePolicy`][pflower.core.policy.UpdatePolicy] (``policy``): uploads with NaN/Inf or wrong
  shapes
  are rejected as failures; failed clients are recorded; a round with too many failures, or none
  that succeeded, stops the run with an error naming the clients and their exceptions;
- [`StageLedger`][pflower.core.ledger.StageLedger] (``ledger``): a communication metric in every L2
  row
  (``bytes_down``, counted here; ``bytes_up``, counted by the client) and the per-client rows of
  stages L1, L2 and U;
- [`pflower.core.sampling`][pflower.core.sampling]: clients are sampled with a seeded generator per
  (phase, round),
  so a run is reproducible; clients held out of training (``eval.unseen_fraction``) are never
  sampled to train and are evaluated in every evaluation round as stage U.

Also here: stage G (the global model on the global test set, server side); in an evaluation round,
stage L2 is measured only by the training clients that are also in the round's evaluation sample
(``eval.l2_clients=evaluated``, the default; the fit config then carries ``measure-l2: false`` for
the others) or by all (``trained``); for server-personalized algorithms
(``keeps_client_models``), a [`ClientModelStore`][pflower.core.store.ClientModelStore] of every
client's latest upload, from which
[`client_messages`][pflower.core.hooks.StrategyHooks.client_messages] computes each
sampled client's own model once per
round (its size is recorded every round as a ``server`` row).

Checkpoint state is declared ([`DeclaredState`][pflower.core.declared.DeclaredState]):
``checkpointed``
names the attributes a checkpoint saves (each class adds its own), ``derived`` those it sets that
are recomputed instead (caches); a test fails if an algorithm holds any other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from logging import WARNING
from typing import ClassVar, Generic

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    NDArrays,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from pflower.config import ExperimentConfig, RobustKind
from pflower.core.averaging import ModelAveraging
from pflower.core.declared import DeclaredState
from pflower.core.errors import NodesMissingError, RoundFailedError
from pflower.core.hooks import StrategyHooks
from pflower.core.ledger import StageLedger
from pflower.core.options import OptionsT
from pflower.core.policy import ClientUpdate, UpdatePolicy
from pflower.core.roster import SIMULATION_SETTLE_S, NodeRoster
from pflower.core.sampling import (
    ClientSampler,
    Phase,
    round_rng,
    unseen_clients,
)
from pflower.core.store import ClientModelStore
from pflower.provenance import CODE_FINGERPRINT, CODE_KEY
from pflower.results.rundir import Recorder
from pflower.robust.attacks import malicious_set

__all__ = [
    "SIMULATION_SETTLE_S",
    "ClientUpdate",
    "GlobalEvaluation",
    "GlobalEvaluator",
    "NodesMissingError",
    "PersonalizedStrategy",
    "Phase",
    "RoundFailedError",
    "round_rng",
    "unseen_clients",
]

GlobalEvaluator = Callable[[NDArrays], dict[str, float]]
"""Evaluates a global model on the global test set; returns ``{"acc": ..., "loss": ...}``."""


@dataclass(frozen=True)
class GlobalEvaluation:
    """Stage G of one round, in two steps so that the server's loop can compute it beside the
    clients' work
    ([`pflower.server.loop.CheckpointingServer`][pflower.server.loop.CheckpointingServer]):
    ``compute`` scores weights
    taken when the evaluation was made (it reads no strategy state, so it may run on another
    thread), ``record`` writes its row and returns Flower's ``evaluate`` result."""

    server_round: int
    compute: Callable[[], dict[str, float]]
    record: Callable[[dict[str, float]], tuple[float, dict[str, Scalar]]]


class PersonalizedStrategy(DeclaredState, StrategyHooks, FedAvg, Generic[OptionsT]):
    """Flower FedAvg machinery plus the personalized-FL protocol (see module docstring); what an
    algorithm declares and its per-client hooks are in
    [`StrategyHooks`][pflower.core.hooks.StrategyHooks]."""

    checkpointed: ClassVar[tuple[str, ...]] = ("_global_weights", "client_models")
    """Attributes that hold what the strategy has learned, saved by `checkpoint_state`.
    A subclass names only its own (the names of its bases are added): server state it sets in
    ``__init__`` or later (control variates, affinities, ...)."""

    def __init__(
        self,
        options: OptionsT,
        settings: ExperimentConfig,
        initial_weights: NDArrays,
        evaluate_global: GlobalEvaluator | None = None,
        recorder: Recorder | None = None,
        trainable_mask: Sequence[bool] | None = None,
        train_sizes: Sequence[int] | None = None,
    ) -> None:
        """``trainable_mask``: per array of the model (``state_dict`` order), whether it is a
        trainable parameter; ``train_sizes``: every client's training-set size, from the
        server's own copy of the federation (the ServerApp gives both; None: unknown)."""
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
        self._global_weights: NDArrays = list(initial_weights)
        self.malicious = malicious_set(settings.attack, settings.seed, settings.num_clients)
        """Partition ids of the Byzantine clients (``attack``); they are never scored."""
        self.unseen = unseen_clients(settings, self.malicious)
        """Partition ids held out of training (``eval.unseen_fraction``), scored as stage U."""
        self.roster = NodeRoster(settings, self.recorder, train_sizes)
        """Which node holds which partition; the bounded wait for nodes."""
        self.policy = UpdatePolicy(settings, self.recorder, self.roster.mark_absent)
        """What is accepted from clients; failed and rejected clients; when a round fails."""
        self.ledger = StageLedger(self.recorder, self.malicious, self.unseen)
        """Bytes sent to each client and the per-client stage rows."""
        self.sampler = ClientSampler(settings, self.unseen, self.roster.partition)
        """Each round's seeded samples of the reachable clients."""
        self.averaging = ModelAveraging(
            options.aggregation, settings.robust, len(self.malicious), self.partial_uploads
        )
        """How client models are averaged (``average``, ``robust_mean``)."""
        self.client_models = ClientModelStore()
        """Every client's latest upload (filled only if ``keeps_client_models``)."""
        self.trainable_mask: list[bool] | None = (
            None if trainable_mask is None else list(trainable_mask)
        )
        """Per array of the model (``state_dict`` order): whether it is a trainable parameter
        (False for buffers such as BatchNorm statistics); None if unknown."""
        self.message_keys: dict[str, Scalar] = {CODE_KEY: CODE_FINGERPRINT}
        """Sent with every fit and evaluate instruction: the server's code fingerprint (clients
        refuse other code, [`pflower.provenance`][pflower.provenance]) and, from the server loop,
        the run attempt, the last round checkpointed and, in a resumed run, the round it resumed
        from (see [`pflower.core.checkpoint`][pflower.core.checkpoint])."""
        idle_robust = self.idle_robust(settings)
        if idle_robust is not None and not idle_robust.refused:
            log(WARNING, "%s", idle_robust.reason)
        self.seal_configuration()  # all set above is configuration or a collaborator
        self.init_declared_state()  # the algorithm's declared server state, before round 1

    # ---------------------------------------------------------- aggregation and helpers
    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        """The new global model from this round's updates (default: FedAvg)."""
        return self.average(updates)

    def average(self, updates: Sequence[ClientUpdate]) -> NDArrays:
        """Mean of the updates' weights: sample-weighted or uniform (``options.aggregation``),
        robust with ``robust`` ([`ModelAveraging`][pflower.core.averaging.ModelAveraging])."""
        weights = self.averaging.client_weights(updates)
        if self.settings.robust.name != RobustKind.none:
            return self.robust_mean([u.weights for u in updates], weights)
        return self.averaging.mean([u.weights for u in updates], weights, self.global_weights)

    def robust_mean(self, arrays: Sequence[NDArrays], weights: np.ndarray) -> NDArrays:
        """The ``robust`` aggregate of client models
        ([`robust_mean`][pflower.core.averaging.ModelAveraging.robust_mean]), clipping for
        ``norm_clip`` from the current global model; Multi-Krum assumes f = the number of
        malicious clients of ``attack`` unless ``robust.num_malicious`` is set."""
        return self.averaging.robust_mean(arrays, weights, self._global_weights)

    @property
    def global_weights(self) -> NDArrays:
        """The current global model (after the last aggregation; Θ^0 before round 1)."""
        return list(self._global_weights)

    @property
    def client_sizes(self) -> dict[int, int]:
        """Training-set size of every connected client, by partition id (asked once per node, or
        read from the map a simulation publishes: `NodeRoster.train_sizes`)."""
        return dict(self.roster.num_train)

    def partition(self, proxy: ClientProxy) -> int:
        """The partition id of the client behind ``proxy``."""
        return self.roster.partition(proxy)

    def check_update(self, weights: NDArrays, current: NDArrays) -> str | None:
        """Why an uploaded model is unusable (wrong count/shapes, NaN/Inf), or None if fine;
        ``current`` is what [`expected_upload`][pflower.core.hooks.StrategyHooks.expected_upload]
        gives."""
        return self.policy.check_arrays(weights, current, self.partial_uploads)

    # -------------------------------------------------------------- Flower Strategy hooks
    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        trainable = self.sampler.trainable(self.roster.reachable(client_manager))
        sampled = self.sampler.draw(trainable, Phase.FIT_SAMPLING, server_round)
        proxies = self.fit_clients(server_round, sampled)
        pids = [self.partition(p) for p in proxies]
        measure_l2 = self.sampler.l2_partitions(server_round, trainable)
        if self.settings.is_eval_round(server_round):
            self.ledger.measure_l2[server_round] = measure_l2
        self.policy.expect(
            "fit", server_round, {p.cid: pid for p, pid in zip(proxies, pids, strict=True)}
        )
        messages = self.client_messages(server_round, pids, self.global_weights)
        instructions = [
            (
                proxy,
                FitIns(
                    self.client_parameters(server_round, pid, parameters)
                    if messages is None
                    else ndarrays_to_parameters(messages[pid]),
                    self.ledger.with_l2_flag(
                        {**self.fit_config(server_round, pid), **self.message_keys},
                        pid,
                        measure_l2,
                    ),
                ),
            )
            for proxy, pid in zip(proxies, pids, strict=True)
        ]
        self.ledger.count_bytes_down(server_round, instructions, pids)
        return instructions

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        current = self._global_weights
        updates, rejected = self.policy.collect(
            results,
            self.roster.partition_of,
            self.expected_upload(current),
            self.check_update,
            self.roster.num_train,
            self.text_metrics,
        )
        self.policy.check_failures(server_round, "fit", updates, rejected, failures)
        if self.settings.is_eval_round(server_round):
            self.ledger.record_l2(server_round, updates)
        if self.keeps_client_models:
            for update in updates:
                self.client_models.put(update.partition_id, update.weights, server_round)
            self.ledger.record_store(server_round, self.client_models)
        self.ledger.forget(server_round)
        new_weights = self.aggregate(server_round, updates, current)
        self._global_weights = new_weights
        self.recorder.fit_done(server_round)
        return ndarrays_to_parameters(new_weights), {}

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        """Stage G: the global model on the global test set (server side), at once."""
        evaluation = self.global_evaluation(server_round, parameters)
        return None if evaluation is None else evaluation.record(evaluation.compute())

    def global_evaluation(
        self, server_round: int, parameters: Parameters
    ) -> GlobalEvaluation | None:
        """Stage G of ``server_round`` as a
        [`GlobalEvaluation`][pflower.core.strategy.GlobalEvaluation] of the weights
        [`scored_parameters`][pflower.core.hooks.StrategyHooks.scored_parameters] gives now, or
        None when the round has no stage G (round 0 always has one)."""
        if not self.has_global_model or self.evaluate_global is None:
            return None
        if "G" not in self.settings.eval.stages:
            return None
        if server_round > 0 and not self.settings.is_eval_round(server_round):
            return None
        weights = parameters_to_ndarrays(self.scored_parameters(parameters))
        evaluate_global = self.evaluate_global
        return GlobalEvaluation(
            server_round,
            compute=lambda: evaluate_global(weights),
            record=lambda metrics: self.ledger.record_global(
                server_round, metrics, self.global_model_label
            ),
        )

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        if not self.settings.is_eval_round(server_round):
            return []
        reachable = self.roster.reachable(client_manager)
        proxies = self.sampler.evaluated(reachable, server_round, self.malicious)
        self.policy.expect("evaluate", server_round, {p.cid: self.partition(p) for p in proxies})
        parameters = self.scored_parameters(parameters)
        return [
            (
                proxy,
                EvaluateIns(
                    self.evaluate_parameters(server_round, self.partition(proxy), parameters),
                    {
                        **self.evaluate_config(server_round, self.partition(proxy)),
                        **self.message_keys,
                    },
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
        partitions = self.roster.partition_of
        accepted, returned = self.policy.screen(
            server_round, results, partitions, self.text_metrics
        )
        self.policy.record_missing(server_round, "evaluate", returned, failures)
        rows = self.ledger.record_l1(server_round, accepted)
        self.recorder.round_done(server_round)
        if server_round == self.settings.rounds:
            self.recorder.finish()
        if not rows:
            return None, {}
        return float(np.mean([r["loss_local"] for r in rows])), {}
