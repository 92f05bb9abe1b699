r"""Ditto: Li, Hu, Beirami and Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021, Algorithm 1.

Each selected client k, given the global model $w^t$,

- (global step) runs the FedAvg local update on $F_k$ from $w^t$ and uploads the result; the server
  averages the uploads exactly as FedAvg does;
- (personal step) updates its persistent personal model $v_k$ with s local epochs of SGD on
  $h_k(v; w^t) = F_k(v) + \frac{λ}{2}\|v − w^t\|^2$ (Alg. 1, line 8), plus the optional L2 term
  $\frac{μ}{2}\|v\|^2$ of the FLAME authors' comparison code (``mu_l2``, default 0).

$λ = 0$ makes $v_k$ pure local training while w follows FedAvg exactly; $λ$ → ∞ pins $v_k$ to $w^t$.

What crosses the wire: $w^t$ to the client and the trained global-step model back (with $n_k$), as
in FedAvg; config ``server-round`` only. $v_k$ never leaves the client.
Client state: ``ditto_v`` ($v_k$; a client seen for the first time starts it from $w^t$).
Stage L1 evaluates $v_k$ (PM) and the received global model (GM) and reports the hybrid model
(FLAME paper, Sec. IV-D). Stage L2 evaluates $v_k$ after the round's personal step.

Learning rates: the global step uses ``global_lr`` (null: ``train.lr``), the personal step
``personal_lr`` (null: ``train.lr``); both use ``train.momentum``, ``train.batch_size`` and the
same seeded data order. The global step runs ``train.local_epochs`` (or ``train.local_steps``),
the personal step ``personal_epochs`` epochs.

Deviation: Alg. 1 runs the personal step before the global one on the same $w^t$; the two are
independent given $w^t$, so the order does not change the result. The FLAME authors' code never
re-synchronizes its global-model copy with $w^t$ (it averages drifting local models), which the
FLAME paper's Table III Ditto-GM numbers reflect; this module implements Ditto as published.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from flwr.common import NDArrays, Scalar

from pflower.api import AlgorithmOptions, PersonalizedStrategy, register_algorithm
from pflower.config import require
from pflower.core.training import TrainSettings, get_weights, set_weights
from pflower.searchspace import tunable
from pflower.strategies.moreau import PersonalAndGlobalClient, with_lr
from pflower.strategies.proximal import anchor_tensors, proximal_term

PERSONAL = "ditto_v"


class DittoStrategy(PersonalizedStrategy["DittoOptions"]):
    """Server side identical to FedAvg (Alg. 1, line 11)."""


class DittoClient(PersonalAndGlobalClient["DittoOptions"]):
    """FedAvg local update for w (uploaded); proximal personal step for v (kept). Stage L1: v_k
    (PM) and the received w^t (GM)."""

    personal_key: ClassVar[str] = PERSONAL

    def train_settings(self, config: dict[str, Scalar]) -> TrainSettings:
        """The global step's settings: the round's, with ``global_lr`` if set."""
        return with_lr(super().train_settings(config), self.options.global_lr)

    def personal_step(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        """v_k ← ``personal_epochs`` epochs of SGD on F_k(v) + (λ/2)‖v − w^t‖² (+ (μ/2)‖v‖²)."""
        set_weights(self.model, self.state.get_arrays(PERSONAL) or global_weights)
        settings = with_lr(super().train_settings(config), self.options.personal_lr)
        settings = replace(settings, epochs=self.options.personal_epochs, steps=None)
        term = None
        if self.options.lambda_ or self.options.mu_l2:
            anchors = anchor_tensors(self.model, self.personal_anchor(global_weights, config))
            term = proximal_term(anchors, self.options.lambda_, self.options.mu_l2)
        self.local_train(settings, config, term)
        return get_weights(self.model)

    def personal_anchor(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        """The model the personal step is pulled toward: the received w^t (Ditto+ALA: the
        ALA-initialized copy of it)."""
        return global_weights

    def remember(
        self, trained: NDArrays, global_weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        """Runs the personal step (the global step's result is already in ``trained``); leaves
        ``self.model`` holding v_k, which stage L2 evaluates."""
        self.state.put_arrays(PERSONAL, self.personal_step(global_weights, config))


@register_algorithm("ditto", strategy=DittoStrategy, client=DittoClient)
@dataclass
class DittoOptions(AlgorithmOptions):
    """Attributes:
    lambda_: λ, the pull of the personal model toward the global one (0: local training).
    personal_epochs: s, epochs of the personal step per round.
    personal_lr: learning rate of the personal step (null: ``train.lr``).
    global_lr: learning rate of the global (FedAvg) step (null: ``train.lr``).
    mu_l2: μ, an extra L2 term on v (the FLAME authors' code uses 0.01; 0 is Ditto as published).
    """

    display_name: ClassVar[str] = "Ditto"
    display_rank: ClassVar[int] = 20

    lambda_: float = tunable(
        1.0,
        low=0.01,
        high=2.0,
        log=True,
        source="Ditto (Li et al., ICML 2021), Sec. 5",
    )
    personal_epochs: int = 1
    personal_lr: float | None = None
    global_lr: float | None = None
    mu_l2: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.lambda_ >= 0, f"strategy.lambda_ must be >= 0, got {self.lambda_}")
        require(
            self.personal_epochs >= 0,
            f"strategy.personal_epochs must be >= 0, got {self.personal_epochs}",
        )
        for key in ("personal_lr", "global_lr"):
            value = getattr(self, key)
            require(value is None or value > 0, f"strategy.{key} must be null or > 0, got {value}")
        require(self.mu_l2 >= 0, f"strategy.mu_l2 must be >= 0, got {self.mu_l2}")
