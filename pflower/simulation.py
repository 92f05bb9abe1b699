"""Run one experiment as a Flower simulation in this process (what ``pflower <overrides>`` does).

The apps receive the experiment exactly as ``flwr run`` delivers it: the Hydra overrides (plus the
pinned run directory) in the run config, fused with the app's declared defaults; Flower's Ray
backend runs the ClientApps.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pflower.config import RUN_CONFIG_KEY, ExperimentConfig, app_dir, overrides_to_string

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


def run_experiment(settings: ExperimentConfig, overrides: Sequence[str], run_dir: Path) -> Path:
    """Run the experiment that ``overrides`` compose as a Ray simulation; returns ``run_dir``.

    Raises:
        ConfigError: ``train.device=cuda`` on a machine without CUDA (checked before Ray starts).
    """
    from pflower.core.training import resolve_device

    resolve_device(settings.train.device)  # fails here, not in the server or a Ray actor
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
    return run_dir
