"""State tests: each fails if an algorithm stores, mixes or starts from the wrong tensor.

Every stateful algorithm gets a test of this kind: it recomputes what the algorithm must have done
from the state it stored and the models that crossed the wire, independently of the algorithm's
own code path, on the same seed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from pflower.compose import config_from_run_config
from pflower.core.experiment import Experiment
from pflower.core.strategy import PersonalizedStrategy
from pflower.core.training import evaluate, get_weights, set_weights
from pflower.strategies.fliu import LOCAL_MODEL, mix
from pflower.strategies.proximal import proximal_to
from tests.helpers import (
    StateLog,
    assert_arrays_close,
    retrain,
    tiny,
)
from tests.inprocess import run_inprocess

GAMMA = 0.3
BASE = tiny(
    "train.lr=0.05",
    "strategy=fliu",
    "strategy.gamma_mode=fixed",
    f"strategy.gamma={GAMMA}",
    rounds=3,
)


def test_fliu_at_gamma_0_3_recomputes_from_the_stored_state(tmp_path: Path) -> None:
    """Alg. 1 / Eq. 3 at a γ strictly between the identities' endpoints:

    - the client stores θ_k^t, its *trained* model, which is what it uploads;
    - Θ^t is the uniform mean of the uploaded θ_k^t;
    - round t+1 trains from γ θ_k^t + (1 − γ) Θ^t (recomputed here with the shared loop);
    - stage L1 of round t evaluates γ θ_k^t + (1 − γ) Θ^t.
    """
    log = StateLog(LOCAL_MODEL)
    strategies: list[PersonalizedStrategy] = []
    rows, contexts = run_inprocess(BASE, tmp_path, log.make_client, strategies)
    (strategy,) = strategies
    run_config = contexts[0].run_config
    experiment = Experiment.of(config_from_run_config(run_config))
    clients = range(4)

    for round_ in (1, 2, 3):
        for pid in clients:
            # The stored tensor is the trained model, exactly what crossed the wire.
            assert_arrays_close(log.after[round_, pid], log.uploaded[round_, pid], rtol=0, atol=0)
    for round_ in (2, 3):
        # Θ^{t-1}, as the server sent it, is the uniform mean of round t-1's uploads.
        mean = [
            np.mean(layer, axis=0)
            for layer in zip(*(log.uploaded[round_ - 1, p] for p in clients), strict=True)
        ]
        assert_arrays_close(log.received[round_, 0], mean, rtol=1e-6, atol=1e-7)
    theta_final = strategy.global_weights
    final_mean = [
        np.mean(layer, axis=0) for layer in zip(*(log.uploaded[3, p] for p in clients), strict=True)
    ]
    assert_arrays_close(theta_final, final_mean, rtol=1e-6, atol=1e-7)

    model = experiment.new_model()
    for pid in clients:
        data = experiment.client_data(pid)
        # Round 3 starts from the mix of the stored θ_k^2 and the received Θ^2, then trains.
        start = mix(GAMMA, log.before[3, pid], log.received[3, pid])
        trained = retrain(experiment, pid, 3, start)
        assert_arrays_close(trained, log.after[3, pid], rtol=1e-5, atol=1e-6)
        # Stage L1 of round 3 evaluates the mix of θ_k^3 and Θ^3.
        set_weights(model, mix(GAMMA, log.after[3, pid], theta_final))
        expected = evaluate(model, data.test, data.prepare, 512)
        (l1,) = [r for r in rows if r["stage"] == "L1" and r["round"] == 3 and r["client"] == pid]
        assert l1["acc_local"] == pytest.approx(expected.accuracy)
        assert l1["loss_local"] == pytest.approx(expected.loss, rel=1e-5)


def test_fedprox_term_value_and_gradient_match_a_hand_computation() -> None:
    """(μ/2)‖w − w^t‖² over trainable parameters, gradient μ (w − w^t); buffers excluded."""
    model = nn.Sequential(nn.Linear(2, 1), nn.BatchNorm1d(1))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, -2.0]]))
        model[0].bias.copy_(torch.tensor([0.5]))
        model[1].weight.copy_(torch.tensor([2.0]))
        model[1].bias.copy_(torch.tensor([0.0]))
        model[1].running_mean.fill_(100.0)  # a buffer far from its anchor: must not count
    anchors = [np.zeros_like(array) for array in get_weights(model)]
    mu = 0.2
    term = proximal_to(model, anchors, mu)(model)
    # ‖w − 0‖² = 1 + 4 + 0.25 + 4 + 0 = 9.25
    assert float(term) == pytest.approx(0.5 * mu * 9.25)
    term.backward()
    np.testing.assert_allclose(model[0].weight.grad.numpy(), mu * np.array([[1.0, -2.0]]))
    np.testing.assert_allclose(model[0].bias.grad.numpy(), mu * np.array([0.5]))
    np.testing.assert_allclose(model[1].weight.grad.numpy(), mu * np.array([2.0]))
    np.testing.assert_allclose(model[1].bias.grad.numpy(), [0.0])


def test_fedprox_pulls_local_training_toward_the_global_model(tmp_path: Path) -> None:
    """With μ > 0 the trained models end closer to the model they started from."""

    def drift(mu: float) -> float:
        log = StateLog(LOCAL_MODEL)
        overrides = [*BASE[:8], "strategy=fedprox", f"strategy.mu={mu}", "rounds=1"]
        run_inprocess(overrides, tmp_path / str(mu), log.make_client)
        return float(
            np.mean(
                [
                    sum(np.sum((u - g) ** 2) for u, g in zip(up, log.received[key], strict=True))
                    for key, up in log.uploaded.items()
                ]
            )
        )

    assert drift(1.0) < 0.9 * drift(0.0)
