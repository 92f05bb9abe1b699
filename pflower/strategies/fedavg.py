"""FedAvg (McMahan et al., 2017): clients train the global model; the server averages.

Stage L1 evaluates the global model itself (nothing is personalized); stage L2 the client's
locally trained copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from pflower.client.base import PersonalClient
from pflower.strategies.base import PersonalizedStrategy
from pflower.strategies.registry import ALGORITHMS, AlgorithmOptions


class FedAvgStrategy(PersonalizedStrategy["FedAvgOptions"]):
    """Sample-weighted (or uniform) averaging of the clients' trained models."""


class FedAvgClient(PersonalClient["FedAvgOptions"]):
    """Trains the received global model; evaluates it unchanged at stage L1."""


@ALGORITHMS.register("fedavg")
@dataclass(frozen=True)
class FedAvgOptions(AlgorithmOptions):
    strategy_class = FedAvgStrategy
    client_class = FedAvgClient
