r"""FedProto: Tan, Long, Liu, Zhou, Lu, Jiang and Zhang, "FedProto: Federated Prototype Learning
across Heterogeneous Clients", AAAI 2022 (a baseline of the DiversiFed paper, Wu et al., Sec. V-B).

No model weights are shared; clients exchange class prototypes, the mean representation
(the input of the classification layer ``fc``) of each class (FedProto's Alg. 1):

- client i, local training: from its own model, minimize per batch
  CE(fc(f(x)), y) + $λ_p$ · MSE(f(x), $C̄^{(y)}$), where $C̄^{(y)}$ is the global prototype of
  class y; samples of classes with no global prototype yet contribute 0 to the MSE, which is
  averaged over the whole batch (as PFLlib, which the DiversiFed paper ran FedProto from);
- client i, after training: its local prototypes $C_i^{(j)}$ = mean of f(x) over its training
  samples of class j (model in eval mode), and their counts |$D_{i,j}$|;
- server: $C̄^{(j)} = \sum _i$ |$D_{i,j}$| $C_i^{(j)} / \sum _i$ |$D_{i,j}$| over the clients
  holding class j (the paper's count-weighted average, ``proto_weighting=counts``), or their plain
  mean (``uniform``, PFLlib);
- prediction: the class of the nearest global prototype in L2 (the paper's inference rule),
  i.e. logits $−\|f(x) − \bar C^{(j)}\|^2$; classes without a global prototype are never predicted.
  The reported loss is the cross-entropy of these scores. Before any global prototype exists
  (stage L2 of round 1) the client's own ``fc`` head predicts instead (pflower's choice; the
  paper does not say).

What crosses the wire: fit and evaluate send the global prototypes as two arrays, ``[C × D
prototypes (float32), C counts]`` (count 0: no prototype for that class), or no arrays before
the first aggregation; config ``server-round``. The client uploads ``[C × D local prototypes,
C counts]``. λ_p is read by both sides from ``strategy.lam``.

Server state: the latest global prototypes (what the base class holds as its "global weights";
no global model, so no stage G). Client state: ``proto_model``, its own model (all
``state_dict`` arrays), read at fit and evaluate; a client starts from $Θ^0$.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

import numpy as np
import torch
from flwr.common import NDArrays, Parameters, Scalar, ndarrays_to_parameters
from torch import nn

from pflower.api import AlgorithmOptions, PersonalClient, PersonalizedStrategy, register_algorithm
from pflower.config import require
from pflower.core.declared import state
from pflower.core.strategy import ClientUpdate
from pflower.core.training import (
    Regularizer,
    TrainSettings,
    model_device,
)
from pflower.models.split import head, head_shape, represent
from pflower.searchspace import tunable
from pflower.strategies.batches import train_batches
from pflower.strategies.model_mixing import OwnModelClient

MODEL = "proto_model"
"""Client state: the client's own model (never sent)."""
NO_PROTOTYPE = -1e9
"""Score of a class without a global prototype (never the nearest)."""


class ProtoWeighting(StrEnum):
    """How the server averages the clients' prototypes of one class."""

    counts = "counts"
    """By the clients' sample counts of the class (the paper's global prototype)."""
    uniform = "uniform"
    """Every client holding the class counts once (PFLlib)."""


def aggregate_prototypes(
    uploads: list[NDArrays], weighting: ProtoWeighting = ProtoWeighting.counts
) -> NDArrays:
    """Global prototypes ``[C × D, C counts]`` from clients' ``[C × D, C counts]``."""
    protos = np.stack([np.asarray(u[0], dtype=np.float64) for u in uploads])
    counts = np.stack([np.asarray(u[1], dtype=np.float64) for u in uploads])
    uniform = weighting == ProtoWeighting.uniform
    weights = (counts > 0).astype(np.float64) if uniform else counts
    totals = weights.sum(axis=0)
    summed = np.einsum("kc,kcd->cd", weights, protos)
    safe = np.where(totals > 0, totals, 1.0)
    global_protos = np.where(totals[:, None] > 0, summed / safe[:, None], 0.0)
    return [global_protos.astype(np.float32), counts.sum(axis=0)]


def prototype_scores(
    features: torch.Tensor, prototypes: torch.Tensor, present: torch.Tensor
) -> torch.Tensor:
    """−‖f − C̄^{(j)}‖² per class (``NO_PROTOTYPE`` where class j has none): argmax = nearest."""
    scores = -(torch.cdist(features, prototypes, compute_mode="donot_use_mm_for_euclid_dist") ** 2)
    return torch.where(present[None, :], scores, torch.full_like(scores, NO_PROTOTYPE))


class NearestPrototype(nn.Module):
    """Wraps a model: logits are the negative squared distances to the global prototypes."""

    def __init__(self, model: nn.Module, prototypes: torch.Tensor, present: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.prototypes = prototypes
        self.present = present

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return prototype_scores(represent(self.model, x), self.prototypes, self.present)


def class_prototypes(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    prepare: Callable[[torch.Tensor], torch.Tensor],
    num_classes: int,
    batch_size: int,
) -> NDArrays:
    """``[C × D mean representation per class, C counts]`` of ``model`` on the samples."""
    model.eval()
    device = model_device(model)
    sums: torch.Tensor | None = None
    counts = torch.zeros(num_classes, dtype=torch.float64, device=device)
    with torch.no_grad():
        for start in range(0, len(labels), batch_size):
            batch = prepare(images[start : start + batch_size]).to(device)
            features = represent(model, batch).double()
            y = labels[start : start + batch_size].to(device)
            if sums is None:
                sums = torch.zeros(
                    num_classes, features.shape[1], dtype=torch.float64, device=device
                )
            sums.index_add_(0, y, features)
            counts += torch.bincount(y, minlength=num_classes).double()
    if sums is None:
        width = head_shape(model)[0]
        sums = torch.zeros(num_classes, width, dtype=torch.float64, device=device)
    means = sums / counts.clamp(min=1.0)[:, None]
    return [means.float().cpu().numpy(), counts.cpu().numpy()]


class FedProtoStrategy(PersonalizedStrategy["FedProtoOptions"]):
    """Averages the clients' class prototypes; sends the global prototypes to every client."""

    robust_aggregation: ClassVar[bool] = False

    has_global_model: ClassVar[bool] = False

    prototypes: NDArrays | None = state()
    """The latest global prototypes ``[C × D, C counts]`` (None before round 1 ends)."""

    def client_parameters(
        self, server_round: int, partition_id: int, global_parameters: Parameters
    ) -> Parameters:
        return ndarrays_to_parameters(self.prototypes or [])

    def check_update(self, weights: NDArrays, current: NDArrays) -> str | None:
        if len(weights) != 2:
            return f"sent {len(weights)} arrays, expected 2 (prototypes and counts)"
        protos, counts = weights
        if protos.ndim != 2 or counts.shape != (protos.shape[0],):
            return f"prototypes {protos.shape} and counts {counts.shape} do not fit"
        if not (np.all(np.isfinite(protos)) and np.all(np.isfinite(counts))):
            return "prototypes or counts contain NaN or Inf"
        if np.any(counts < 0):
            return "negative class counts"
        return None

    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        self.prototypes = aggregate_prototypes(
            [u.weights for u in updates], self.options.proto_weighting
        )
        return self.prototypes


class FedProtoClient(OwnModelClient["FedProtoOptions"]):
    """Trains its own model with the prototype regularizer; uploads its class prototypes."""

    model_key: ClassVar[str] = MODEL
    _global: tuple[torch.Tensor, torch.Tensor] | None = None

    def receive(self, parameters: NDArrays) -> None:
        """Keep the global prototypes of this message (none before the first aggregation)."""
        if len(parameters) == 2:
            protos, counts = parameters
            device = model_device(self.model)
            self._global = (
                torch.from_numpy(np.asarray(protos)).float().to(device),
                torch.from_numpy(counts > 0).to(device),
            )
        else:
            self._global = None

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        self.receive(global_weights)
        return self.own_model()

    def local_train(
        self,
        settings: TrainSettings,
        config: dict[str, Scalar],
        regularizer: Regularizer | None = None,
        after_step: Callable[[nn.Module], None] | None = None,
    ) -> float:
        """CE + λ_p·MSE(f(x), C̄^{(y)}) over the client's train split (same batches as the
        shared loop: data order seeded per round and client)."""
        return prototype_train(self, settings, config, self._global, self.options.lam)

    def upload(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> NDArrays:
        return class_prototypes(
            self.model,
            self.data.train.images,
            self.data.train.labels,
            self.data.prepare,
            self.experiment.federation.dataset.num_classes,
            self.experiment.settings.eval.batch_size,
        )

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        self.receive(global_weights)
        return self.own_model()

    def stage_metrics(self) -> dict[str, Scalar]:
        """Nearest-global-prototype accuracy (own head before any prototype exists)."""
        if self._global is None:
            return super().stage_metrics()
        return self.scores(NearestPrototype(self.model, *self._global))


def prototype_train(
    client: PersonalClient,
    settings: TrainSettings,
    config: dict[str, Scalar],
    prototypes: tuple[torch.Tensor, torch.Tensor] | None,
    lam: float,
) -> float:
    """FedProto's local objective on ``client``'s model with the shared loop's batches
    ([`train_batches`][pflower.strategies.batches.train_batches]) and optimizer; returns the
    mean cross-entropy."""
    model = client.model
    model.train()
    optimizer = settings.make_optimizer(model.parameters())
    criterion = nn.CrossEntropyLoss()
    total, batches = 0.0, 0
    for inputs, y in train_batches(client, settings, config):
        optimizer.zero_grad(set_to_none=True)
        features = represent(model, inputs)
        loss = criterion(head(model)(features), y)
        total += float(loss.detach())
        if prototypes is not None and lam > 0:
            protos, present = prototypes
            target = features.detach().clone()
            has = present[y]
            target[has] = protos[y[has]]
            loss = loss + lam * nn.functional.mse_loss(features, target)
        loss.backward()
        optimizer.step()
        batches += 1
    return total / max(batches, 1)


@register_algorithm("fedproto", strategy=FedProtoStrategy, client=FedProtoClient)
@dataclass
class FedProtoOptions(AlgorithmOptions):
    """Attributes:
    lam: λ_p, weight of the prototype regularizer.
    proto_weighting: ``counts`` (the paper) or ``uniform`` (PFLlib) averaging of prototypes.
    """

    display_name: ClassVar[str] = "FedProto"
    display_rank: ClassVar[int] = 44

    lam: float = tunable(
        1.0, low=0.01, high=10.0, log=True, source="FedProto (Tan et al., AAAI 2022), Sec. 5: λ = 1"
    )
    proto_weighting: ProtoWeighting = ProtoWeighting.counts

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.lam >= 0, f"strategy.lam must be >= 0, got {self.lam}")
