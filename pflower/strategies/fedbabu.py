"""FedBABU: Oh, Kim and Yun, "FedBABU: Towards Enhanced Representation for Federated Image
Classification", ICLR 2022 (Sec. 4, Algorithm 1).

During federated training the head (the classifier) is never updated: it keeps its random
initialization $Θ^0$, and clients train and share only the body ("body update": the head's learning
rate is 0). The server averages the bodies weighted by $n_k$. For evaluation each client
fine-tunes the whole received model (body and head) on its training data for ``finetune_epochs``
epochs with the round's local optimizer settings, and evaluates that fine-tuned copy (stage L1);
the fine-tuned weights are never uploaded.

What crosses the wire: the full global model down (its head is $Θ^0$'s for the whole run); the body
up, with empty arrays for the unchanged head (the base's ``partial_uploads``). No client state.

Stage G evaluates the global model (trained body, initial head) before fine-tuning, as the paper
reports "before fine-tuning" beside "after".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

from flwr.common import NDArrays, Scalar
from torch import nn

from pflower.api import AlgorithmOptions, PersonalClient, PersonalizedStrategy, register_algorithm
from pflower.config import require
from pflower.core.training import Regularizer, TrainSettings, get_weights, set_weights
from pflower.models import split
from pflower.searchspace import tunable
from pflower.strategies.split import shared_arrays


class FedBABUStrategy(PersonalizedStrategy["FedBABUOptions"]):
    """FedAvg over the bodies; the global head stays Θ^0's."""

    partial_uploads: ClassVar[bool] = True


class FedBABUClient(PersonalClient["FedBABUOptions"]):
    """Trains the body under the frozen head; fine-tunes everything before evaluation."""

    def local_train(
        self,
        settings: TrainSettings,
        config: dict[str, Scalar],
        regularizer: Regularizer | None = None,
        after_step: Callable[[nn.Module], None] | None = None,
    ) -> float:
        with split.trainable_only(self.model, split.body_parameters(self.model)):
            return super().local_train(settings, config, regularizer, after_step)

    def upload(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> NDArrays:
        return shared_arrays(trained, split.head_mask(self.model))

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        set_weights(self.model, global_weights)
        settings = replace(
            self.train_settings(config), epochs=self.options.finetune_epochs, steps=None
        )
        PersonalClient.local_train(self, settings, config)  # the whole model, head included
        return get_weights(self.model)


@register_algorithm("fedbabu", strategy=FedBABUStrategy, client=FedBABUClient)
@dataclass
class FedBABUOptions(AlgorithmOptions):
    """Attributes:
    finetune_epochs: epochs of fine-tuning the whole model before evaluation (0: evaluate the
        global model as it is).
    """

    display_name: ClassVar[str] = "FedBABU"
    display_rank: ClassVar[int] = 230

    finetune_epochs: int = tunable(
        5,
        low=1,
        high=10,
        source="FedBABU (Oh et al., ICLR 2022), Sec. 4",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.finetune_epochs >= 0,
            f"strategy.finetune_epochs must be >= 0, got {self.finetune_epochs}",
        )
