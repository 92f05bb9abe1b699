"""The ClientApp: builds the configured algorithm's client for the node's partition."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from flwr.app import Context
from flwr.client import Client, ClientApp
from omegaconf import DictConfig

from pflower.compose import compose_config, config_from_run_config, warm_config
from pflower.config import StateStore
from pflower.core.algorithm import algorithm_of
from pflower.core.checkpoint import PersistentClient
from pflower.core.experiment import Experiment
from pflower.core.state import ClientState
from pflower.core.training import import_first_step_modules
from pflower.registry import ConfigError
from pflower.runtime.logs import plain_flower_console_unless_tty
from pflower.runtime.packing import packed_arrays_mod
from pflower.runtime.raycluster import local_ray_under_flwr_simulation


class _QuietActorShutdown(logging.Filter):
    """Drops Flower's "Manually terminating ClientAppActor" warning. Flower logs it from every Ray
    actor at the normal end of every simulation, where nothing is wrong, and Ray forwards it to the
    user's console."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Manually terminating")


logging.getLogger("flwr").addFilter(_QuietActorShutdown())
plain_flower_console_unless_tty()
local_ray_under_flwr_simulation()  # `flwr run .`: Flower's engine imports this before ray.init


def client_fn(context: Context) -> Client:
    """The client of partition ``partition-id`` (node config), with the node's state."""
    cfg = config_from_run_config(context.run_config)
    experiment = Experiment.of(cfg)
    settings = experiment.settings
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    if num_partitions != settings.num_clients:
        raise ConfigError(
            f"this node belongs to a federation of {num_partitions} partitions but the experiment "
            f"has num_clients={settings.num_clients}; start {settings.num_clients} SuperNodes "
            f"with num-partitions={settings.num_clients}, or set num_clients={num_partitions}"
        )
    torch.set_num_threads(settings.train.threads)
    options = settings.strategy
    client = algorithm_of(options).client(
        options=options,
        experiment=experiment,
        data=experiment.client_data(partition_id),
        model=experiment.shared_model(),
        state=ClientState(context.state),
    )
    on_disk = settings.client_state.store == StateStore.disk
    state_dir = client_state_dir(cfg, context)
    if state_dir is None and on_disk:
        raise ConfigError(
            "client_state.store=disk needs a folder for the clients' state: set "
            "client_state.dir, output_dir, or the node config client-state-dir"
        )
    if state_dir is None or not (settings.checkpoint.every or on_disk):
        return client.to_client()
    return PersistentClient(client, context.state, state_dir, partition_id, on_disk).to_client()


def prepare_ahead(overrides: Sequence[str]) -> None:
    """Compose ``overrides`` (a run config's, as [`client_fn`][pflower.client.app.client_fn] sees
    them) and build that
    experiment's federation and shared model in this process's caches.

    The deployment's fork server ([`pflower.runtime.forkserver`][pflower.runtime.forkserver]) calls
    it for the runs its
    tasks served, so the tasks it forks afterwards skip loading the dataset, partitioning it and
    building the model (0.1-0.2 s per task); ``backend=fork`` calls it before it forks its
    workers ([`pflower.runtime.forkbackend`][pflower.runtime.forkbackend]). It runs torch on one
    thread and leaves it so:
    a process that forks must never have run torch's thread pool, or a child that runs torch on
    more than one thread hangs (GNU OpenMP; the children set their own ``train.threads``).
    """
    torch.set_num_threads(1)
    experiment = Experiment.of(warm_config(overrides))
    experiment.federation  # noqa: B018 - a cached property: built here, kept for the children
    experiment.shared_model()
    import_first_step_modules()  # torch._dynamo, 2-3 s on 2 cores: here, once for all children


def warm_up() -> None:
    """Compose the default configuration once: imports what Hydra loads lazily (the
    deployment's fork server calls it before it forks its first task)."""
    compose_config([])


def client_state_dir(cfg: DictConfig, context: Context) -> Path | None:
    """Where this node keeps its clients' state snapshots: the node config's
    ``client-state-dir``, else ``client_state.dir``, else ``<output_dir>/client_state``; None
    when none is known (a ``flwr run`` without ``output_dir``: the server then writes no
    checkpoint either)."""
    if "client-state-dir" in context.node_config:
        return Path(str(context.node_config["client-state-dir"]))
    if cfg.client_state.dir:
        return Path(cfg.client_state.dir)
    if cfg.output_dir:
        return Path(cfg.output_dir) / "client_state"
    return None


app = ClientApp(client_fn=client_fn, mods=[packed_arrays_mod])
