r"""FLAME: personalized FL by ADMM on the Moreau-envelope objective.

Zhu, Zeng, Wang, Sun, Li, Yao and Peng, "On ADMM in Heterogeneous Federated Learning:
Personalization, Robustness, and Fairness" (arXiv 2407.16397), Sec. IV, Algorithm 1.

Problem (9) splits the Moreau-envelope objective (5)-(6) with a local copy $w_i$ of the global
model:

$$
\min_{θ, w_i, w} \sum_i α_i \Bigl[ L_i(θ_i) + \frac{λ}{2}\|θ_i − w_i\|^2 \Bigr]
\quad \text{s.t.} \quad w_i = w \text{ for all } i,
$$

and ADMM on its augmented Lagrangian (10),
$\sum_i α_i[L_i(θ_i) + \frac{λ}{2}\|θ_i − w_i\|^2] + ⟨π_i, w_i − w⟩ + \frac{ρ}{2}\|w_i − w\|^2$,
gives per selected client $i$ in round $k$ (Eqs. 11-13):

$$
\begin{aligned}
θ_i^{k+1} &≈ \operatorname*{argmin}_θ L_i(θ) + \frac{λ}{2}\|θ − w_i^k\|^2
    && \text{(11, inexact: local SGD)} \\
w_i^{k+1} &= \frac{α_i λ θ_i^{k+1} + ρ w^k − π_i^k}{α_i λ + ρ} && \text{(12, closed form)} \\
π_i^{k+1} &= π_i^k + ρ (w_i^{k+1} − w^k) && \text{(13)}
\end{aligned}
$$

and on the server $w^{k+1} = \frac{1}{m} \sum_{i=1}^{m} (w_i^{k+1} + π_i^{k+1}/ρ)$ (Algorithm 1,
last line), over all m clients: a client not selected this round contributes its last upload (stale
cache; before its first upload, $w^0$, since $w_i^0 = w^0$ and $π_i^0 = 0$). With ``robust=<name>``
the mean is replaced by the robust aggregate of the m cached vectors (Sec. VI-B3 compares FLAME with
Multi-Krum; this combination is pflower's). The global model needs no
learning rate. Lemma 3: $π_i^{k+1} = α_i λ (θ_i^{k+1} − w_i^{k+1})$, so the upload
$z_i = w_i + π_i/ρ$ equals $θ_i$ exactly when $ρ = α_i λ$.

Client procedure (as in the authors' code, the default): $w_i \leftarrow  w^k$ at the start of the
round (``reset_local_to_global``); a fresh SGD optimizer (``train.lr``, ``train.momentum``,
``train.batch_size``); ``train.local_epochs`` = R passes over the local train split, each step on
$∇\mathrm{CE} + λ(θ − w_i) + μθ$ (``mu_l2``, an L2 term of the authors' code), and after each pass
the updates (12)-(13) (``admm_update=per_epoch``). ``admm_update=per_round`` with
``reset_local_to_global=false`` is Algorithm 1 as printed: R passes on (11) anchored on the
persistent $w_i^k$, then (12)-(13) once. With R = 1 the two cadences coincide.

Model selection (Sec. IV-D): stage L1 evaluates $θ_i$ (PM) and $w^{k+1}$ (GM) on the client's own
data and reports the hybrid model HM, the better of the two (``selection.split``).

What crosses the wire:
- fit, server → client: $w^k$; config ``server-round``, ``num_clients`` (m, for $α_i = 1/m$ and
  $ρ = λ/m$) and, once known, ``n_total`` (n = $\sum  n_i$, for $α_i = n_i/n$ with ``alpha=size``).
- fit, client → server: $z_i = w_i + π_i/ρ$; $n_i$; metrics ``admm_primal_residual``
  $\|w_i − w^k\|$.
- evaluate, server → client: $w^{k+1}$; the client reports PM/GM/HM metrics.

Client state (``context.state``): ``flame_theta`` $θ_i$, ``flame_pi`` $π_i$, ``flame_w_local``
$w_i$. $θ_i$ of a client seen for the first time is the model it receives ($w^0$ in round 1).
Server state: the cache $z_i$ of every partition id. The m clients of the consensus are those that
train: clients held out by ``eval.unseen_fraction`` are not among them.

Deviations: hyperparameters the paper's text does not give are the authors' code defaults ($λ = 1$,
$μ = 0.01$; the preset sets lr 0.01, momentum 0.5, batch 100, R = 1), except $ρ$: its default is
$λ/m$, the rule behind every value the paper uses (the code's fixed 0.1 is $λ/m$ at m = 10). The
global model is evaluated after aggregation $(w^{k+1})$; the authors' code evaluates $w^k$ inside
training. The $ε$-accuracy of (11) (Eq. 17) is not enforced: R passes are run. Arrays that are not
floating point (none in the zoo's FLAME models) are taken from $θ_i$ unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

import numpy as np
from flwr.common import NDArrays, Scalar
from torch import nn

from pflower.api import AlgorithmOptions, PersonalizedStrategy, register_algorithm
from pflower.config import ExperimentConfig, RobustKind, require
from pflower.core.declared import state
from pflower.core.options import Aggregation
from pflower.core.strategy import ClientUpdate
from pflower.core.training import Regularizer, get_weights
from pflower.searchspace import tunable
from pflower.strategies.moreau import PersonalAndGlobalClient, float_or, steps_per_epoch
from pflower.strategies.proximal import anchor_tensors, proximal_term, set_anchors

THETA = "flame_theta"
DUAL = "flame_pi"
LOCAL_COPY = "flame_w_local"


# ----------------------------------------------------------------- closed forms (Eqs. 12-13)
def local_model_update(
    theta: NDArrays, global_: NDArrays, dual: NDArrays, alpha_lambda: float, rho: float
) -> NDArrays:
    """Eq. 12: w_i = (α_i λ θ_i + ρ w − π_i) / (α_i λ + ρ), elementwise (float64, cast back)."""
    return [
        float_or(t, (alpha_lambda * t.astype(np.float64) + rho * g - p) / (alpha_lambda + rho))
        for t, g, p in zip(theta, global_, dual, strict=True)
    ]


def dual_update(dual: NDArrays, local: NDArrays, global_: NDArrays, rho: float) -> NDArrays:
    """Eq. 13: π_i ← π_i + ρ (w_i − w)."""
    return [
        float_or(p, p.astype(np.float64) + rho * (w_i.astype(np.float64) - g))
        for p, w_i, g in zip(dual, local, global_, strict=True)
    ]


def upload_vector(local: NDArrays, dual: NDArrays, rho: float) -> NDArrays:
    """z_i = w_i + π_i / ρ, the client's term of the server's average."""
    return [
        float_or(w_i, w_i.astype(np.float64) + p / rho) for w_i, p in zip(local, dual, strict=True)
    ]


def client_weight(alpha: AlphaMode, num_clients: int, num_train: int, n_total: int | None) -> float:
    """α_i: 1/m, or n_i/n (falls back to 1/m before the server knows n)."""
    if alpha == AlphaMode.size and n_total:
        return num_train / n_total
    return 1.0 / num_clients


class AlphaMode(StrEnum):
    """The client weights α_i of Problem (9)."""

    uniform = "uniform"
    """α_i = 1/m (the authors' code)."""
    size = "size"
    """α_i = n_i / n."""


class AdmmCadence(StrEnum):
    """When a client applies the closed-form updates (12)-(13) within a round."""

    per_epoch = "per_epoch"
    """After every pass over the local data (the authors' code)."""
    per_round = "per_round"
    """Once, after all R passes (Algorithm 1 as printed)."""


# ------------------------------------------------------------------------------ server half
class FLAMEStrategy(PersonalizedStrategy["FLAMEOptions"]):
    """Averages the cached z_i of all m clients (stale for clients not selected this round)."""

    uploads: dict[int, NDArrays] = state({})
    """z_i by partition id: the last upload of every client that has trained."""
    _initial: NDArrays = state(factory=lambda strategy: strategy.global_weights)
    """Θ^0, the z_i of a client that has not trained yet."""

    def fit_config(self, server_round: int, partition_id: int) -> dict[str, Scalar]:
        members = self.members
        config = {**super().fit_config(server_round, partition_id), "num_clients": len(members)}
        sizes = self.client_sizes
        if len(sizes) == self.settings.num_clients:
            config["n_total"] = sum(sizes[pid] for pid in members)
        return config

    @property
    def members(self) -> list[int]:
        """The m clients of the ADMM consensus: all but those held out of training
        (``eval.unseen_fraction``), which never upload a z_i."""
        return [pid for pid in range(self.settings.num_clients) if pid not in self.unseen]

    @classmethod
    def robust_inputs(cls, settings: ExperimentConfig) -> tuple[int, str]:
        """The robust aggregate runs over the m cached z_i, sampled this round or not."""
        m = settings.num_clients - settings.num_unseen
        return m, f"the m = {m} cached z_i of every round"

    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        for update in updates:
            self.uploads[update.partition_id] = update.weights
        cache = [self.uploads.get(pid, self._initial) for pid in self.members]
        if self.settings.robust.name != RobustKind.none:
            return self.robust_mean(cache, np.ones(len(cache)))
        return admm_average(cache)


def admm_average(uploads: list[NDArrays]) -> NDArrays:
    """w = (1/m) Σ_i z_i over all m clients (float64 accumulation, cast back)."""
    return [
        np.mean(np.stack([u.astype(np.float64) for u in layer]), axis=0).astype(layer[0].dtype)
        for layer in zip(*uploads, strict=True)
    ]


# ------------------------------------------------------------------------------ client half
class FLAMEClient(PersonalAndGlobalClient["FLAMEOptions"]):
    """θ_i by local SGD on (11); w_i and π_i by (12)-(13); uploads z_i = w_i + π_i/ρ. Stage L1:
    θ_i (PM) and w^{k+1} (GM)."""

    personal_key: ClassVar[str] = THETA

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        """θ_i^k (the received model for a client seen for the first time)."""
        return self.state.get_arrays(THETA) or global_weights

    def regularizer(self, global_weights: NDArrays, config: dict[str, Scalar]) -> Regularizer:
        """(λ/2)‖θ − w_i‖² + (μ/2)‖θ‖², with w_i held in tensors the ADMM step updates."""
        options = self.options
        self._w_global = global_weights
        stored = self.state.get_arrays(LOCAL_COPY)
        self._w_local = (
            list(global_weights) if options.reset_local_to_global or stored is None else stored
        )
        self._dual = self.state.get_arrays(DUAL) or [np.zeros_like(a) for a in global_weights]
        self._alpha = client_weight(
            options.alpha,
            int(config["num_clients"]),
            len(self.data.train),
            int(config["n_total"]) if "n_total" in config else None,
        )
        m = int(config["num_clients"])
        self._rho = options.lambda_ / m if options.rho is None else options.rho
        self._anchors = anchor_tensors(self.model, self._w_local)
        self._steps = 0
        return proximal_term(self._anchors, options.lambda_, options.mu_l2)

    def after_step(
        self, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> Callable[[nn.Module], None] | None:
        """Per-epoch cadence: (12)-(13) after every full pass over the local data."""
        if self.options.admm_update != AdmmCadence.per_epoch:
            return None
        per_epoch = steps_per_epoch(len(self.data.train), self.train_settings(config).batch_size)

        def step(model: nn.Module) -> None:
            self._steps += 1
            if self._steps % per_epoch == 0:
                self._admm_step(get_weights(model))

        return step

    def _admm_step(self, theta: NDArrays) -> None:
        """Eqs. 12-13 at the current θ; the anchor of (11) moves to the new w_i."""
        options = self.options
        self._w_local = local_model_update(
            theta, self._w_global, self._dual, self._alpha * options.lambda_, self._rho
        )
        self._dual = dual_update(self._dual, self._w_local, self._w_global, self._rho)
        set_anchors(self._anchors, self.model, self._w_local)

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        if self.options.admm_update == AdmmCadence.per_round:
            self._admm_step(trained)
        else:
            batch_size = self.train_settings(config).batch_size
            per_epoch = steps_per_epoch(len(self.data.train), batch_size)
            if self._steps == 0 or self._steps % per_epoch:
                self._admm_step(trained)  # no pass ran, or a last partial one (train.local_steps)
        self.state.put_arrays(THETA, trained)
        self.state.put_arrays(DUAL, self._dual)
        self.state.put_arrays(LOCAL_COPY, self._w_local)

    def upload(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> NDArrays:
        return upload_vector(self._w_local, self._dual, self._rho)

    def fit_metrics(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        residual = sum(
            float(np.sum((w.astype(np.float64) - g) ** 2))
            for w, g in zip(self._w_local, self._w_global, strict=True)
        )
        return {"admm_primal_residual": math.sqrt(residual)}


@register_algorithm("flame", strategy=FLAMEStrategy, client=FLAMEClient)
@dataclass
class FLAMEOptions(AlgorithmOptions):
    """Attributes:
    lambda_: λ, the Moreau-envelope / proximity strength of (5)-(11).
    rho: ρ > 0, the ADMM penalty of (10) (ρ = α_i λ makes z_i = θ_i); null: λ/m, the paper's
        choice in every experiment (0.1 with m = 10, 0.02 with m = 50, 0.03 with λ = 3 and
        m = 100).
    alpha: client weights α_i, ``uniform`` (1/m) or ``size`` (n_i/n).
    mu_l2: μ, an extra L2 term μθ in the θ-gradient (the authors' code; 0 disables it).
    admm_update: ``per_epoch`` (code) or ``per_round`` (Algorithm 1) cadence of (12)-(13).
    reset_local_to_global: w_i ← w^k at the start of each round (code) or keep w_i^k.
    aggregation: must stay ``uniform``: the server step of Algorithm 1 is the plain mean over m.
    """

    display_name: ClassVar[str] = "FLAME"
    display_rank: ClassVar[int] = 200

    lambda_: float = tunable(
        1.0,
        low=0.01,
        high=10.0,
        log=True,
        source=(
            "FLAME, Sec. V sensitivity study: λ in {1, 3, 5}; down to 0.01 as Ditto's λ (the same "
            "pull toward the global model), since tuning chose the old floor 0.1 on MNIST"
        ),
    )
    rho: float | None = None
    alpha: AlphaMode = AlphaMode.uniform
    mu_l2: float = 0.01
    admm_update: AdmmCadence = AdmmCadence.per_epoch
    reset_local_to_global: bool = True
    aggregation: Aggregation = Aggregation.uniform

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.lambda_ > 0, f"strategy.lambda_ must be > 0, got {self.lambda_}")
        require(
            self.rho is None or self.rho > 0, f"strategy.rho must be null or > 0, got {self.rho}"
        )
        require(self.mu_l2 >= 0, f"strategy.mu_l2 must be >= 0, got {self.mu_l2}")
        require(
            self.aggregation == Aggregation.uniform,
            "strategy.aggregation must be 'uniform' for FLAME: its server step is the mean of "
            "w_i + π_i/ρ over all m clients (the weights α_i enter the clients' updates)",
        )
