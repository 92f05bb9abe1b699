"""FedMPR's regularizers: dropout and Gaussian noise inside ResNet BasicBlocks.

Source: FedMPR (Göksu & Pugeault), Sec. IV-B "Regularization" (Eqs. 3-4): dropout and weight
noise "within the basic blocks" (Figs. 4-5), at the rates d = 0.2 and σ = 0.4 of Sec. VII. The
order inside a block is pflower's reading (see [`BasicBlock`][pflower.models.resnet.BasicBlock]).

Both act only at forward time and hold no parameters, so a regularized ResNet has exactly the
``state_dict`` of the plain one (one wire format for FedMPR, its ablations and the baselines):

- **Dropout** is element-wise inverted dropout (``F.dropout``, the paper's Eq. 3) at rate
  ``dropout``.
- **Noise** (Eq. 4) is sampled fresh on every training forward pass. In the weight modes it perturbs
  the conv weights used by that pass only: the perturbation is detached, so gradients are computed
  at the noisy weights and applied straight through to the clean stored weights, and the
  parameters themselves never change. Eq. 4 reads as absolute weight noise, but the paper calls σ
  a noise "ratio" (Sec. VII), and an absolute σ = 0.4 would swamp ResNet conv weights (std about
  0.02-0.06), so pflower's default is relative. Modes:

  ``weight_relative`` (default)  W + N(0, (σ·std(W))²), std taken per tensor
  ``weight_abs``                 W + N(0, σ²), the literal Eq. 4
  ``weight_mult``                W ⊙ (1 + N(0, σ²))
  ``activation``                 x + N(0, σ²) added after each BatchNorm of the block

Blocks apply their [`Regularization`][pflower.models.regularization.Regularization] only in
``train()``; in ``eval()`` a block is the plain
one and its output is deterministic. Randomness comes from torch's global RNG, so a client that
wants its own stream seeds it before training (pflower's reading of the paper's "randomly
generated values specific to each client", Sec. IV-B: seed = hash(global_seed, client_id, round)).
With ``dropout = noise_sigma = 0`` no random number is drawn, so the model reproduces the plain
ResNet bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pflower.registry import ConfigError

NOISE_MODES = ("weight_relative", "weight_abs", "weight_mult", "activation")


@dataclass(frozen=True)
class Regularization:
    """Dropout rate and noise settings of one BasicBlock (all zero = off)."""

    dropout: float = 0.0
    noise_sigma: float = 0.0
    noise_mode: str = "weight_relative"

    def __post_init__(self) -> None:
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.noise_sigma < 0.0:
            raise ConfigError(f"noise_sigma must be >= 0, got {self.noise_sigma}")
        if self.noise_mode not in NOISE_MODES:
            raise ConfigError(
                f"Unknown noise_mode '{self.noise_mode}'. Valid modes: {', '.join(NOISE_MODES)}"
            )

    @property
    def active(self) -> bool:
        """Whether this changes the forward pass at all."""
        return self.dropout > 0.0 or self.noise_sigma > 0.0

    def conv(self, conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
        """``conv(x)``, computed with freshly perturbed weights in the weight-noise modes."""
        if self.noise_sigma == 0.0 or self.noise_mode == "activation":
            return conv(x)
        with torch.no_grad():
            perturbation = self._weight_perturbation(conv.weight)
        weight = conv.weight + perturbation
        return F.conv2d(x, weight, conv.bias, conv.stride, conv.padding, conv.dilation, conv.groups)

    def after_norm(self, x: torch.Tensor) -> torch.Tensor:
        """Add activation noise after a BatchNorm (``activation`` mode only)."""
        if self.noise_sigma == 0.0 or self.noise_mode != "activation":
            return x
        return x + self.noise_sigma * torch.randn_like(x)

    def drop(self, x: torch.Tensor) -> torch.Tensor:
        """Element-wise inverted dropout at rate ``dropout``."""
        return F.dropout(x, self.dropout, training=True) if self.dropout > 0.0 else x

    def _weight_perturbation(self, weight: torch.Tensor) -> torch.Tensor:
        noise = self.noise_sigma * torch.randn_like(weight)
        if self.noise_mode == "weight_relative":
            return noise * weight.std()
        if self.noise_mode == "weight_mult":
            return noise * weight
        return noise


NO_REGULARIZATION = Regularization()
