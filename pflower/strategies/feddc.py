"""FedDC: Gao, Fu, Li, Chen, Xu and Xu, "FedDC: Federated Learning with Non-IID Data via Local
Drift Decoupling and Correction", CVPR 2022 (a baseline of FedMPR, Göksu & Pugeault,
Tables II-III). Written from the paper and the authors' public implementation.

Client i keeps a local drift variable h_i and a local gradient-correction term G_i (zeros at the
start); the server keeps the global model w and the global correction G. A sampled client starts
from θ ← w and minimizes, with the round's local SGD (K steps at learning rate η),

    F_i(θ) = L_i(θ) + (α/2) ‖θ + h_i − w‖² + ⟨θ, G − G_i⟩

(the drift-decoupling penalty and the SCAFFOLD-style gradient correction), then, with Δ = θ − w,

    h_i ← h_i + Δ                                   (local drift)
    G_i⁺ = G_i − G − Δ / (K η),   ΔG_i = G_i⁺ − G_i (correction, stored as G_i ← G_i⁺)

and uploads θ, h_i and ΔG_i. The server, with N clients in all and the sampled set S,

    w ← mean_{i∈S} θ_i + (1/N) Σ_{all i} h_i,      G ← G + (1/N) Σ_{i∈S} ΔG_i

using each client's latest h_i (cached by partition id; zero for a client never sampled).
h, G and the corrections act on the trainable parameters only; BatchNorm buffers are averaged as
in FedAvg.

What crosses the wire:
- server → client (fit): w (every ``state_dict`` entry) followed by G (trainable parameters);
  evaluate instructions carry w alone. Fit config: ``server-round`` only.
- client → server: θ (every entry), then h_i, then ΔG_i (trainable parameters each): three
  model-sized arrays up, two down (``bytes_up``/``bytes_down``).

Client state (``context.state``): ``feddc_drift`` (h_i) and ``feddc_correction`` (G_i), trainable
parameters in ``state_dict`` order; absent means zero.

Server state (attributes of :class:`FedDCStrategy`, for checkpoints):
    global_correction: G, one array per trainable parameter (None = zero).
    client_drifts: {partition id: h_i}, the latest drift each client uploaded.
    global_weights: w (the base class's global model).

Deviations and additions: the official code scales α and the correction by n_i / mean(n), which is
1 for equal-sized clients and is left out here. ``drift_weight`` λ (pflower's knob, 1 = FedDC)
multiplies h_i in the penalty and in the server correction, and the gradient-correction term:
λ = 0 leaves FedProx with μ = α, and with α = 0 as well, FedAvg exactly. The mean over S follows
``aggregation`` (default ``uniform``, as the official code).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from flwr.common import NDArrays, Parameters, Scalar, ndarrays_to_parameters, parameters_to_ndarrays

from pflower.config import require
from pflower.core.algorithm import register_algorithm
from pflower.core.client import PersonalClient
from pflower.core.options import Aggregation, AlgorithmOptions
from pflower.core.strategy import ClientUpdate, PersonalizedStrategy
from pflower.core.training import Regularizer, trainable_mask
from pflower.strategies.fedprox import proximal_term
from pflower.strategies.scaffold import (
    as_float64,
    cast_like,
    linear_term,
    local_steps,
    require_mask,
    trainable_part,
    zeros_like_trainable,
)

DRIFT = "feddc_drift"
CORRECTION = "feddc_correction"


class FedDCStrategy(PersonalizedStrategy["FedDCOptions"]):
    """Keeps G and every client's latest h_i; w = mean θ_i + mean h_i."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.global_correction: NDArrays | None = None
        """G: one array per trainable parameter (None = zero, before the first update)."""
        self.client_drifts: dict[int, NDArrays] = {}
        """h_i by partition id: the latest drift each client uploaded."""
        self._message: tuple[int, Parameters] | None = None

    def correction(self) -> NDArrays:
        if self.global_correction is None:
            self.global_correction = zeros_like_trainable(self.global_weights, require_mask(self))
        return [array.copy() for array in self.global_correction]

    def client_parameters(
        self, server_round: int, partition_id: int, global_parameters: Parameters
    ) -> Parameters:
        """w followed by G (one message for all clients, built once per round)."""
        if self._message is None or self._message[0] != server_round:
            arrays = parameters_to_ndarrays(global_parameters) + self.correction()
            self._message = (server_round, ndarrays_to_parameters(arrays))
        return self._message[1]

    def evaluate_parameters(
        self, server_round: int, partition_id: int, global_parameters: Parameters
    ) -> Parameters:
        return global_parameters

    def expected_upload(self, current: NDArrays) -> NDArrays:
        """θ, then h_i, then ΔG_i."""
        trainable = zeros_like_trainable(current, require_mask(self))
        return list(current) + trainable + [array.copy() for array in trainable]

    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        mask = require_mask(self)
        size, count = len(current), sum(mask)
        num_clients = self.settings.num_clients
        for update in updates:
            self.client_drifts[update.partition_id] = [
                np.array(a, copy=True) for a in update.weights[size : size + count]
            ]
        models = [
            ClientUpdate(u.partition_id, u.weights[:size], u.num_examples, u.metrics)
            for u in updates
        ]
        mean = self.average(models)
        weight = self.options.drift_weight
        new = list(mean)
        if weight != 0.0:
            drift = [np.zeros(a.shape, np.float64) for a in trainable_part(current, mask)]
            for drifts in self.client_drifts.values():
                for acc, h in zip(drift, drifts, strict=True):
                    acc += np.asarray(h, np.float64) / num_clients
            positions = [index for index, keep in enumerate(mask) if keep]
            for index, h in zip(positions, drift, strict=True):
                new[index] = (np.asarray(mean[index], np.float64) + weight * h).astype(
                    mean[index].dtype
                )
        correction = self.correction()
        total = as_float64(correction)
        for update in updates:
            for acc, delta in zip(total, update.weights[size + count :], strict=True):
                acc += np.asarray(delta, np.float64) / num_clients
        self.global_correction = cast_like(total, correction)
        return new


class FedDCClient(PersonalClient["FedDCOptions"]):
    """Penalized, corrected local training; updates h_i and G_i."""

    def _split(self, parameters: NDArrays) -> tuple[NDArrays, NDArrays]:
        size = len(self.model.state_dict())
        return list(parameters[:size]), list(parameters[size:])

    def _stored(self, key: str, like: NDArrays) -> NDArrays:
        stored = self.state.get_arrays(key)
        return stored if stored is not None else [np.zeros_like(a) for a in like]

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self._split(global_weights)[0]

    def regularizer(self, global_weights: NDArrays, config: dict[str, Scalar]) -> Regularizer:
        w, g_server = self._split(global_weights)
        mask = trainable_mask(self.model)
        h = self._stored(DRIFT, g_server)
        g_own = self._stored(CORRECTION, g_server)
        weight = self.options.drift_weight
        drifts = iter(h)
        anchor = [
            (np.asarray(array, np.float64) - weight * np.asarray(next(drifts), np.float64)).astype(
                array.dtype
            )
            if trainable
            else array
            for array, trainable in zip(w, mask, strict=True)
        ]  # ‖θ + λh_i − w‖² = ‖θ − (w − λh_i)‖²
        penalty = proximal_term(self.model, anchor, self.options.alpha)
        correction = linear_term(
            self.model, [s - own for s, own in zip(g_server, g_own, strict=True)], scale=weight
        )
        return lambda model: penalty(model) + correction(model)

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        w, g_server = self._split(global_weights)
        mask = trainable_mask(self.model)
        h = self._stored(DRIFT, g_server)
        g_own = self._stored(CORRECTION, g_server)
        delta = [
            np.asarray(t, np.float64) - np.asarray(x, np.float64)
            for t, x in zip(trainable_part(trained, mask), trainable_part(w, mask), strict=True)
        ]
        new_h = [np.asarray(own, np.float64) + d for own, d in zip(h, delta, strict=True)]
        settings = self.train_settings(config)
        steps = local_steps(len(self.data.train), settings)
        scale = 1.0 / (steps * settings.lr) if steps else 0.0
        new_g = [
            np.asarray(own, np.float64) - np.asarray(s, np.float64) - scale * d
            for own, s, d in zip(g_own, g_server, delta, strict=True)
        ]
        if not steps:
            new_g = as_float64(g_own)
        self._upload_extra = cast_like(new_h, h) + cast_like(
            [n - np.asarray(o, np.float64) for n, o in zip(new_g, g_own, strict=True)], g_own
        )
        self.state.put_arrays(DRIFT, cast_like(new_h, h))
        self.state.put_arrays(CORRECTION, cast_like(new_g, g_own))

    def upload(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> NDArrays:
        """θ, then h_i, then ΔG_i."""
        return list(trained) + list(self._upload_extra)


@register_algorithm("feddc", strategy=FedDCStrategy, client=FedDCClient)
@dataclass
class FedDCOptions(AlgorithmOptions):
    """Attributes:
    alpha: weight α of the drift-decoupling penalty (0.01, the official default).
    drift_weight: λ, the weight of the local drift and of the gradient correction (1 = FedDC;
        0 with alpha = 0 is FedAvg).
    aggregation: ``uniform`` (default, as the official code) or ``weighted`` by n_i.
    """

    display_name: ClassVar[str] = "FedDC"
    display_rank: ClassVar[int] = 14

    alpha: float = 0.01
    drift_weight: float = 1.0
    aggregation: Aggregation = Aggregation.uniform

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.alpha >= 0, f"strategy.alpha must be >= 0, got {self.alpha}")
        require(
            0.0 <= self.drift_weight <= 1.0,
            f"strategy.drift_weight must be in [0, 1], got {self.drift_weight}",
        )
