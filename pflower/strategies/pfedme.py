r"""pFedMe: Dinh, Tran and Nguyen, "Personalized Federated Learning with Moreau Envelopes",
NeurIPS 2020, Algorithm 1.

Each client minimizes the Moreau envelope $F_i(w) = \min_θ \{ f_i(θ) + \frac{λ}{2}\|θ − w\|^2 \}$ of
its loss: the personalized model $θ_i$ approximately solves the inner problem, and the client's
local copy $w_i$ of the global model descends $F_i$ with $∇F_i(w) = λ(w − \hat θ_i(w))$:

$$
\begin{aligned}
\hat θ &≈ \operatorname*{argmin}_θ f_i(θ; \text{batch}) + \frac{λ}{2}\|θ − w_{i,r}\|^2
    && \text{($K$ steps, \texttt{personal\_lr})} \\
w_{i,r+1} &= w_{i,r} − η λ (w_{i,r} − \hat θ) && \text{(written } (1 − ηλ) w + ηλ \hat θ \text{)}
\end{aligned}
$$

starting from $w_{i,0} = w^t$; the client uploads $w_{i,R}$, and the server sets
$w^{t+1} = (1 − β) w^t + β \operatorname{mean}_i w_{i,R}$ (Alg. 1, last line). The personalized
model evaluated at stage L1 (PM) is $θ_i$, the global model (GM) the received w.

Two profiles (``profile``):

- ``original`` (Alg. 1 as published): $θ$ starts each round at $w^t$ and persists across the round's
  mini-batches; for every mini-batch, K = ``inner_steps`` steps on that batch, then the w-step.
  ``train.local_epochs`` passes (or ``train.local_steps`` batches) per round.
- ``flame_paper`` (default; the variant the FLAME paper's comparison code runs, Zhu et al.,
  Sec. VI-A): $θ_i$ persists across rounds; each local iteration is one pass of SGD on
  $f_i(θ) + \frac{λ}{2}\|θ − w_i\|^2$ (+ $\frac{μ}{2}\|θ\|^2$, ``mu_l2``), followed by one w-step
  with $η$ (``eta``, the code's default 0.1); ``train.local_epochs`` iterations per round; $β = 1$.

Identities: K = 1, ηλ = 1 and $β = 1$ in the original profile is FedAvg ($θ̂$ is one SGD step from w
and the w-step copies it); K = 0 leaves $w_i = w^t$, so the global model never moves.

What crosses the wire: $w^t$ to the client, $w_{i,R}$ and $n_i$ back; config ``server-round`` only.
Client state: ``pfedme_theta`` ($θ_i$, stored after training).

Deviation: the optimizer of the $θ$-steps is the round's SGD (``train.momentum``; the original uses
plain SGD, i.e. ``train.momentum=0``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

import numpy as np
from flwr.common import NDArrays, Scalar
from torch import nn

from pflower.api import AlgorithmOptions, PersonalizedStrategy, register_algorithm
from pflower.config import require
from pflower.core.options import Aggregation
from pflower.core.strategy import ClientUpdate
from pflower.core.training import (
    Regularizer,
    TrainSettings,
    get_weights,
)
from pflower.searchspace import tunable
from pflower.strategies.batches import train_batches
from pflower.strategies.moreau import (
    PersonalAndGlobalClient,
    float_or,
    steps_per_epoch,
    with_lr,
)
from pflower.strategies.proximal import anchor_tensors, proximal_term, set_anchors

THETA = "pfedme_theta"


class PFedMeProfile(StrEnum):
    """Which pFedMe client procedure runs (see the module docstring)."""

    flame_paper = "flame_paper"
    original = "original"


def moreau_step(local: NDArrays, theta: NDArrays, eta_lambda: float) -> NDArrays:
    """w ← w − ηλ (w − θ), computed as (1 − ηλ) w + ηλ θ (float64, cast back)."""
    return [
        float_or(t, (1.0 - eta_lambda) * w.astype(np.float64) + eta_lambda * t)
        for w, t in zip(local, theta, strict=True)
    ]


def server_step(current: NDArrays, mean: NDArrays, beta: float) -> NDArrays:
    """w^{t+1} = (1 − β) w^t + β · mean."""
    return [
        ((1.0 - beta) * c.astype(np.float64) + beta * m).astype(c.dtype)
        for c, m in zip(current, mean, strict=True)
    ]


class PFedMeStrategy(PersonalizedStrategy["PFedMeOptions"]):
    """w^{t+1} = (1 − β) w^t + β · mean of the uploaded w_{i,R}."""

    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        mean = self.average(updates)
        if self.options.beta == 1.0:
            return mean
        return server_step(current, mean, self.options.beta)


class PFedMeClient(PersonalAndGlobalClient["PFedMeOptions"]):
    """θ by (K-step or one-pass) proximal SGD; w_i by the Moreau-envelope gradient step. Stage
    L1: θ_i (PM) and the received w (GM)."""

    personal_key: ClassVar[str] = THETA

    def train_settings(self, config: dict[str, Scalar]) -> TrainSettings:
        return with_lr(super().train_settings(config), self.options.personal_lr)

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        if self.options.profile == PFedMeProfile.original:
            return global_weights
        return self.state.get_arrays(THETA) or global_weights

    def regularizer(self, global_weights: NDArrays, config: dict[str, Scalar]) -> Regularizer:
        self._w_local = list(global_weights)
        self._anchors = anchor_tensors(self.model, global_weights)
        self._steps = 0
        return proximal_term(self._anchors, self.options.lambda_, self.options.mu_l2)

    def after_step(
        self, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> Callable[[nn.Module], None]:
        """The w-step: after every K-step batch (original) or every pass (flame_paper)."""
        if self.options.profile == PFedMeProfile.original:
            every = 1
        else:
            every = steps_per_epoch(len(self.data.train), self.train_settings(config).batch_size)
        eta_lambda = self.options.eta * self.options.lambda_

        def step(model: nn.Module) -> None:
            self._steps += 1
            if self._steps % every == 0:
                self._w_local = moreau_step(self._w_local, get_weights(model), eta_lambda)
                set_anchors(self._anchors, model, self._w_local)

        return step

    def local_train(
        self,
        settings: TrainSettings,
        config: dict[str, Scalar],
        regularizer: Regularizer | None = None,
        after_step: Callable[[nn.Module], None] | None = None,
    ) -> float:
        if self.options.profile != PFedMeProfile.original:
            return super().local_train(settings, config, regularizer, after_step)
        return self._inner_loop(settings, config, regularizer, after_step)

    def _inner_loop(
        self,
        settings: TrainSettings,
        config: dict[str, Scalar],
        regularizer: Regularizer | None,
        after_batch: Callable[[nn.Module], None] | None,
    ) -> float:
        """Alg. 1: per mini-batch, K steps on f(θ; batch) + (λ/2)‖θ − w‖², then the w-step.

        Batches come in the seeded order the shared loop uses, so K = 1 with ηλ = 1 reproduces
        FedAvg's local training exactly."""
        model = self.model
        model.train()
        optimizer = settings.make_optimizer(model.parameters())
        criterion = nn.CrossEntropyLoss()
        total, batches = 0.0, 0
        for images, labels in train_batches(self, settings, config):
            for _ in range(self.options.inner_steps):
                optimizer.zero_grad(set_to_none=True)
                loss = criterion(model(images), labels)
                total += float(loss.detach())
                batches += 1
                if regularizer is not None:
                    loss = loss + regularizer(model)
                loss.backward()
                optimizer.step()
            if after_batch is not None:
                after_batch(model)
        return total / max(batches, 1)

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        self.state.put_arrays(THETA, trained)

    def upload(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> NDArrays:
        return self._w_local


@register_algorithm("pfedme", strategy=PFedMeStrategy, client=PFedMeClient)
@dataclass
class PFedMeOptions(AlgorithmOptions):
    """Attributes:
    profile: ``flame_paper`` (the FLAME comparison code's variant) or ``original`` (Alg. 1).
    lambda_: λ of the Moreau envelope.
    eta: η, the step of the local copy w_i (w ← w − ηλ(w − θ)).
    beta: β of the server step (1: plain mean).
    inner_steps: K, θ-steps per mini-batch (``original`` profile only).
    personal_lr: learning rate of the θ-steps (null: ``train.lr``).
    mu_l2: μ, an extra L2 term on θ (the FLAME authors' code uses 0.01).
    aggregation: the server's mean, ``uniform`` (Alg. 1) or ``weighted``.
    """

    display_name: ClassVar[str] = "pFedMe"
    display_rank: ClassVar[int] = 25

    profile: PFedMeProfile = PFedMeProfile.flame_paper
    lambda_: float = tunable(
        1.0,
        low=0.001,
        high=30.0,
        log=True,
        source=(
            "pFedMe (Dinh et al., NeurIPS 2020), Sec. 5: λ up to 30, personal lr η; down to 0.001, "
            "since tuning chose the floor on MNIST twice (0.1, then 0.01)"
        ),
    )
    eta: float = tunable(
        0.1,
        low=0.005,
        high=0.5,
        log=True,
        source="pFedMe (Dinh et al., NeurIPS 2020), Sec. 5: λ up to 30, personal lr η",
    )
    beta: float = 1.0
    inner_steps: int = 5
    personal_lr: float | None = None
    mu_l2: float = 0.0
    aggregation: Aggregation = Aggregation.uniform

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.lambda_ >= 0, f"strategy.lambda_ must be >= 0, got {self.lambda_}")
        require(self.eta > 0, f"strategy.eta must be > 0, got {self.eta}")
        require(self.beta > 0, f"strategy.beta must be > 0, got {self.beta}")
        require(self.inner_steps >= 0, f"strategy.inner_steps must be >= 0, got {self.inner_steps}")
        require(
            self.personal_lr is None or self.personal_lr > 0,
            f"strategy.personal_lr must be null or > 0, got {self.personal_lr}",
        )
        require(self.mu_l2 >= 0, f"strategy.mu_l2 must be >= 0, got {self.mu_l2}")
