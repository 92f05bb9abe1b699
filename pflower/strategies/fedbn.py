"""FedBN: Li, Jiang, Zhang, Kamp and Dou, "FedBN: Federated Learning on Non-IID Features via
Local Batch Normalization", ICLR 2021 (Sec. 4, Algorithm 1).

FedAvg in which every BatchNorm layer stays local: its affine parameters ($γ$, $β$) and its running
statistics are never uploaded and never overwritten by the server (Alg. 1: "aggregate all
parameters except BN"). Each round the client starts from the received non-BN parameters and its
own BN layers, trains the whole model, and uploads the non-BN arrays; the server averages them
weighted by $n_k$. Stage L1 evaluates received model + own BN layers.

Which arrays are BatchNorm is read from the model
([`pflower.models.split.batchnorm_mask`][pflower.models.split.batchnorm_mask]),
so FedBN runs on every model; on a model without BatchNorm it is FedAvg exactly.

What crosses the wire: the split-model family's
([`pflower.strategies.split`][pflower.strategies.split]), with the BN
arrays as the personal ones. Client state: ``split_personal``, the client's BN parameters and
statistics.

Deviation: the global model has $Θ^0$'s BN layers, so there is no stage G.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pflower.api import AlgorithmOptions, register_algorithm
from pflower.models import split
from pflower.strategies.split import SplitClient, SplitStrategy


class FedBNStrategy(SplitStrategy):
    """FedAvg over every array except BatchNorm's."""


class FedBNClient(SplitClient):
    """Keeps its BatchNorm layers (parameters and statistics) local."""

    def personal_mask(self) -> list[bool]:
        return split.batchnorm_mask(self.model)


@register_algorithm("fedbn", strategy=FedBNStrategy, client=FedBNClient)
@dataclass
class FedBNOptions(AlgorithmOptions):
    """FedBN has only the common options."""

    display_name: ClassVar[str] = "FedBN"
    display_rank: ClassVar[int] = 210

    @classmethod
    def collapse_on(cls, model: Any) -> str | None:
        """FedAvg, on a model without BatchNorm: nothing is kept local."""
        return None if any(split.batchnorm_mask(model)) else "fedavg"
