"""Run one experiment as a Flower simulation in this process (what ``pflower <overrides>`` does).

The apps receive the experiment exactly as ``flwr run`` delivers it: the Hydra overrides (plus the
pinned run directory) in the run config, fused with the app's declared defaults. Processes forked
from this one run the ClientApps (``backend=fork``, the default: :mod:`pflower.forkbackend`), or
Flower's Ray backend (``backend=ray``, ``backend=ray_cluster``). Two parts of Flower's simulation
engine that cost time in proportion to the population rather than to the sampled clients are
replaced for these runs (see :func:`_scale_to_many_clients`): with them, a round of 100 clients
out of 10,000 takes seconds.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pflower.config import RUN_CONFIG_KEY, ExperimentConfig, app_dir, overrides_to_string

if TYPE_CHECKING:
    import threading
    from queue import Queue

    from flwr.app import Message
    from flwr.server.superlink.linkstate import LinkState

QUIET_RAY_ENVIRONMENT = {
    # Ray >= 2.48 warns on every start that it will stop clearing CUDA_VISIBLE_DEVICES for
    # actors with num_gpus=0; pflower sets GPU resources explicitly, so opt in to the new rule.
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}
"""Environment for Ray that keeps its start-up notices off a run's console."""


def ray_backend_config(settings: ExperimentConfig) -> dict[str, Any]:
    """Flower's Ray backend settings from the ``backend`` config group."""
    backend = settings.backend
    init_args: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
    if backend.address:
        init_args["address"] = backend.address
    return {
        "client_resources": {
            "num_cpus": backend.num_cpus_per_client,
            "num_gpus": backend.num_gpus_per_client,
        },
        "init_args": init_args,
    }


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
    Flower does), so a round costs what its sampled clients cost. Same messages, same
    delivery."""
    position = {node_id: index for index, node_id in enumerate(nodes_mapping)}
    store: dict[str, Message] = state.message_ins_store  # type: ignore[attr-defined]
    while not f_stop.is_set():
        with state.lock:  # type: ignore[attr-defined]
            waiting = {
                message.metadata.dst_node_id
                for message in store.values()
                if message.metadata.delivered_at == ""
            }
        for node_id in sorted(waiting & position.keys(), key=position.__getitem__):
            for message in state.get_message_ins(node_id=node_id, limit=1):
                queue.put(message)
        f_stop.wait(0.1)


def _scale_to_many_clients() -> None:
    """Two changes to Flower's simulation engine (``vce_api``) that keep a round's cost
    proportional to the sampled clients: :func:`deliver_pending_messages` delivers the server's
    messages, and the node-to-partition map Flower makes when it registers the nodes is published
    on the (in-memory) link state (:data:`~pflower.core.nodes.SIMULATED_PARTITIONS`), so that the
    server need not ask every node for its partition before the first round."""
    from flwr.server.superlink.fleet.vce import vce_api

    from pflower.core.nodes import SIMULATED_PARTITIONS

    register_nodes = getattr(vce_api._register_nodes, "__wrapped__", vce_api._register_nodes)

    @functools.wraps(register_nodes)
    def register_and_publish(num_nodes: int, state_factory: Any) -> dict[int, int]:
        mapping = register_nodes(num_nodes, state_factory)
        setattr(state_factory.state(), SIMULATED_PARTITIONS, dict(mapping))
        return mapping

    vce_api._register_nodes = register_and_publish
    vce_api.add_messages_to_queue = deliver_pending_messages


RAY_HEAD_EXTRAS = ("start_monitor", "start_api_server")
"""Methods of Ray's head node that start processes a simulation does not use (see
:func:`lean_ray_head`)."""


@contextlib.contextmanager
def lean_ray_head() -> Iterator[None]:
    """While active, a local Ray cluster starts without its autoscaler monitor and API server.

    With ``include_dashboard=False`` (Flower's setting) Ray's API server loads only its usage-
    statistics module, and the monitor autoscales a cluster of one fixed node: neither serves a
    simulation, yet both are Python processes that import much of Ray, and ``ray.init`` waits
    for the API server. Measured on 2 cores, they cost about 3 s of an 8-10 s ``ray.init`` and
    about 125 MB. Ray has no public switch for them (``ray start --no-monitor`` exists,
    ``ray.init`` has nothing), so the two methods of Ray's ``Node`` that start them do nothing
    while Flower's backend calls ``ray.init`` (Ray is pinned by Flower, 2.55.1 for Flower 1.39; a
    Ray without these methods is left as it is). Ray handles a head node without an API server
    as one whose dashboard did not start: there is no dashboard URL, and no usage statistics are
    reported. Attaching to a running cluster (``backend.address``) starts no head, so this
    changes nothing there."""
    from ray._private.node import Node

    originals = {name: getattr(Node, name) for name in RAY_HEAD_EXTRAS if hasattr(Node, name)}
    for name in originals:
        setattr(Node, name, _start_nothing)
    try:
        yield
    finally:
        for name, method in originals.items():
            setattr(Node, name, method)


def _start_nothing(*_args: Any, **_kwargs: Any) -> None:
    """Stands in for a process-starting method of Ray's ``Node`` (see :func:`lean_ray_head`)."""


def _backend_workers(
    settings: ExperimentConfig, client_app: Any, run_config: dict[str, Any]
) -> contextlib.AbstractContextManager[None]:
    """What runs the engine's ClientApps: forked workers for ``backend=fork``, else Ray (with a
    lean head)."""
    backend = settings.backend
    if backend.name != "fork":
        return lean_ray_head()
    from pflower.compose import overrides_from_run_config
    from pflower.forkbackend import default_worker_count, forked_workers

    count = backend.workers or default_worker_count(backend.num_cpus_per_client)
    return forked_workers(client_app, overrides_from_run_config(run_config), count)


def run_experiment(settings: ExperimentConfig, overrides: Sequence[str], run_dir: Path) -> Path:
    """Run the experiment that ``overrides`` compose as a Flower simulation (on forked workers,
    or on Ray with ``backend=ray``); returns ``run_dir``. With ``backend=fork`` on a GPU the
    run has a process of its own, forked from this one, which never uses CUDA itself
    (:func:`pflower.forkbackend.run_in_forked_process`).

    Raises:
        ConfigError: ``train.device=cuda`` on a machine without CUDA (checked before Ray starts).
    """
    from pflower.core.training import resolve_device

    forked = settings.backend.name == "fork"
    if forked:
        # torch's CUDA check without initializing CUDA, so that forked workers can use it
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    device = resolve_device(settings.train.device)  # fails here, not in the server or an actor
    if forked and device.type == "cuda":
        # The run's process uses CUDA (stage G), after which it could not fork workers again:
        # it is a child, and this process stays free of CUDA for a sweep's next job.
        from pflower.forkbackend import run_in_forked_process

        run_in_forked_process(functools.partial(_simulate, settings, overrides, run_dir))
    else:
        _simulate(settings, overrides, run_dir)
    return run_dir


def _simulate(settings: ExperimentConfig, overrides: Sequence[str], run_dir: Path) -> None:
    """Flower's simulation engine on this process: the ServerApp on a thread, the ClientApps on
    the backend's workers."""
    from flwr.app import Context, RecordDict
    from flwr.common.config import get_fused_config_from_dir
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.supercore.telemetry import EventType

    from pflower.client.app import app as client_app
    from pflower.server.app import app as server_app

    for key, value in QUIET_RAY_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    _scale_to_many_clients()
    overrides = [*overrides, f"output_dir={run_dir.resolve()}"]
    run = Run.create_empty(run_id=settings.seed + 1)
    run.override_config = {RUN_CONFIG_KEY: overrides_to_string(overrides)}
    run.primary_task_id = 1
    run.federation_id = NOOP_FEDERATION_ID
    run_config = get_fused_config_from_dir(app_dir(), run.override_config)
    server_context = Context(
        run_id=run.run_id, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    # The public ``run_simulation`` of Flower 1.39 takes no run config; this is the call that
    # Flower's own simulation runtime (``flwr run``) makes, with the app directory for defaults.
    with _backend_workers(settings, client_app, run_config):
        _run_simulation(
            num_supernodes=settings.num_clients,
            exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
            client_app=client_app,
            server_app=server_app,
            backend_name=settings.backend.name,
            backend_config=ray_backend_config(settings),
            server_app_context=server_context,
            app_dir=str(app_dir()),
            run=run,
            is_app=True,
        )
