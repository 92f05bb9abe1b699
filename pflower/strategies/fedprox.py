"""FedProx (Li et al., MLSys 2020): FedAvg with a proximal term on the client.

Each client minimizes ``loss + mu/2 * ||w - w_global||^2`` during local training; the server
averages as FedAvg does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from flwr.common import NDArrays, Scalar
from torch import nn

from pflower.client.base import PersonalClient
from pflower.client.training import Regularizer
from pflower.registry import ConfigError
from pflower.strategies.base import PersonalizedStrategy
from pflower.strategies.registry import ALGORITHMS, AlgorithmOptions


class FedProxStrategy(PersonalizedStrategy["FedProxOptions"]):
    """Server side identical to FedAvg."""


class FedProxClient(PersonalClient["FedProxOptions"]):
    """Adds the proximal term ``mu/2 ||w - w_global||^2`` to the local loss."""

    def regularizer(self, global_weights: NDArrays, config: dict[str, Scalar]) -> Regularizer:
        mu = self.options.mu
        names = list(self.model.state_dict())
        anchors = {
            name: torch.from_numpy(array).clone()
            for name, array in zip(names, global_weights, strict=True)
        }

        def proximal_term(model: nn.Module) -> torch.Tensor:
            squared = [
                (param - anchors[name]).pow(2).sum() for name, param in model.named_parameters()
            ]
            return 0.5 * mu * torch.stack(squared).sum()

        return proximal_term


@ALGORITHMS.register("fedprox")
@dataclass(frozen=True)
class FedProxOptions(AlgorithmOptions):
    """Attributes:
    mu: weight of the proximal term (0 gives FedAvg).
    """

    strategy_class = FedProxStrategy
    client_class = FedProxClient

    mu: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mu < 0:
            raise ConfigError(f"strategy.mu must be >= 0, got {self.mu}")
