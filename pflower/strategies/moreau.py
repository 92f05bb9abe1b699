r"""Shared machinery of the methods that keep a personalized model beside the global one and
train it on a proximal (Moreau-envelope) objective: pFedMe (Dinh, Tran and Nguyen, NeurIPS 2020,
Alg. 1), FLAME (Zhu et al., arXiv 2407.16397, Eq. 11), Ditto (Li et al., ICML 2021, Alg. 1
line 8), and APFL's model pair (Deng, Kamani and Mahdavi, arXiv 2003.13461).

- their loss term $θ \mapsto \frac{λ}{2}\|θ − \text{anchor}\|^2 + \frac{μ}{2}\|θ\|^2$, with an
  anchor that may move between steps, is the regularized family's one proximal term
  ([`pflower.strategies.proximal`][pflower.strategies.proximal]);
- [`steps_per_epoch`][pflower.strategies.moreau.steps_per_epoch]: the mini-batches of one pass (when
  the per-pass updates run);
- [`float_or`][pflower.strategies.moreau.float_or]: an elementwise closed-form update that leaves
  non-float arrays alone;
- [`with_lr`][pflower.strategies.moreau.with_lr]: a step's own learning rate option (null: the
  round's ``train.lr``);
- [`PersonalAndGlobalClient`][pflower.strategies.moreau.PersonalAndGlobalClient]: stage L1 evaluates
  the stored personalized model (PM) and
  the received global model (GM), and reports the hybrid model (HM, the better of the two on the
  split ``selection.split`` names; FLAME paper, Sec. IV-D).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import ClassVar

import numpy as np
from flwr.common import NDArrays, Scalar

from pflower.api import PersonalClient
from pflower.config import SelectionSplit
from pflower.core.options import OptionsT
from pflower.core.training import TrainSettings, evaluate, set_weights


def steps_per_epoch(num_samples: int, batch_size: int) -> int:
    """Mini-batches in one pass (the last may be smaller)."""
    return max(1, math.ceil(num_samples / batch_size))


def float_or(reference: np.ndarray, value: np.ndarray) -> np.ndarray:
    """``value`` in ``reference``'s dtype; non-float arrays (counters) keep ``reference``."""
    if not np.issubdtype(reference.dtype, np.floating):
        return reference.copy()
    return np.asarray(value).astype(reference.dtype)


def with_lr(settings: TrainSettings, lr: float | None) -> TrainSettings:
    """``settings`` with learning rate ``lr``; ``None`` keeps theirs (the round's ``train.lr``)."""
    return settings if lr is None else replace(settings, lr=lr)


class PersonalAndGlobalClient(PersonalClient[OptionsT]):
    """Stage L1 evaluates the personalized model stored under `personal_key` (the received
    model before the client has trained) as PM and the received global model as GM."""

    personal_key: ClassVar[str]

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        """The PM (the received model before the client has trained)."""
        return self.state.get_arrays(self.personal_key) or global_weights

    def global_model_for_eval(
        self, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> NDArrays:
        """The GM: the received global model, for the hybrid model (FLAME paper, Sec. IV-D)."""
        return global_weights

    def evaluation_metrics(
        self, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> dict[str, Scalar]:
        """The PM's stage metrics plus ``acc_pm``/``acc_gm``/``acc_hm`` (and losses) and
        ``hm_choice_pm``
        ([`hybrid_metrics`][pflower.strategies.moreau.PersonalAndGlobalClient.hybrid_metrics])."""
        metrics = self.stage_metrics()
        global_model = self.global_model_for_eval(global_weights, config)
        return {**metrics, **self.hybrid_metrics(metrics, global_model)}

    def hybrid_metrics(
        self, personal: dict[str, Scalar], global_model: NDArrays
    ) -> dict[str, Scalar]:
        """PM, GM and HM on the local test split (FLAME paper, Sec. IV-D); ``self.model`` holds
        the PM and ``personal`` its stage metrics.

        HM is the model with the higher accuracy on ``selection.split`` (ties: PM); its test
        accuracy and loss are reported, and ``loss_hm_min`` = min(loss_pm, loss_gm) as well.
        """
        batch_size = self.experiment.settings.eval.batch_size
        by_val = self.experiment.settings.selection.split == SelectionSplit.val
        if by_val and len(self.data.val) == 0:
            raise ValueError(
                "selection.split=val needs a validation share: set split.val_fraction > 0"
            )
        if by_val:
            pm_val = evaluate(self.model, self.data.val, self.data.prepare, batch_size)
        set_weights(self.model, global_model)
        gm = evaluate(self.model, self.data.test, self.data.prepare, batch_size)
        acc_pm, loss_pm = float(personal["acc_local"]), float(personal["loss_local"])
        if by_val:
            gm_val = evaluate(self.model, self.data.val, self.data.prepare, batch_size)
            choose_pm = pm_val.accuracy >= gm_val.accuracy
        else:
            choose_pm = acc_pm >= gm.accuracy
        return {
            "acc_pm": acc_pm,
            "loss_pm": loss_pm,
            "acc_gm": gm.accuracy,
            "loss_gm": gm.loss,
            "acc_hm": acc_pm if choose_pm else gm.accuracy,
            "loss_hm": loss_pm if choose_pm else gm.loss,
            "loss_hm_min": min(loss_pm, gm.loss),
            "hm_choice_pm": 1.0 if choose_pm else 0.0,
        }
