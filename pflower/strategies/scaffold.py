r"""SCAFFOLD: Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020 (a baseline of FedMPR, Göksu & Pugeault,
Tables II-III).

Control variates correct the client drift (Alg. 1). The server holds the model x and the server
control variate c; client i holds its control variate $c_i$ (all zero at the start). In a round,
each sampled client starts from $y_i$ ← x and takes K local SGD steps on the corrected gradient

$$
y_i \leftarrow y_i − η_l \bigl(g_i(y_i) − c_i + c\bigr) \qquad \text{(Alg. 1, line 10)}
$$

then updates its control variate with option II of Eq. (4)

$$
c_i^+ = c_i − c + \frac{x − y_i}{K η_l} \qquad \text{(Alg. 1, line 12)}
$$

and returns $Δy_i = y_i − x$ and $Δc_i = c_i^+ − c_i$. The server updates, over the sampled set S of
the N clients,

$$
x \leftarrow x + η_g \operatorname{mean}_{i∈S} Δy_i, \qquad
c \leftarrow c + \frac{1}{N} \sum_{i∈S} Δc_i
\qquad \text{(Alg. 1, lines 16-17)}
$$

The correction acts on the trainable parameters only; BatchNorm buffers are averaged as in FedAvg
(they are not optimized, so they have no gradient to correct). The correction is applied as the
loss term ⟨$θ$, c − $c_i$⟩, whose gradient is exactly c − $c_i$: the optimizer sees g − $c_i$ + c,
also with momentum or weight decay. K is the number of optimizer steps the client took this round,
$η_l$ the round's learning rate.

Momentum (a deviation; Alg. 1 takes plain SGD steps): with ``train.momentum`` $β > 0$ the option-II
denominator K $η_l$ becomes $K_{eff} η_l$, $K_{eff} = \sum _{k=1..K}$ (1 − $β^k$)/(1 − $β$)
([`effective_steps`][pflower.strategies.control_variates.effective_steps]). Option II's (x −
$y_i$)/(K $η_l$) is
the mean of the K corrected gradients because each plain SGD step moves the model by $η_l$ times
one gradient; under heavy-ball momentum (buffer reset every round) the displacement is
$η_l \sum _k w_k g̃_k$ with $\sum _k w_k = K_{eff}$ ≈ K/(1 − $β$), so dividing by K $η_l$
overestimates $c_i$ about 1/(1 − $β$) times (10× at $β = 0.9$ for K ≫ 10) and the control variates
blow up (NaN within 5 rounds on digits with the default $β = 0.9$, where K = 28 and $K_{eff}$ ≈
195). Dividing by $K_{eff} η_l$ restores a weighted mean of the corrected gradients with weights
summing to 1 (exact for a constant gradient, as option II is for plain SGD); $β = 0$ computes K
$η_l$ exactly as printed. The FedMPR comparison (Göksu & Pugeault, Sec. V-C) trains every method
with the same SGD (lr 2e-2, momentum not stated), so SCAFFOLD runs with the shared optimizer instead
of refusing momentum; set ``train.momentum=0`` for Alg. 1 verbatim. ``train.optimizer=adam`` is
refused (ConfigError): Adam's displacement is no multiple of the gradient.

What crosses the wire (Alg. 1 lines 5 and 13, exactly two model-sized messages each way):

- server → client (fit): the arrays of x (every ``state_dict`` entry), followed by c (one array
  per trainable parameter, in ``state_dict`` order). The client splits them at the number of
  arrays of its model. Fit config: ``server-round`` only. Evaluate instructions carry x alone.
- client → server: $y_i$ (every ``state_dict`` entry), followed by Δc_i (trainable parameters).
  Sending $y_i$ instead of Δy_i = $y_i$ − x is the same message up to the x both sides know: the
  server forms Δy_i itself, in float64, so $η_g = 1$ gives the average of the $y_i$ bit for bit.
- ``bytes_down`` / ``bytes_up`` in the L2 rows therefore read about twice FedAvg's.

Client state (``context.state``): ``scaffold_ci``, the client control variate $c_i$ (trainable
parameters, ``state_dict`` order); absent means zero.

Server state (attributes of [`ScaffoldStrategy`][pflower.strategies.scaffold.ScaffoldStrategy], for
checkpoints):
- ``server_control``: c, one array per trainable parameter (None until first used, meaning zero).
- ``global_weights``: x (the base class's global model).

Deviations: the mean of the Δy_i follows ``aggregation`` (default ``uniform``, Alg. 1's 1/|S|;
``weighted`` by $n_i$ as in FedAvg). With zero control variates and $η_g = 1$ a round is FedAvg's
round exactly (the first round always is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from flwr.common import NDArrays, Scalar

from pflower.api import AlgorithmOptions, register_algorithm
from pflower.config import require
from pflower.core.declared import state
from pflower.core.options import Aggregation
from pflower.core.strategy import ClientUpdate
from pflower.core.training import Regularizer, trainable_mask
from pflower.strategies.control_variates import (
    ModelAndVariateClient,
    ModelAndVariateStrategy,
    cast_like,
    linear_term,
    mean_delta_update,
    require_mask,
    require_sgd,
    trainable_part,
    zeros_like_trainable,
)

CLIENT_CONTROL = "scaffold_ci"


# ----------------------------------------------------------------------------- server
class ScaffoldStrategy(ModelAndVariateStrategy["ScaffoldOptions"]):
    """Keeps the server control variate c; sends (x, c) (Alg. 1 line 5); applies Alg. 1 lines
    16-17."""

    variate_attribute: ClassVar[str] = "server_control"

    server_control: NDArrays | None = state()
    """c: one array per trainable parameter (None = zero, before the first update)."""

    def expected_upload(self, current: NDArrays) -> NDArrays:
        """y_i followed by Δc_i."""
        return list(current) + zeros_like_trainable(current, require_mask(self))

    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        mask = require_mask(self)
        size = len(current)
        models = [update.model_part(size) for update in updates]
        mean_y = self.average(models)
        eta = self.options.server_lr
        new_x: NDArrays = []
        for x, y, trainable in zip(current, mean_y, mask, strict=True):
            if not trainable or eta == 1.0:  # buffers: FedAvg; η_g = 1: x + (ȳ − x) = ȳ
                new_x.append(y)
            else:
                x64 = np.asarray(x, dtype=np.float64)
                new_x.append((x64 + eta * (np.asarray(y, dtype=np.float64) - x64)).astype(x.dtype))
        self.server_control = mean_delta_update(
            self.server_variate(), [u.weights[size:] for u in updates], self.settings.num_clients
        )
        return new_x


# ----------------------------------------------------------------------------- client
class ScaffoldClient(ModelAndVariateClient["ScaffoldOptions"]):
    """Trains with the gradient correction c − c_i and updates c_i (option II); uploads y_i
    followed by Δc_i."""

    def client_control(self, like: NDArrays) -> NDArrays:
        """c_i from the client's state (zeros shaped like ``like`` before the first round)."""
        return self.stored_or_zeros(CLIENT_CONTROL, like)

    def regularizer(self, global_weights: NDArrays, config: dict[str, Scalar]) -> Regularizer:
        _, c = self.split_message(global_weights)
        c_i = self.client_control(c)
        return linear_term(self.model, [s - own for s, own in zip(c, c_i, strict=True)])

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        x, c = self.split_message(global_weights)
        c_i = self.client_control(c)
        mask = trainable_mask(self.model)
        scale = self.option_ii_scale(config)  # 1/(K η_l); 1/(K_eff η_l) with momentum
        if scale is None:
            self.extra_upload = [np.zeros_like(a) for a in c_i]
            return
        x_t, y_t = trainable_part(x, mask), trainable_part(trained, mask)
        new_c_i = [
            np.asarray(own, np.float64)
            - np.asarray(server, np.float64)
            + scale * (np.asarray(x0, np.float64) - np.asarray(y, np.float64))
            for own, server, x0, y in zip(c_i, c, x_t, y_t, strict=True)
        ]
        self.extra_upload = cast_like(
            [new - np.asarray(own, np.float64) for new, own in zip(new_c_i, c_i, strict=True)], c_i
        )
        self.state.put_arrays(CLIENT_CONTROL, cast_like(new_c_i, c_i))


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

    def check_experiment(self, settings: Any, model: Any) -> None:
        require_sgd(settings.train.optimizer)
