"""PersonalizedStrategy: the server half every algorithm derives from.

It keeps Flower's FedAvg machinery (``Strategy`` hooks, parameters, legacy server loop) and adds
what a personalized-FL experiment needs:

- clients are known by the ``partition_id`` they report, never by node id, and sampled with a
  seeded generator, so a run is reproducible and per-client memory survives node restarts;
- per-client fit and evaluate instructions (:meth:`fit_config`, :meth:`client_parameters`);
- a failure policy: failed clients are recorded; a round with too many failures, or none that
  succeeded, stops the run with an error naming the clients and their exceptions;
- updates with NaN/Inf or wrong shapes are rejected as failures;
- no unbounded wait for nodes: before round 1 the server waits at most ``connect_timeout`` for
  ``num_clients`` nodes, logging the missing partitions, then fails naming the expected and the
  connected nodes; a simulation with another number of SuperNodes is refused at once;
- a communication metric in every L2 row: ``bytes_down`` (array bytes of the client's fit
  instruction, counted here) and ``bytes_up`` (of its upload, counted by the client);
- stage G (the global model on the global test set, server side) and the recording of stages L1
  and L2 per client; in an evaluation round, stage L2 is measured only by the training clients that
  are also in the round's evaluation sample (``eval.l2_clients=evaluated``, the default; the fit
  config then carries ``measure-l2: false`` for the others) or by all (``trained``);
- clients held out of training (``eval.unseen_fraction``): never sampled to train, evaluated in
  every evaluation round through the algorithm's stage-L1 path, recorded as stage U;
- for server-personalized algorithms (``keeps_client_models``), a :class:`ClientModelStore` of
  every client's latest upload, from which :meth:`client_messages` computes each sampled client's
  own model once per round; its size is logged and recorded every round (a ``server`` row).

Algorithms override :meth:`aggregate` (the model update) and the per-client hooks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from logging import INFO, WARNING
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
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from pflower.config import ExperimentConfig, L2Clients, RobustKind
from pflower.core.aggregation import weighted_mean, weighted_mean_partial
from pflower.core.client import MEASURE_L2
from pflower.core.nodes import (
    NodeQuestions,
    ranges,
    simulated_nodes,
    simulated_partitions,
    simulation_mismatch,
)
from pflower.core.options import Aggregation, OptionsT
from pflower.core.store import ClientModelStore
from pflower.core.training import payload_bytes
from pflower.provenance import CODE_FINGERPRINT, CODE_KEY
from pflower.results.rundir import L1, L2, Recorder, U, client_row
from pflower.robust.aggregators import robust_average
from pflower.robust.attacks import malicious_set

GlobalEvaluator = Callable[[NDArrays], dict[str, float]]
"""Evaluates a global model on the global test set; returns ``{"acc": ..., "loss": ...}``."""


@dataclass(frozen=True)
class GlobalEvaluation:
    """Stage G of one round, in two steps so that the server's loop can compute it beside the
    clients' work (:class:`pflower.server.loop.CheckpointingServer`): ``compute`` scores weights
    taken when the evaluation was made (it reads no strategy state, so it may run on another
    thread), ``record`` writes its row and returns Flower's ``evaluate`` result."""

    server_round: int
    compute: Callable[[], dict[str, float]]
    record: Callable[[dict[str, float]], tuple[float, dict[str, Scalar]]]


class RoundFailedError(RuntimeError):
    """Too many clients of a round failed: the run stops rather than continue on too little."""


class NodesMissingError(RoundFailedError):
    """The run cannot start: fewer nodes than ``num_clients`` connected within
    ``connect_timeout``, or a simulation's federation has another number of SuperNodes."""


SIMULATION_SETTLE_S = 2.0
"""Seconds a simulation's node count must stay short of ``num_clients`` before the run refuses:
Flower's simulation registers all its SuperNodes at once when the run starts."""


class Phase(IntEnum):
    """What a random stream is used for; each phase has its own stream per round."""

    FIT_SAMPLING = 1
    EVALUATE_SAMPLING = 2
    HOLD_OUT = 3


def round_rng(seed: int, phase: Phase, server_round: int) -> np.random.Generator:
    """The random stream of ``phase`` in ``server_round``.

    Every (seed, phase, round) has its own stream, independent of every other, so changing how
    often clients are evaluated never changes which clients train, and a resumed run draws exactly
    what the uninterrupted run drew.
    """
    return np.random.default_rng([seed, int(phase), server_round])


def unseen_clients(settings: ExperimentConfig, malicious: frozenset[int]) -> frozenset[int]:
    """The clients ``eval.unseen_fraction`` holds out of training: ``settings.num_unseen`` of the
    benign partition ids, drawn from the run's seed in a stream of their own (round 0)."""
    count = settings.num_unseen
    if count == 0:
        return frozenset()
    benign = [pid for pid in range(settings.num_clients) if pid not in malicious]
    if count >= len(benign):
        raise ValueError(
            f"eval.unseen_fraction={settings.eval.unseen_fraction} holds out {count} clients, but "
            f"only {len(benign)} of {settings.num_clients} are benign (attack.fraction="
            f"{settings.attack.fraction}): at least one benign client must train"
        )
    rng = round_rng(settings.seed, Phase.HOLD_OUT, 0)
    return frozenset(benign[i] for i in rng.choice(len(benign), size=count, replace=False))


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

    keeps_client_models: ClassVar[bool] = False
    """Whether the server keeps every client's latest upload (:attr:`client_models`)."""

    global_model_label: ClassVar[str | None] = None
    """Recorded with stage G as ``model`` when what ``aggregate`` returns is not a global model
    the algorithm trains (e.g. ``mean_of_client_models`` for methods without one)."""

    partial_uploads: ClassVar[bool] = False
    """Whether clients may leave personal arrays out of a fit upload by sending an empty array
    (size 0) in their place (split models: FedPer/FedRep keep the head, FedBN the BatchNorm
    layers). :meth:`average` then averages each array over the clients that sent it and keeps the
    current global array where none did."""

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
        self._bytes_down: dict[tuple[int, int], int] = {}
        self._measure_l2: dict[int, set[int] | None] = {}
        """Per evaluation round: the partitions told to measure stage L2 (None: all)."""
        self._global_weights: NDArrays = list(initial_weights)
        self.malicious = malicious_set(settings.attack, settings.seed, settings.num_clients)
        """Partition ids of the Byzantine clients (``attack``); they are never scored."""
        self.unseen = unseen_clients(settings, self.malicious)
        """Partition ids held out of training (``eval.unseen_fraction``), scored as stage U."""
        self.client_models = ClientModelStore()
        """Every client's latest upload (filled only if ``keeps_client_models``)."""
        self.trainable_mask: list[bool] | None = None
        """Per array of the model (``state_dict`` order): whether it is a trainable parameter
        (False for buffers such as BatchNorm statistics); set by the ServerApp, None if unknown."""
        self.train_sizes: list[int] | None = None
        """Training-set size of every partition, from the server's own copy of the federation
        (set by the ServerApp): with it, a simulation's nodes need not be asked (see
        :meth:`_learn_partitions`)."""
        self.message_keys: dict[str, Scalar] = {CODE_KEY: CODE_FINGERPRINT}
        """Sent with every fit and evaluate instruction: the server's code fingerprint (clients
        refuse other code, :mod:`pflower.provenance`) and, from the server loop, the run
        attempt, the last round checkpointed and, in a resumed run, the round it resumed from
        (see :mod:`pflower.core.checkpoint`)."""
        self._configuration = frozenset(vars(self)) - {"_global_weights", "client_models"} | {
            "_configuration"
        }

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
        :meth:`client_parameters`); algorithms that send more than a model to train override it."""
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
        (typically from :attr:`client_models`); None (the default) sends
        :meth:`client_parameters` to each."""
        return None

    # ------------------------------------------------------------------------ checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        """What this strategy has learned so far, for a checkpoint: the global model, the
        per-client store, and every attribute an algorithm sets beyond those the base sets from
        the configuration and the connected nodes (control variates, affinities, ...)."""
        return {k: v for k, v in vars(self).items() if k not in self._configuration}

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from what :meth:`checkpoint_state` returned."""
        vars(self).update(state)

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
        assumes f = the number of malicious clients of ``attack`` unless ``robust.num_malicious``
        is set."""
        return robust_average(self.settings.robust, arrays, list(weights), len(self.malicious))

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
        trainable = self._trainable(self._reachable(client_manager))
        sampled = self._choose(
            trainable,
            self.settings.fraction,
            round_rng(self.settings.seed, Phase.FIT_SAMPLING, server_round),
        )
        proxies = self.fit_clients(server_round, sampled)
        measure_l2 = self._l2_partitions(server_round, trainable)
        self._sent[f"fit-{server_round}"] = {p.cid: self._partition_of[p.cid] for p in proxies}
        messages = self.client_messages(
            server_round, [self._partition_of[p.cid] for p in proxies], self.global_weights
        )
        instructions = [
            (
                proxy,
                FitIns(
                    self.client_parameters(server_round, self._partition_of[proxy.cid], parameters)
                    if messages is None
                    else ndarrays_to_parameters(messages[self._partition_of[proxy.cid]]),
                    self._with_l2_flag(
                        {
                            **self.fit_config(server_round, self._partition_of[proxy.cid]),
                            **self.message_keys,
                        },
                        self._partition_of[proxy.cid],
                        measure_l2,
                    ),
                ),
            )
            for proxy in proxies
        ]
        self._count_bytes_down(server_round, instructions)
        return instructions

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
            measured = self._measure_l2.pop(server_round, None)
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
                    if u.partition_id not in self.malicious
                    and (measured is None or u.partition_id in measured)
                ],
            )
        if self.keeps_client_models:
            self._store_uploads(server_round, updates)
        for key in [key for key in self._bytes_down if key[0] <= server_round]:
            del self._bytes_down[key]
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
        """Stage G of ``server_round`` as a :class:`GlobalEvaluation` of the weights
        :meth:`scored_parameters` gives now, or None when the round has no stage G (round 0
        always has one)."""
        if not self.has_global_model or self.evaluate_global is None:
            return None
        if server_round > 0 and not self.settings.is_eval_round(server_round):
            return None
        weights = parameters_to_ndarrays(self.scored_parameters(parameters))
        evaluate_global = self.evaluate_global
        return GlobalEvaluation(
            server_round,
            compute=lambda: evaluate_global(weights),
            record=lambda metrics: self._record_global(server_round, metrics),
        )

    def _record_global(
        self, server_round: int, metrics: dict[str, float]
    ) -> tuple[float, dict[str, Scalar]]:
        if self.global_model_label is not None:
            metrics = {**metrics, "model": self.global_model_label}
        self.recorder.global_stage(server_round, metrics)
        return metrics["loss"], dict(metrics)

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        if not self.settings.is_eval_round(server_round):
            return []
        reachable = self._reachable(client_manager)
        proxies = self._choose(
            self._trainable(reachable),
            self.settings.eval.fraction,
            round_rng(self.settings.seed, Phase.EVALUATE_SAMPLING, server_round),
        )
        # Malicious clients (``attack``) are never scored; held-out ones always are (stage U).
        proxies = [p for p in proxies if self._partition_of[p.cid] not in self.malicious]
        proxies += [p for p in reachable if self._partition_of[p.cid] in self.unseen]
        self._sent[f"evaluate-{server_round}"] = {p.cid: self._partition_of[p.cid] for p in proxies}
        parameters = self.scored_parameters(parameters)
        return [
            (
                proxy,
                EvaluateIns(
                    self.evaluate_parameters(
                        server_round, self._partition_of[proxy.cid], parameters
                    ),
                    {
                        **self.evaluate_config(server_round, self._partition_of[proxy.cid]),
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
        rows = sorted(
            (
                client_row(server_round, L1, self._partition_of[proxy.cid], res.metrics)
                for proxy, res in results
            ),
            key=lambda r: r["client"],
        )
        returned = {self._partition_of[proxy.cid] for proxy, _ in results}
        self._record_missing(server_round, "evaluate", returned, failures)
        unseen = [{**r, "stage": U} for r in rows if r["client"] in self.unseen]
        rows = [r for r in rows if r["client"] not in self.unseen]
        self.recorder.client_stage(server_round, L1, rows)
        if unseen:
            self.recorder.client_stage(server_round, U, unseen)
        self.recorder.round_done(server_round)
        if server_round == self.settings.rounds:
            self.recorder.finish()
        if not rows:
            return None, {}
        return float(np.mean([r["loss_local"] for r in rows])), {}

    # ------------------------------------------------------------------------- internals
    def _trainable(self, proxies: list[ClientProxy]) -> list[ClientProxy]:
        """``proxies`` without the clients held out of training (``eval.unseen_fraction``)."""
        return [p for p in proxies if self._partition_of[p.cid] not in self.unseen]

    def _l2_partitions(self, server_round: int, trainable: list[ClientProxy]) -> set[int] | None:
        """The partitions that measure stage L2 in ``server_round`` (None: every one that trains).

        With ``eval.l2_clients=evaluated`` these are the clients of the round's evaluation sample:
        the draw :meth:`configure_evaluate` makes from its own stream, made here from the
        trainable clients reachable now (the same draw unless nodes come or go between fit and
        evaluate).
        """
        if not self.settings.is_eval_round(server_round):
            return None
        measured: set[int] | None = None
        if self.settings.eval.l2_clients == L2Clients.evaluated:
            chosen = self._choose(
                trainable,
                self.settings.eval.fraction,
                round_rng(self.settings.seed, Phase.EVALUATE_SAMPLING, server_round),
            )
            measured = {self._partition_of[p.cid] for p in chosen}
        self._measure_l2[server_round] = measured
        return measured

    def _with_l2_flag(
        self, config: dict[str, Scalar], partition_id: int, measured: set[int] | None
    ) -> dict[str, Scalar]:
        """``config`` plus ``measure-l2: false`` for a client that does not measure stage L2."""
        if measured is None or partition_id in measured:
            return config
        return {**config, MEASURE_L2: False}

    def _count_bytes_down(
        self, server_round: int, instructions: list[tuple[ClientProxy, FitIns]]
    ) -> None:
        """Remember the array bytes each client's fit instruction carries (``bytes_down``)."""
        sizes: dict[int, int] = {}
        for proxy, ins in instructions:
            if id(ins.parameters) not in sizes:
                sizes[id(ins.parameters)] = payload_bytes(parameters_to_ndarrays(ins.parameters))
            self._bytes_down[(server_round, self._partition_of[proxy.cid])] = sizes[
                id(ins.parameters)
            ]

    def _bytes_down_metric(self, server_round: int, partition_id: int) -> dict[str, Scalar]:
        """``bytes_down``: array bytes sent to the client with its fit instruction this round."""
        sent = self._bytes_down.get((server_round, partition_id))
        return {} if sent is None else {"bytes_down": sent}

    def _store_uploads(self, server_round: int, updates: list[ClientUpdate]) -> None:
        """Keep every accepted upload in :attr:`client_models`; log and record the store's size."""
        for update in updates:
            self.client_models.put(update.partition_id, update.weights, server_round)
        size = self.client_models.nbytes
        log(
            INFO,
            "round %s: client model store holds %s models, %s bytes",
            server_round,
            len(self.client_models),
            size,
        )
        self.recorder.server_state(
            server_round,
            {"client_store_models": len(self.client_models), "client_store_bytes": size},
        )

    def _learn_partitions(
        self, client_manager: ClientManager, skip: set[str] | None = None
    ) -> dict[str, str]:
        """Ask newly connected nodes, all at once, which partition they hold (once per node).

        A node that cannot answer in time is left out until it can; it is recorded as a failure.
        Nodes in ``skip`` are not asked. Returns the nodes that failed, with their errors.
        """
        if self._read_simulated_partitions(client_manager):
            return {}
        asking = self._ask_new_nodes(client_manager, skip or set())
        if asking is None:
            return {}
        asking.wait()
        return self._record_answers(asking.answers)

    def _read_simulated_partitions(self, client_manager: ClientManager) -> bool:
        """In a simulation that published its node-to-partition map (pflower's own), take every
        node's partition from it and its training-set size from :attr:`train_sizes`, asking no
        node: one question per node costs a message through the Ray workers each, minutes at
        10,000 clients. Returns whether it did."""
        partitions = simulated_partitions(client_manager)
        if partitions is None or self.train_sizes is None:
            return False
        for cid, partition_id in partitions.items():
            self._partition_of[cid] = partition_id
            self._num_train[partition_id] = self.train_sizes[partition_id]
        return True

    def _ask_new_nodes(self, client_manager: ClientManager, skip: set[str]) -> NodeQuestions | None:
        """Start asking the connected nodes whose partition is unknown (None if there are none).

        A node gets ``round_timeout`` to answer, else Flower's message time-to-live (12 hours): the
        first message builds the client's experiment, which may take long on a large dataset.
        """
        new = [
            p
            for cid, p in client_manager.all().items()
            if cid not in self._partition_of and cid not in skip
        ]
        if not new:
            return None

        def ask(proxy: ClientProxy) -> dict[str, Scalar]:
            ins = GetPropertiesIns({})
            timeout = self.settings.round_timeout
            return proxy.get_properties(ins, timeout=timeout, group_id=0).properties

        return NodeQuestions(new, ask)

    def _record_answers(
        self, answers: dict[str, dict[str, Scalar] | BaseException]
    ) -> dict[str, str]:
        """Keep the partitions the nodes reported; record the nodes that failed (returned)."""
        refused: dict[str, str] = {}
        for cid, answer in answers.items():
            if isinstance(answer, BaseException):  # a broken node must not stop the others
                refused[cid] = _failure_text(answer)
                self.recorder.failures(0, "connect", {f"node {cid}": refused[cid]})
                continue
            partition_id = int(answer["partition_id"])
            self._partition_of[cid] = partition_id
            self._num_train[partition_id] = int(answer["num_train"])
        return refused

    def _reachable(self, client_manager: ClientManager) -> list[ClientProxy]:
        """The connected clients whose partition is known, in partition order.

        Before the first round the server waits up to ``connect_timeout`` for all ``num_clients``
        nodes, then fails naming the expected and the connected ones. Before later rounds it gives
        nodes that left up to ``connect_timeout`` to reconnect, then goes on with the connected
        ones, as long as at least ``min_clients`` of them answer. Either wait logs every
        ``connect_log_every`` seconds which partitions are missing.
        """
        refused = self._await_nodes(client_manager, initial=not self._partition_of)
        self._learn_partitions(client_manager, skip=set(refused))
        proxies = sorted(
            (p for p in client_manager.all().values() if p.cid in self._partition_of),
            key=lambda p: self._partition_of[p.cid],
        )
        if len(proxies) < self.settings.min_clients:
            message = (
                f"only {len(proxies)} client(s) reachable, fewer than min_clients="
                f"{self.settings.min_clients}; nothing can be trained. "
                f"{self._node_report(client_manager, refused)}"
            )
            self.recorder.fail(message)
            raise RoundFailedError(message)
        return proxies

    def _choose(
        self, proxies: list[ClientProxy], fraction: float, rng: np.random.Generator
    ) -> list[ClientProxy]:
        """A share ``fraction`` of ``proxies`` (at least ``min_clients``), drawn from ``rng``."""
        count = max(int(len(proxies) * fraction), min(self.min_fit_clients, len(proxies)))
        if count >= len(proxies):
            return proxies
        chosen = rng.choice(len(proxies), size=count, replace=False)
        return [proxies[i] for i in sorted(chosen)]

    def _await_nodes(self, client_manager: ClientManager, initial: bool) -> dict[str, str]:
        """Wait, at most ``connect_timeout`` seconds, until ``num_clients`` nodes are connected.

        While it waits it asks each newly connected node for its partition (once) and logs every
        ``connect_log_every`` seconds the connected nodes and the missing partitions. Before the
        first round (``initial``) it gives up with :class:`NodesMissingError`, recorded in the run
        directory; a simulation whose federation has another number of SuperNodes than
        ``num_clients`` is refused at once (its nodes are all registered when it starts). Before
        later rounds it logs the nodes still missing and returns. Returns the nodes that answered
        with an error, with their errors.
        """
        expected = self.settings.num_clients
        limit = self.settings.connect_timeout
        every = self.settings.connect_log_every
        start = time.monotonic()
        next_log = start
        refused: dict[str, str] = {}
        asking: NodeQuestions | None = None  # nodes are asked in the background: logs keep coming
        while True:
            if asking is not None and asking.done():
                refused.update(self._record_answers(asking.answers))
                asking = None
            connected = client_manager.num_available()
            waited = time.monotonic() - start
            simulated = simulated_nodes(client_manager)
            if (
                initial
                and simulated is not None
                and (
                    simulated > expected or (simulated < expected and waited >= SIMULATION_SETTLE_S)
                )
            ):
                self._give_up(simulation_mismatch(simulated, expected))
            if connected >= expected:
                if asking is not None:
                    asking.wait()
                    refused.update(self._record_answers(asking.answers))
                if waited >= every:
                    log(INFO, "all %s nodes connected after %.0f s", expected, waited)
                return refused
            if waited >= limit:
                break
            if initial and simulated is None and asking is None:
                asking = self._ask_new_nodes(client_manager, set(refused))
            now = time.monotonic()
            if now >= next_log and simulated is None:  # a simulation is decided within seconds
                log(
                    WARNING,
                    "waiting for nodes (%.0f of %.0f s): %s",
                    now - start,
                    limit,
                    self._node_report(client_manager, refused),
                )
                next_log = now + every
            pause = min(1.0, every, max(0.0, limit - (now - start)))
            client_manager.wait_for(expected, timeout=pause)  # type: ignore[arg-type]
        if asking is not None:  # what the nodes answered so far; the others are left unanswered
            refused.update(self._record_answers(asking.answers))
        report = self._node_report(client_manager, refused)
        if initial:
            self._give_up(
                f"{expected} nodes expected (num_clients={expected}), but only {connected} "
                f"connected within connect_timeout={limit:g} s. {report} Start the missing "
                "SuperNodes (one per partition), lower num_clients, or raise connect_timeout."
            )
        log(WARNING, "going on without the missing nodes after %.0f s: %s", limit, report)
        return refused

    def _node_report(self, client_manager: ClientManager, refused: dict[str, str]) -> str:
        """Which nodes are connected (with their partitions) and which partitions are missing."""
        expected = self.settings.num_clients
        nodes = client_manager.all()
        known = sorted((self._partition_of[cid], cid) for cid in nodes if cid in self._partition_of)
        unknown = sorted(cid for cid in nodes if cid not in self._partition_of)
        parts = [
            f"connected {len(nodes)} of {expected}: "
            + (", ".join(f"partition {pid} (node {cid})" for pid, cid in known) or "none")
        ]
        if unknown:
            parts.append(
                "partition not yet known: "
                + ", ".join(
                    f"node {cid}" + (f" ({refused[cid]})" if cid in refused else "")
                    for cid in unknown
                )
            )
        present = {pid for pid, _ in known}
        missing = [pid for pid in range(expected) if pid not in present]
        if missing and not unknown:
            parts.append("missing partitions: " + ranges(missing))
        elif missing:
            parts.append(f"{len(missing)} partition(s) without a known node")
        return "; ".join(parts) + "."

    def _give_up(self, message: str) -> None:
        """Record ``message`` as the reason the run failed, log it, and stop the run."""
        log(WARNING, "%s", message)
        self.recorder.fail(message)
        raise NodesMissingError(message)

    def _collect_updates(
        self, results: list[tuple[ClientProxy, FitRes]], current: NDArrays
    ) -> tuple[list[ClientUpdate], dict[int, str]]:
        """Valid updates sorted by partition id, and the rejected ones with the reason."""
        updates, rejected = [], {}
        for proxy, res in results:
            pid = self._partition_of[proxy.cid]
            weights = parameters_to_ndarrays(res.parameters)
            problem = self.check_update(weights, self.expected_upload(current))
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
            if self.partial_uploads and array.size == 0 and reference.size > 0:
                continue  # a personal array the client keeps (see ``partial_uploads``)
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


def _failure_text(failure: Any) -> str:
    if isinstance(failure, BaseException):
        return f"{type(failure).__name__}: {failure}"
    _, res = failure
    return f"status {res.status.code.name}: {res.status.message}"


def _describe(failed: dict[int | str, str]) -> str:
    return "\n".join(f"  client {pid}: {error}" for pid, error in failed.items())
