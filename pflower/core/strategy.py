"""PersonalizedStrategy: the server half every algorithm derives from.

It keeps Flower's FedAvg machinery (``Strategy`` methods, parameters, legacy server loop), the
hooks an algorithm overrides ([`aggregate`][pflower.core.strategy.PersonalizedStrategy.aggregate]
and the per-client hooks),
and delegates the rest of the personalized-FL protocol to named collaborators:

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
[`client_messages`][pflower.core.strategy.PersonalizedStrategy.client_messages] computes each
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
from pflower.core.aggregation import weighted_mean, weighted_mean_partial
from pflower.core.declared import DeclaredState
from pflower.core.errors import NodesMissingError, RoundFailedError
from pflower.core.ledger import StageLedger
from pflower.core.options import Aggregation, OptionsT
from pflower.core.policy import ClientUpdate, UpdatePolicy
from pflower.core.roster import SIMULATION_SETTLE_S, NodeRoster
from pflower.core.sampling import (
    ClientSampler,
    Phase,
    round_rng,
    sample_size,
    unseen_clients,
)
from pflower.core.store import ClientModelStore
from pflower.provenance import CODE_FINGERPRINT, CODE_KEY
from pflower.results.rundir import Recorder
from pflower.robust.aggregators import (
    Idle,
    clip_update_norms,
    idle,
    robust_average,
    robust_average_partial,
)
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


class PersonalizedStrategy(DeclaredState, FedAvg, Generic[OptionsT]):
    """Flower FedAvg machinery plus the personalized-FL protocol (see module docstring)."""

    has_global_model: ClassVar[bool] = True
    """Whether the algorithm keeps a global model (evaluated at stage G)."""

    keeps_client_models: ClassVar[bool] = False
    """Whether the server keeps every client's latest upload
    ([`client_models`][pflower.core.strategy.PersonalizedStrategy.client_models])."""

    global_model_label: ClassVar[str | None] = None
    """Recorded with stage G as ``model`` when what ``aggregate`` returns is not a global model
    the algorithm trains (e.g. ``mean_of_client_models`` for methods without one)."""

    partial_uploads: ClassVar[bool] = False
    """Whether clients may leave personal arrays out of a fit upload by sending an empty array
    (size 0) in their place (split models: FedPer/FedRep keep the head, FedBN the BatchNorm
    layers). [`average`][pflower.core.strategy.PersonalizedStrategy.average] then averages each
    array over the clients that sent it and keeps the
    current global array where none did."""

    robust_aggregation: ClassVar[bool] = True
    """Whether ``robust=<name>`` changes what the server computes: `aggregate` combines
    client models through `average` or `robust_mean`. An algorithm that combines
    them otherwise (per-client mixtures, prototypes, masked means) or adopts one client's model
    sets False, and composing then refuses ``robust=`` (`idle_robust`)."""

    text_metrics: ClassVar[frozenset[str]] = frozenset()
    """Metrics the algorithm's clients report as text (every other metric is a number)."""

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
        the run
        attempt, the last round checkpointed and, in a resumed run, the round it resumed from
        (see [`pflower.core.checkpoint`][pflower.core.checkpoint])."""
        idle_robust = self.idle_robust(settings)
        if idle_robust is not None and not idle_robust.refused:
            log(WARNING, "%s", idle_robust.reason)
        self.seal_configuration()  # all set above is configuration or a collaborator
        self.init_declared_state()  # the algorithm's declared server state, before round 1

    # ------------------------------------------------------------------ hooks for algorithms
    def fit_clients(self, server_round: int, sampled: list[ClientProxy]) -> list[ClientProxy]:
        """The clients that train this round, from the seeded sample (default: all of it)."""
        return sampled

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

    def evaluate_parameters(
        self, server_round: int, partition_id: int, global_parameters: Parameters
    ) -> Parameters:
        """The arrays sent with client ``partition_id``'s evaluate instruction (default: those of
        [`client_parameters`][pflower.core.strategy.PersonalizedStrategy.client_parameters]);
        algorithms that send more than a model to train override it."""
        return self.client_parameters(server_round, partition_id, global_parameters)

    def scored_parameters(self, global_parameters: Parameters) -> Parameters:
        """The model that stages G and L1 score for a round whose global model is
        ``global_parameters`` (default: that model). FedDyn sends clients a corrected model but,
        as its official code, scores the plain average of the client models."""
        return global_parameters

    def expected_upload(self, current: NDArrays) -> NDArrays:
        """Arrays with the count and shapes a fit upload must have (default: the global model's);
        algorithms that upload more than a model (e.g. control variates) extend it."""
        return current

    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        """The new global model from this round's updates (default: FedAvg)."""
        return self.average(updates)

    def client_messages(
        self, server_round: int, partition_ids: list[int], global_weights: NDArrays
    ) -> dict[int, NDArrays] | None:
        """Each sampled client's own model for this round's fit, computed once per round
        (typically from
        [`client_models`][pflower.core.strategy.PersonalizedStrategy.client_models]); None (the
        default) sends
        [`client_parameters`][pflower.core.strategy.PersonalizedStrategy.client_parameters] to
        each."""
        return None

    # --------------------------------------------------------------------- shared helpers
    def average(self, updates: Sequence[ClientUpdate]) -> NDArrays:
        """Mean of the updates' weights: sample-weighted or uniform (``options.aggregation``)."""
        if self.options.aggregation == Aggregation.uniform:
            weights = np.ones(len(updates))
        else:
            weights = np.array([u.num_examples for u in updates], dtype=np.float64)
        if self.settings.robust.name != RobustKind.none:
            return self.robust_mean([u.weights for u in updates], weights)
        if self.partial_uploads:
            return weighted_mean_partial([u.weights for u in updates], weights, self.global_weights)
        return weighted_mean([u.weights for u in updates], weights)

    def robust_mean(self, arrays: Sequence[NDArrays], weights: np.ndarray) -> NDArrays:
        """The ``robust`` aggregate (Multi-Krum, trimmed mean, median) of client models; Multi-Krum
        assumes f = the number of malicious clients of ``attack`` unless ``robust.num_malicious`` is
        set. ``norm_clip`` clips each model's update from the current global model
        ([`clip_update_norms`][pflower.robust.aggregators.clip_update_norms]) and takes the mean
        with ``weights``. Where uploads may be partial, each array is aggregated over the clients
        that sent it and the current global array kept where none did, as `average` does."""
        robust, current = self.settings.robust, self._global_weights
        if robust.name == RobustKind.norm_clip:
            clipped = clip_update_norms(arrays, current, robust.clip_factor)
            if self.partial_uploads:
                return weighted_mean_partial(clipped, weights, current)
            return weighted_mean(clipped, weights)
        attackers = len(self.malicious)
        if self.partial_uploads:
            return robust_average_partial(robust, arrays, list(weights), attackers, current)
        return robust_average(robust, arrays, list(weights), attackers)

    @classmethod
    def robust_inputs(cls, settings: ExperimentConfig) -> tuple[int, str]:
        """How many client vectors `robust_mean` gets each round, as the configuration
        fixes it (fewer when clients fail), and a phrase saying so for messages: by default the
        round's training sample."""
        trainable = settings.num_clients - settings.num_unseen
        count = sample_size(trainable, settings.fraction, settings.min_clients)
        if count == trainable:
            return count, f"the {count} clients of every round"
        return count, (
            f"the {count} clients sampled per round (fraction={settings.fraction:g} of "
            f"{trainable}, min_clients={settings.min_clients})"
        )

    @classmethod
    def idle_robust(cls, settings: ExperimentConfig) -> Idle | None:
        """Why ``robust`` cannot act on `robust_inputs` vectors a round (None if it can, or
        without ``robust``): composing refuses it, or the server logs it when it starts."""
        if settings.robust.name == RobustKind.none:
            return None
        if not cls.robust_aggregation:
            return Idle(
                f"robust={settings.robust.name} changes nothing with "
                f"strategy={settings.strategy.config_name}: it does not combine client models "
                "by a mean that a robust aggregator could replace; use robust=none",
                refused=True,
            )
        count, per_round = cls.robust_inputs(settings)
        attackers = len(malicious_set(settings.attack, settings.seed, settings.num_clients))
        return idle(settings.robust, count, attackers, per_round)

    @property
    def global_weights(self) -> NDArrays:
        """The current global model (after the last aggregation; Θ^0 before round 1)."""
        return list(self._global_weights)

    @property
    def client_sizes(self) -> dict[int, int]:
        """Training-set size of every connected client, by partition id (asked once per node)."""
        return dict(self.roster.num_train)

    def partition(self, proxy: ClientProxy) -> int:
        """The partition id of the client behind ``proxy``."""
        return self.roster.partition(proxy)

    def check_update(self, weights: NDArrays, current: NDArrays) -> str | None:
        """Why an uploaded model is unusable (wrong count/shapes, NaN/Inf), or None if fine;
        ``current`` is what
        [`expected_upload`][pflower.core.strategy.PersonalizedStrategy.expected_upload] gives."""
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
        [`scored_parameters`][pflower.core.strategy.PersonalizedStrategy.scored_parameters] gives
        now, or None when the round has no stage G (round 0
        always has one)."""
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
        proxies = self.sampler.draw(
            self.sampler.trainable(reachable), Phase.EVALUATE_SAMPLING, server_round
        )
        # Malicious clients (``attack``) are never scored; held-out ones always are (stage U).
        proxies = [p for p in proxies if self.partition(p) not in self.malicious]
        proxies += [p for p in reachable if self.partition(p) in self.unseen]
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
