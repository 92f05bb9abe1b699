"""SCAFFOLD: Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020 (a baseline of FedMPR, Göksu & Pugeault,
Tables II-III).

Control variates correct the client drift (Alg. 1). The server holds the model x and the server
control variate c; client i holds its control variate c_i (all zero at the start). In a round,
each sampled client starts from y_i ← x and takes K local SGD steps on the corrected gradient

    y_i ← y_i − η_l (g_i(y_i) − c_i + c)                                   (Alg. 1, line 10)

then updates its control variate with option II of Eq. (4)

    c_i⁺ = c_i − c + (x − y_i) / (K η_l)                                   (Alg. 1, line 12)

and returns Δy_i = y_i − x and Δc_i = c_i⁺ − c_i. The server updates, over the sampled set S of
the N clients,

    x ← x + η_g · mean_{i∈S} Δy_i,     c ← c + (1/N) Σ_{i∈S} Δc_i          (Alg. 1, lines 16-17)

The correction acts on the trainable parameters only; BatchNorm buffers are averaged as in FedAvg
(they are not optimized, so they have no gradient to correct). The correction is applied as the
loss term ⟨θ, c − c_i⟩, whose gradient is exactly c − c_i: the optimizer sees g − c_i + c, also
with momentum or weight decay. K is the number of optimizer steps the client took this round,
η_l the round's learning rate.

What crosses the wire (Alg. 1 lines 5 and 13, exactly two model-sized messages each way):

- server → client (fit): the arrays of x (every ``state_dict`` entry), followed by c (one array
  per trainable parameter, in ``state_dict`` order). The client splits them at the number of
  arrays of its model. Fit config: ``server-round`` only. Evaluate instructions carry x alone.
- client → server: y_i (every ``state_dict`` entry), followed by Δc_i (trainable parameters).
  Sending y_i instead of Δy_i = y_i − x is the same message up to the x both sides know: the
  server forms Δy_i itself, in float64, so η_g = 1 gives the average of the y_i bit for bit.
- ``bytes_down`` / ``bytes_up`` in the L2 rows therefore read about twice FedAvg's.

Client state (``context.state``): ``scaffold_ci``, the client control variate c_i (trainable
parameters, ``state_dict`` order); absent means zero.

Server state (attributes of :class:`ScaffoldStrategy`, for checkpoints):
    server_control: c, one array per trainable parameter (None until first used, meaning zero).
    global_weights: x (the base class's global model).

Deviations: the mean of the Δy_i follows ``aggregation`` (default ``uniform``, Alg. 1's 1/|S|;
``weighted`` by n_i as in FedAvg). With zero control variates and η_g = 1 a round is FedAvg's
round exactly (the first round always is).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from flwr.common import NDArrays, Parameters, Scalar, ndarrays_to_parameters, parameters_to_ndarrays
from torch import nn

from pflower.config import require
from pflower.core.algorithm import register_algorithm
from pflower.core.client import PersonalClient
from pflower.core.options import Aggregation, AlgorithmOptions
from pflower.core.strategy import ClientUpdate, PersonalizedStrategy
from pflower.core.training import Regularizer, TrainSettings, trainable_mask

CLIENT_CONTROL = "scaffold_ci"


# ----------------------------------------------------------------------- shared helpers
def trainable_part(arrays: Sequence[np.ndarray], mask: Sequence[bool]) -> NDArrays:
    """The entries of a ``state_dict``-ordered list that are trainable parameters."""
    return [array for array, keep in zip(arrays, mask, strict=True) if keep]


def zeros_like_trainable(arrays: Sequence[np.ndarray], mask: Sequence[bool]) -> NDArrays:
    """Zero arrays shaped like the trainable entries of ``arrays``."""
    return [np.zeros_like(array) for array in trainable_part(arrays, mask)]


def local_steps(num_examples: int, settings: TrainSettings) -> int:
    """K: the optimizer steps of one local round (as :func:`~pflower.core.training.train` takes)."""
    if num_examples == 0:
        return 0
    if settings.steps is not None:
        return settings.steps
    return settings.epochs * -(-num_examples // settings.batch_size)


def linear_term(model: nn.Module, coefficients: NDArrays, scale: float = 1.0) -> Regularizer:
    """The loss term θ ↦ scale · Σ_j ⟨θ_j, v_j⟩ over the trainable parameters of ``model`` (in
    ``state_dict`` order), with ``coefficients`` v; its gradient is exactly scale · v."""
    names = [
        name for name, keep in zip(model.state_dict(), trainable_mask(model), strict=True) if keep
    ]
    vectors = {
        name: torch.from_numpy(np.asarray(array)).clone()
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


def as_float64(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(array, dtype=np.float64) for array in arrays]


def cast_like(arrays: Sequence[np.ndarray], references: Sequence[np.ndarray]) -> NDArrays:
    return [
        np.asarray(array).astype(reference.dtype)
        for array, reference in zip(arrays, references, strict=True)
    ]


def require_mask(strategy: PersonalizedStrategy) -> list[bool]:
    """The strategy's trainable mask (the ServerApp sets it); a clear error if it is missing."""
    if strategy.trainable_mask is None:
        raise RuntimeError(
            f"{type(strategy).__name__} needs strategy.trainable_mask (which model arrays are "
            "trainable parameters); the ServerApp sets it, a hand-built strategy must set it too"
        )
    return strategy.trainable_mask


# ----------------------------------------------------------------------------- server
class ScaffoldStrategy(PersonalizedStrategy["ScaffoldOptions"]):
    """Keeps the server control variate c; sends (x, c); applies Alg. 1 lines 16-17."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.server_control: NDArrays | None = None
        """c: one array per trainable parameter (None = zero, before the first update)."""
        self._message: tuple[int, Parameters] | None = None

    def control(self) -> NDArrays:
        """The current server control variate c (zeros before any update)."""
        if self.server_control is None:
            self.server_control = zeros_like_trainable(self.global_weights, require_mask(self))
        return [array.copy() for array in self.server_control]

    def client_parameters(
        self, server_round: int, partition_id: int, global_parameters: Parameters
    ) -> Parameters:
        """x followed by c (the same message for every client; built once per round)."""
        if self._message is None or self._message[0] != server_round:
            arrays = parameters_to_ndarrays(global_parameters) + self.control()
            self._message = (server_round, ndarrays_to_parameters(arrays))
        return self._message[1]

    def evaluate_parameters(
        self, server_round: int, partition_id: int, global_parameters: Parameters
    ) -> Parameters:
        """Evaluation needs x only."""
        return global_parameters

    def expected_upload(self, current: NDArrays) -> NDArrays:
        """y_i followed by Δc_i."""
        return list(current) + zeros_like_trainable(current, require_mask(self))

    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        mask = require_mask(self)
        size = len(current)
        models = [
            ClientUpdate(u.partition_id, u.weights[:size], u.num_examples, u.metrics)
            for u in updates
        ]
        mean_y = self.average(models)
        eta = self.options.server_lr
        new_x: NDArrays = []
        for x, y, trainable in zip(current, mean_y, mask, strict=True):
            if not trainable or eta == 1.0:  # buffers: FedAvg; η_g = 1: x + (ȳ − x) = ȳ
                new_x.append(y)
            else:
                x64 = np.asarray(x, dtype=np.float64)
                new_x.append((x64 + eta * (np.asarray(y, dtype=np.float64) - x64)).astype(x.dtype))
        control = self.control()
        total = as_float64(control)
        for update in updates:
            for acc, delta in zip(total, update.weights[size:], strict=True):
                acc += np.asarray(delta, dtype=np.float64) / self.settings.num_clients
        self.server_control = cast_like(total, control)
        return new_x


# ----------------------------------------------------------------------------- client
class ScaffoldClient(PersonalClient["ScaffoldOptions"]):
    """Trains with the gradient correction c − c_i and updates c_i (option II)."""

    def _split(self, parameters: NDArrays) -> tuple[NDArrays, NDArrays]:
        size = len(self.model.state_dict())
        return list(parameters[:size]), list(parameters[size:])

    def client_control(self, like: NDArrays) -> NDArrays:
        """c_i from the client's state (zeros shaped like ``like`` before the first round)."""
        stored = self.state.get_arrays(CLIENT_CONTROL)
        return stored if stored is not None else [np.zeros_like(a) for a in like]

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self._split(global_weights)[0]

    def regularizer(self, global_weights: NDArrays, config: dict[str, Scalar]) -> Regularizer:
        _, c = self._split(global_weights)
        c_i = self.client_control(c)
        return linear_term(self.model, [s - own for s, own in zip(c, c_i, strict=True)])

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        x, c = self._split(global_weights)
        c_i = self.client_control(c)
        mask = trainable_mask(self.model)
        settings = self.train_settings(config)
        steps = local_steps(len(self.data.train), settings)
        if steps == 0:
            self._delta_control = [np.zeros_like(a) for a in c_i]
            return
        scale = 1.0 / (steps * settings.lr)
        x_t, y_t = trainable_part(x, mask), trainable_part(trained, mask)
        new_c_i = [
            np.asarray(own, np.float64)
            - np.asarray(server, np.float64)
            + scale * (np.asarray(x0, np.float64) - np.asarray(y, np.float64))
            for own, server, x0, y in zip(c_i, c, x_t, y_t, strict=True)
        ]
        self._delta_control = cast_like(
            [new - np.asarray(own, np.float64) for new, own in zip(new_c_i, c_i, strict=True)], c_i
        )
        self.state.put_arrays(CLIENT_CONTROL, cast_like(new_c_i, c_i))

    def upload(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> NDArrays:
        """y_i followed by Δc_i."""
        return list(trained) + list(self._delta_control)


@register_algorithm("scaffold", strategy=ScaffoldStrategy, client=ScaffoldClient)
@dataclass
class ScaffoldOptions(AlgorithmOptions):
    """Attributes:
    server_lr: the global step size η_g (Alg. 1 line 16; 1 in the paper's experiments).
    aggregation: ``uniform`` (Alg. 1's mean over S, default) or ``weighted`` by n_i.
    """

    display_name: ClassVar[str] = "SCAFFOLD"
    display_rank: ClassVar[int] = 12

    server_lr: float = 1.0
    aggregation: Aggregation = Aggregation.uniform

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.server_lr > 0, f"strategy.server_lr must be > 0, got {self.server_lr}")
