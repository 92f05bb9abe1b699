r"""FedAvg-C / FedProx-C: FedAvg or FedProx (Li et al., MLSys 2020) in which every client
fine-tunes the received global model before using it, as the FedALA paper compares them (Zhang
et al., AAAI 2023, Sec. "Experimental Setup": "FedAvg-C and FedProx-C, which locally fine-tune
the global model for local initialization at each iteration"; Table 2).

Each round client k receives $Θ^{t-1}$, fine-tunes a copy for ``finetune_epochs`` epochs of plain
SGD on its training data (the round's optimizer settings, no proximal term), evaluates that
fine-tuned model (stage L1), and, with ``finetune_init`` (default, the paper's "for local
initialization"), continues its local training from it: FedProx's loss
$F_k(w) + \frac{μ}{2}\|w − Θ^{t-1}\|^2$, the anchor being the *received* model, then uploads the
trained w. The server averages as FedAvg does. ``mu = 0`` is FedAvg-C.

The fine-tuning is deterministic in the global model version it starts from (its batch order is
seeded by that version), so the model evaluated at stage L1 of round t is exactly the model fit of
round t+1 starts from (as long as the learning rate does not decay between the two rounds); no
client state is needed.

Identity: ``finetune_init = false, mu = 0`` is FedAvg-FT
    ([`pflower.strategies.fedavg_ft`][pflower.strategies.fedavg_ft])
exactly. The paper gives no fine-tuning length; Table 3's cost (about 15x FedAvg per round)
suggests many epochs: ``finetune_epochs`` is the knob.

What crosses the wire: FedAvg's (the full model each way, ``server-round``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from flwr.common import NDArrays, Scalar

from pflower.api import Collapse, PersonalizedStrategy, register_algorithm
from pflower.config import require
from pflower.core.client import server_round
from pflower.core.training import get_weights, set_weights
from pflower.searchspace import tunable
from pflower.strategies.fedprox import FedProxClient, FedProxOptions, tunable_mu


class FedProxFTStrategy(PersonalizedStrategy["FedProxFTOptions"]):
    """Server side identical to FedAvg."""


class FedProxFTClient(FedProxClient["FedProxFTOptions"]):
    """Fine-tunes the received model; evaluates it and trains on from it with FedProx's loss."""

    def finetuned(self, received: NDArrays, version: int, config: dict[str, Scalar]) -> NDArrays:
        """``received`` (global model ``version``) after ``finetune_epochs`` of plain SGD."""
        set_weights(self.model, received)
        settings = replace(
            self.train_settings(config), epochs=self.options.finetune_epochs, steps=None
        )
        self.local_train(settings, {**config, "server-round": version})
        return get_weights(self.model)

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        if not self.options.finetune_init:
            return global_weights
        return self.finetuned(global_weights, server_round(config) - 1, config)

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self.finetuned(global_weights, server_round(config), config)


@register_algorithm("fedprox_ft", strategy=FedProxFTStrategy, client=FedProxFTClient)
@dataclass
class FedProxFTOptions(FedProxOptions):
    """Attributes:
    mu: FedProx's proximal weight μ (0: FedAvg-C; the FedALA paper uses 0.001).
    finetune_epochs: epochs of fine-tuning the received model each round.
    finetune_init: start local training from the fine-tuned model (the paper's FedAvg-C); false
        starts it from the received model and fine-tunes only for evaluation.
    """

    display_name: ClassVar[str] = "FedProx-C"
    display_rank: ClassVar[int] = 3
    collapses: ClassVar[tuple[Collapse, ...]] = ()  # μ = 0 is FedAvg-C, which its label names

    mu: float = tunable_mu(0.001)
    finetune_epochs: int = tunable(
        1,
        low=1,
        high=10,
        source="FedALA (Zhang et al., AAAI 2023), FedAvg-C; the top as FedBABU's",
    )
    finetune_init: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.finetune_epochs >= 0,
            f"strategy.finetune_epochs must be >= 0, got {self.finetune_epochs}",
        )

    def label(self) -> str:
        """``FedAvg-C`` for μ = 0, else ``FedProx-C``."""
        return "FedAvg-C" if self.mu == 0 else self.display_name

    def label_keys(self) -> tuple[str, ...]:
        return ("mu",)
