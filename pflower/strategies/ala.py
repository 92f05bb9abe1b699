r"""The Adaptive Local Aggregation (ALA) module of FedALA, shared by every "+ALA" client.

Zhang, Hua, Wang, Song, Xue, Ma and Guan, "FedALA: Adaptive Local Aggregation for Personalized
Federated Learning", AAAI 2023, Sec. "Adaptive Local Aggregation (ALA)" and Algorithm 1.

Instead of overwriting its old local model $Θ_i^{t-1}$ with the received global model $Θ^{t-1}$,
client i initializes

$$
\hat Θ_i^t := Θ_i^{t-1} + (Θ^{t-1} − Θ_i^{t-1}) \odot [1^{|Θ_i|−p}; W_i^p] \qquad \text{(Eq. 4)}
$$

i.e. the lower layers are overwritten (weight 1) and the p higher layers are mixed element-wise
with learned weights $W_i^p$ ∈ [0, 1]. $W_i^p$ is learned on a random s% of the local training data
by SGD on the cross-entropy of $Θ̂_i^t$ (Eq. 5), with the global and the local model frozen, and
clipped element-wise by $σ(w) = \max(0, \min(1, w))$ after every step. By the chain rule
$∇_W L = (Θ − Θ_i) \odot ∇_{\hat Θ} L$ ("Analysis of ALA"), so one step is

$$
W \leftarrow σ\bigl(W − η \, ∇_{\hat Θ} L \odot (Θ^{t-1} − Θ_i^{t-1})\bigr).
$$

W starts at ones (Alg. 1 line 4: Eq. 4 is then FedAvg's overwrite) and persists across rounds.
The first time ALA is active (Alg. 1 line 10, the "initial stage") W is trained until it converges
(lines 11-13); afterwards one epoch per round (lines 15-16). ALA is deactivated while the client
has no local model of its own ($Θ^0 = Θ_i^0$, "Note that ALA is meaningless ... in the first
iteration").

Choices where the paper is silent (from the authors' released code):

- ``layer_idx`` counts parameter *tensors* from the top (``model.parameters()`` order), so the
  paper's p = 1 for a Linear head (weight and bias) is ``layer_idx = 2``. ``layer_idx = 0`` is the
  paper's p = 0: no mixed tensors, Eq. 4 is FedAvg's overwrite. (The released code's slice
  ``[-0:]`` would select every tensor; set ``layer_idx`` to the number of tensors for that.)
- "s% of local data" is one contiguous slice of the client's training list, at a uniformly drawn
  start, iterated in order in mini-batches (last partial batch kept), redrawn every round and kept
  for all epochs of the initial stage.
- Convergence of the initial stage: after each epoch the loss of its *last* mini-batch is
  recorded; the stage ends once more than ``num_pre_loss`` losses are recorded and the population
  standard deviation of the last ``num_pre_loss`` is below ``threshold``. The released code has no
  cap; ``max_start_epochs`` caps it (reported as ``ala_capped``).
- Only parameters are mixed; buffers (BatchNorm statistics) stay the local model's.
- W is trained with the model in train mode; statistics updated on the way are discarded.
- Eq. 4 is evaluated as ``torch.lerp(Θ_i, Θ, W)``, equal to $Θ_i + (Θ − Θ_i)$ ⊙ W and exact at the
  endpoints (W = 1 gives $Θ$ bit for bit, W = 0 gives $Θ_i$).

Client state (``context.state``): ``ala_local`` the client's current local model (its last trained
model, or its last ALA-initialized model when it was not trained since), ``ala_weights`` W (one
array per mixed tensor; its absence means the initial stage is still ahead), and ``ala_meta``
(``version``: the global model version ALA was last applied to; epoch and timing counters).
ALA is applied exactly once per global model version: stage L1 of round t (which receives $Θ^t$)
runs it and stores the result; fit of round t+1 (which receives the same $Θ^t$) trains from it.
If that client was not evaluated, fit runs ALA itself: where every client trains every round,
nothing depends on evaluation. The authors' server sends each global model to every client,
selected or not, and each applies ALA to it (``send_models`` in ``serverALA.py``); a Flower
client applies it to the models it receives, at fit or at stage-L1 evaluation. Evaluated every
round (``eval.fraction=1``, the default), every client applies ALA to every version, as
in the authors' code; under partial participation, a round in which a client is neither
selected nor evaluated (``eval.every > 1``, ``eval.rounds``) is a version it skips.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.common import NDArrays, Scalar
from torch import nn

from pflower.api import PersonalClient
from pflower.config import require
from pflower.core.client import server_round
from pflower.core.training import Prepare, set_weights
from pflower.datasets.base import ImageSplit
from pflower.searchspace import tunable

ALA_LOCAL = "ala_local"
ALA_WEIGHTS = "ala_weights"
ALA_META = "ala_meta"


@dataclass
class ALAFields:
    """The ALA options, added to an algorithm's options to give its "+ALA" variant.

    Attributes:
        eta: learning rate η of the weight learning (Eq. 5).
        rand_percent: s, the percentage of the local training data W is learned on.
        layer_idx: number of top parameter tensors mixed by W (2 = the paper's p = 1 for a Linear
            head; 0 = no mixing, FedAvg's overwrite).
        threshold: the initial stage stops when the std of the last ``num_pre_loss`` epoch losses
            is below this.
        num_pre_loss: how many epoch losses the convergence test looks at.
        max_start_epochs: cap on the epochs of the initial stage.
        ala_batch_size: mini-batch size of the weight learning (null: ``train.batch_size``).
        adapt_after_start: keep learning W (one epoch per round) after the initial stage; false
            reuses the initial-stage W (the paper's ablation, Sec. "Practical heterogeneous
            setting").
    """

    eta: float = tunable(
        1.0,
        choices=(0.01, 0.1, 1.0, 10.0, 100.0),
        source=(
            "FedALA (Zhang et al., AAAI 2023), Sec. 5: η and s studied around 1.0 and 80%; a "
            "decade past each end of 0.1-10, since tuning chose 10 (FedALA) and 0.1 (Ditto+ALA, "
            "FedRep+ALA) on MNIST and Fashion-MNIST"
        ),
    )
    rand_percent: float = tunable(
        80.0,
        low=5.0,
        high=100.0,
        step=5.0,
        source="FedALA (Zhang et al., AAAI 2023), Sec. 5: η and s studied around 1.0 and 80%",
    )
    layer_idx: int = 2
    threshold: float = 0.1
    num_pre_loss: int = 10
    max_start_epochs: int = 50
    ala_batch_size: int | None = None
    adapt_after_start: bool = True

    def check_ala(self) -> None:
        """Reject out-of-range ALA options."""
        require(self.eta > 0, f"strategy.eta must be > 0, got {self.eta}")
        require(
            0.0 < self.rand_percent <= 100.0,
            f"strategy.rand_percent must be in (0, 100], got {self.rand_percent}",
        )
        require(self.layer_idx >= 0, f"strategy.layer_idx must be >= 0, got {self.layer_idx}")
        require(self.threshold >= 0, f"strategy.threshold must be >= 0, got {self.threshold}")
        require(
            self.num_pre_loss >= 1, f"strategy.num_pre_loss must be >= 1, got {self.num_pre_loss}"
        )
        require(
            self.max_start_epochs >= 1,
            f"strategy.max_start_epochs must be >= 1, got {self.max_start_epochs}",
        )
        require(
            self.ala_batch_size is None or self.ala_batch_size >= 1,
            f"strategy.ala_batch_size must be >= 1 or null, got {self.ala_batch_size}",
        )

    def ala_settings(self, train_batch_size: int) -> ALASettings:
        """These options as one ALA call's settings; B is ``ala_batch_size`` or, when that is
        null, ``train_batch_size``."""
        return ALASettings(
            eta=self.eta,
            rand_percent=self.rand_percent,
            layer_idx=self.layer_idx,
            threshold=self.threshold,
            num_pre_loss=self.num_pre_loss,
            max_start_epochs=self.max_start_epochs,
            batch_size=self.ala_batch_size or train_batch_size,
            adapt_after_start=self.adapt_after_start,
        )


@dataclass(frozen=True)
class ALASettings:
    """The hyperparameters of one ALA call (η, s, p as ``layer_idx``, convergence test, B)."""

    eta: float = 1.0
    rand_percent: float = 80.0
    layer_idx: int = 2
    threshold: float = 0.1
    num_pre_loss: int = 10
    max_start_epochs: int = 50
    batch_size: int = 10
    adapt_after_start: bool = True


@dataclass(frozen=True)
class ALAResult:
    """What one ALA call produced."""

    weights: NDArrays
    """Θ̂_i^t, the initialized local model, in ``state_dict`` order."""
    mix_weights: NDArrays
    """W after this call, one array per mixed tensor (top ``layer_idx`` parameters)."""
    epochs: int
    """Epochs of weight learning run in this call."""
    losses: tuple[float, ...]
    """Last-mini-batch loss of each epoch."""
    capped: bool
    """Whether the initial stage stopped at ``max_start_epochs`` instead of converging."""


def mixed_keys(
    model: nn.Module, layer_idx: int, candidates: Sequence[str] | None = None
) -> list[str]:
    """The top ``layer_idx`` parameter names (``parameters()`` order) among ``candidates``
    (default: all parameters): the tensors W mixes."""
    names = [name for name, _ in model.named_parameters()]
    if candidates is not None:
        allowed = set(candidates)
        names = [name for name in names if name in allowed]
    if layer_idx <= 0:
        return []
    return names[-layer_idx:]


def adaptive_local_aggregation(
    model: nn.Module,
    global_weights: NDArrays,
    local_weights: NDArrays,
    mix_weights: NDArrays | None,
    data: ImageSplit,
    prepare: Prepare,
    settings: ALASettings,
    rng: np.random.Generator,
    candidates: Sequence[str] | None = None,
) -> ALAResult:
    """One ALA call (Eq. 4 and 5): the initialized local model from the received global model
    Θ (``global_weights``) and the old local model Θ_i (``local_weights``), both full
    ``state_dict`` lists.

    ``mix_weights`` is the stored W (None: the initial stage, W starts at ones and is trained to
    convergence). ``candidates`` restricts the mixed and overwritten tensors to these parameter
    names (FedRep+ALA: the body); the others keep ``local_weights``. ``model`` is used as the
    temporary model; its weights are overwritten.
    """
    keys = list(model.state_dict())
    if not len(keys) == len(global_weights) == len(local_weights):
        raise ValueError(
            f"ALA needs full models: the model has {len(keys)} arrays, the global model "
            f"{len(global_weights)} and the local model {len(local_weights)}"
        )
    parameter_names = [name for name, _ in model.named_parameters()]
    overwritten = set(parameter_names if candidates is None else candidates)
    higher = mixed_keys(model, settings.layer_idx, candidates)
    lower = overwritten - set(higher)
    # Eq. 4, lower part: overwritten by the global model; buffers and excluded tensors stay local.
    base = [
        glob if key in lower else loc
        for key, glob, loc in zip(keys, global_weights, local_weights, strict=True)
    ]
    if not higher:
        return ALAResult(base, [], 0, (), False)

    position = {key: index for index, key in enumerate(keys)}
    params = dict(model.named_parameters())
    glob = {k: _tensor(global_weights[position[k]], params[k]) for k in higher}
    loc = {k: _tensor(local_weights[position[k]], params[k]) for k in higher}
    update = {k: glob[k] - loc[k] for k in higher}  # ∂Θ̂/∂W = Θ − Θ_i
    start_phase = mix_weights is None
    if mix_weights is None:
        w = [torch.ones_like(params[k], dtype=params[k].dtype) for k in higher]
    else:
        if len(mix_weights) != len(higher):
            raise ValueError(
                f"stored ALA weights have {len(mix_weights)} arrays, expected {len(higher)} "
                f"(did layer_idx change?)"
            )
        w = [_tensor(array, params[k]) for k, array in zip(higher, mix_weights, strict=True)]

    losses: list[float] = []
    capped = False
    num_samples = len(data)
    size = int(settings.rand_percent / 100.0 * num_samples)
    learn = size > 0 and (start_phase or settings.adapt_after_start)
    if learn:
        begin = int(rng.integers(0, num_samples - size + 1))
        images = data.images[begin : begin + size]
        labels = data.labels[begin : begin + size]
        set_weights(model, base)
        trainable = {name: param.requires_grad for name, param in params.items()}
        for name, param in params.items():
            param.requires_grad_(name in glob)
        model.train()
        criterion = nn.CrossEntropyLoss()
        try:
            while True:
                for start in range(0, size, settings.batch_size):
                    with torch.no_grad():
                        for key, weight in zip(higher, w, strict=True):
                            params[key].copy_(torch.lerp(loc[key], glob[key], weight))
                            params[key].grad = None
                    batch = slice(start, start + settings.batch_size)
                    device = params[higher[0]].device
                    loss = criterion(
                        model(prepare(images[batch]).to(device)), labels[batch].to(device)
                    )
                    loss.backward()
                    with torch.no_grad():
                        for key, weight in zip(higher, w, strict=True):
                            grad = params[key].grad
                            assert grad is not None
                            weight.copy_(
                                torch.clamp(weight - settings.eta * grad * update[key], 0.0, 1.0)
                            )
                losses.append(float(loss.detach()))
                if not start_phase:
                    break
                recent = losses[-settings.num_pre_loss :]
                if len(losses) > settings.num_pre_loss and np.std(recent) < settings.threshold:
                    break
                if len(losses) >= settings.max_start_epochs:
                    capped = True
                    break
        finally:
            for name, param in params.items():
                param.grad = None
                param.requires_grad_(trainable[name])

    result = list(base)
    for key, weight in zip(higher, w, strict=True):
        mixed = torch.lerp(loc[key], glob[key], weight).detach().cpu().numpy()
        result[position[key]] = mixed.astype(np.asarray(local_weights[position[key]]).dtype)
    return ALAResult(
        result,
        [weight.detach().cpu().numpy().copy() for weight in w],
        len(losses),
        tuple(losses),
        capped,
    )


def _tensor(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.array(array, copy=True)).to(device=like.device, dtype=like.dtype)


class ALAClientMixin(PersonalClient[Any]):
    """Adds ALA to a client: put it *before* the method's client class in the bases.

    Wherever the method starts from or evaluates the received model, it gets
    ALA(received, local) instead (the paper's "+ALA", Table 4: ALA "only modifies the local
    initialization"); everything else of the method is unchanged. The options must derive from
    [`ALAFields`][pflower.strategies.ala.ALAFields]. ``ala_candidates`` may restrict ALA to part of
    the model.
    """

    def ala_candidates(self) -> list[str] | None:
        """Parameter names ALA overwrites or mixes (None: all)."""
        return None

    def ala_settings(self, config: dict[str, Scalar]) -> ALASettings:
        return self.options.ala_settings(self.train_settings(config).batch_size)

    def ala_initialized(
        self, received: NDArrays, version: int, config: dict[str, Scalar]
    ) -> NDArrays:
        """ALA(received, local) for global model ``version``, computed once and stored."""
        local = self.state.get_arrays(ALA_LOCAL)
        if local is None:  # no model of its own yet: ALA is deactivated (Θ_i = Θ)
            return received
        meta = self.state.get_scalars(ALA_META)
        if int(meta.get("version", -1)) >= version:
            return local
        rng = np.random.default_rng(
            [self.experiment.settings.seed, self.partition_id, version, 0xA1A]
        )
        began = time.perf_counter()
        result = adaptive_local_aggregation(
            self.model,
            received,
            local,
            self.state.get_arrays(ALA_WEIGHTS),
            self.data.train,
            self.data.prepare,
            self.ala_settings(config),
            rng,
            self.ala_candidates(),
        )
        start_phase = not self.state.has(ALA_WEIGHTS)
        self.state.put_arrays(ALA_LOCAL, result.weights)
        if result.mix_weights:
            self.state.put_arrays(ALA_WEIGHTS, result.mix_weights)
        self.state.put_scalars(
            ALA_META,
            {
                **meta,
                "version": version,
                "epochs": result.epochs,
                "seconds": time.perf_counter() - began,
                **(
                    {"start_epochs": result.epochs, "capped": result.capped}
                    if start_phase and result.mix_weights
                    else {}
                ),
            },
        )
        return result.weights

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        received = super().start_model(global_weights, config)
        return self.ala_initialized(received, server_round(config) - 1, config)

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        received = super().personalize(global_weights, config)
        return self.ala_initialized(received, server_round(config), config)

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        super().remember(trained, global_weights, config)
        self.state.put_arrays(ALA_LOCAL, trained)

    def fit_metrics(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        meta = self.state.get_scalars(ALA_META)
        ala: dict[str, Scalar] = {}
        if int(meta.get("version", -1)) == server_round(config) - 1:
            ala = {"ala_epochs": meta["epochs"], "ala_seconds": meta["seconds"]}
        if "start_epochs" in meta:
            ala["ala_start_epochs"] = meta["start_epochs"]
            ala["ala_capped"] = int(bool(meta["capped"]))
        return {**super().fit_metrics(config), **ala}
