r"""Shared machinery of the drift-correction family (SCAFFOLD, FedDC, FedDyn).

These methods keep, beside the model, vectors over the *trainable* parameters only (control
variates c and $c_i$ of SCAFFOLD, Karimireddy et al., ICML 2020, Alg. 1; the correction G and
drift $h_i$ of FedDC, Gao et al., CVPR 2022; the linear term and h of FedDyn, Acar et al.,
ICLR 2021). BatchNorm buffers have no gradient and are left out of them. This module holds:

- array helpers over a ``state_dict``-ordered list and its trainable mask;
- [`linear_term`][pflower.strategies.control_variates.linear_term], the loss term ⟨$θ$, v⟩ whose
  gradient is exactly v;
- [`local_steps`][pflower.strategies.control_variates.local_steps] (K) and
  [`effective_steps`][pflower.strategies.control_variates.effective_steps] (the denominator of
  SCAFFOLD's option II
  and of FedDC's correction under heavy-ball momentum, see there);
- [`mean_delta_update`][pflower.strategies.control_variates.mean_delta_update], the server step
  $v \leftarrow v + \frac{1}{N} \sum_{i∈S} Δv_i$;
- [`ModelAndVariateStrategy`][pflower.strategies.control_variates.ModelAndVariateStrategy] /
  [`ModelAndVariateClient`][pflower.strategies.control_variates.ModelAndVariateClient]: the wire
  format "model,
  then one server variate per trainable parameter" (fit only; evaluate carries the model alone);
- [`ClientAverageScoring`][pflower.strategies.control_variates.ClientAverageScoring]: which model
  FedDyn and FedDC report ([`ReportedModel`][pflower.strategies.control_variates.ReportedModel]).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.common import NDArrays, Parameters, Scalar, ndarrays_to_parameters, parameters_to_ndarrays
from torch import nn

from pflower.api import PersonalClient, PersonalizedStrategy
from pflower.core.declared import cache, state
from pflower.core.options import OptionsT
from pflower.core.training import Regularizer, TrainSettings, model_device, trainable_mask
from pflower.registry import ConfigError


# ------------------------------------------------------------------------- array helpers
def trainable_part(arrays: Sequence[np.ndarray], mask: Sequence[bool]) -> NDArrays:
    """The entries of a ``state_dict``-ordered list that are trainable parameters."""
    return [array for array, keep in zip(arrays, mask, strict=True) if keep]


def zeros_like_trainable(arrays: Sequence[np.ndarray], mask: Sequence[bool]) -> NDArrays:
    """Zero arrays shaped like the trainable entries of ``arrays``."""
    return [np.zeros_like(array) for array in trainable_part(arrays, mask)]


def as_float64(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(array, dtype=np.float64) for array in arrays]


def cast_like(arrays: Sequence[np.ndarray], references: Sequence[np.ndarray]) -> NDArrays:
    return [
        np.asarray(array).astype(reference.dtype)
        for array, reference in zip(arrays, references, strict=True)
    ]


def require_mask(strategy: PersonalizedStrategy) -> list[bool]:
    """The strategy's trainable mask (the ServerApp gives it); a clear error if it is missing."""
    if strategy.trainable_mask is None:
        raise RuntimeError(
            f"{type(strategy).__name__} needs a trainable_mask (which model arrays are "
            "trainable parameters); the ServerApp gives it, a hand-built strategy needs it too"
        )
    return strategy.trainable_mask


def mean_delta_update(
    current: NDArrays, deltas: Sequence[Sequence[np.ndarray]], num_clients: int
) -> NDArrays:
    """v + (1/N) Σ_{i∈S} Δv_i over the uploaded ``deltas`` (float64, cast back to ``current``):
    SCAFFOLD's c update (Alg. 1 line 17) and FedDC's G update, with N all clients."""
    total = as_float64(current)
    for delta in deltas:
        for acc, part in zip(total, delta, strict=True):
            acc += np.asarray(part, dtype=np.float64) / num_clients
    return cast_like(total, current)


# ------------------------------------------------------------------------ local training
def linear_term(model: nn.Module, coefficients: NDArrays, scale: float = 1.0) -> Regularizer:
    """The loss term θ ↦ scale · Σ_j ⟨θ_j, v_j⟩ over the trainable parameters of ``model`` (in
    ``state_dict`` order), with ``coefficients`` v; its gradient is exactly scale · v."""
    names = [
        name for name, keep in zip(model.state_dict(), trainable_mask(model), strict=True) if keep
    ]
    device = model_device(model)
    vectors = {
        name: torch.from_numpy(np.asarray(array)).clone().to(device)
        for name, array in zip(names, coefficients, strict=True)
    }

    def term(current: nn.Module) -> torch.Tensor:
        products = [
            (param * vectors[name]).sum()
            for name, param in current.named_parameters()
            if name in vectors
        ]
        return scale * torch.stack(products).sum()

    return term


def local_steps(num_examples: int, settings: TrainSettings) -> int:
    """K: the optimizer steps of one local round (as [`train`][pflower.core.training.train]
    takes)."""
    if num_examples == 0:
        return 0
    if settings.steps is not None:
        return settings.steps
    return settings.epochs * -(-num_examples // settings.batch_size)


def require_sgd(optimizer: str) -> None:
    """SCAFFOLD's option II and FedDC's correction read the mean gradient off the SGD
    displacement (x − y)/(K η); Adam has no such relation."""
    if optimizer != "sgd":
        raise ConfigError(
            "SCAFFOLD's option II and FedDC's correction estimate the mean gradient from the SGD "
            f"displacement (x − y)/(K η); train.optimizer={optimizer} has no such relation: set "
            "train.optimizer=sgd"
        )


def effective_steps(steps: int, settings: TrainSettings) -> float:
    """K_eff, with x − y_i = η_l · K_eff · (a weighted mean of the K corrected gradients).

    SCAFFOLD's option II (Karimireddy et al. 2020, Eq. 4 / Alg. 1 line 12) reads
    c_i⁺ = c_i − c + (x − y_i)/(K η_l): for plain SGD x − y_i = η_l Σ_k g̃_k, so (x − y_i)/(K η_l)
    is the mean corrected gradient g̃. With heavy-ball momentum β (PyTorch's SGD: buffer
    b_k = β b_{k−1} + g̃_k, step η_l b_k, buffer reset every round) the gradient of step k moves
    the model by η_l (1 − β^{K−k+1})/(1 − β), so x − y_i = η_l Σ_k w_k g̃_k with
    Σ_k w_k = K_eff = Σ_{k=1..K} (1 − β^k)/(1 − β), about K/(1 − β) for K ≫ 1/(1 − β).
    Dividing by K_eff η_l instead of K η_l keeps option II's quantity a weighted *mean* of the
    corrected gradients (weights summing to 1); dividing by K η_l overestimates it about
    1/(1 − β) times (10× at β = 0.9), and the control variates then diverge within a few rounds.

    Returns ``steps`` itself (an int) when momentum is 0, so plain SGD computes exactly the
    paper's K η_l. Adam has no such displacement/gradient relation: refused.
    """
    require_sgd(settings.optimizer)
    beta = settings.momentum
    if beta == 0.0:
        return steps
    return sum((1.0 - beta**k) / (1.0 - beta) for k in range(1, steps + 1))


# ----------------------------------------------------------------------------- wire format
class ModelAndVariateStrategy(PersonalizedStrategy[OptionsT]):
    """Fit sends the global model followed by
    [`server_variate`][pflower.strategies.control_variates.ModelAndVariateStrategy.server_variate]
    (one array per trainable
    parameter; the same message for every client, built once per round); evaluate sends the
    model alone. The uploads start with the client's model."""

    _message: tuple[int, Parameters] | None = cache()
    """This round's fit message (round, parameters), rebuilt when the round changes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Refuses optimizers other than SGD
        ([`require_sgd`][pflower.strategies.control_variates.require_sgd]); the rest is the
        base's."""
        super().__init__(*args, **kwargs)
        require_sgd(self.settings.train.optimizer)

    variate_attribute: ClassVar[str]
    """The attribute holding the server's vector over the trainable parameters (SCAFFOLD's c,
    FedDC's G): None means zero, before the first update."""

    def server_variate(self) -> NDArrays:
        """A copy of the server's vector (zeros before the first update)."""
        if getattr(self, self.variate_attribute) is None:
            setattr(
                self,
                self.variate_attribute,
                zeros_like_trainable(self.global_weights, require_mask(self)),
            )
        return [array.copy() for array in getattr(self, self.variate_attribute)]

    def client_parameters(
        self, server_round: int, partition_id: int, global_parameters: Parameters
    ) -> Parameters:
        if self._message is None or self._message[0] != server_round:
            arrays = parameters_to_ndarrays(global_parameters) + self.server_variate()
            self._message = (server_round, ndarrays_to_parameters(arrays))
        return self._message[1]

    def evaluate_parameters(
        self, server_round: int, partition_id: int, global_parameters: Parameters
    ) -> Parameters:
        """Evaluation needs the model only."""
        return global_parameters


class ModelAndVariateClient(PersonalClient[OptionsT]):
    """Splits
    [`ModelAndVariateStrategy`][pflower.strategies.control_variates.ModelAndVariateStrategy]'s
    message; trains from the model part."""

    def split_message(self, parameters: NDArrays) -> tuple[NDArrays, NDArrays]:
        """(model, server variate): the first ``len(state_dict)`` arrays, then the rest."""
        size = len(self.model.state_dict())
        return list(parameters[:size]), list(parameters[size:])

    def stored_or_zeros(self, key: str, like: NDArrays) -> NDArrays:
        """The arrays stored under ``key`` in the client's state, or zeros shaped like ``like``."""
        stored = self.state.get_arrays(key)
        return stored if stored is not None else [np.zeros_like(a) for a in like]

    extra_upload: NDArrays
    """What [`upload`][pflower.strategies.control_variates.ModelAndVariateClient.upload] sends after
    the trained model (set by ``remember``)."""

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self.split_message(global_weights)[0]

    def upload(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> NDArrays:
        """The trained model followed by
        [`extra_upload`][pflower.strategies.control_variates.ModelAndVariateClient.extra_upload]."""
        return list(trained) + list(self.extra_upload)

    def option_ii_scale(self, config: dict[str, Scalar]) -> float | None:
        """1/(K_eff η_l) of this round
        ([`effective_steps`][pflower.strategies.control_variates.effective_steps]), or None when no
        step ran."""
        settings = self.train_settings(config)
        steps = local_steps(len(self.data.train), settings)
        if steps == 0:
            return None
        return 1.0 / (effective_steps(steps, settings) * settings.lr)


class ReportedModel(StrEnum):
    """The model FedDyn and FedDC score at stages G and L1 (``strategy.report``)."""

    average = "average"
    """The plain average of the round's client models: what FedDyn's official code evaluates
    (``avg_model``), FedDyn's default."""
    server = "server"
    """The corrected server model that clients receive and train from (FedDyn's θ^t = mean − h/α,
    FedDC's w = mean + mean h_i): what FedDC's official code evaluates (``cur_cld_model``),
    FedDC's default."""


class ClientAverageScoring:
    """Mixin for a strategy whose ``aggregate`` corrects the average of the client models: it
    keeps that average
    ([`client_average`][pflower.strategies.control_variates.ClientAverageScoring.client_average],
    set by
    [`remember_average`][pflower.strategies.control_variates.ClientAverageScoring.remember_average])
    and has stages G
    and L1 score it when ``options.report`` is ``average`` (see
    [`ReportedModel`][pflower.strategies.control_variates.ReportedModel]).

    Before the first aggregation (round 0) both reports are the initial model.
    """

    client_average: NDArrays | None = state()
    """The average of the latest round's client models (None before the first aggregation)."""
    options: Any

    def remember_average(self, mean: NDArrays) -> None:
        """Keep ``mean`` (the arrays
        [`average`][pflower.strategies.control_variates.ReportedModel.average] returned; nothing
        changes them in place)."""
        self.client_average = mean

    def scored_parameters(self, global_parameters: Parameters) -> Parameters:
        if self.options.report == ReportedModel.server or self.client_average is None:
            return global_parameters
        return ndarrays_to_parameters(self.client_average)
