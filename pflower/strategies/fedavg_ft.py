"""FedAvg + fine-tuning (FedAvg-FT): FedAvg, personalized by a few local epochs before use.

Training and aggregation are FedAvg's. The deployable model at stage L1 is the global model
fine-tuned for ``finetune_epochs`` epochs on the client's train split, with the round's local
optimizer settings; the fine-tuned weights are never uploaded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from flwr.common import NDArrays, Scalar

from pflower.api import (
    AlgorithmOptions,
    Collapse,
    PersonalClient,
    PersonalizedStrategy,
    register_algorithm,
)
from pflower.config import require
from pflower.core.training import get_weights, set_weights
from pflower.searchspace import tunable


class FedAvgFTStrategy(PersonalizedStrategy["FedAvgFTOptions"]):
    """Server side identical to FedAvg."""


class FedAvgFTClient(PersonalClient["FedAvgFTOptions"]):
    """Fine-tunes the global model locally before evaluating it at stage L1."""

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        set_weights(self.model, global_weights)
        settings = replace(
            self.train_settings(config), epochs=self.options.finetune_epochs, steps=None
        )
        self.local_train(settings, config)
        return get_weights(self.model)


@register_algorithm("fedavg_ft", strategy=FedAvgFTStrategy, client=FedAvgFTClient)
@dataclass
class FedAvgFTOptions(AlgorithmOptions):
    """Attributes:
    finetune_epochs: local epochs of fine-tuning before evaluation (0 gives FedAvg).
    """

    display_name: ClassVar[str] = "FedAvg-FT"
    display_rank: ClassVar[int] = 2
    collapses: ClassVar[tuple[Collapse, ...]] = (
        Collapse("fedavg", (("finetune_epochs", 0),)),
    )  # no fine-tuning is FedAvg

    finetune_epochs: int = tunable(
        1,
        low=1,
        high=5,
        source="FedAvg-C in FedALA (Zhang et al., AAAI 2023)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.finetune_epochs >= 0,
            f"strategy.finetune_epochs must be >= 0, got {self.finetune_epochs}",
        )
