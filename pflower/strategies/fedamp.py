r"""FedAMP: Huang, Chu, Zhou, Wang, Liu, Pei and Zhang, "Personalized Cross-Silo Federated
Learning on Non-IID Data", AAAI 2021 (a baseline of the DiversiFed paper, Wu et al., Sec. V-B).

Attentive message passing by incremental proximal steps (FedAMP's Alg. 1):

- server: for every sampled client i, with the stored models $w_j$ of the other clients,
  $ξ_{ij} = α_K \exp(−\|w_i − w_j\|^2/σ)/σ$ ($j ≠ i$; the attention-inducing function A(x) =
  −exp(−x/$σ$) of the paper's experiments, A'(x) = exp(−x/$σ$)/$σ$),
  $ξ_{ii} = 1 − \sum _{j≠i} ξ_{ij}$, $u_i = \sum _j ξ_{ij} w_j$ (a convex combination while
  $\sum _{j≠i} ξ_{ij} ≤ 1$);
- client: from its own $w_i$ (not from $u_i$), minimize
  $\mathrm{CE}_i(w) + \frac{λ}{2α_K}\|w − u_i\|^2$ with the configured local training. The proximal
  term is a real, differentiable term (PFLlib's FedAMP adds it on ``.data`` tensors, which
  contributes no gradient; not copied).

Guard (pflower's, not in the paper): the paper requires $α_K$ small enough for $ξ_{ii} ≥ 0.$ When
the off-diagonal weights of a client sum above 1 they are rescaled to sum to exactly 1
($ξ_{ii} = 0$: $u_i$ is the attention-weighted mean of the *other* models), and a log line says so
each time (``strategy.guard_events`` counts them). As $σ$ grows with $α_K/σ ≥ 1$/(m−1), every client
is sent the plain mean of the others.

$α_K$ decays by ``alpha_decay`` every ``alpha_decay_every`` rounds (the step decay of the DiversiFed
authors' FedAMP configuration, ×0.1 every 30 rounds; 1.0 keeps it constant). Distances are over
the trainable parameters (BatchNorm statistics stay personal).

What crosses the wire: fit sends each sampled client its own $u_i$ (all ``state_dict`` arrays;
buffers copied from the client's stored model, never read) with config ``server-round`` and
``fedamp-alpha-k`` (the round's $α_K$, used in the client's $λ/(2α_K)$); the client uploads its
trained $w_i$. Server state: the base class's ClientModelStore (latest upload per partition id;
$Θ^0$ for a client never sampled). No global model: stage G evaluates the mean of the stored
models (labelled ``mean_of_client_models``). Client state: ``fedamp_personal``, its $w_i$ (read at
fit and at evaluate: stage L1 is the personalized model); a client first sampled after round 1
starts from $Θ^0$.
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import WARNING
from typing import ClassVar

import numpy as np
from flwr.common import NDArrays, Scalar
from flwr.common.logger import log

from pflower.api import register_algorithm
from pflower.config import require
from pflower.core.declared import state
from pflower.core.options import Collapse
from pflower.core.training import Regularizer
from pflower.searchspace import tunable
from pflower.strategies.model_mixing import (
    MixingOptions,
    ModelMixingStrategy,
    Neighbors,
    OwnModelClient,
    pairwise_distances,
)
from pflower.strategies.proximal import proximal_to

PERSONAL = "fedamp_personal"
"""Client state: the personalized model w_i (all ``state_dict`` arrays)."""
ALPHA_KEY = "fedamp-alpha-k"


def attention_weights(
    squared_distances: np.ndarray, alpha_k: float, sigma: float
) -> tuple[np.ndarray, list[tuple[int, float]]]:
    """Ξ of FedAMP's server step from ‖w_i − w_j‖², and the rows the guard rescaled (with the
    off-diagonal sum before rescaling). Rows sum to 1."""
    xi = alpha_k * np.exp(-squared_distances / sigma) / sigma
    np.fill_diagonal(xi, 0.0)
    rescaled = []
    for i, total in enumerate(xi.sum(axis=1)):
        if total > 1.0:
            xi[i] /= total
            rescaled.append((i, float(total)))
    np.fill_diagonal(xi, 1.0 - xi.sum(axis=1))
    return xi, rescaled


def alpha_at(options: FedAMPOptions, server_round: int) -> float:
    """α_K in round ``server_round`` (step decay)."""
    return options.alpha_k * options.alpha_decay ** (
        (server_round - 1) // options.alpha_decay_every
    )


class FedAMPStrategy(ModelMixingStrategy["FedAMPOptions"]):
    """The server's attentive message passing from the stored client models."""

    guard_events: list[tuple[int, int, float]] = state([])
    """(round, partition id, off-diagonal sum) each time the guard rescaled a row."""

    def fit_config(self, server_round: int, partition_id: int) -> dict[str, Scalar]:
        return {
            **super().fit_config(server_round, partition_id),
            ALPHA_KEY: self.alpha(server_round),
        }

    def alpha(self, server_round: int) -> float:
        return alpha_at(self.options, server_round)

    def mixing(self, server_round: int, neighbors: list[int], vectors: np.ndarray) -> np.ndarray:
        xi, rescaled = attention_weights(
            pairwise_distances(vectors, squared=True), self.alpha(server_round), self.options.sigma
        )
        for row, total in rescaled:
            self.guard_events.append((server_round, neighbors[row], total))
            log(
                WARNING,
                "FedAMP round %s, client %s: off-diagonal weights sum to %.4g > 1; rescaled to "
                "sum to 1 (the client is sent the weighted mean of the others)",
                server_round,
                neighbors[row],
                total,
            )
        return xi


class FedAMPClient(OwnModelClient["FedAMPOptions"]):
    """Trains its own w_i with the pull (λ/(2α_K))‖w − u_i‖² toward the received u_i."""

    model_key: ClassVar[str] = PERSONAL

    def regularizer(
        self, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> Regularizer | None:
        if self.options.lam == 0:
            return None
        alpha_k = float(config[ALPHA_KEY])
        return proximal_to(self.model, global_weights, self.options.lam / alpha_k)


_SEARCH_SOURCE = "FedAMP (Huang et al., AAAI 2021), Sec. 5: around α_K = 1e4, σ = 100, λ = 1"
"""Where the search ranges of α_K, σ and λ come from."""


@register_algorithm("fedamp", strategy=FedAMPStrategy, client=FedAMPClient)
@dataclass
class FedAMPOptions(MixingOptions):
    """Attributes:
    alpha_k: α_K, the server's step size (weights α_K·A'(d²)).
    sigma: σ of the attention function exp(−d²/σ)/σ (match the squared-distance scale).
    lam: λ; the client's proximal weight is λ/(2α_K) (0 gives local training).
    alpha_decay: factor applied to α_K every ``alpha_decay_every`` rounds (1 = constant).
    alpha_decay_every: rounds between decays.
    neighbors: ``participants`` (this round's) or ``all_stale`` (every client's latest upload).
    """

    display_name: ClassVar[str] = "FedAMP"
    display_rank: ClassVar[int] = 40
    collapses: ClassVar[tuple[Collapse, ...]] = (
        Collapse("local", (("lam", 0.0),)),
    )  # λ = 0 is local training

    alpha_k: float = tunable(1e4, low=1e3, high=1e5, log=True, source=_SEARCH_SOURCE)
    sigma: float = tunable(100.0, choices=(1.0, 10.0, 100.0), source=_SEARCH_SOURCE)
    lam: float = tunable(
        1.0,
        low=0.1,
        high=1e4,
        log=True,
        source=(
            f"{_SEARCH_SOURCE}; λ up to 1e4 so that the client's pull λ/α_K (at most 0.01 within "
            "the paper's values) spans FedProx's μ and Ditto's λ ranges, up to 1 (1e3 first; "
            "tuning chose 716 on MNIST)"
        ),
    )
    alpha_decay: float = 0.1
    alpha_decay_every: int = 30
    neighbors: Neighbors = Neighbors.participants

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.alpha_k > 0, f"strategy.alpha_k must be > 0, got {self.alpha_k}")
        require(self.sigma > 0, f"strategy.sigma must be > 0, got {self.sigma}")
        require(self.lam >= 0, f"strategy.lam must be >= 0, got {self.lam}")
        require(
            0 < self.alpha_decay <= 1,
            f"strategy.alpha_decay must be in (0, 1], got {self.alpha_decay}",
        )
        require(
            self.alpha_decay_every >= 1,
            f"strategy.alpha_decay_every must be >= 1, got {self.alpha_decay_every}",
        )
