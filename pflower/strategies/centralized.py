"""Centralized reference: one model trained on the union of all clients' training data.

This is the "Supervised" row of FedMPR (Göksu & Pugeault, Tables II-III: "a ResNet18 trained on
both clients' datasets", Sec. VI), the upper reference the federated methods are compared with.

Each round one client (the sampled client with the smallest partition id) trains the global model
for the round's local epochs on the union of every client's training split, and the server adopts
the result. Over R rounds that is R·E epochs over all the data: the same number of sample passes
as FedAvg with full participation (with ``train.local_steps``, the trainer takes K times the
steps, K = ``num_clients``). The optimizer is the shared one, fresh every round, as for the
federated methods. Stage G is the model on the global test set; stage L1 evaluates it on every
client's own test split.

What crosses the wire: the model to the trainer and back (fit config ``server-round`` only); the
other clients only receive it for evaluation. No client or server state beyond the model.

Deviation: the union is normalized as clean data; partition schemes that perturb each client's
inputs (quality skew) are rejected, since their noise belongs to a client, not to the union.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
from flwr.common import Scalar
from flwr.server.client_proxy import ClientProxy
from torch import nn

from pflower.api import AlgorithmOptions, PersonalClient, PersonalizedStrategy, register_algorithm
from pflower.blocks import PartitionBlock, blocks
from pflower.config import require
from pflower.core.training import Prepare, Regularizer, TrainSettings
from pflower.datasets.base import ImageSplit
from pflower.registry import ConfigError


def _input_noise(partition: str) -> bool:
    """Whether partition scheme ``partition`` adds per-client input noise."""
    block = blocks("partition")[partition]
    return issubclass(block, PartitionBlock) and block.input_noise


class CentralizedStrategy(PersonalizedStrategy["CentralizedOptions"]):
    """Sends the fit instruction to one client only and adopts its model."""

    robust_aggregation: ClassVar[bool] = False

    def fit_clients(self, server_round: int, sampled: list[ClientProxy]) -> list[ClientProxy]:
        """One trainer: the sampled client with the lowest partition id (every client can reach
        the union of the training data, so which one trains does not matter)."""
        return [min(sampled, key=lambda proxy: self.partition(proxy))]


class CentralizedClient(PersonalClient["CentralizedOptions"]):
    """Trains on the union of all clients' training splits."""

    def union(self) -> ImageSplit:
        federation = self.experiment.federation
        if federation.input_noise is not None:
            raise ConfigError(
                "strategy=centralized trains on the union of the clients' data, which is not "
                "defined under per-client input noise (quality skew); choose another partition"
            )
        indices = np.concatenate([client.train for client in federation.clients])
        return federation.pool.subset(indices)

    def local_train(
        self,
        settings: TrainSettings,
        config: dict[str, Scalar],
        regularizer: Regularizer | None = None,
        after_step: Callable[[nn.Module], None] | None = None,
    ) -> float:
        """The round's budget on the union: ``local_steps`` scale with the number of clients."""
        if settings.steps is not None:
            settings = replace(
                settings, steps=settings.steps * self.experiment.settings.num_clients
            )
        return super().local_train(settings, config, regularizer, after_step)

    def training_data(self) -> tuple[ImageSplit, Prepare]:
        return self.union(), self.experiment.prepare()


@register_algorithm("centralized", strategy=CentralizedStrategy, client=CentralizedClient)
@dataclass
class CentralizedOptions(AlgorithmOptions):
    """The centralized reference has only the common options (one model, nothing averaged)."""

    display_name: ClassVar[str] = "Centralized"
    display_rank: ClassVar[int] = 90

    def check_experiment(self, settings: Any, model: Any) -> None:
        """The union of the clients' data does not exist under per-client input noise."""
        require(
            not _input_noise(settings.partition["name"]),
            "strategy=centralized trains on the union of the clients' data, which is not "
            f"defined under per-client input noise (partition={settings.partition['name']}); "
            "choose another partition",
        )
