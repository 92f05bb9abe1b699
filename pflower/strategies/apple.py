r"""APPLE: Luo and Wu, "Adapt to Adaptation: Learning Personalization for Cross-Silo Federated
Learning", IJCAI 2022 (a baseline of the DiversiFed paper, Wu et al., Sec. V-B).

Every client i owns a "core" model $w_i$ and a directed relationship vector $p_i ∈ R^N$ (initialized
to p0 = 1/N). Its personalized model is $\hat w_i = \sum_j p_{ij} w_j$ over all N core models, which
the server sends every round (downlink N models per client). Per mini-batch (Alg. 1):

- $\hat w_i \leftarrow \sum_j p_{ij} w_j$ (trainable parameters; BatchNorm statistics are the
  client's own);
- $g = ∇\,\mathrm{CE}$ at $\hat w_i$;
- core step: $w_i \leftarrow w_i − η N p_{ii} g$ ($η$ = ``train.lr``; plain SGD, the
  paper's update, whatever ``train.optimizer`` says). The chain rule gives $∂L/∂w_i = p_{ii} g$;
  the factor N is PFLlib's (it multiplies the client learning rate by the number of clients), so
  that the first step, at $p_{ii} = 1/N$, is $η g$. Without it the core would learn N times slower
  than every other method at the same ``train.lr``;
- relationship step: $p_{ij} \leftarrow p_{ij} − η_p (∂L/∂p_{ij} + λ_r μ (p_{ij} − p^0_j))$,
  with $∂L/∂p_{ij} = \sum ⟨g, w_j⟩$ over every trainable element (the derivative of the loss at
  $\hat w_i$, which the APPLE paper uses and its official code takes by autograd), and $λ_r$ =
  (cos($π$ r / (L·R)) + 1)/2 for the client's r-th trained round while r < L·R, else 0 (the proximal
  pull of $p_i$ toward p0 fades out over the first fraction L of the R rounds).

The loop follows PFLlib's APPLE, which the DiversiFed paper ran; the relationship step uses the
core $w_i$ after this batch's core step (PFLlib's order). One deviation from PFLlib, and why:
PFLlib's ∂L/∂$p_{ij}$ is the mean over layers of mean(g ⊙ $w_j$), about 1/(number of parameters) of
the derivative, so at any $η_p$ near the official code's 0.001 (or PFLlib's own default 0) $p_i$
does not move and ŵ_i stays the average of the cores: on Fashion-MNIST with the DiversiFed
paper's MLP, 20 clients and 2 classes each, that APPLE reached 65% after 20 rounds where the
other personalized methods reach 96%. ``p_gradient=pfllib_mean`` restores PFLlib's form (with
a larger ``drlr``). Defaults: $η_p = 0.001$ (the official code's ``lr_coef``), $μ = 0.1$, L = 0.2.

What a client uploads (``upload``): its core $w_i$ (``core``, the default: the APPLE paper's Alg. 1,
where the server holds and sends the cores), or its personalized model ŵ_i (``personalized``: what
PFLlib's clientAPPLE does, by the author of FedALA, whose Table 2 ran it: it uploads ``model_c``,
a copy of the mixture, and drops the core it stepped). With ``personalized`` every core starts a
round from its client's last ŵ_i, so the N·$p_{ii}$-scaled core steps (a full-rate SGD step on a
gradient taken at the mixture, which moves about N times less) never accumulate across rounds.
With ``core`` they do: on FedALA's pathological MNIST at SGD lr 0.1 (Appendix G's settings) the
cores of clients with disjoint classes were pushed apart until their losses overflowed
(``docs/results/fedala.md``). Two PFLlib details are not reproduced: it trains the clients one
after another and shares the core objects in place, so a client sees the cores of the clients
that trained before it in the same round (a sequential-simulation artifact: here every client
starts from the cores of the round's start); and it uploads the mixture of the last batch
before that batch's steps (here: after, the model stage L1 evaluates).

After training the client stores $\hat w_i = \sum_j p_{ij} w_j$ (with its final $p_i$ and core
$w_i$) as its personalized model, evaluated at stage L1; PFLlib evaluates the ŵ_i of the last batch,
before that batch's steps.

What crosses the wire: fit sends every sampled client all N core models (partition ids 0..N−1,
each the ``state_dict`` arrays, concatenated; $Θ^0$ for a client that never uploaded); config
``server-round``. The client uploads its core $w_i$ or its ŵ_i (``upload``; all arrays). Server
state: the base class's ClientModelStore (every client's latest upload). No global model: stage G
evaluates the mean of the stored uploads (labelled ``mean_of_client_models``). Client state:
``apple_p`` $(p_i)$, ``apple_personal`` (ŵ_i, all arrays) and ``apple_rounds`` (rounds trained,
for $λ_r$).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, cast

import numpy as np
import torch
from flwr.common import NDArrays, Scalar
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from pflower.api import AlgorithmOptions, PersonalClient, PersonalizedStrategy, register_algorithm
from pflower.config import require
from pflower.core.declared import state
from pflower.core.strategy import ClientUpdate
from pflower.core.training import (
    Regularizer,
    TrainSettings,
    model_device,
    trainable_mask,
)
from pflower.searchspace import tunable
from pflower.strategies.batches import train_batches
from pflower.strategies.model_mixing import (
    MEAN_OF_CLIENT_MODELS,
    initial_weights_untouched,
    mean_of_stored,
)

P_KEY = "apple_p"
PERSONAL = "apple_personal"
ROUNDS = "apple_rounds"


def proximal_weight(rounds_trained: int, fade_rounds: float) -> float:
    """λ_r: (cos(π r / (L·R)) + 1)/2 while r < L·R, then 0."""
    if rounds_trained >= fade_rounds:
        return 0.0
    return (math.cos(math.pi * rounds_trained / fade_rounds) + 1.0) / 2.0


class RelationshipGradient(StrEnum):
    """How the relationship step measures ∂L/∂p_ij from the gradient g at ŵ_i and the core w_j."""

    exact = "exact"
    """Σ ⟨g, w_j⟩ over every trainable element: the derivative (APPLE's official code)."""
    pfllib_mean = "pfllib_mean"
    """The mean over layers of mean(g ⊙ w_j) (PFLlib)."""


def relationship_weights(layer_sizes: list[int], form: RelationshipGradient) -> torch.Tensor | None:
    """Per-element weights that turn ``cores @ (g ⊙ weights)`` into ∂L/∂p_ij in ``form``.

    ``None`` for ``exact`` (``cores @ g``); for ``pfllib_mean`` the elements of a layer of
    ``n_l`` elements weigh ``1 / (L n_l)``, L the number of layers: the mean over layers of
    mean(g ⊙ w_j).

    Args:
        layer_sizes: the element count of each trainable tensor, in order.
        form: the form of the gradient.
    """
    if form == RelationshipGradient.exact:
        return None
    count = len(layer_sizes)
    return torch.cat([torch.full((size,), 1.0 / (count * size)) for size in layer_sizes])


def relationship_gradient(
    grad: torch.Tensor, cores: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """∂L/∂p_ij for each core j (float64, one entry per core).

    Args:
        grad: g, the flattened gradient at ŵ_i (``P`` trainable elements).
        cores: the core models as rows of an ``N x P`` matrix, in the same element order.
        weights: [`relationship_weights`][pflower.strategies.apple.relationship_weights] (on
            ``grad``'s device), or ``None`` (exact).
    """
    if weights is not None:
        grad = grad * weights
    return (cores @ grad).double().cpu()


class AppleUpload(StrEnum):
    """What a client uploads after training, and so what the others receive as its core."""

    core = "core"
    """Its core w_i (the APPLE paper)."""
    personalized = "personalized"
    """Its personalized model ŵ_i = Σ_j p_ij w_j (PFLlib)."""


class AppleStrategy(PersonalizedStrategy["AppleOptions"]):
    """Sends every sampled client all N stored core models."""

    robust_aggregation: ClassVar[bool] = False

    keeps_client_models: ClassVar[bool] = True
    global_model_label: ClassVar[str | None] = MEAN_OF_CLIENT_MODELS

    initial_weights: NDArrays = state(factory=lambda strategy: strategy.global_weights)
    """Θ^0, the stored core of a client never sampled."""

    def client_messages(
        self, server_round: int, partition_ids: list[int], global_weights: NDArrays
    ) -> dict[int, NDArrays]:
        cores = [
            array
            for pid in range(self.settings.num_clients)
            for array in self.client_models.get(pid, self.initial_weights)
        ]
        return dict.fromkeys(partition_ids, cores)

    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        return mean_of_stored(self)


class AppleClient(PersonalClient["AppleOptions"]):
    """Learns its core model and its relationship vector p_i on every batch."""

    def initial(self) -> NDArrays:
        return initial_weights_untouched(self)

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        per_model = len(self.model.state_dict())
        count = self.experiment.settings.num_clients
        self._cores = [global_weights[j * per_model : (j + 1) * per_model] for j in range(count)]
        return self._cores[self.partition_id]

    def local_train(
        self,
        settings: TrainSettings,
        config: dict[str, Scalar],
        regularizer: Regularizer | None = None,
        after_step: Callable[[nn.Module], None] | None = None,
    ) -> float:
        count = self.experiment.settings.num_clients
        stored_p = self.state.get_arrays(P_KEY)
        p = (
            torch.from_numpy(stored_p[0]).double()
            if stored_p is not None
            else torch.full((count,), 1.0 / count, dtype=torch.float64)
        )
        rounds_trained = int(self.state.get_scalars(ROUNDS).get("count", 0))
        fade = self.options.fade_fraction * self.experiment.settings.rounds
        lam_r = proximal_weight(rounds_trained, fade)
        device = model_device(self.model)
        mask = trainable_mask(self.model)
        cores = torch.stack(
            [
                torch.cat(
                    [
                        torch.from_numpy(np.asarray(a, dtype=np.float32)).reshape(-1)
                        for a, m in zip(core, mask, strict=True)
                        if m
                    ]
                )
                for core in self._cores
            ]
        ).to(device)
        loss_mean, p = apple_train(self, settings, config, cores, p, lam_r)
        # the model ends as ŵ_i with the final p_i and core w_i; the core is uploaded
        set_personal(self.model, cores, p)
        self._core = cores[self.partition_id]
        self.state.put_arrays(P_KEY, [p.numpy()])
        self.state.put_scalars(ROUNDS, {"count": rounds_trained + 1})
        return loss_mean

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        self.state.put_arrays(PERSONAL, trained)

    def upload(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> NDArrays:
        if self.options.upload == AppleUpload.personalized:
            return trained  # the model holds ŵ_i (local_train ends with it)
        mask = trainable_mask(self.model)
        sizes = [a.size for a, m in zip(trained, mask, strict=True) if m]
        core = iter(torch.split(self._core.cpu(), sizes))
        return [
            next(core).numpy().reshape(a.shape).copy() if m else a
            for a, m in zip(trained, mask, strict=True)
        ]

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        stored = self.state.get_arrays(PERSONAL)
        return stored if stored is not None else self.initial()


def set_personal(model: nn.Module, cores: torch.Tensor, p: torch.Tensor) -> None:
    """Load ŵ = Σ_j p_j w_j (``p @ cores``, cores the rows of ``N x P``) into ``model``'s
    trainable parameters."""
    with torch.no_grad():
        vector_to_parameters(p.to(cores) @ cores, model.parameters())


def apple_train(
    client: AppleClient,
    settings: TrainSettings,
    config: dict[str, Scalar],
    cores: torch.Tensor,
    p: torch.Tensor,
    lam_r: float,
) -> tuple[float, torch.Tensor]:
    """APPLE's per-batch core and relationship steps (module docstring) over the shared loop's
    batches ([`train_batches`][pflower.strategies.batches.train_batches]); updates the client's
    row of ``cores`` (``N x P``, trainable elements) in place and returns the mean training loss
    and the new p."""
    model, own, options = client.model, client.partition_id, client.options
    model.train()
    criterion = nn.CrossEntropyLoss()
    p0 = 1.0 / len(cores)
    p = p.clone()
    layer_sizes = [param.numel() for param in model.parameters()]
    weights = relationship_weights(layer_sizes, options.p_gradient)
    if weights is not None:
        weights = weights.to(cores)
    total, batches = 0.0, 0
    for inputs, labels in train_batches(client, settings, config):
        set_personal(model, cores, p)
        model.zero_grad(set_to_none=True)
        loss = criterion(model(inputs), labels)
        total += float(loss.detach())
        loss.backward()
        grad = parameters_to_vector([cast(torch.Tensor, p.grad) for p in model.parameters()])
        cores[own] -= settings.lr * len(cores) * float(p[own]) * grad
        p_grad = relationship_gradient(grad, cores, weights)
        p = p - options.drlr * (p_grad + lam_r * options.mu * (p - p0))
        batches += 1
    return total / max(batches, 1), p


_SEARCH_SOURCE = "APPLE (Luo and Wu, IJCAI 2022), Sec. 5: around the paper's η_p and μ"
"""Where the search ranges of η_p (``drlr``) and μ come from."""


@register_algorithm("apple", strategy=AppleStrategy, client=AppleClient)
@dataclass
class AppleOptions(AlgorithmOptions):
    """Attributes:
    drlr: η_p, the learning rate of the relationship vector p_i (0 keeps p_i = 1/N).
    mu: μ, weight of the proximal pull of p_i toward p0 = 1/N.
    fade_fraction: L, the fraction of the rounds over which that pull fades (cosine) to 0.
    p_gradient: ∂L/∂p_ij as the derivative (``exact``) or PFLlib's per-layer means
        (``pfllib_mean``, about 1/(number of parameters) of it: raise ``drlr`` with it).
    upload: what a client uploads: its ``core`` w_i (the paper) or its ``personalized`` model
        ŵ_i (PFLlib's clientAPPLE).
    """

    display_name: ClassVar[str] = "APPLE"
    display_rank: ClassVar[int] = 42

    drlr: float = tunable(0.001, low=1e-4, high=1e-2, log=True, source=_SEARCH_SOURCE)
    mu: float = tunable(0.1, low=1e-3, high=1.0, log=True, source=_SEARCH_SOURCE)
    fade_fraction: float = 0.2
    p_gradient: RelationshipGradient = RelationshipGradient.exact
    upload: AppleUpload = AppleUpload.core

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.drlr >= 0, f"strategy.drlr must be >= 0, got {self.drlr}")
        require(self.mu >= 0, f"strategy.mu must be >= 0, got {self.mu}")
        require(
            0 < self.fade_fraction <= 1,
            f"strategy.fade_fraction must be in (0, 1], got {self.fade_fraction}",
        )
