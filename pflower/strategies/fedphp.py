r"""FedPHP: Li, Zhan, Zhang and Zhang, "FedPHP: Federated Personalization with Inherited Private
Models", ECML PKDD 2021 (Sec. 3, Algorithm 1), in the form the FedALA paper compares it
(Zhang et al., AAAI 2023, Table 2; $μ = 0.9$, $λ = 0.01$, Appendix G).

Client i keeps its local model $w_i$ (the "inherited private model"). In round R of T it

1. inherits: w ← (1 − $μ_R$) $Θ^{R−1} + μ_R w_i$ with $μ_R = μ$ · R / T (the private model's share
   grows over the run; round 1 starts from $Θ^0$);
2. trains w on $(1 − λ)\,\mathrm{CE} + λ\,\mathrm{MMD}^2(f_w(x), f_Θ(x))$ per batch, where f is the
body's
   feature vector ([`pflower.models.split.represent`][pflower.models.split.represent]) and $Θ$ =
   $Θ^{R−1}$ is the received
   global model, frozen; the kernel is a sum of Gaussians,
   $k(a, b) = \sum_{s ∈ \{10, 15, 20, 50\}} \exp(−\|a − b\|^2 / (2s))$, and
   $\mathrm{MMD}^2 = \operatorname{mean}(K_{aa} + K_{bb} − 2 K_{ab})$ over the batch (the biased
   estimate);
3. keeps w as $w_i$ and uploads w; the server averages as FedAvg does.

Stage L1 of round R evaluates the model round R+1 starts from, (1 − $μ_{R+1}$) $Θ^R + μ_{R+1} w_i$.

What crosses the wire: FedAvg's. Client state: ``fedphp_local``, $w_i$ after its last training.
``mu = 0`` and ``lam = 0`` is FedAvg exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from flwr.common import NDArrays, Scalar
from torch import nn

from pflower.api import (
    AlgorithmOptions,
    Collapse,
    PersonalClient,
    PersonalizedStrategy,
    register_algorithm,
)
from pflower.config import require
from pflower.core.client import server_round
from pflower.core.training import (
    Regularizer,
    TrainSettings,
    set_weights,
)
from pflower.models import split
from pflower.searchspace import tunable
from pflower.strategies.batches import optimizer_step, train_batches

LOCAL_MODEL = "fedphp_local"
BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)


def mmd(
    a: torch.Tensor, b: torch.Tensor, bandwidths: tuple[float, ...] = BANDWIDTHS
) -> torch.Tensor:
    """Biased MMD² between feature batches ``a`` and ``b`` with a sum of Gaussian kernels."""
    both = torch.cat([a, b])
    squared = torch.cdist(both, both).pow(2)
    kernel = torch.zeros_like(squared)
    for s in bandwidths:
        kernel = kernel + torch.exp(-squared / (2.0 * s))
    n = a.shape[0]
    return (kernel[:n, :n] + kernel[n:, n:] - 2.0 * kernel[:n, n:]).mean()


def inherit(mu_r: float, global_: NDArrays, local: NDArrays) -> NDArrays:
    """(1 − μ_R) Θ + μ_R w_i, every array (float arrays; others taken from Θ)."""
    return [
        ((1.0 - mu_r) * g + mu_r * w).astype(g.dtype) if np.issubdtype(g.dtype, np.floating) else g
        for g, w in zip(global_, local, strict=True)
    ]


class FedPHPStrategy(PersonalizedStrategy["FedPHPOptions"]):
    """Server side identical to FedAvg."""


class FedPHPClient(PersonalClient["FedPHPOptions"]):
    """Inherits its private model, trains with the MMD feature alignment to the global model."""

    def inherited(self, global_weights: NDArrays, fit_round: int) -> NDArrays:
        local = self.state.get_arrays(LOCAL_MODEL)
        if local is None:
            return global_weights
        mu_r = (
            self.options.mu
            * min(fit_round, self.experiment.settings.rounds)
            / (self.experiment.settings.rounds)
        )
        return inherit(mu_r, global_weights, local)

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self.inherited(global_weights, server_round(config))

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self.inherited(global_weights, server_round(config) + 1)

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        self.state.put_arrays(LOCAL_MODEL, trained)

    def local_train(
        self,
        settings: TrainSettings,
        config: dict[str, Scalar],
        regularizer: Regularizer | None = None,
        after_step: Callable[[nn.Module], None] | None = None,
    ) -> float:
        model, lam = self.model, self.options.lam
        frozen = copy.deepcopy(model)
        set_weights(frozen, self._received)
        frozen.eval()
        for param in frozen.parameters():
            param.requires_grad_(False)
        model.train()
        optimizer = settings.make_optimizer(model.parameters())
        total, batches = 0.0, 0
        for x, y in train_batches(self, settings, config):
            z = split.represent(model, x)
            ce = nn.functional.cross_entropy(split.head(model)(z), y)
            total += float(ce.detach())
            loss = (1.0 - lam) * ce
            if lam > 0:
                with torch.no_grad():
                    z_global = split.represent(frozen, x)
                loss = loss + lam * mmd(z, z_global)
            optimizer_step(optimizer, loss, model, regularizer, after_step)
            batches += 1
        return total / max(batches, 1)

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        self._received = parameters  # the frozen MMD reference Θ^{R−1}
        return super().fit(parameters, config)


_SEARCH_SOURCE = "FedPHP (Li et al., ECML-PKDD 2021), Sec. 5: around μ = 0.9, λ = 0.01"
"""Where the search ranges of μ and λ come from."""


@register_algorithm("fedphp", strategy=FedPHPStrategy, client=FedPHPClient)
@dataclass
class FedPHPOptions(AlgorithmOptions):
    """Attributes:
    mu: μ, the private model's final share in the inheritance (μ_R = μ R / T).
    lam: λ, the weight of the MMD feature alignment in the loss.
    """

    display_name: ClassVar[str] = "FedPHP"
    display_rank: ClassVar[int] = 260
    collapses: ClassVar[tuple[Collapse, ...]] = (
        Collapse("fedavg", (("mu", 0.0), ("lam", 0.0))),
    )  # μ = λ = 0 is FedAvg

    mu: float = tunable(0.9, low=0.5, high=0.99, source=_SEARCH_SOURCE)
    lam: float = tunable(0.01, low=1e-3, high=1.0, log=True, source=_SEARCH_SOURCE)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0.0 <= self.mu <= 1.0, f"strategy.mu must be in [0, 1], got {self.mu}")
        require(0.0 <= self.lam <= 1.0, f"strategy.lam must be in [0, 1], got {self.lam}")
