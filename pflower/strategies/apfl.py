r"""APFL: Deng, Kamani and Mahdavi, "Adaptive Personalized Federated Learning", arXiv 2003.13461
(2020), Algorithm 1.

Each client i keeps a local model $v_i$ and a mixing weight $α_i$ ∈ [0, 1]; its personalized model
is

$$
\bar v_i = α_i v_i + (1 − α_i) w \qquad \text{(Eq. 3)}
$$

On every local step, on one mini-batch $ξ$ and from the same iterates (Alg. 1, lines 6-8):

$$
\begin{aligned}
w &\leftarrow w − η ∇f_i(w; ξ) && \text{(the FedAvg local update of the global model)} \\
v_i &\leftarrow v_i − η ∇_v f_i(\bar v_i; ξ)
    && (= α_i ∇f_i(\bar v_i; ξ) \text{, through the mixture)} \\
α_i &\leftarrow α_i − η_α ∇_α f_i(\bar v_i; ξ)
    && (= ⟨v_i − w, ∇f_i(\bar v_i; ξ)⟩ \text{), clipped to } [0, 1]
\end{aligned}
$$

(Eq. 10 for $α$; the mixture's gradient flows to $v_i$ and $α_i$ only, w is held fixed in it). The
client uploads w, the server averages as FedAvg does. Stage L1 evaluates $v̄_i$ with the received
global model (PM) and the global model itself (GM), and reports the hybrid model (FLAME paper, Sec.
IV-D).

Identities: $α$ fixed at 0 (``adaptive_alpha=false``, ``alpha_init=0``) is FedAvg (v̄ = w); $α$
fixed at 1 makes $v_i$ local training on the client's own data.

What crosses the wire: w to the client and its trained w back with $n_i$, as in FedAvg; config
``server-round`` only. Client state: ``apfl_v`` ($v_i$; first set to the received model) and
``apfl_alpha`` $(α_i)$.

Deviation: $v_i$ uses the round's optimizer settings (``train.lr``, ``train.momentum``), a fresh
optimizer each round like w's; the paper writes plain SGD steps (``train.momentum=0``). The
learning rate of $α$ is ``alpha_lr`` (null: ``train.lr``). In models with BatchNorm the running
statistics see both forward passes of a step (the zoo's models used with APFL have none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from flwr.common import NDArrays, Scalar
from torch import nn
from torch.func import functional_call

from pflower.api import AlgorithmOptions, Collapse, PersonalizedStrategy, register_algorithm
from pflower.config import require
from pflower.core.training import Regularizer, TrainSettings, model_device
from pflower.searchspace import tunable
from pflower.strategies.batches import train_batches
from pflower.strategies.moreau import PersonalAndGlobalClient

LOCAL = "apfl_v"
ALPHA = "apfl_alpha"


def mixture(alpha: float, local: NDArrays, global_: NDArrays) -> NDArrays:
    """Eq. 3: α v + (1 − α) w, elementwise."""
    return [
        (alpha * v.astype(np.float64) + (1.0 - alpha) * w).astype(w.dtype)
        if np.issubdtype(w.dtype, np.floating)
        else w.copy()
        for v, w in zip(local, global_, strict=True)
    ]


class APFLStrategy(PersonalizedStrategy["APFLOptions"]):
    """Server side identical to FedAvg."""


class APFLClient(PersonalAndGlobalClient["APFLOptions"]):
    """Trains w (uploaded), v_i and α_i (kept) on the same mini-batches. Stage L1: the mixture
    v̄_i (PM, [`personalize`][pflower.strategies.apfl.APFLClient.personalize]) and the received w
    (GM)."""

    personal_key: ClassVar[str] = LOCAL

    def _alpha(self) -> float:
        return float(self.state.get_scalars(ALPHA).get("alpha", self.options.alpha_init))

    def local_train(
        self,
        settings: TrainSettings,
        config: dict[str, Scalar],
        regularizer: Regularizer | None = None,
        after_step: Callable[[nn.Module], None] | None = None,
    ) -> float:
        """Alg. 1, lines 5-9: ``self.model`` is w; v_i and α_i are updated beside it."""
        model = self.model
        device = model_device(model)
        names = list(model.state_dict())
        stored = self.state.get_arrays(LOCAL)
        start = (
            stored
            if stored is not None
            else [t.detach().cpu().numpy() for t in model.state_dict().values()]
        )
        local = {
            name: torch.tensor(
                np.array(array),
                device=device,
                requires_grad=name in dict(model.named_parameters()),
            )
            for name, array in zip(names, start, strict=True)
        }
        trainable = [t for t in local.values() if t.requires_grad]
        alpha = torch.tensor(self._alpha(), dtype=torch.float32, device=device, requires_grad=True)
        alpha_lr = self.options.alpha_lr if self.options.alpha_lr is not None else settings.lr

        model.train()
        w_optimizer = settings.make_optimizer(model.parameters())
        v_optimizer = settings.make_optimizer(trainable)
        criterion = nn.CrossEntropyLoss()
        total, batches = 0.0, 0
        for images, labels in train_batches(self, settings, config):
            # v̄ = α v + (1 − α) w at the current iterates (w held fixed in the mixture).
            current = {name: t.detach() for name, t in model.state_dict().items()}
            mixed = {
                name: alpha * local[name] + (1.0 - alpha) * current[name]
                if local[name].requires_grad
                else current[name]
                for name in names
            }
            v_optimizer.zero_grad(set_to_none=True)
            alpha.grad = None
            criterion(functional_call(model, mixed, (images,)), labels).backward()
            # w: the FedAvg step on the same batch.
            w_optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(images), labels)
            total += float(loss.detach())
            loss.backward()
            w_optimizer.step()
            v_optimizer.step()
            if self.options.adaptive_alpha and alpha.grad is not None:
                with torch.no_grad():
                    alpha -= alpha_lr * alpha.grad
                    alpha.clamp_(0.0, 1.0)
            batches += 1
        self._new_local = [local[name].detach().cpu().numpy().copy() for name in names]
        self._new_alpha = float(alpha.detach())
        return total / max(batches, 1)

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        self.state.put_arrays(LOCAL, self._new_local)
        self.state.put_scalars(ALPHA, {"alpha": self._new_alpha})

    def fit_metrics(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        return {"alpha": self._new_alpha}

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        """v̄_i = α_i v_i + (1 − α_i) w with the received w (w alone before the first fit)."""
        local = self.state.get_arrays(LOCAL)
        if local is None:
            return global_weights
        return mixture(self._alpha(), local, global_weights)


@register_algorithm("apfl", strategy=APFLStrategy, client=APFLClient)
@dataclass
class APFLOptions(AlgorithmOptions):
    """Attributes:
    alpha_init: α_i before the client's first update (0: FedAvg, 1: local model only).
    adaptive_alpha: learn α_i by its gradient (Eq. 10), or keep ``alpha_init``.
    alpha_lr: learning rate of α_i (null: ``train.lr``).
    """

    display_name: ClassVar[str] = "APFL"
    display_rank: ClassVar[int] = 30
    collapses: ClassVar[tuple[Collapse, ...]] = (
        Collapse("fedavg", (("alpha_init", 0.0), ("adaptive_alpha", False))),
    )  # α fixed at 0 is FedAvg

    alpha_init: float = tunable(
        0.5,
        choices=(0.25, 0.5, 0.75),
        source="APFL (Deng et al., 2020), Sec. 5",
    )
    adaptive_alpha: bool = True
    alpha_lr: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            0.0 <= self.alpha_init <= 1.0,
            f"strategy.alpha_init must be in [0, 1], got {self.alpha_init}",
        )
        require(
            self.alpha_lr is None or self.alpha_lr > 0,
            f"strategy.alpha_lr must be null or > 0, got {self.alpha_lr}",
        )
