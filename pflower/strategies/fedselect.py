r"""FedSelect: Tamirisa, Xie, Bao, Zhou, Arel and Shamsian, "FedSelect: Personalized Federated
Learning with Customized Selection of Parameters for Fine-Tuning", CVPR 2024 (a baseline of
FedMPR, Göksu & Pugeault, Tables II-III). Written from the paper and the authors' public
implementation, whose settings it follows.

Every client k keeps a binary mask $m_k$ over its model's parameters (1 = personal, 0 = shared),
starting with everything personal, and its own full model $θ_k$. In a round:

1. Broadcast: the client overwrites only its shared entries with the server's values,
   $θ_k \leftarrow  m_k$ ⊙ $θ_k$ + (1 − $m_k$) ⊙ w.
2. Local training ("LocalAlt"): every local epoch is two passes over the client's data, the first
   updating only the personal entries, the second only the shared ones (the other entries are
   held fixed by restoring them after each optimizer step).
3. Mask growth (the GradSelect step, every ``mask_every`` rounds): in every trainable tensor whose
   name contains "weight" and that is not yet more than ``share_limit`` shared, the fraction
   ``select_fraction`` of its still-personal entries whose values moved least since the last
   mask update, |$θ_{now} − θ_{last}$|, become shared. Biases and BatchNorm statistics stay
   personal.
4. Upload: $θ_k$ ⊙ (1 − $m_k$) and the shared mask 1 − $m_k$ (the new mask: a newly shared entry is
   averaged from the clients' own values before anyone receives it).
5. Server: per scalar, the mean over the clients that share it, $\sum _k θ_k$ (1 − $m_k$) /
$\sum _k$ (1 − $m_k$);
   entries nobody shares keep their server value.

What crosses the wire: w down (fit config ``server-round`` only); up, $θ_k$ with its personal
entries zeroed, followed by one boolean mask per ``state_dict`` entry (1 byte per scalar).

Client state (``context.state``): ``fedselect_model`` ($θ_k$, every ``state_dict`` entry),
``fedselect_personal`` ($m_k$, float 0/1 per entry) and ``fedselect_last`` ($θ$ at the last mask
update).

Server state: the server's model w (the base class's global model), no per-client memory.

Global model: FedSelect is personalized and has none; stage G is not reported. The headline is
each client's personalized model (step 1) on the global test set, ``acc_global`` of stage L1, and
its mean over clients (the paper's "global model" accuracy of FedSelect is not defined; this is
pflower's reading).

Deviations: the optimizer is the shared one (fresh per pass); the official code uses plain SGD.
The mask is initialized all personal, so nothing is shared before round ``mask_every``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import torch
from flwr.common import NDArrays, Scalar
from torch import nn

from pflower.api import AlgorithmOptions, PersonalClient, PersonalizedStrategy, register_algorithm
from pflower.config import require
from pflower.core.client import server_round
from pflower.core.options import Aggregation
from pflower.core.strategy import ClientUpdate
from pflower.core.training import (
    Regularizer,
    TrainSettings,
    get_weights,
    train,
    trainable_mask,
)
from pflower.searchspace import tunable
from pflower.strategies.batches import data_generator

MODEL = "fedselect_model"
PERSONAL = "fedselect_personal"
LAST = "fedselect_last"


def selectable_mask(model: nn.Module) -> list[bool]:
    """Per ``state_dict`` entry: a trainable tensor whose name contains "weight"."""
    return [
        trainable and "weight" in name
        for name, trainable in zip(model.state_dict(), trainable_mask(model), strict=True)
    ]


def grow_shared(
    personal: NDArrays,
    now: NDArrays,
    last: NDArrays,
    selectable: list[bool],
    fraction: float,
    limit: float,
) -> NDArrays:
    """The new personal mask: in every selectable tensor at most ``limit`` shared, the
    ``fraction`` of its personal entries with the smallest |now − last| become shared."""
    updated = []
    for mask, current, previous, selectable_ in zip(personal, now, last, selectable, strict=True):
        mask = np.array(mask, copy=True)
        shared_fraction = 1.0 - float(mask.mean()) if mask.size else 1.0
        if selectable_ and shared_fraction <= limit:
            personal_idx = np.flatnonzero(mask.reshape(-1) == 1)
            count = int(np.floor(fraction * personal_idx.size))
            if count > 0:
                moved = np.abs(
                    np.asarray(current, np.float64) - np.asarray(previous, np.float64)
                ).reshape(-1)[personal_idx]
                chosen = personal_idx[np.argsort(moved, kind="stable")[:count]]
                flat = mask.reshape(-1)
                flat[chosen] = 0
        updated.append(mask)
    return updated


class FedSelectStrategy(PersonalizedStrategy["FedSelectOptions"]):
    """Per-scalar mean over the clients that share each entry."""

    robust_aggregation: ClassVar[bool] = False

    has_global_model: ClassVar[bool] = False

    def expected_upload(self, current: NDArrays) -> NDArrays:
        """θ_k (personal entries zeroed), then one boolean shared-mask per entry."""
        return list(current) + [np.zeros(a.shape, dtype=bool) for a in current]

    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        size = len(current)
        new = []
        for index, server_value in enumerate(current):
            total = np.zeros(server_value.shape, np.float64)
            sharers = np.zeros(server_value.shape, np.float64)
            for update in updates:
                shared = np.asarray(update.weights[size + index], dtype=bool)
                total += np.where(shared, np.asarray(update.weights[index], np.float64), 0.0)
                sharers += shared
            mean = np.divide(total, sharers, out=np.zeros_like(total), where=sharers > 0)
            new.append(np.where(sharers > 0, mean, server_value).astype(server_value.dtype))
        return new


class FedSelectClient(PersonalClient["FedSelectOptions"]):
    """Keeps its model and mask; trains with LocalAlt; grows the shared part."""

    def _personal(self, like: NDArrays) -> NDArrays:
        stored = self.state.get_arrays(PERSONAL)
        return stored if stored is not None else [np.ones(a.shape, np.float32) for a in like]

    def personalized(self, global_weights: NDArrays) -> NDArrays:
        """m ⊙ θ_k + (1 − m) ⊙ w (w itself before the client's first round)."""
        local = self.state.get_arrays(MODEL)
        if local is None:
            return global_weights
        return [
            np.where(mask == 1, own, glob).astype(glob.dtype)
            for own, glob, mask in zip(
                local, global_weights, self._personal(global_weights), strict=True
            )
        ]

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self.personalized(global_weights)

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        return self.personalized(global_weights)

    def local_train(
        self,
        settings: TrainSettings,
        config: dict[str, Scalar],
        regularizer: Regularizer | None = None,
        after_step: Callable[[nn.Module], None] | None = None,
    ) -> float:
        """LocalAlt: per epoch, a pass on the personal entries, then one on the shared ones."""
        personal = self._personal(get_weights(self.model))
        names = list(self.model.state_dict())
        trainable = dict(self.model.named_parameters())
        one_pass = replace(settings, epochs=1, steps=None)
        generator = data_generator(self, config)  # one data order for all passes
        losses = []
        for _ in range(settings.epochs):
            for free in (1, 0):
                frozen = {
                    name: (
                        torch.from_numpy(mask != free).to(trainable[name].device),
                        trainable[name].detach().clone(),
                    )
                    for name, mask in zip(names, personal, strict=True)
                    if name in trainable
                }

                def restore(
                    model: nn.Module,
                    frozen: dict[str, tuple[torch.Tensor, torch.Tensor]] = frozen,
                ) -> None:
                    with torch.no_grad():
                        for name, param in model.named_parameters():
                            keep, value = frozen[name]
                            param[keep] = value[keep]

                losses.append(
                    train(
                        self.model,
                        self.data.train,
                        self.data.prepare,
                        one_pass,
                        generator,
                        regularizer,
                        restore,
                    )
                )
        return float(np.mean(losses)) if losses else 0.0

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        personal = self._personal(trained)
        last = self.state.get_arrays(LAST) or self.personalized(global_weights)
        if server_round(config) % self.options.mask_every == 0:
            personal = grow_shared(
                personal,
                trained,
                last,
                selectable_mask(self.model),
                self.options.select_fraction,
                self.options.share_limit,
            )
            last = trained
        self.state.put_arrays(MODEL, trained)
        self.state.put_arrays(PERSONAL, personal)
        self.state.put_arrays(LAST, last)
        self._personal_now = personal

    def upload(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> NDArrays:
        shared = [mask == 0 for mask in self._personal_now]
        return [
            np.where(s, t, 0).astype(t.dtype) for t, s in zip(trained, shared, strict=True)
        ] + shared

    def fit_metrics(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        total = sum(mask.size for mask in self._personal_now)
        shared = sum(int((mask == 0).sum()) for mask in self._personal_now)
        return {"shared_fraction": shared / total if total else 0.0}


@register_algorithm("fedselect", strategy=FedSelectStrategy, client=FedSelectClient)
@dataclass
class FedSelectOptions(AlgorithmOptions):
    """Attributes:
    select_fraction: share of a tensor's personal entries that become shared at each mask
        update (0.25, the official setting).
    share_limit: a tensor stops growing its shared part once more than this fraction is
        shared (0.8).
    mask_every: rounds between mask updates (3).
    aggregation: unused by the server's per-scalar mean (kept for the common schema).
    """

    display_name: ClassVar[str] = "FedSelect"
    display_rank: ClassVar[int] = 20

    select_fraction: float = tunable(
        0.25,
        low=0.005,
        high=0.5,
        log=True,
        source=(
            "FedSelect (Tamirisa et al., CVPR 2024); log-uniform down to 0.005, since tuning chose "
            "0.062 of the old uniform [0.05, 0.5] on MNIST"
        ),
    )
    share_limit: float = 0.8
    mask_every: int = 3
    aggregation: Aggregation = Aggregation.uniform

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            0.0 < self.select_fraction <= 1.0,
            f"strategy.select_fraction must be in (0, 1], got {self.select_fraction}",
        )
        require(
            0.0 <= self.share_limit <= 1.0,
            f"strategy.share_limit must be in [0, 1], got {self.share_limit}",
        )
        require(self.mask_every >= 1, f"strategy.mask_every must be >= 1, got {self.mask_every}")
