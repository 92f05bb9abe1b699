"""Flower's simulation engine as pflower runs it: the private call that starts it, two of its
functions replaced so a round costs what its sampled clients cost, and Ray's head started lean.

[`run_engine`][pflower.runtime.engine.run_engine] is what [`pflower.simulation`][pflower.simulation]
calls to run one experiment: Flower 1.39's
``_run_simulation`` (`RUN_SIMULATION`, the call `flwr run`'s
simulation runtime makes; the public ``run_simulation`` takes no run config), inside
[`scaled_to_many_clients`][pflower.runtime.engine.scaled_to_many_clients], which replaces for the
run's length

- ``vce_api.add_messages_to_queue`` (`ADD_MESSAGES_TO_QUEUE`) by
  [`deliver_pending_messages`][pflower.runtime.engine.deliver_pending_messages], and
- ``vce_api._register_nodes`` (`REGISTER_NODES`) by a wrapper that
  publishes the node-to-partition map on the in-memory link state
  ([`SIMULATED_PARTITIONS`][pflower.runtime.engine.SIMULATED_PARTITIONS], read back by
  [`published_partitions`][pflower.runtime.engine.published_partitions]).

With them a round of 100 clients out of 10,000 takes seconds. `lean_ray_head` and
`ray_keeps_signal_handlers` are the Ray backend's: Ray's head node starts without its
autoscaler monitor and API server, and ``ray.init`` leaves pflower's signal handlers in place.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pflower.runtime.fence import (
    ADD_MESSAGES_TO_QUEUE,
    EMPTY_RUN,
    FUSED_CONFIG,
    IN_MEMORY_GRID,
    RAY_INIT,
    RAY_START_API_SERVER,
    RAY_START_MONITOR,
    REGISTER_NODES,
    RUN_SIMULATION,
)

if TYPE_CHECKING:
    import threading
    from pathlib import Path
    from queue import Queue

    from flwr.app import Message
    from flwr.server.superlink.linkstate import LinkState

DELIVERY_POLL_S = 0.005
"""How often [`deliver_pending_messages`][pflower.runtime.engine.deliver_pending_messages] looks
for undelivered messages. Flower looks every 0.1 s: the messages of each half of a round (fit,
then evaluate) waited 0.05 s on average before a worker took them, in rounds of about a second
(the cpu suite's trials). A look takes the link state's lock and scans its stored messages once."""

SIMULATED_PARTITIONS = "pflower_partitions"
"""Attribute of a simulation's in-memory link state holding its node-id -> partition-id map,
set when the engine registers the nodes
([`scaled_to_many_clients`][pflower.runtime.engine.scaled_to_many_clients])."""


def deliver_pending_messages(
    state: LinkState,
    queue: Queue[Message],
    nodes_mapping: dict[int, int],
    f_stop: threading.Event,
) -> None:
    """Flower's simulation loop that hands the server's messages to the client workers, asking
    the link state only for the nodes that have an undelivered message.

    Flower 1.39's own loop (``vce_api.add_messages_to_queue``) asks for every node's messages
    every 0.1 s, and each question scans every stored message: N x M checks per pass, which
    keeps the driver busy for minutes per round at 10,000 clients. This one scans the stored
    messages once per pass and asks only for their destinations (in the nodes' order, as
    Flower does), so a round costs what its sampled clients cost, and passes every
    [`DELIVERY_POLL_S`][pflower.runtime.engine.DELIVERY_POLL_S], so a message waits for its
    worker milliseconds instead of up to 0.1 s. Same messages, same delivery. It reads the
    in-memory link state's ``message_ins_store`` under its ``lock``."""
    position = {node_id: index for index, node_id in enumerate(nodes_mapping)}
    store: dict[str, Message] = state.message_ins_store  # type: ignore[attr-defined]  # InMemoryLinkState's
    while not f_stop.is_set():
        with state.lock:  # type: ignore[attr-defined]  # InMemoryLinkState's
            waiting = {
                message.metadata.dst_node_id
                for message in store.values()
                if message.metadata.delivered_at == ""
            }
        for node_id in sorted(waiting & position.keys(), key=position.__getitem__):
            for message in state.get_message_ins(node_id=node_id, limit=1):
                queue.put(message)
        f_stop.wait(DELIVERY_POLL_S)


def _publishing(register_nodes: Any) -> Any:
    """``vce_api._register_nodes`` that also publishes its node map on the link state."""

    @functools.wraps(register_nodes)
    def register_and_publish(num_nodes: int, state_factory: Any) -> dict[int, int]:
        mapping: dict[int, int] = register_nodes(num_nodes, state_factory)
        setattr(state_factory.state(), SIMULATED_PARTITIONS, dict(mapping))
        return mapping

    return register_and_publish


@contextlib.contextmanager
def scaled_to_many_clients() -> Iterator[None]:
    """While active, Flower's simulation engine delivers messages with
    [`deliver_pending_messages`][pflower.runtime.engine.deliver_pending_messages] and publishes its
    node-to-partition map on the link state
    (so the server need not ask every node for its partition before the first round); Flower's
    two functions come back at the end."""
    register_nodes = REGISTER_NODES.current()
    with (
        REGISTER_NODES.replaced(_publishing(register_nodes)),
        ADD_MESSAGES_TO_QUEUE.replaced(deliver_pending_messages),
    ):
        yield


def grid_of(proxy: object) -> object | None:
    """The grid that the legacy server's proxy of a node talks through (the ``grid`` attribute of
    Flower's ``GridClientProxy``, `GRID_CLIENT_PROXY`; None for a proxy without one, such as
    the in-process test's)."""
    return getattr(proxy, "grid", None)


def is_in_memory_grid(grid: object) -> bool:
    """Whether ``grid`` is a simulation's in-memory grid (Flower's server-side grid modules are
    imported on the first call: a ClientApp never needs them)."""
    return isinstance(grid, _in_memory_grid_class())


def is_simulated(proxy: object) -> bool:
    """Whether ``proxy``'s node is reached through a simulation's in-memory grid."""
    return is_in_memory_grid(grid_of(proxy))


@functools.cache
def _in_memory_grid_class() -> type:
    grid_class: type = IN_MEMORY_GRID.current()
    return grid_class


def published_partitions(proxy: object) -> dict[int, int] | None:
    """The node-id -> partition-id map published on the link state of the in-memory grid that
    ``proxy`` talks through (None where the grid is no simulation's, or none was published: under
    ``flwr run``); the published dict itself, not a copy (a round asks it once per node)."""
    if not is_simulated(proxy):
        return None
    published: dict[int, int] | None = getattr(
        getattr(grid_of(proxy), "state", None), SIMULATED_PARTITIONS, None
    )
    return published


RAY_HEAD_EXTRAS = (RAY_START_MONITOR, RAY_START_API_SERVER)
"""Methods of Ray's head node that start processes a simulation does not use (see
[`lean_ray_head`][pflower.runtime.engine.lean_ray_head])."""


@contextlib.contextmanager
def lean_ray_head() -> Iterator[None]:
    """While active, a local Ray cluster starts without its autoscaler monitor and API server.

    With ``include_dashboard=False`` (Flower's setting) Ray's API server loads only its usage-
    statistics module, and the monitor autoscales a cluster of one fixed node: neither serves a
    simulation, yet both are Python processes that import much of Ray, and ``ray.init`` waits
    for the API server. Measured on 2 cores, they cost about 3 s of an 8-10 s ``ray.init`` and
    about 125 MB. Ray has no public switch for them (``ray start --no-monitor`` exists,
    ``ray.init`` has nothing), so the two methods of Ray's ``Node`` that start them
    (`RAY_START_MONITOR`,
    `RAY_START_API_SERVER`) do nothing while Flower's backend calls
    ``ray.init`` (Ray is pinned by Flower, 2.55.1 for Flower 1.39). Ray handles a head node
    without an API server as one whose dashboard did not start: there is no dashboard URL, and
    no usage statistics are reported. Attaching to a running cluster (``backend.address``)
    starts no head, so this changes nothing there."""
    with contextlib.ExitStack() as stack:
        for method in RAY_HEAD_EXTRAS:
            stack.enter_context(method.replaced(_start_nothing))
        yield


def _start_nothing(*_args: Any, **_kwargs: Any) -> None:
    """Stands in for a process-starting method of Ray's ``Node`` (see
    [`lean_ray_head`][pflower.runtime.engine.lean_ray_head])."""


KEPT_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals whose handlers `ray_keeps_signal_handlers` puts back after ``ray.init``."""


@contextlib.contextmanager
def ray_keeps_signal_handlers() -> Iterator[None]:
    """While active, Flower's Ray backend starts Ray
    (``RayBackend.init_ray``, `RAY_INIT`, on the simulation's main
    thread) leaving the SIGTERM and SIGINT handlers as it found them.

    ``ray.init`` installs its own SIGTERM handler, ``sys.exit``, in place of pflower's, which
    records the run as interrupted and ends the process
    ([`pflower.results.failures.summary_on_signal`][pflower.results.failures.summary_on_signal]);
    Ray's C++ core, started by the same call, installs one that prints a stack trace. With them a
    ``kill`` of a Ray run wrote no ``summary.json``, and the ``SystemExit`` raised in Flower's
    engine left the process running. Putting the handlers back (``signal.signal`` sets the
    process's disposition again) makes a Ray run end on SIGTERM as a forked one does."""
    init_ray = RAY_INIT.current()

    @functools.wraps(init_ray)
    def init_ray_keeping_handlers(backend: Any, backend_config: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            init_ray(backend, backend_config)
            return
        handlers = {signum: signal.getsignal(signum) for signum in KEPT_SIGNALS}
        try:
            init_ray(backend, backend_config)
        finally:
            for signum, handler in handlers.items():
                if handler is not None:  # None: not installed from Python, nothing to restore
                    signal.signal(signum, handler)

    with RAY_INIT.replaced(init_ray_keeping_handlers):
        yield


def run_engine(
    *,
    client_app: Any,
    server_app: Any,
    num_supernodes: int,
    backend_name: str,
    backend_config: dict[str, Any],
    run_id: int,
    override_config: dict[str, Any],
    app_dir: Path,
    server_context: Any,
) -> None:
    """Flower's simulation engine on this process (`RUN_SIMULATION`):
    the ServerApp on a thread, the ClientApps on the backend's workers, as `flwr run`'s
    simulation runtime starts it: a run ``run_id`` with ``override_config`` and the app's
    directory (for the run config's defaults), inside
    [`scaled_to_many_clients`][pflower.runtime.engine.scaled_to_many_clients]."""
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.telemetry import EventType

    run = EMPTY_RUN.current()(run_id=run_id)
    run.override_config = override_config
    run.primary_task_id = 1
    run.federation_id = NOOP_FEDERATION_ID
    with scaled_to_many_clients():
        RUN_SIMULATION.check()
        RUN_SIMULATION.current()(
            num_supernodes=num_supernodes,
            exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
            client_app=client_app,
            server_app=server_app,
            backend_name=backend_name,
            backend_config=backend_config,
            server_app_context=server_context,
            app_dir=str(app_dir),
            run=run,
            is_app=True,
        )


def fused_run_config(app_dir: Path, override_config: dict[str, Any]) -> dict[str, Any]:
    """The run config a simulation's apps see: the app's declared defaults (its
    ``pyproject.toml``) fused with ``override_config``
    (`FUSED_CONFIG`)."""
    fused: dict[str, Any] = FUSED_CONFIG.current()(app_dir, override_config)
    return fused
