"""SCAFFOLD's option II and FedDC's correction under heavy-ball momentum
(:func:`pflower.strategies.control_variates.effective_steps`): the denominator K_eff η, checked
against a real torch SGD step sequence, in the stored c_i, and over a 6-round run with the default
optimizer (SGD lr 0.05, momentum 0.9), which diverged to NaN with K η. Adam is refused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pflower.core.state import ClientState
from pflower.core.training import TrainSettings
from pflower.registry import ConfigError
from pflower.strategies.control_variates import effective_steps, local_steps
from tests.helpers import (
    recorded_run,
    stage_rows,
    train_size,
)
from tests.inprocess import run_inprocess

DEFAULT_OPTIMIZER = [
    "dataset=digits",
    "partition=pathological",
    "model=small_cnn",
    "num_clients=4",
]  # train.* left at the defaults: SGD, lr 0.05, momentum 0.9, batch 16, 2 epochs


def settings(momentum: float, optimizer: str = "sgd") -> TrainSettings:
    return TrainSettings(
        epochs=1, steps=None, batch_size=8, optimizer=optimizer, lr=0.1, momentum=momentum
    )


def test_effective_steps_by_hand() -> None:
    assert effective_steps(7, settings(0.0)) == 7  # plain SGD: K itself, exactly
    assert isinstance(effective_steps(7, settings(0.0)), int)
    # β = 0.5, K = 3: 1 + 1.5 + 1.75
    assert effective_steps(3, settings(0.5)) == pytest.approx(4.25)
    # β = 0.9: K_eff → K/(1 − β) − β/(1 − β)² for K ≫ 10
    assert effective_steps(1000, settings(0.9)) == pytest.approx(10 * 1000 - 90, rel=1e-9)


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
def test_displacement_over_effective_steps_is_the_constant_gradient(momentum: float) -> None:
    """With a constant gradient g, (x − y)/(K_eff η) = g for torch's SGD with momentum (what
    option II needs); dividing by K η gives ≈ g/(1 − β)."""
    g = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
    theta = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    config = settings(momentum)
    optimizer = config.make_optimizer(iter([theta]))
    steps = 25
    for _ in range(steps):
        optimizer.zero_grad()
        (theta * g).sum().backward()
        optimizer.step()
    displacement = -theta.detach().numpy()  # x − y with x = 0
    estimate = displacement / (effective_steps(steps, config) * config.lr)
    np.testing.assert_allclose(estimate, g.numpy(), rtol=1e-12)


def test_scaffold_first_control_variate_uses_effective_steps(tmp_path: Path) -> None:
    """Round 1 (c = c_i = 0): the stored c_i is (x − y_i)/(K_eff η_l) with the default
    momentum 0.9, and Δc_i is uploaded after y_i."""
    _, contexts, recording, strategy = recorded_run(
        [*DEFAULT_OPTIMIZER, "rounds=1", "strategy=scaffold"], tmp_path
    )
    size = len(strategy.global_weights)
    for pid, context in enumerate(contexts):
        sent, uploaded, _ = recording.fits[(1, pid)]
        steps = -(-train_size(context) // 16) * 2  # 2 epochs of batch 16
        assert steps == local_steps(train_size(context), TrainSettings(2, None, 16, "sgd", 0.05))
        k_eff = effective_steps(steps, settings(0.9))
        assert k_eff > 5 * steps  # the momentum correction is large here
        expected = [
            (x - y) / (k_eff * 0.05) for x, y in zip(sent[:size], uploaded[:size], strict=True)
        ]
        stored = ClientState(context.state).get_arrays("scaffold_ci")
        for s, e, d in zip(stored, expected, uploaded[size:], strict=True):
            np.testing.assert_allclose(s, e, rtol=1e-4, atol=1e-7)
            np.testing.assert_allclose(d, e, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("strategy", ["scaffold", "feddc"])
def test_six_rounds_with_default_momentum_stay_finite(strategy: str, tmp_path: Path) -> None:
    """6 rounds with SGD momentum 0.9 (the defaults): with K η in the denominator SCAFFOLD's
    clients uploaded NaN in round 5 and FedDC's in round 4."""
    rows, contexts = run_inprocess(
        [*DEFAULT_OPTIMIZER, "rounds=6", f"strategy={strategy}"], tmp_path
    )
    l2 = stage_rows(rows, "L2")
    assert len(l2) == 6 * 4
    assert all(np.isfinite(r["train_loss"]) for r in l2)
    assert all(np.isfinite(r["loss_global"]) for r in stage_rows(rows, "L1", 6))
    key = "scaffold_ci" if strategy == "scaffold" else "feddc_correction"
    for context in contexts:
        assert all(np.isfinite(a).all() for a in ClientState(context.state).get_arrays(key))
    if strategy == "scaffold":  # and it learns (≈ 0.9 on the global test set in round 6)
        assert np.mean([r["acc_global"] for r in stage_rows(rows, "L1", 6)]) > 0.5


@pytest.mark.parametrize("strategy", ["scaffold", "feddc"])
def test_adam_is_refused(strategy: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"train\.optimizer=sgd"):
        run_inprocess(
            [*DEFAULT_OPTIMIZER, "rounds=1", f"strategy={strategy}", "train.optimizer=adam"],
            tmp_path,
        )
    with pytest.raises(ConfigError, match=r"train\.optimizer=sgd"):
        effective_steps(3, settings(0.9, optimizer="adam"))
