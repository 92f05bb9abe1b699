"""FedRep: Collins, Hassani, Mokhtari and Shakkottai, "Exploiting Shared Representations for
Personalized Federated Learning", ICML 2021 (Sec. 3, Algorithm 1).

The model is a shared representation $φ$ (the body) and a client-specific head $h_i$. In round t
client i receives $φ^t$ and

1. updates its head for $τ$ epochs with the body frozen: $h_i$ ← GRD($f_i$(h, $φ^t$), h, $α$)
   (Alg. 1, the head loop, ``head_epochs`` = $τ$);
2. updates the body with its new head frozen: $φ_i^{t+1}$ ← GRD($f_i$($h_i$, $φ$), $φ$, $α$) for the
round's
   local epochs (``train.local_epochs``);
3. uploads $φ_i^{t+1}$ only; the server averages the bodies, weighted by $n_i$ (the paper's
   experiments; Alg. 1 writes the plain mean, ``aggregation=uniform``).

The head persists on the client across rounds; stage L1 evaluates the received body with the
client's head (what the client deploys before its next round of training). Both phases use the
round's optimizer settings (the paper uses one step size $α$ for both).

Identity: with ``head_epochs = 0`` the head is never trained, so step 2 trains the body under
$Θ^0$'s head, exactly FedBABU's federated training
([`pflower.strategies.fedbabu`][pflower.strategies.fedbabu]); both share
the body update path (stage L2 and the global body agree).

What crosses the wire: the split-model family's
([`pflower.strategies.split`][pflower.strategies.split]): the full
global model down, the body up (the head as empty arrays). Client state: ``split_personal``, the
head $h_i$. The head phase draws its batch order from its own seeded stream; the body phase from
the same stream as every algorithm's local training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

from flwr.common import Scalar
from torch import nn

from pflower.api import AlgorithmOptions, register_algorithm
from pflower.config import require
from pflower.core.training import Regularizer, TrainSettings, train
from pflower.models import split
from pflower.searchspace import tunable
from pflower.strategies.batches import data_generator
from pflower.strategies.split import SplitClient, SplitStrategy


class FedRepStrategy(SplitStrategy):
    """FedAvg over the representation (body)."""


class FedRepClient(SplitClient):
    """Head epochs with the body frozen, then body epochs with the head frozen; body upload."""

    def local_train(
        self,
        settings: TrainSettings,
        config: dict[str, Scalar],
        regularizer: Regularizer | None = None,
        after_step: Callable[[nn.Module], None] | None = None,
    ) -> float:
        if self.options.head_epochs > 0:
            head_settings = replace(settings, epochs=self.options.head_epochs, steps=None)
            with split.trainable_only(self.model, split.head_parameters(self.model)):
                train(
                    self.model,
                    self.data.train,
                    self.data.prepare,
                    head_settings,
                    data_generator(self, config, 1),
                    regularizer,
                    after_step,
                )
        with split.trainable_only(self.model, split.body_parameters(self.model)):
            return super().local_train(settings, config, regularizer, after_step)


@register_algorithm("fedrep", strategy=FedRepStrategy, client=FedRepClient)
@dataclass
class FedRepOptions(AlgorithmOptions):
    """Attributes:
    head_epochs: τ, epochs of head training per round before the body epochs (FedALA's
        comparison uses 5).
    """

    display_name: ClassVar[str] = "FedRep"
    display_rank: ClassVar[int] = 220

    head_epochs: int = tunable(
        5, low=1, high=10, source="FedRep (Collins et al., ICML 2021); FedALA's baseline grid 1-10"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.head_epochs >= 0, f"strategy.head_epochs must be >= 0, got {self.head_epochs}")
