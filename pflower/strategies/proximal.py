r"""The proximal term of the regularized family, one implementation for every method that pulls
the local model toward an anchor:

$$
θ \mapsto \frac{λ}{2}\|θ − \text{anchor}\|^2 + \frac{μ}{2}\|θ\|^2
$$

over the trainable parameters, gradient $λ(θ − \text{anchor}) + μθ$.

Its users, and the anchor and $λ$ each passes:

- FedProx (Li et al., MLSys 2020, Alg. 2): the received global model $w^t$, $λ = μ$;
- FedDyn (Acar et al., ICLR 2021, Alg. 2) and FedDC (Gao et al., CVPR 2022): the received model
  (FedDC's shifted by the client's drift $h_i$), $λ = α$;
- DiversiFed (Wu et al., TNNLS 2025, Eq. 7) and FedAMP (Huang et al., AAAI 2021, Alg. 1): the
  received $u_i$, $λ$ over the server's step size;
- pFedMe (Dinh et al., NeurIPS 2020, Alg. 1), FLAME (Zhu et al., arXiv 2407.16397, Eq. 11) and
  Ditto (Li et al., ICML 2021, Alg. 1 line 8), with $μ$ the extra L2 term of the FLAME authors'
  code (``mu_l2``): an anchor that may move between steps (pFedMe's local copy $w_i$ after each
  w-step, FLAME's $w_i$ after each ADMM update), updated in place with
  [`set_anchors`][pflower.strategies.proximal.set_anchors].

BatchNorm statistics are not parameters and are left to the data.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.common import NDArrays
from torch import nn

from pflower.core.training import Regularizer, model_device


def anchor_tensors(model: nn.Module, weights: NDArrays) -> dict[str, torch.Tensor]:
    """``weights`` (state_dict order) as float32 tensors on ``model``'s device, keyed by
    parameter name (trainable ones only); a copy, so later changes to ``weights`` do not move
    them."""
    names = list(model.state_dict())
    trainable = {name for name, _ in model.named_parameters()}
    device = model_device(model)
    return {
        name: torch.from_numpy(np.array(array, dtype=np.float32)).to(device)
        for name, array in zip(names, weights, strict=True)
        if name in trainable
    }


def proximal_term(anchors: dict[str, torch.Tensor], lambda_: float, mu: float = 0.0) -> Regularizer:
    """θ ↦ (λ/2)‖θ − anchor‖² + (μ/2)‖θ‖² over the trainable parameters (see the module doc).

    ``anchors`` (from [`anchor_tensors`][pflower.strategies.proximal.anchor_tensors]) are read at
    every call, so updating them in place
    ([`set_anchors`][pflower.strategies.proximal.set_anchors]) moves the anchor between steps. A
    zero λ or μ leaves its part out."""

    def term(model: nn.Module) -> torch.Tensor:
        total = torch.zeros((), device=model_device(model))
        for name, param in model.named_parameters():
            if lambda_:
                total = total + 0.5 * lambda_ * (param - anchors[name]).pow(2).sum()
            if mu:
                total = total + 0.5 * mu * param.pow(2).sum()
        return total

    return term


def proximal_to(model: nn.Module, weights: NDArrays, lambda_: float) -> Regularizer:
    """θ ↦ (λ/2)‖θ − w‖² toward the fixed ``weights`` w (state_dict order, as they arrive from
    the server): [`proximal_term`][pflower.strategies.proximal.proximal_term] with anchors
    [`anchor_tensors`][pflower.strategies.proximal.anchor_tensors] of ``weights``."""
    return proximal_term(anchor_tensors(model, weights), lambda_)


def set_anchors(anchors: dict[str, torch.Tensor], model: nn.Module, weights: NDArrays) -> None:
    """Overwrite ``anchors`` in place with ``weights`` (state_dict order)."""
    for name, array in zip(model.state_dict(), weights, strict=True):
        if name in anchors:
            anchors[name].copy_(torch.from_numpy(np.asarray(array, dtype=np.float32)))
