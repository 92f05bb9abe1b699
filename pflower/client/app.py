"""The ClientApp: builds the configured algorithm's client for the node's partition."""

from __future__ import annotations

import logging

import torch
from flwr.app import Context
from flwr.client import Client, ClientApp

from pflower.compose import config_from_run_config
from pflower.core.algorithm import algorithm_of
from pflower.core.experiment import Experiment
from pflower.core.state import ClientState
from pflower.registry import ConfigError


class _QuietActorShutdown(logging.Filter):
    """Drops Flower's "Manually terminating ClientAppActor" warning. Flower logs it from every Ray
    actor at the normal end of every simulation, where nothing is wrong, and Ray forwards it to the
    user's console."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Manually terminating")


logging.getLogger("flwr").addFilter(_QuietActorShutdown())


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
    return (
        algorithm_of(options)
        .client(
            options=options,
            experiment=experiment,
            data=experiment.client_data(partition_id),
            model=experiment.shared_model(),
            state=ClientState(context.state),
        )
        .to_client()
    )


app = ClientApp(client_fn=client_fn)
