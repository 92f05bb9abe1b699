r"""FedDyn: Acar, Zhao, Matas, Mattina, Whatmough and Saligrama, "Federated Learning Based on
Dynamic Regularization", ICLR 2021 (a baseline of FedMPR, Göksu & Pugeault, Tables II-III).

Each round, every sampled client k solves (Alg. 2, "FedDyn") from the server model $θ^{t−1}$

$$
θ_k^t = \operatorname*{argmin}_θ \; L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + \frac{α}{2} \|θ − θ^{t−1}\|^2
$$

approximately, with the round's local SGD, then updates its lagged gradient (the linear term)

$$
∇L_k(θ_k^t) \leftarrow ∇L_k(θ_k^{t−1}) − α (θ_k^t − θ^{t−1})
$$

and uploads $θ_k^t$. The server, with m clients in all and the sampled set $P_t$,

$$
\begin{aligned}
h^t &= h^{t−1} − α \frac{1}{m} \sum_{k∈P_t} (θ_k^t − θ^{t−1}) \\
θ^t &= \frac{1}{|P_t|} \sum_{k∈P_t} θ_k^t − \frac{1}{α} h^t
\end{aligned}
$$

The linear and quadratic terms, and h, act on the trainable parameters only; BatchNorm buffers
are averaged as in FedAvg.

What crosses the wire: $θ^{t−1}$ down and $θ_k^t$ up, as FedAvg (config: ``server-round`` only).

Client state (``context.state``): ``feddyn_grad``, the client's linear term
$g_k = ∇L_k(θ_k^{t−1})$ (trainable parameters, ``state_dict`` order); absent means zero.

Server state (attributes of [`FedDynStrategy`][pflower.strategies.feddyn.FedDynStrategy], for
checkpoints):
- ``server_h``: h, one array per trainable parameter (None until the first update, meaning zero).
- ``global_weights``: $θ^t$ (the base class's global model).
- ``client_average``: the round's plain mean of the client models.

Which model is reported: the official code (``utils_methods.py``, ``train_FedDyn``) sends $θ^t$
(its "cloud model") to the clients but evaluates ``avg_model``, the plain mean of the sampled
clients' models; the paper's accuracies are that model's. Stages G and L1 score it too
(``report: average``, the default); ``report: server`` scores $θ^t$. The two differ most when
the correction is large: MNIST, 2 IID clients, ResNet-18 at width 16, round 5: the client models
reached about 96.5% and $θ^t$ 58-93% (seeds 0-2).

Deviations: the mean over $P_t$ follows ``aggregation`` (default ``uniform``, Alg. 2's 1/|$P_t$|).
$α = 0$ switches the dynamic regularizer off and is FedAvg: h stays 0 and the correction h/$α$ is
taken as 0 (Alg. 2 divides by $α$; as $α$ → 0⁺ the correction h/$α$ stays the accumulated mean
drift, so $α = 0$ is a convention, not the limit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from flwr.common import NDArrays, Scalar

from pflower.api import (
    AlgorithmOptions,
    Collapse,
    PersonalClient,
    PersonalizedStrategy,
    register_algorithm,
)
from pflower.config import require
from pflower.core.declared import state
from pflower.core.options import Aggregation
from pflower.core.strategy import ClientUpdate
from pflower.core.training import Regularizer, trainable_mask
from pflower.searchspace import tunable
from pflower.strategies.control_variates import (
    ClientAverageScoring,
    ReportedModel,
    as_float64,
    cast_like,
    linear_term,
    require_mask,
    trainable_part,
    zeros_like_trainable,
)
from pflower.strategies.proximal import proximal_to

LINEAR_TERM = "feddyn_grad"


class FedDynStrategy(ClientAverageScoring, PersonalizedStrategy["FedDynOptions"]):
    """Averages the client models and subtracts h/α (Alg. 2, server side)."""

    server_h: NDArrays | None = state()
    """h: one array per trainable parameter (None = zero, before the first update)."""

    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        mean = self.average(updates)
        self.remember_average(mean)
        alpha = self.options.alpha
        if alpha == 0.0:
            return mean
        mask = require_mask(self)
        if self.server_h is None:
            self.server_h = zeros_like_trainable(current, mask)
        previous = as_float64(trainable_part(current, mask))
        h = as_float64(self.server_h)
        num_clients = self.settings.num_clients
        for update in updates:
            for acc, theta, theta_prev in zip(
                h, trainable_part(update.weights, mask), previous, strict=True
            ):
                acc -= alpha * (np.asarray(theta, np.float64) - theta_prev) / num_clients
        self.server_h = cast_like(h, self.server_h)
        corrections = iter(h)
        new = []
        for averaged, trainable in zip(mean, mask, strict=True):
            if trainable:
                value = np.asarray(averaged, np.float64) - next(corrections) / alpha
                new.append(value.astype(averaged.dtype))
            else:
                new.append(averaged)
        return new


class FedDynClient(PersonalClient["FedDynOptions"]):
    """Minimizes L_k − ⟨g_k, θ⟩ + (α/2)‖θ − θ^{t−1}‖², then updates g_k."""

    def linear_coefficients(self, global_weights: NDArrays) -> NDArrays:
        """g_k from the client's state (zeros before the first round)."""
        stored = self.state.get_arrays(LINEAR_TERM)
        if stored is not None:
            return stored
        return zeros_like_trainable(global_weights, trainable_mask(self.model))

    def regularizer(self, global_weights: NDArrays, config: dict[str, Scalar]) -> Regularizer:
        linear = linear_term(self.model, self.linear_coefficients(global_weights), scale=-1.0)
        quadratic = proximal_to(self.model, global_weights, self.options.alpha)
        return lambda model: linear(model) + quadratic(model)

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        mask = trainable_mask(self.model)
        g = self.linear_coefficients(global_weights)
        alpha = self.options.alpha
        updated = [
            np.asarray(own, np.float64)
            - alpha * (np.asarray(theta, np.float64) - np.asarray(theta_prev, np.float64))
            for own, theta, theta_prev in zip(
                g, trainable_part(trained, mask), trainable_part(global_weights, mask), strict=True
            )
        ]
        self.state.put_arrays(LINEAR_TERM, cast_like(updated, g))


@register_algorithm("feddyn", strategy=FedDynStrategy, client=FedDynClient)
@dataclass
class FedDynOptions(AlgorithmOptions):
    """Attributes:
    alpha: the dynamic regularization weight α (0 gives FedAvg; 0.01 is the official CIFAR
        setting, which FedMPR does not report).
    aggregation: ``uniform`` (Alg. 2's mean over P_t, default) or ``weighted`` by n_k.
    report: the model stages G and L1 score: ``average`` (the mean of the round's client
        models, which the official code evaluates) or ``server`` (θ^t, sent to the clients).
    """

    display_name: ClassVar[str] = "FedDyn"
    display_rank: ClassVar[int] = 13
    collapses: ClassVar[tuple[Collapse, ...]] = (
        Collapse("fedavg", (("alpha", 0.0),)),
    )  # α = 0 is FedAvg

    alpha: float = tunable(
        0.01,
        choices=(0.001, 0.01, 0.1, 1.0),
        source=(
            "FedDyn (Acar et al., ICLR 2021), Sec. 5: α in 0.001, 0.01, 0.1; up to 1, since "
            "tuning chose 0.1 on Fashion-MNIST"
        ),
    )
    aggregation: Aggregation = Aggregation.uniform
    report: ReportedModel = ReportedModel.average

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.alpha >= 0, f"strategy.alpha must be >= 0, got {self.alpha}")
