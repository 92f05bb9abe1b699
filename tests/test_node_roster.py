"""The node roster: a node that missed a deadline is not waited for again until it reconnects.

Nodes are fake ``ClientProxy`` objects in Flower's own ``SimpleClientManager``: a node "dies" by
being unregistered (as the SuperLink does when its heartbeats stop) and "restarts" by a new node
id registering the same partition.
"""

from __future__ import annotations

import time

from flwr.common import Code, GetPropertiesIns, GetPropertiesRes, Status
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy

from pflower.compose import compose_config, settings_of
from pflower.core.roster import NodeRoster
from pflower.results.rundir import Recorder

TIMEOUT = 3.0


class Node(ClientProxy):
    """A node that answers the server's registration question with its partition."""

    def __init__(self, cid: str, partition_id: int) -> None:
        super().__init__(cid)
        self.partition_id = partition_id

    def get_properties(
        self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None
    ) -> GetPropertiesRes:
        properties = {"partition_id": self.partition_id, "num_train": 10}
        return GetPropertiesRes(Status(Code.OK, ""), properties)

    def get_parameters(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def fit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def evaluate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def reconnect(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise NotImplementedError


def _roster() -> tuple[NodeRoster, SimpleClientManager, list[Node]]:
    cfg = compose_config(
        [
            "dataset=digits",
            "num_clients=3",
            f"connect_timeout={TIMEOUT}",
            "connect_log_every=1",
        ]
    )
    roster = NodeRoster(settings_of(cfg), Recorder())
    manager = SimpleClientManager()
    nodes = [Node(f"node-{pid}", pid) for pid in range(3)]
    for node in nodes:
        manager.register(node)
    return roster, manager, nodes


def _timed(roster: NodeRoster, manager: SimpleClientManager) -> tuple[float, list[int]]:
    start = time.monotonic()
    proxies = roster.reachable(manager)
    return time.monotonic() - start, [roster.partition(p) for p in proxies]


def test_a_dead_node_costs_one_wait_then_none_until_it_reconnects() -> None:
    roster, manager, nodes = _roster()
    assert _timed(roster, manager)[1] == [0, 1, 2]
    manager.unregister(nodes[1])  # the node of partition 1 dies
    waited, partitions = _timed(roster, manager)
    assert waited >= TIMEOUT and partitions == [0, 2]
    assert roster.absent == {1}
    for _ in range(3):  # later phases and rounds: no wait for the absent node
        waited, partitions = _timed(roster, manager)
        assert waited < 1.0 and partitions == [0, 2]
    manager.register(Node("node-1-restarted", 1))  # restarted: a new node id, same partition
    waited, partitions = _timed(roster, manager)
    assert waited < 1.0 and partitions == [0, 1, 2]
    assert roster.absent == set()


def test_a_node_that_missed_a_reply_is_not_waited_for_after_it_leaves() -> None:
    roster, manager, nodes = _roster()
    _timed(roster, manager)
    roster.mark_absent({2}, "no fit reply in round 1")
    manager.unregister(nodes[2])
    waited, partitions = _timed(roster, manager)
    assert waited < 1.0 and partitions == [0, 1]


def test_a_second_node_claiming_a_held_partition_is_refused() -> None:
    roster, manager, _ = _roster()
    _timed(roster, manager)
    manager.register(Node("impostor", 0))
    manager.register(Node("out-of-range", 7))
    roster.learn_partitions(manager)
    assert roster.partition_of == {"node-0": 0, "node-1": 1, "node-2": 2}
