"""FedMPR: Göksu and Pugeault, "Robust Federated Learning in the Face of Covariate Shift: A
Magnitude Pruning with Hybrid Regularization Framework for Enhanced Model Aggregation".

Each round (Alg. 1), every client trains its copy of the global ResNet with the hybrid
regularization of Sec. IV-B, then magnitude-prunes the trained weights and uploads them; the
server averages as FedAvg does:

1. Local training (Alg. 1 line 12) of the regularized model: dropout at rate d (Eq. 3,
   y = M ⊙ f(Wx + b), element-wise) and Gaussian weight noise $W_n$ = W + $ε$ (Eq. 4) inside every
   BasicBlock of the stages ``reg_stages``. The noise is drawn fresh on every training forward
   pass and is never written into the parameters or sent (see
   [`pflower.models.regularization`][pflower.models.regularization] for the placement and the
   ``noise_mode`` readings of $σ$).
   The random numbers come from a stream of the client's own: seed (run seed, partition id,
   round) ("randomly generated values specific to each client", Sec. IV-B).
2. Magnitude pruning (Alg. 1 lines 13-19): t = the (100·p)-th percentile of |$W_k$| over the
   prunable tensors, one global threshold (line 14); every weight with |w| ≤ t is set to 0
   (k = ⌊p·N⌋ smallest magnitudes; ties may prune slightly more). Nothing is kept between rounds:
   no mask, no rewinding, each round re-prunes the freshly trained dense model.
3. Upload of the pruned weights; the server's FedAvg (line 21, Eq. 1: weights $n_k/n$) counts the
   zeros as ordinary values (not mask-aware).

Prunable tensors (``prune_scope``): ``conv_linear_weights`` (default: the ``weight`` of every
Conv2d and Linear; biases and BatchNorm parameters and statistics are never pruned) or
``all_params`` (every trainable parameter). ``prune_granularity``: ``global`` (Alg. 1, one
threshold) or ``layerwise`` (the fraction p of each tensor).

Ablations (Table IV) are presets of this one algorithm (``conf/strategy/fedmpr_*.yaml``): pruning
only (p = 0.2, 0.4), dropout only (d = 0.2, 0.8), noise only ($σ = 0.2$, 0.4; the table's "$α$" is
$σ$). p = d = $σ = 0$ is FedAvg exactly: no random number is drawn and nothing is pruned.

What crosses the wire: the global model down, the pruned model up (dense arrays with zeros);
fit config ``server-round`` only (every FedMPR setting is in the shared configuration). Fit
metrics: ``sparsity`` (fraction of exact zeros among the prunable weights after pruning) and
``prune_threshold`` (t; the mean of the per-tensor thresholds when layerwise).

Client state: none (the paper's client is stateless). Server state: the global model only.

Deviations: the paper does not say how $σ$ is scaled (Eq. 4 reads as absolute noise, Sec. VII calls
$σ$ a "ratio"): ``noise_mode`` defaults to noise relative to each tensor's std (see
[`pflower.models.regularization`][pflower.models.regularization]). Dropout and noise need a ResNet
(the paper's ResNet-18);
with other models only pruning is available (d = $σ = 0$).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.common import NDArrays, Scalar
from torch import nn

from pflower.api import (
    AlgorithmOptions,
    Collapse,
    PersonalClient,
    PersonalizedStrategy,
    register_algorithm,
)
from pflower.config import require
from pflower.core.client import server_round
from pflower.core.training import Regularizer, TrainSettings, trainable_mask
from pflower.models.regularization import Regularization
from pflower.models.resnet import ResNet, apply_regularization
from pflower.registry import ConfigError
from pflower.searchspace import tunable


class PruneScope(StrEnum):
    """Which tensors magnitude pruning considers."""

    conv_linear_weights = "conv_linear_weights"
    """The weights of every Conv2d and Linear layer."""
    all_params = "all_params"
    """Every trainable parameter (biases and BatchNorm affine parameters included)."""


PruneGranularity = StrEnum(
    "PruneGranularity", {"global": "global", "layerwise": "layerwise"}, module=__name__
)
"""One threshold for all prunable tensors (``global``, Alg. 1), or one per tensor."""
GLOBAL = PruneGranularity["global"]


class NoiseMode(StrEnum):
    """How σ scales the noise (see
    [`pflower.models.regularization`][pflower.models.regularization])."""

    weight_relative = "weight_relative"
    weight_abs = "weight_abs"
    weight_mult = "weight_mult"
    activation = "activation"


def prunable_mask(model: nn.Module, scope: PruneScope) -> list[bool]:
    """Per ``state_dict`` entry: whether pruning considers it."""
    if scope == PruneScope.all_params:
        return trainable_mask(model)
    names = {
        f"{name}.weight" if name else "weight"
        for name, module in model.named_modules()
        if isinstance(module, nn.Conv2d | nn.Linear)
    }
    return [name in names for name in model.state_dict()]


@dataclass(frozen=True)
class Pruned:
    """The pruned arrays and what pruning did."""

    weights: NDArrays
    threshold: float
    sparsity: float


def magnitude_prune(
    weights: Sequence[np.ndarray],
    prunable: Sequence[bool],
    ratio: float,
    granularity: PruneGranularity = GLOBAL,
) -> Pruned:
    """Zero every prunable weight with |w| ≤ t, t the ⌊ratio·N⌋-th smallest |w| (Alg. 1, lines
    14-19); over all prunable tensors together (``global``) or per tensor (``layerwise``).
    Non-prunable arrays are returned unchanged (copies)."""
    pruned = [np.array(array, copy=True) for array in weights]
    chosen = [index for index, keep in enumerate(prunable) if keep]
    thresholds: list[float] = []
    if ratio > 0.0 and chosen:
        groups = [chosen] if granularity == GLOBAL else [[i] for i in chosen]
        for group in groups:
            magnitudes = torch.cat(
                [torch.from_numpy(np.abs(pruned[i]).astype(np.float32)).reshape(-1) for i in group]
            )
            count = math.floor(ratio * magnitudes.numel())
            if count == 0:
                continue
            threshold = float(torch.kthvalue(magnitudes, count).values)
            thresholds.append(threshold)
            for i in group:
                pruned[i][np.abs(pruned[i]) <= threshold] = 0
    total = sum(pruned[i].size for i in chosen)
    zeros = sum(int(np.count_nonzero(pruned[i] == 0)) for i in chosen)
    return Pruned(
        weights=pruned,
        threshold=float(np.mean(thresholds)) if thresholds else 0.0,
        sparsity=zeros / total if total else 0.0,
    )


class FedMPRStrategy(PersonalizedStrategy["FedMPROptions"]):
    """Plain FedAvg over the pruned uploads, zeros counted (Alg. 1, line 21)."""


class FedMPRClient(PersonalClient["FedMPROptions"]):
    """Trains the regularized model, prunes the result and uploads it."""

    def regularization(self) -> Regularization:
        options = self.options
        return Regularization(
            dropout=options.dropout,
            noise_sigma=options.noise_sigma,
            noise_mode=str(options.noise_mode),
        )

    def local_train(
        self,
        settings: TrainSettings,
        config: dict[str, Scalar],
        regularizer: Regularizer | None = None,
        after_step: Callable[[nn.Module], None] | None = None,
    ) -> float:
        """Local training with dropout and weight noise switched on in the chosen blocks only for
        its duration, drawing from the client's own random stream."""
        regularization = self.regularization()
        if not regularization.active:
            return super().local_train(settings, config, regularizer, after_step)
        if not isinstance(self.model, ResNet):
            raise ConfigError(
                f"FedMPR's dropout and weight noise act inside ResNet BasicBlocks (Sec. IV-B), "
                f"but the model is {type(self.model).__name__}: choose model=resnet18 (or "
                "resnet8), or set strategy.dropout=0 strategy.noise_sigma=0 (pruning only)"
            )
        blocks = [block for stage in self.model.stages() for block in stage]
        previous = [block.regularization for block in blocks]
        seed = np.random.SeedSequence(
            [self.experiment.settings.seed, self.partition_id, server_round(config), 1]
        ).generate_state(1)[0]
        try:
            apply_regularization(self.model, regularization, self.options.reg_stages)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(seed))
                return super().local_train(settings, config, regularizer, after_step)
        finally:
            for block, old in zip(blocks, previous, strict=True):
                block.regularization = old

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        """Nothing goes to state; the round's pruned upload is computed here, once."""
        self._pruned = magnitude_prune(
            trained,
            prunable_mask(self.model, self.options.prune_scope),
            self.options.prune_ratio,
            self.options.prune_granularity,
        )

    def upload(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> NDArrays:
        return self._pruned.weights

    def fit_metrics(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        return {"sparsity": self._pruned.sparsity, "prune_threshold": self._pruned.threshold}


PAPER_SETTING = (0.4, 0.2, 0.4)
"""(p, d, σ) of FedMPR in Tables II-IV."""


_SEARCH_SOURCE = "FedMPR, Sec. V ablation: p and σ in {0.2, 0.4}, d in {0.2, 0.8}, 0 = off"
"""Where the search choices of the three mechanisms' strengths come from."""


@register_algorithm("fedmpr", strategy=FedMPRStrategy, client=FedMPRClient)
@dataclass
class FedMPROptions(AlgorithmOptions):
    """Attributes:
    prune_ratio: fraction p of the prunable weights zeroed after every local round (0.4).
    prune_scope: ``conv_linear_weights`` (default) or ``all_params``.
    prune_granularity: ``global`` (Alg. 1's single threshold, default) or ``layerwise``.
    dropout: element-wise dropout rate d inside the BasicBlocks (0.2).
    noise_sigma: weight-noise level σ (0.4).
    noise_mode: how σ scales the noise (``weight_relative`` by default).
    reg_stages: the ResNet stages (1-based) whose BasicBlocks are regularized (all four).
    aggregation: ``weighted`` by n_k (Eq. 1, default) or ``uniform``.
    """

    display_name: ClassVar[str] = "FedMPR"
    display_rank: ClassVar[int] = 300
    collapses: ClassVar[tuple[Collapse, ...]] = (
        Collapse("fedavg", (("prune_ratio", 0.0), ("dropout", 0.0), ("noise_sigma", 0.0))),
    )  # p = d = σ = 0 is FedAvg

    prune_ratio: float = tunable(0.4, choices=(0.0, 0.2, 0.4), source=_SEARCH_SOURCE)
    prune_scope: PruneScope = PruneScope.conv_linear_weights
    prune_granularity: PruneGranularity = GLOBAL
    dropout: float = tunable(0.2, choices=(0.0, 0.2, 0.8), source=_SEARCH_SOURCE)
    noise_sigma: float = tunable(0.4, choices=(0.0, 0.2, 0.4), source=_SEARCH_SOURCE)
    noise_mode: NoiseMode = NoiseMode.weight_relative
    reg_stages: list[int] = field(default_factory=lambda: [1, 2, 3, 4])

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            0.0 <= self.prune_ratio < 1.0,
            f"strategy.prune_ratio must be in [0, 1), got {self.prune_ratio}",
        )
        require(
            0.0 <= self.dropout < 1.0, f"strategy.dropout must be in [0, 1), got {self.dropout}"
        )
        require(self.noise_sigma >= 0, f"strategy.noise_sigma must be >= 0, got {self.noise_sigma}")
        require(
            len(self.reg_stages) > 0 and all(int(s) >= 1 for s in self.reg_stages),
            f"strategy.reg_stages must list stages numbered from 1, got {self.reg_stages}",
        )

    def check_experiment(self, settings: Any, model: Any) -> None:
        """Dropout and weight noise act inside ResNet BasicBlocks (Sec. IV-B): with either on,
        the model must be a ResNet with every stage of ``reg_stages``."""
        if self.dropout == 0.0 and self.noise_sigma == 0.0:
            return
        require(
            isinstance(model, ResNet),
            f"FedMPR's dropout and weight noise act inside ResNet BasicBlocks (Sec. IV-B), but "
            f"model={settings.model['name']} is a {type(model).__name__}: choose model=resnet18 "
            f"(or resnet8), or set strategy.dropout=0 strategy.noise_sigma=0 (pruning only)",
        )
        unknown = sorted(set(self.reg_stages) - set(range(1, model.num_stages + 1)))
        require(
            not unknown,
            f"strategy.reg_stages {unknown} do not exist: model={settings.model['name']} has "
            f"stages 1..{model.num_stages}",
        )

    def label(self) -> str:
        """``FedMPR`` at the paper's (p, d, σ); an ablation names its settings (Table IV)."""
        setting = (self.prune_ratio, self.dropout, self.noise_sigma)
        if setting == PAPER_SETTING:
            return self.display_name
        return f"{self.display_name} (p={setting[0]:g}, d={setting[1]:g}, σ={setting[2]:g})"

    def label_keys(self) -> tuple[str, ...]:
        return ("prune_ratio", "dropout", "noise_sigma")
