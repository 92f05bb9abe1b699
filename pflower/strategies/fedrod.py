"""FedRoD: Chen and Chao, "On Bridging Generic and Personalized Federated Learning for Image
Classification", ICLR 2022 (Sec. 4, "Federated Robust Decoupling", Algorithm 1).

The model is a shared body f (feature extractor) with two heads on its features z = f(x):

- the generic head g, shared and averaged by the server with the body, trained with the
  *balanced softmax* loss (Sec. 4.1, class-balanced risk): CE(g(z) + log $n_{i,c}$, y), where
  $n_{i,c}$ is the number of training samples of class c on client i, so the generic model targets
  a class-balanced objective despite each client's skew;
- the personal head $p_i$, kept on the client, trained on the same batch with the body and the
  generic head frozen (detached) on the personalized prediction g(z) + $p_i$(z) with plain CE
  (Sec. 4.2, "the personalized model ... adds a personal head").

The client uploads body + generic head (the full model); the server averages as FedAvg does.
Stage L1 and L2 evaluate the personalized prediction g(z) + $p_i$(z); stage G the generic model
on the global test set. The personal head starts as a copy of $Θ^0$'s head (as in the authors'
released code) and is trained with the round's optimizer settings.

Classes absent from a client's training data get log $n_c$ = log 1e-8 in the balanced softmax
(the released code uses log 0 = −∞).

What crosses the wire: FedAvg's. Client state: ``fedrod_head``, the personal head's parameters.
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

from pflower.api import AlgorithmOptions, PersonalClient, PersonalizedStrategy, register_algorithm
from pflower.core.client import server_round
from pflower.core.training import (
    Regularizer,
    TrainSettings,
    get_weights,
    model_device,
)
from pflower.models import split
from pflower.strategies.batches import optimizer_step, train_batches

PERSONAL_HEAD = "fedrod_head"


class PersonalizedPrediction(nn.Module):
    """g(f(x)) + p(f(x)): the personalized model of FedRoD (for evaluation)."""

    def __init__(self, model: nn.Module, personal_head: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.personal_head = personal_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = split.represent(self.model, x)
        return split.head(self.model)(z) + self.personal_head(z)


class FedRoDStrategy(PersonalizedStrategy["FedRoDOptions"]):
    """Server side identical to FedAvg (body and generic head)."""


class FedRoDClient(PersonalClient["FedRoDOptions"]):
    """Balanced-softmax generic training and a personal head on top."""

    _personal: nn.Module | None = None

    def personal_head(self, initial: NDArrays | None = None) -> nn.Module:
        """The client's personal head p_i (from state; else a copy of Θ^0's head)."""
        head = copy.deepcopy(split.head(self.model))
        stored = self.state.get_arrays(PERSONAL_HEAD)
        if stored is None:
            stored = [
                array
                for keep, array in zip(
                    split.head_mask(self.model),
                    initial if initial is not None else self.experiment.initial_weights(),
                    strict=True,
                )
                if keep
            ]
        with torch.no_grad():
            for param, array in zip(head.state_dict().values(), stored, strict=True):
                param.copy_(torch.from_numpy(np.array(array, copy=True)))
        return head

    def local_train(
        self,
        settings: TrainSettings,
        config: dict[str, Scalar],
        regularizer: Regularizer | None = None,
        after_step: Callable[[nn.Module], None] | None = None,
    ) -> float:
        model, data = self.model, self.data.train
        initial = get_weights(model) if server_round(config) == 1 else None
        personal = self.personal_head(initial)
        counts = torch.bincount(data.labels, minlength=split.head_shape(model)[1])
        device = model_device(model)
        log_prior = counts.to(torch.float32).clamp_min(1e-8).log().to(device)
        model.train()
        optimizer = settings.make_optimizer(model.parameters())
        personal_optimizer = settings.make_optimizer(personal.parameters())
        total, batches = 0.0, 0
        for x, y in train_batches(self, settings, config):
            z = split.represent(model, x)
            generic = split.head(model)(z)
            loss = nn.functional.cross_entropy(generic + log_prior, y)  # balanced softmax
            total += float(loss.detach())
            optimizer_step(optimizer, loss, model, regularizer, after_step)
            personal_loss = nn.functional.cross_entropy(generic.detach() + personal(z.detach()), y)
            personal_optimizer.zero_grad(set_to_none=True)
            personal_loss.backward()
            personal_optimizer.step()
            batches += 1
        self.state.put_arrays(
            PERSONAL_HEAD,
            [t.detach().cpu().numpy().copy() for t in personal.state_dict().values()],
        )
        return total / max(batches, 1)

    def stage_metrics(self) -> dict[str, Scalar]:
        """Metrics of the personalized prediction g(z) + p_i(z)."""
        model = self.model
        self.model = PersonalizedPrediction(model, self.personal_head())
        try:
            return super().stage_metrics()
        finally:
            self.model = model


@register_algorithm("fedrod", strategy=FedRoDStrategy, client=FedRoDClient)
@dataclass
class FedRoDOptions(AlgorithmOptions):
    """FedRoD has only the common options (the heads are the model's declared head)."""

    display_name: ClassVar[str] = "FedRoD"
    display_rank: ClassVar[int] = 250
