r"""DiversiFed: Wu, Liu, Niu, Zhu, Tang, Li and Cao, "The Diversity Bonus: Learning from Dissimilar
Distributed Clients in Personalized Federated Learning", arXiv 2407.15464 (IEEE TNNLS 2025).

Every client i keeps a personalized model $w_i$ and minimizes $\mathrm{CE}_i(w_i) + λ L_M(w_i)$
(Sec. III-C, Eq. 3), where the model distance loss (Eq. 4) over the other clients j ∈ S∖{i}, with
$d_{ij} = \|w_i − w_j\|_2$ (Euclidean distance in parameter space) and temperature $τ$, is

$$
L_M(w_i) = \sum_j \log \frac{\exp(τ d_{ij})}{\sum_k \exp(τ d_{ik})} = \sum_j \log q_{ij},
\qquad q_i = \operatorname{softmax}_j(τ d_{ij}).
$$

Minimizing it attracts $w_i$ to each $w_j$ through the numerator and repels it from all through the
denominator (Sec. III-C); the net force along $(w_j − w_i)$ is $c_{ij} = τ$(1 − (m−1) $q_{ij}$),
positive (attraction) for relatively near models and negative (repulsion) for relatively far ones,
which is Lemma 1's sign rule and the three-model example of Fig. 4. The printed copy of the paper
lost the formula of Eq. 4; this form is the one that reproduces Fig. 4 and Lemma 1 (the InfoNCE
sign, exp(−$τ$·d), would equalize distances instead).

How $τ$ scales the distance (``tau_scale``). The paper's text says a larger $τ$ strengthens both the
attraction and the repulsion (Sec. V-G, V-H, the $τ$ studies of Tables IV-VI). With the distance
multiplied, $τ$·d (``tau_scale=multiply``, the default), it does: every force is $τ$ times a factor
that sharpens with $τ$, so the pull toward near models and the push from the farthest both grow.
With the distance divided, d/$τ$ (``tau_scale=divide``, a temperature in the InfoNCE sense, which
is how pflower first reconstructed Eq. 4), forces fall roughly as $1/τ$, the opposite of the
paper's description. The default follows the paper's description; results pflower published
before this option existed were made with ``divide``, and ``strategy.tau_scale=divide``
reproduces them (the run's ``config.yaml`` records which was used).

Incremental proximal optimization (Sec. III-D):

- server, Eq. 6: one gradient step per sampled client,
  $u_i = w_i − η ∇_{w_i} L_M(w_i) = ξ_{ii} w_i + \sum _{j≠i} ξ_{ij} w_j$ with
  $ξ_{ij} = η c_{ij} / d_{ij}$ and $ξ_{ii} = 1 − \sum _{j≠i} ξ_{ij}$ (Lemma 1: $u_i$ is an affine
  combination of the uploaded models, so no client can recover another's model). Softmax in float64
  with the max subtracted; $ξ_{ij} = 0$ where $d_{ij}$ < ``eps_dist`` (subgradient at 0), so round
  1, where every model is $Θ^0$, sends $Θ^0$;
- client, Eq. 7: from its own $w_i$ (not from $u_i$), minimize
  $\mathrm{CE}_i(w) + \frac{λ}{2η}\|w − u_i\|^2$ with the configured local training; the first
  step's proximal gradient equals $λ∇L_M(w_i)$. The paper's copy lost the coefficient; $λ$/(2η) is
  the incremental-proximal convention of FedAMP (the paper's ref. [11]) on which Sec. III-D builds.

What crosses the wire: fit sends each sampled client its own $u_i$ (all ``state_dict`` arrays: the
trainable parameters mixed as above, BatchNorm buffers copied from the client's stored model,
which the client never reads) with config ``server-round``; the client uploads its trained $w_i$
(all arrays). $λ$, $η$, $τ$ and the other keys are read by both sides from ``strategy.*``. Evaluate
sends the server's stage-G model, which the client ignores: stage L1 is its personalized $w_i$.

Server state: [`client_models`][pflower.strategies.diversifed.DiversiFedStrategy.client_models] (the
base class's ClientModelStore, keyed by partition id),
the latest upload of every client; a client never sampled counts as $Θ^0$. There is no global
model: stage G evaluates the mean of the stored models (labelled ``mean_of_client_models``),
for reference only. Client state: ``div_personal``, its personalized model (parameters and
BatchNorm buffers), read at fit (start point) and evaluate, written after fit; a client first
sampled after round 1 starts from $Θ^0$, never from $u_i$.

Options beyond the paper's defaults (not in the paper; for ablations):
``distance=l2_sq`` uses squared distances ($ξ_{ij}$ = 2η $c_{ij}$); ``grad_mode=full`` steps on
$\sum _k L_M(w_k) (c_{ij} + c_{ji})$; ``neighbors=all_stale`` uses every client's latest upload
instead of only this round's participants (the default, m = |$S_t$|: Sec. V-I attributes the loss at
50% participation to the absent clients' missing information); ``start_from=target`` starts local
training from $u_i$.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

import numpy as np
from flwr.common import NDArrays, Scalar

from pflower.api import Collapse, register_algorithm
from pflower.config import require
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

PERSONAL = "div_personal"
"""Client state: the personalized model w_i (all ``state_dict`` arrays)."""


class Distance(StrEnum):
    """The distance d_ij of Eq. 4."""

    l2 = "l2"
    """‖w_i − w_j‖₂, the paper's Euclidean distance."""
    l2_sq = "l2_sq"
    """‖w_i − w_j‖₂² (ablation)."""


class TauScale(StrEnum):
    """How τ enters Eq. 4's softmax."""

    multiply = "multiply"
    """τ·d_ij: a larger τ strengthens attraction and repulsion (the paper's Sec. V-G, V-H)."""
    divide = "divide"
    """d_ij/τ: a temperature; forces fall roughly as 1/τ (pflower's first reconstruction)."""


class GradMode(StrEnum):
    """Which loss the server's step (Eq. 6) differentiates with respect to w_i."""

    per_client = "per_client"
    """L_M(w_i) alone, the other models fixed (each client's own objective, Eq. 3)."""
    full = "full"
    """Σ_k L_M(w_k), the global objective (Sec. IV)."""


class StartFrom(StrEnum):
    """Where a client's local training starts."""

    personal = "personal"
    """Its own w_i (incremental proximal step, Eq. 7)."""
    target = "target"
    """The received u_i (ablation)."""


# ----------------------------------------------------------------------------- server math
def force_coefficients(
    distances: np.ndarray, tau: float, tau_scale: TauScale = TauScale.multiply
) -> np.ndarray:
    """c_ij = ∂L_M(w_i)/∂d_ij = s(1 − (m−1) q_ij) with q_i = softmax_{j≠i}(s·d_ij) (Eq. 4),
    where s = τ (``multiply``) or 1/τ (``divide``); zero on the diagonal. Each row sums to 0:
    equal distances exert no force."""
    count = len(distances)
    coefficients = np.zeros((count, count))
    if count < 2:
        return coefficients
    factor = tau if tau_scale == TauScale.multiply else 1.0 / tau
    for i in range(count):
        others = np.arange(count) != i
        scaled = distances[i, others] * factor
        exp = np.exp(scaled - scaled.max())
        q = exp / exp.sum()
        coefficients[i, others] = (1.0 - (count - 1) * q) * factor
    return coefficients


def mixing_matrix(
    distances: np.ndarray,
    tau: float,
    eta: float,
    distance: Distance = Distance.l2,
    grad_mode: GradMode = GradMode.per_client,
    eps_dist: float = 1e-12,
    tau_scale: TauScale = TauScale.multiply,
) -> np.ndarray:
    """Ξ with U = Ξ W the server's step of Eq. 6 for every row of W (rows sum to 1).

    ``distances`` are d_ij as Eq. 4 uses them (plain for ``l2``, squared for ``l2_sq``).
    """
    coefficients = force_coefficients(distances, tau, tau_scale)
    if grad_mode == GradMode.full:
        coefficients = coefficients + coefficients.T
    if distance == Distance.l2:
        safe = np.where(distances < eps_dist, 1.0, distances)
        xi = np.where(distances < eps_dist, 0.0, eta * coefficients / safe)
    else:
        xi = 2.0 * eta * coefficients
    np.fill_diagonal(xi, 0.0)
    np.fill_diagonal(xi, 1.0 - xi.sum(axis=1))
    return xi


# --------------------------------------------------------------------------------- server
class DiversiFedStrategy(ModelMixingStrategy["DiversiFedOptions"]):
    """Eq. 6 on the server: one gradient step on L_M per sampled client from the stored models."""

    def mixing(self, server_round: int, neighbors: list[int], vectors: np.ndarray) -> np.ndarray:
        options = self.options
        distances = pairwise_distances(vectors, squared=options.distance == Distance.l2_sq)
        return mixing_matrix(
            distances,
            options.tau,
            options.eta,
            options.distance,
            options.grad_mode,
            options.eps_dist,
            options.tau_scale,
        )


# --------------------------------------------------------------------------------- client
class DiversiFedClient(OwnModelClient["DiversiFedOptions"]):
    """Eq. 7: trains its own w_i with the pull (λ/(2η))‖w − u_i‖² toward the received u_i."""

    model_key: ClassVar[str] = PERSONAL

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        if self.options.start_from == StartFrom.target:
            return global_weights
        return self.own_model()

    def regularizer(
        self, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> Regularizer | None:
        if self.options.lam == 0:
            return None
        return proximal_to(self.model, global_weights, self.options.lam / self.options.eta)


@register_algorithm("diversifed", strategy=DiversiFedStrategy, client=DiversiFedClient)
@dataclass
class DiversiFedOptions(MixingOptions):
    """Attributes:
    tau: τ of Eq. 4; with the default ``tau_scale`` a larger τ strengthens both attraction and
        repulsion, as the paper's Sec. V-G and V-H describe.
    tau_scale: ``multiply`` (τ·d_ij, the default, after the paper's description of τ) or
        ``divide`` (d_ij/τ, pflower's earlier reconstruction); see the module docstring.
    lam: weight λ of L_M in Eq. 3 (0 gives local training).
    eta: the server's step size η in Eq. 6; the client's pull is λ/(2η).
    distance: ``l2`` (the paper) or ``l2_sq``.
    grad_mode: ``per_client`` (∇ of L_M(w_i)) or ``full`` (∇ of Σ_k L_M(w_k)).
    neighbors: ``participants`` (this round's) or ``all_stale`` (every client's latest upload).
    start_from: ``personal`` (own w_i, Eq. 7) or ``target`` (u_i).
    eps_dist: distances below this exert no force (subgradient at 0).
    """

    display_name: ClassVar[str] = "DiversiFed"
    display_rank: ClassVar[int] = 500
    collapses: ClassVar[tuple[Collapse, ...]] = (
        Collapse("local", (("lam", 0.0),)),
    )  # λ = 0 is local training

    tau: float = tunable(
        1.0,
        choices=(0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1),
        source="DiversiFed (Wu et al., TNNLS 2025), Tables IV-VI: τ from 0.5 to 1.1",
    )
    lam: float = tunable(
        0.01,
        low=1e-5,
        high=1.0,
        log=True,
        source=(
            "DiversiFed (Wu et al., TNNLS 2025), Sec. V: around λ = 0.01, η = 1; down to 1e-5, "
            "since its profile at the values chosen on Fashion-MNIST (η = 0.01) was highest there"
        ),
    )
    eta: float = tunable(
        1.0,
        choices=(0.01, 0.1, 1.0, 10.0, 100.0),
        source=(
            "DiversiFed (Wu et al., TNNLS 2025), Sec. V: around λ = 0.01, η = 1; up to 100, "
            "since tuning chose 10 of 0.1-10 on Fashion-MNIST; down to 0.01, since its profile "
            "at the values chosen on Fashion-MNIST was highest there"
        ),
    )
    tau_scale: TauScale = TauScale.multiply
    distance: Distance = Distance.l2
    grad_mode: GradMode = GradMode.per_client
    neighbors: Neighbors = Neighbors.participants
    start_from: StartFrom = StartFrom.personal
    eps_dist: float = 1e-12

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.tau > 0, f"strategy.tau must be > 0, got {self.tau}")
        require(self.lam >= 0, f"strategy.lam must be >= 0, got {self.lam}")
        require(self.eta > 0, f"strategy.eta must be > 0, got {self.eta}")
        require(self.eps_dist >= 0, f"strategy.eps_dist must be >= 0, got {self.eps_dist}")
