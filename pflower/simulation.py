"""Run one experiment as a Flower simulation in this process (what ``pflower <overrides>`` does).

The apps receive the experiment exactly as ``flwr run`` delivers it: the run record (the Hydra
overrides, the run directory, the resume point:
[`RunRecord.to_run_config`][pflower.config.record.RunRecord.to_run_config]) in the run config,
fused with the app's declared defaults. Processes forked
from this one run the ClientApps (``backend=fork``, the default:
[`pflower.runtime.forkbackend`][pflower.runtime.forkbackend]), or Flower's Ray backend
(``backend=ray``,
``backend=ray_cluster``). Two parts of Flower's simulation engine that cost time in proportion to
the population rather than to the sampled clients are replaced for these runs
([`pflower.runtime.engine.scaled_to_many_clients`][pflower.runtime.engine.scaled_to_many_clients]):
with them, a round of 100 clients out of
10,000 takes seconds. Everything here that touches Flower's or Ray's internals is in
[`pflower.runtime`][pflower.runtime].
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from typing import Any

from pflower.config import ExperimentConfig, RunRecord, app_dir

QUIET_RAY_ENVIRONMENT = {
    # Ray >= 2.48 warns on every start that it will stop clearing CUDA_VISIBLE_DEVICES for
    # actors with num_gpus=0; pflower sets GPU resources explicitly, so opt in to the new rule.
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}
"""Environment for Ray that keeps its start-up notices off a run's console."""


def ray_backend_config(settings: ExperimentConfig) -> dict[str, Any]:
    """Flower's Ray backend settings from the ``backend`` config group: a local Ray of the
    run's own, or the cluster asked for once it answers
    ([`pflower.runtime.raycluster.ray_address`][pflower.runtime.raycluster.ray_address]; only for
    ``backend=ray``).

    Raises:
        RayClusterUnreachable: the cluster asked for does not answer.
    """
    backend = settings.backend
    init_args: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
    if backend.name == "ray":
        from pflower.runtime.raycluster import ray_address

        init_args["address"] = ray_address(backend.address)
    return {
        "client_resources": {
            "num_cpus": backend.num_cpus_per_client,
            "num_gpus": backend.num_gpus_per_client,
        },
        "init_args": init_args,
    }


@contextlib.contextmanager
def _ray_workers() -> Iterator[None]:
    """Flower's Ray backend, its head lean and pflower's signal handlers kept."""
    from pflower.runtime.engine import lean_ray_head, ray_keeps_signal_handlers

    with lean_ray_head(), ray_keeps_signal_handlers():
        yield


def _backend_workers(
    settings: ExperimentConfig, client_app: Any, record: RunRecord
) -> contextlib.AbstractContextManager[None]:
    """What runs the engine's ClientApps: forked workers for ``backend=fork``, else Ray (with a
    lean head, leaving pflower's signal handlers in place)."""
    backend = settings.backend
    if backend.name != "fork":
        return _ray_workers()
    from pflower.client.app import prepare_ahead
    from pflower.runtime.forkbackend import default_worker_count, forked_workers

    count = backend.workers or default_worker_count(backend.num_cpus_per_client)
    prepare = functools.partial(prepare_ahead, record.to_overrides())
    return forked_workers(client_app, prepare, count)


def run_experiment(settings: ExperimentConfig, record: RunRecord) -> None:
    """Run ``record`` (whose typed settings are ``settings``) as a Flower simulation (on forked
    workers, or on Ray with ``backend=ray``). With ``backend=fork`` on a GPU the
    run has a process of its own, forked from this one, which never uses CUDA itself
    ([`pflower.runtime.forkbackend.run_in_forked_process`][pflower.runtime.forkbackend.run_in_forked_process]).

    Raises:
        ConfigError: ``train.device=cuda`` on a machine without CUDA (checked before Ray starts).
    """
    from pflower.core.training import resolve_device

    _check_numerics(settings)
    forked = settings.backend.name == "fork"
    if forked:
        from pflower.runtime.forkbackend import NVML_CUDA_CHECK

        # torch's CUDA check without initializing CUDA, so that forked workers can use it
        os.environ.setdefault(NVML_CUDA_CHECK, "1")
    device = resolve_device(settings.train.device)  # fails here, not in the server or an actor
    if forked and device.type == "cuda":
        # The run's process uses CUDA (stage G), after which it could not fork workers again:
        # it is a child, and this process stays free of CUDA for a sweep's next job.
        from pflower.runtime.forkbackend import run_in_forked_process

        run_in_forked_process(functools.partial(_simulate, settings, record))
    else:
        _simulate(settings, record)


def _check_numerics(settings: ExperimentConfig) -> None:
    """Warn, in one line, where this process's CPU kernels are not held as ``numerics`` asks
    (a CPU without AVX2, torch imported before pflower, a sweep over ``numerics``): the run goes on,
    and ``summary.json`` records the numerics it had
    ([`pflower.provenance.numerics`][pflower.provenance.numerics])."""
    import torch  # noqa: F401  (numerics are those of the imported torch)

    from pflower.provenance import numerics

    held = numerics()
    if held["mode"] != settings.numerics.value:
        reason = held.get("not_held") or "the kernels were chosen before this run's config"
        logging.getLogger(__name__).warning(
            "numerics=%s asked, but this process runs %s CPU kernels (%s); summary.json "
            "records what ran",
            settings.numerics.value,
            held["cpu_capability"],
            reason,
        )


def _simulate(settings: ExperimentConfig, record: RunRecord) -> None:
    """Flower's simulation engine on this process: the ServerApp on a thread, the ClientApps on
    the backend's workers."""
    from flwr.app import Context, RecordDict

    from pflower.client.app import app as client_app
    from pflower.runtime.engine import fused_run_config, run_engine
    from pflower.server.app import app as server_app

    for key, value in QUIET_RAY_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    run_id = settings.seed + 1
    override_config = record.to_run_config()
    run_config = fused_run_config(app_dir(), override_config)
    server_context = Context(
        run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    with _backend_workers(settings, client_app, record):
        run_engine(
            client_app=client_app,
            server_app=server_app,
            num_supernodes=settings.num_clients,
            backend_name=settings.backend.name,
            backend_config=ray_backend_config(settings),
            run_id=run_id,
            override_config=override_config,
            app_dir=app_dir(),
            server_context=server_context,
        )
