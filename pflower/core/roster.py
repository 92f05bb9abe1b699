"""The server's roster of nodes: which node holds which partition, and how long to wait for them.

Clients are known by the ``partition_id`` they report, never by node id, so per-client memory
survives node restarts. A node is asked once (or, in pflower's simulation, read from the map the
simulation published); the nodes that connect together are asked in one push. Waits are bounded:
before round 1 the server waits at most ``connect_timeout`` for ``num_clients`` nodes, logging
the missing partitions, then fails naming the expected and the connected nodes; a simulation
with another number of SuperNodes is refused at once.

A node that misses a phase's deadline (it was sent work and did not reply, or the server waited
``connect_timeout`` for it) is marked absent: later phases and rounds do not wait for it again.
A node that reconnects is asked for its partition at the next phase that starts and is no longer
absent. A node that registers a partition id outside ``0 .. num_clients-1``, or one that another
connected node holds, is refused (logged and recorded) and asked again later.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from logging import INFO, WARNING
from typing import Any, cast

from flwr.common import Scalar
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from pflower.config import ExperimentConfig
from pflower.core.errors import NodesMissingError, RoundFailedError
from pflower.core.nodes import (
    NodeQuestions,
    ranges,
    simulated_nodes,
    simulated_partitions,
    simulation_mismatch,
)
from pflower.results.rundir import Recorder

SIMULATION_SETTLE_S = 2.0
"""Seconds a simulation's node count must stay short of ``num_clients`` before the run refuses:
Flower's simulation registers all its SuperNodes at once when the run starts."""


def failure_text(failure: object) -> str:
    """One line for a failed reply: an exception, or a ``(proxy, result)`` with a bad status."""
    if isinstance(failure, BaseException):
        return f"{type(failure).__name__}: {failure}"
    res = cast(tuple[Any, Any], failure)[1]  # Flower's (ClientProxy, FitRes | EvaluateRes)
    return f"status {res.status.code.name}: {res.status.message}"


def registration_problem(
    cid: str,
    answer: Mapping[str, Scalar],
    expected: int,
    partition_of: Mapping[str, int],
    connected: Mapping[str, ClientProxy],
) -> str | None:
    """Why node ``cid``'s registration (its ``answer``: partition id and training-set size) is
    refused, or None: a partition id outside ``0 .. expected-1``, a size that is not a count, or
    a partition another ``connected`` node holds (``partition_of``: node id -> partition id)."""
    partition_id, num_train = answer.get("partition_id"), answer.get("num_train")
    if not isinstance(partition_id, int) or not 0 <= partition_id < expected:
        return f"partition_id={partition_id!r:.40} is not in 0..{expected - 1}"
    if not isinstance(num_train, int) or isinstance(num_train, bool) or num_train < 0:
        return f"num_train={num_train!r:.40} is not a count"
    holders = [c for c, p in partition_of.items() if p == partition_id and c != cid]
    holder = next((c for c in holders if c in connected), None)
    if holder is not None:
        return f"claims partition {partition_id}, already held by node {holder}"
    return None


def nodes_report(
    partition_of: Mapping[str, int],
    nodes: Mapping[str, ClientProxy],
    expected: int,
    refused: Mapping[str, str],
) -> str:
    """Which of the connected ``nodes`` hold which partition (``partition_of``), which are not
    known yet (with why, where ``refused``), and which of the ``expected`` partitions are
    missing: one line for the logs and the run's error."""
    known = sorted((partition_of[cid], cid) for cid in nodes if cid in partition_of)
    unknown = sorted(cid for cid in nodes if cid not in partition_of)
    parts = [
        f"connected {len(nodes)} of {expected}: "
        + (", ".join(f"partition {pid} (node {cid})" for pid, cid in known) or "none")
    ]
    if unknown:
        parts.append(
            "partition not yet known: "
            + ", ".join(
                f"node {cid}" + (f" ({refused[cid]})" if cid in refused else "") for cid in unknown
            )
        )
    present = {pid for pid, _ in known}
    missing = [pid for pid in range(expected) if pid not in present]
    if missing and not unknown:
        parts.append("missing partitions: " + ranges(missing))
    elif missing:
        parts.append(f"{len(missing)} partition(s) without a known node")
    return "; ".join(parts) + "."


class NodeRoster:
    """Which connected node holds which partition, and the bounded wait for nodes.

    Parameters
    ----------
    settings:
        The run's configuration (``num_clients``, ``min_clients``, ``connect_timeout``,
        ``connect_log_every``, ``round_timeout``).
    recorder:
        Where nodes that fail to answer and a run that cannot start are recorded.
    train_sizes:
        Every partition's training-set size, if the server knows them (see
        [`train_sizes`][pflower.core.roster.NodeRoster.train_sizes]).
    """

    def __init__(
        self,
        settings: ExperimentConfig,
        recorder: Recorder,
        train_sizes: Sequence[int] | None = None,
    ) -> None:
        self.settings = settings
        self.recorder = recorder
        self.partition_of: dict[str, int] = {}
        """Node id -> the partition id the node reported."""
        self.num_train: dict[int, int] = {}
        """Partition id -> its training-set size (as its node reported, or
        [`train_sizes`][pflower.core.roster.NodeRoster.train_sizes])."""
        self.train_sizes: list[int] | None = None if train_sizes is None else list(train_sizes)
        """Training-set size of every partition, from the server's own copy of the federation
        (None: unknown): with it, a simulation's nodes need not be asked."""
        self.absent: set[int] = set()
        """Partitions whose node missed a deadline: not waited for until a node of theirs
        reconnects."""

    def present(self, client_manager: ClientManager) -> set[int]:
        """The partitions of the connected nodes (those whose partition is known)."""
        return {self.partition_of[cid] for cid in client_manager.all() if cid in self.partition_of}

    def mark_absent(self, partitions: set[int], why: str) -> None:
        """Stop waiting for ``partitions`` (they missed a deadline: ``why``) until they return."""
        new = partitions - self.absent
        if new:
            self.absent |= new
            log(
                WARNING,
                "partition(s) %s marked absent (%s): later phases and rounds do not wait for "
                "them until their node reconnects",
                ranges(sorted(new)),
                why,
            )

    def partition(self, proxy: ClientProxy) -> int:
        """The partition ``proxy``'s node holds (it must be known)."""
        return self.partition_of[proxy.cid]

    def reachable(self, client_manager: ClientManager) -> list[ClientProxy]:
        """The connected clients whose partition is known, in partition order.

        Before the first round the server waits up to ``connect_timeout`` for all ``num_clients``
        nodes, then fails naming the expected and the connected ones. Before later rounds it gives
        nodes that left up to ``connect_timeout`` to reconnect, then goes on with the connected
        ones, as long as at least ``min_clients`` of them answer. Either wait logs every
        ``connect_log_every`` seconds which partitions are missing.
        """
        refused = self.await_nodes(client_manager, initial=not self.partition_of)
        self.learn_partitions(client_manager, skip=set(refused))
        back = self.absent & self.present(client_manager)
        if back:
            log(INFO, "partition(s) %s reconnected", ranges(sorted(back)))
            self.absent -= back
        proxies = sorted(
            (p for p in client_manager.all().values() if p.cid in self.partition_of),
            key=self.partition,
        )
        if len(proxies) < self.settings.min_clients:
            message = (
                f"only {len(proxies)} client(s) reachable, fewer than min_clients="
                f"{self.settings.min_clients}; nothing can be trained. "
                f"{self.report(client_manager, refused)}"
            )
            self.recorder.fail(message)
            raise RoundFailedError(message)
        return proxies

    def learn_partitions(
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
        return self._record_answers(asking.answers, client_manager)

    def _read_simulated_partitions(self, client_manager: ClientManager) -> bool:
        """In a simulation that published its node-to-partition map (pflower's own), take every
        node's partition from it and its training-set size from
        [`train_sizes`][pflower.core.roster.NodeRoster.train_sizes], asking no
        node: one question per node costs a message through the simulation's workers each,
        minutes at 10,000 clients. Returns whether it did."""
        partitions = simulated_partitions(client_manager)
        if partitions is None or self.train_sizes is None:
            return False
        for cid, partition_id in partitions.items():
            self.partition_of[cid] = partition_id
            self.num_train[partition_id] = self.train_sizes[partition_id]
        return True

    def _ask_new_nodes(self, client_manager: ClientManager, skip: set[str]) -> NodeQuestions | None:
        """Start asking the connected nodes whose partition is unknown (None if there are none).

        A node gets ``round_timeout`` to answer, else Flower's message time-to-live (12 hours): the
        first message builds the client's experiment, which may take long on a large dataset. The
        questions go in one push ([`NodeQuestions`][pflower.core.nodes.NodeQuestions]).
        """
        new = [
            p
            for cid, p in client_manager.all().items()
            if cid not in self.partition_of and cid not in skip
        ]
        if not new:
            return None

        return NodeQuestions(new, self.settings.round_timeout)

    def _record_answers(
        self, answers: dict[str, dict[str, Scalar] | BaseException], client_manager: ClientManager
    ) -> dict[str, str]:
        """Keep the partitions the nodes reported; record the nodes that failed or were refused
        (returned, with the reason)."""
        refused: dict[str, str] = {}
        for cid, answer in answers.items():
            if isinstance(answer, BaseException):  # a broken node must not stop the others
                problem: str | None = failure_text(answer)
            else:
                problem = registration_problem(
                    cid, answer, self.settings.num_clients, self.partition_of, client_manager.all()
                )
            if problem or isinstance(answer, BaseException):
                refused[cid] = problem or "no answer"
                log(WARNING, "node %s refused: %s", cid, refused[cid])
                self.recorder.failures(0, "connect", {f"node {cid}": refused[cid]})
                continue
            partition_id = int(answer["partition_id"])
            self.partition_of[cid] = partition_id
            self.num_train[partition_id] = int(answer["num_train"])
        return refused

    def await_nodes(self, client_manager: ClientManager, initial: bool) -> dict[str, str]:
        """Wait, at most ``connect_timeout`` seconds, until ``num_clients`` nodes are connected.

        While it waits it asks each newly connected node for its partition (once) and logs every
        ``connect_log_every`` seconds the connected nodes and the missing partitions. Before the
        first round (``initial``) it gives up with
        [`NodesMissingError`][pflower.core.roster.NodesMissingError], recorded in the run
        directory; a simulation whose federation has another number of SuperNodes than
        ``num_clients`` is refused at once (its nodes are all registered when it starts). Before
        later rounds it logs the nodes still missing and returns. Returns the nodes that answered
        with an error, with their errors.
        """
        expected = self.settings.num_clients
        limit = self.settings.connect_timeout
        every = self.settings.connect_log_every
        wanted = expected - len(self.absent - self.present(client_manager))
        start = time.monotonic()
        next_log = start
        refused: dict[str, str] = {}
        asking: NodeQuestions | None = None  # nodes are asked in the background: logs keep coming
        while True:
            if asking is not None and asking.done():
                refused.update(self._record_answers(asking.answers, client_manager))
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
            if connected >= wanted:
                if asking is not None:
                    asking.wait()
                    refused.update(self._record_answers(asking.answers, client_manager))
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
                    self.report(client_manager, refused),
                )
                next_log = now + every
            pause = min(1.0, every, max(0.0, limit - (now - start)))
            client_manager.wait_for(expected, timeout=pause)  # type: ignore[arg-type]  # Flower: int; a float works
        if asking is not None:  # what the nodes answered so far; the others are left unanswered
            refused.update(self._record_answers(asking.answers, client_manager))
        report = self.report(client_manager, refused)
        if initial:
            self._give_up(
                f"{expected} nodes expected (num_clients={expected}), but only {connected} "
                f"connected within connect_timeout={limit:g} s. {report} Start the missing "
                "SuperNodes (one per partition), lower num_clients, or raise connect_timeout."
            )
        log(WARNING, "going on without the missing nodes after %.0f s: %s", limit, report)
        missing = set(range(expected)) - self.present(client_manager)
        self.mark_absent(missing, f"not connected within connect_timeout={limit:g} s")
        return refused

    def report(self, client_manager: ClientManager, refused: dict[str, str]) -> str:
        """Which nodes are connected (with their partitions) and which partitions are missing
        ([`nodes_report`][pflower.core.roster.nodes_report])."""
        return nodes_report(
            self.partition_of, client_manager.all(), self.settings.num_clients, refused
        )

    def _give_up(self, message: str) -> None:
        """Record ``message`` as the reason the run failed, log it, and stop the run."""
        log(WARNING, "%s", message)
        self.recorder.fail(message)
        raise NodesMissingError(message)
