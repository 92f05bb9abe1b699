"""FedAvg (McMahan et al., 2017): clients train the global model; the server averages.

Stage L1 evaluates the global model itself (nothing is personalized); stage L2 the client's
locally trained copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pflower.api import AlgorithmOptions, PersonalClient, PersonalizedStrategy, register_algorithm


class FedAvgStrategy(PersonalizedStrategy["FedAvgOptions"]):
    """Sample-weighted (or uniform) averaging of the clients' trained models."""


class FedAvgClient(PersonalClient["FedAvgOptions"]):
    """Trains the received global model; evaluates it unchanged at stage L1."""


@register_algorithm("fedavg", strategy=FedAvgStrategy, client=FedAvgClient)
@dataclass
class FedAvgOptions(AlgorithmOptions):
    """FedAvg has only the common options (``aggregation``: weighted by n_k, as in the paper)."""

    display_name: ClassVar[str] = "FedAvg"
    display_rank: ClassVar[int] = 0
