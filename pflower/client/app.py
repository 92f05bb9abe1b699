"""The ClientApp: builds the configured algorithm's client for the node's partition."""

from __future__ import annotations

import torch
from flwr.app import Context
from flwr.client import Client, ClientApp

from pflower.client.state import ClientState
from pflower.config import config_from_run_config
from pflower.experiment import Experiment
from pflower.registry import ConfigError


def client_fn(context: Context) -> Client:
    cfg = config_from_run_config(context.run_config)
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    if num_partitions != cfg.num_clients:
        raise ConfigError(
            f"this node belongs to a federation of {num_partitions} partitions but the experiment "
            f"has num_clients={cfg.num_clients}; start {cfg.num_clients} SuperNodes with "
            f"num-partitions={cfg.num_clients}, or set num_clients={num_partitions}"
        )
    torch.set_num_threads(cfg.train.threads)
    experiment = Experiment.of(cfg)
    algorithm = experiment.algorithm
    return algorithm.client_class(
        options=algorithm,
        experiment=experiment,
        data=experiment.client_data(partition_id),
        model=experiment.shared_model(),
        state=ClientState(context.state),
    ).to_client()


app = ClientApp(client_fn=client_fn)
