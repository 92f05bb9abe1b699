r"""FedDC: Gao, Fu, Li, Chen, Xu and Xu, "FedDC: Federated Learning with Non-IID Data via Local
Drift Decoupling and Correction", CVPR 2022 (a baseline of FedMPR, Göksu & Pugeault,
Tables II-III). Written from the paper and the authors' public implementation.

Client i keeps a local drift variable $h_i$ and a local gradient-correction term $G_i$ (zeros at the
start); the server keeps the global model w and the global correction G. A sampled client starts
from $θ$ ← w and minimizes, with the round's local SGD (K steps at learning rate $η$),

$$
F_i(θ) = L_i(θ) + \frac{α}{2} \|θ + h_i − w\|^2 + ⟨θ, G − G_i⟩
$$

(the drift-decoupling penalty and the SCAFFOLD-style gradient correction), then, with $Δ = θ$ − w,

$$
\begin{aligned}
h_i &\leftarrow h_i + Δ && \text{(local drift)} \\
G_i^+ &= G_i − G − Δ / (K η), \quad ΔG_i = G_i^+ − G_i
    && \text{(correction, stored as } G_i \leftarrow G_i^+ \text{)}
\end{aligned}
$$

and uploads $θ$, $h_i$ and ΔG_i. The server, with N clients in all and the sampled set S,

$$
w \leftarrow \operatorname{mean}_{i∈S} θ_i + \frac{1}{N} \sum_{\text{all } i} h_i, \qquad
G \leftarrow G + \frac{1}{N} \sum_{i∈S} ΔG_i
$$

using each client's latest $h_i$ (cached by partition id; zero for a client never sampled).
h, G and the corrections act on the trainable parameters only; BatchNorm buffers are averaged as
in FedAvg.

What crosses the wire:
- server → client (fit): w (every ``state_dict`` entry) followed by G (trainable parameters);
  evaluate instructions carry w alone. Fit config: ``server-round`` only.
- client → server: $θ$ (every entry), then $h_i$, then ΔG_i (trainable parameters each): three
  model-sized arrays up, two down (``bytes_up``/``bytes_down``).

Client state (``context.state``): ``feddc_drift`` $(h_i)$ and ``feddc_correction`` $(G_i)$,
trainable parameters in ``state_dict`` order; absent means zero.

Server state (attributes of [`FedDCStrategy`][pflower.strategies.feddc.FedDCStrategy], for
checkpoints):
- ``global_correction``: G, one array per trainable parameter (None = zero).
- ``client_drifts``: {partition id: $h_i$}, the latest drift each client uploaded.
- ``global_weights``: w (the base class's global model).
- ``client_average``: the round's plain mean of the client models (scored with ``report:
  average``; the official code evaluates w, its ``cur_cld_model``, the default here).

Deviations and additions: the official code scales $α$ and the correction by $n_i$ / mean(n), which
is 1 for equal-sized clients and is left out here. ``drift_weight`` $λ$ (pflower's knob, 1 = FedDC)
multiplies $h_i$ in the penalty and in the server correction, and the gradient-correction term:
$λ = 0$ leaves FedProx with $μ = α$, and with $α = 0$ as well, FedAvg exactly. The mean over S
follows ``aggregation`` (default ``uniform``, as the official code). The correction's $Δ$/(K $η$) is
SCAFFOLD's option II and, like it, assumes plain SGD steps: with ``train.momentum`` $β > 0$ the
denominator is $K_{eff} η$, $K_{eff} = \sum _{k=1..K}$ (1 − $β^k$)/(1 − $β$)
([`effective_steps`][pflower.strategies.control_variates.effective_steps], which explains why; with
K $η$
the corrections grow about 1/(1 − $β$) times too large and diverge to NaN within 4 rounds on
digits at the default $β = 0.9$). $β = 0$ computes K $η$ exactly; ``train.optimizer=adam`` is
refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from flwr.common import NDArrays, Scalar

from pflower.api import AlgorithmOptions, Collapse, register_algorithm
from pflower.config import require
from pflower.core.declared import state
from pflower.core.options import Aggregation
from pflower.core.strategy import ClientUpdate
from pflower.core.training import Regularizer, trainable_mask
from pflower.searchspace import tunable
from pflower.strategies.control_variates import (
    ClientAverageScoring,
    ModelAndVariateClient,
    ModelAndVariateStrategy,
    ReportedModel,
    as_float64,
    cast_like,
    linear_term,
    mean_delta_update,
    require_mask,
    require_sgd,
    trainable_part,
    zeros_like_trainable,
)
from pflower.strategies.proximal import proximal_to

DRIFT = "feddc_drift"
CORRECTION = "feddc_correction"


class FedDCStrategy(ClientAverageScoring, ModelAndVariateStrategy["FedDCOptions"]):
    """Keeps G (sent after w) and every client's latest h_i; w = mean θ_i + mean h_i."""

    variate_attribute: ClassVar[str] = "global_correction"

    global_correction: NDArrays | None = state()
    """G: one array per trainable parameter (None = zero, before the first update)."""
    client_drifts: dict[int, NDArrays] = state({})
    """h_i by partition id: the latest drift each client uploaded."""

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
        models = [update.model_part(size) for update in updates]
        mean = self.average(models)
        self.remember_average(mean)
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
        self.global_correction = mean_delta_update(
            self.server_variate(), [u.weights[size + count :] for u in updates], num_clients
        )
        return new


class FedDCClient(ModelAndVariateClient["FedDCOptions"]):
    """Penalized, corrected local training; updates h_i and G_i; uploads θ, then h_i, then
    ΔG_i."""

    def regularizer(self, global_weights: NDArrays, config: dict[str, Scalar]) -> Regularizer:
        w, g_server = self.split_message(global_weights)
        mask = trainable_mask(self.model)
        h = self.stored_or_zeros(DRIFT, g_server)
        g_own = self.stored_or_zeros(CORRECTION, g_server)
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
        penalty = proximal_to(self.model, anchor, self.options.alpha)
        correction = linear_term(
            self.model, [s - own for s, own in zip(g_server, g_own, strict=True)], scale=weight
        )
        return lambda model: penalty(model) + correction(model)

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        w, g_server = self.split_message(global_weights)
        mask = trainable_mask(self.model)
        h = self.stored_or_zeros(DRIFT, g_server)
        g_own = self.stored_or_zeros(CORRECTION, g_server)
        delta = [
            np.asarray(t, np.float64) - np.asarray(x, np.float64)
            for t, x in zip(trainable_part(trained, mask), trainable_part(w, mask), strict=True)
        ]
        new_h = [np.asarray(own, np.float64) + d for own, d in zip(h, delta, strict=True)]
        scale = self.option_ii_scale(config)  # 1/(K η); 1/(K_eff η) with momentum
        if scale is None:
            new_g = as_float64(g_own)
        else:
            new_g = [
                np.asarray(own, np.float64) - np.asarray(s, np.float64) - scale * d
                for own, s, d in zip(g_own, g_server, delta, strict=True)
            ]
        self.extra_upload = cast_like(new_h, h) + cast_like(
            [n - np.asarray(o, np.float64) for n, o in zip(new_g, g_own, strict=True)], g_own
        )
        self.state.put_arrays(DRIFT, cast_like(new_h, h))
        self.state.put_arrays(CORRECTION, cast_like(new_g, g_own))


@register_algorithm("feddc", strategy=FedDCStrategy, client=FedDCClient)
@dataclass
class FedDCOptions(AlgorithmOptions):
    """Attributes:
    alpha: weight α of the drift-decoupling penalty (0.01, the official default).
    drift_weight: λ, the weight of the local drift and of the gradient correction (1 = FedDC;
        0 with alpha = 0 is FedAvg).
    aggregation: ``uniform`` (default, as the official code) or ``weighted`` by n_i.
    report: the model stages G and L1 score: ``server`` (w, sent to the clients, which the
        official code evaluates; default) or ``average`` (the mean of the round's client models).
    """

    display_name: ClassVar[str] = "FedDC"
    display_rank: ClassVar[int] = 14
    collapses: ClassVar[tuple[Collapse, ...]] = (
        Collapse("fedavg", (("alpha", 0.0), ("drift_weight", 0.0))),
    )  # α = λ = 0 is FedAvg

    alpha: float = tunable(
        0.01,
        choices=(0.001, 0.01, 0.1, 1.0),
        source=(
            "FedDC (Gao et al., CVPR 2022), Sec. 5; up to 1, since tuning chose 0.1 of "
            "0.001-0.1 on MNIST and Fashion-MNIST"
        ),
    )
    drift_weight: float = 1.0
    report: ReportedModel = ReportedModel.server
    aggregation: Aggregation = Aggregation.uniform

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.alpha >= 0, f"strategy.alpha must be >= 0, got {self.alpha}")
        require(
            0.0 <= self.drift_weight <= 1.0,
            f"strategy.drift_weight must be in [0, 1], got {self.drift_weight}",
        )

    def check_experiment(self, settings: Any, model: Any) -> None:
        require_sgd(settings.train.optimizer)
