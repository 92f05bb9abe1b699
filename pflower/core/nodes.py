"""Talking to nodes that may be slow, missing or gone: questions asked without blocking the server,
and what a Flower simulation's node count says about a mismatch with the experiment."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from flwr.common import GetPropertiesIns, Scalar
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from pflower.runtime.engine import is_simulated, published_partitions
from pflower.runtime.polling import PromptGrid, ask_properties_at_once, round_grid


class NodeQuestions:
    """Each of some nodes asked for its properties (``GetPropertiesIns({})``: the roster's question
    for its partition), all at once, in the background.

    Over a grid (a deployment's, or a ``flwr run`` simulation's) the questions go to the SuperLink
    in one push ([`ask_properties_at_once`][pflower.runtime.polling.ask_properties_at_once], which
    says why) and one daemon thread collects the answers; elsewhere (proxies that talk through no
    grid, as in the tests) each node is asked in a daemon thread of its own. A node that never
    answers keeps neither the server loop nor the server process waiting:
    [`done`][pflower.core.nodes.NodeQuestions.done] tells whether all answered,
    [`answers`][pflower.core.nodes.NodeQuestions.answers] holds the answers so far (the
    properties, or the exception) by node id, in the order the nodes were asked. Each node gets
    ``timeout`` seconds to answer (None: Flower's message time-to-live).
    """

    def __init__(self, proxies: Sequence[ClientProxy], timeout: float | None) -> None:
        self._order = [proxy.cid for proxy in proxies]
        self._answers: dict[str, dict[str, Scalar] | BaseException] = {}
        grid = round_grid(proxies)
        if grid is not None:
            self._threads = [
                threading.Thread(target=self._ask_all, args=(grid, proxies, timeout), daemon=True)
            ]
        else:
            self._threads = [
                threading.Thread(target=self._ask, args=(proxy, timeout), daemon=True)
                for proxy in proxies
            ]
        for thread in self._threads:
            thread.start()

    def _take(self, proxy: ClientProxy, answer: dict[str, Scalar] | BaseException) -> None:
        self._answers[proxy.cid] = answer  # one key per node: atomic under the GIL

    def _ask_all(
        self, grid: PromptGrid, proxies: Sequence[ClientProxy], timeout: float | None
    ) -> None:
        try:
            ask_properties_at_once(grid, proxies, timeout, self._take)
        except Exception as error:  # the push failed: no node got a question
            for proxy in proxies:
                self._answers.setdefault(proxy.cid, error)

    def _ask(self, proxy: ClientProxy, timeout: float | None) -> None:
        try:
            ins = GetPropertiesIns({})
            answer: dict[str, Scalar] | BaseException = proxy.get_properties(
                ins, timeout=timeout, group_id=0
            ).properties
        except Exception as error:
            answer = error
        self._take(proxy, answer)

    @property
    def answers(self) -> dict[str, dict[str, Scalar] | BaseException]:
        """The answers received so far, in the order the nodes were asked."""
        received = dict(self._answers)
        return {cid: received[cid] for cid in self._order if cid in received}

    def done(self) -> bool:
        """Whether every node answered."""
        return not any(thread.is_alive() for thread in self._threads)

    def wait(self) -> None:
        """Block until every node answered."""
        for thread in self._threads:
            thread.join()


def simulated_nodes(client_manager: ClientManager) -> int | None:
    """The number of SuperNodes of a Flower simulation (None outside of one).

    A simulation registers all its SuperNodes when it starts and never adds any; its nodes are
    reached through an in-memory grid, a deployment's through the SuperLink.
    """
    proxies = list(client_manager.all().values())
    if proxies and all(is_simulated(p) for p in proxies):
        return len(proxies)
    return None


def simulated_partitions(client_manager: ClientManager) -> dict[str, int] | None:
    """Every connected node's partition, when a simulation published them on its link state (None
    otherwise, e.g. in a deployment or under ``flwr run``, where nodes are asked)."""
    partitions: dict[str, int] = {}
    for cid, proxy in client_manager.all().items():
        published = published_partitions(proxy)
        if published is None or int(cid) not in published:
            return None
        partitions[cid] = int(published[int(cid)])
    return partitions or None


def simulation_mismatch(available: int, expected: int) -> str:
    """Why a simulation of ``available`` SuperNodes cannot run ``expected`` clients; the fix."""
    return (
        f"This Flower simulation has {available} SuperNodes, but the experiment expects "
        f"num_clients={expected} (one SuperNode per client; the default federation of "
        f"`flwr run` has 2). Run it with a federation of {expected} SuperNodes:\n"
        f"  flwr run . --stream --federation-config 'num-supernodes={expected}' "
        f"--run-config 'overrides=\"num_clients={expected} ...\"'\n"
        f"or set num_clients={available}."
    )


def ranges(values: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    spans: list[list[int]] = []
    for value in values:
        if spans and value == spans[-1][1] + 1:
            spans[-1][1] = value
        else:
            spans.append([value, value])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
