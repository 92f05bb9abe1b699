"""FedAMP (Huang et al., AAAI 2021): the server's attention weights on hand-built models, the
guard, the real proximal term, and a state test recomputing round 3."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pflower.compose import config_from_run_config
from pflower.core.experiment import Experiment
from pflower.core.strategy import PersonalizedStrategy
from pflower.strategies.fedamp import PERSONAL, attention_weights
from pflower.strategies.model_mixing import flatten, mix, pairwise_distances, unflatten
from tests.helpers import ADAM_TINY as BASE
from tests.helpers import (
    StateLog,
    assert_pulled_toward_target,
)
from tests.inprocess import run_inprocess

MODELS = np.array([[0.0, 0.0, 1.0], [1.0, 2.0, 0.0], [-1.0, 0.5, 0.5], [3.0, -1.0, 2.0]])


def test_weights_match_a_hand_computation_below_the_guard() -> None:
    alpha_k, sigma = 0.5, 2.0
    d2 = pairwise_distances(MODELS, squared=True)
    xi, rescaled = attention_weights(d2, alpha_k, sigma)
    assert rescaled == []
    # client 0: ‖w0 − w1‖² = 1 + 4 + 1 = 6, ‖w0 − w2‖² = 1 + 0.25 + 0.25 = 1.5,
    # ‖w0 − w3‖² = 9 + 1 + 1 = 11
    expected = alpha_k * np.exp(-np.array([6.0, 1.5, 11.0]) / sigma) / sigma
    np.testing.assert_allclose(xi[0, 1:], expected)
    np.testing.assert_allclose(xi[0, 0], 1.0 - expected.sum())
    u0 = (1.0 - expected.sum()) * MODELS[0] + expected @ MODELS[1:]
    np.testing.assert_allclose(mix(xi, MODELS)[0], u0)


def test_large_sigma_sends_every_client_the_mean_of_the_others() -> None:
    """σ → ∞ (with α_K/σ ≥ 1/(m−1)): all attention weights equal, the guard rescales them to
    1/(m−1) and ξ_ii = 0, so u_i is the mean of the other models."""
    sigma = 1e9
    xi, rescaled = attention_weights(pairwise_distances(MODELS, squared=True), 10 * sigma, sigma)
    assert [row for row, _ in rescaled] == [0, 1, 2, 3]
    got = mix(xi, MODELS)
    for i in range(4):
        others = np.delete(MODELS, i, axis=0).mean(axis=0)
        np.testing.assert_allclose(got[i], others, atol=1e-7)
        assert xi[i, i] == pytest.approx(0.0, abs=1e-12)


def test_guard_rescales_only_rows_above_one_and_logs_each(tmp_path: Path) -> None:
    d2 = np.array([[0.0, 0.1, 50.0], [0.1, 0.0, 50.0], [50.0, 50.0, 0.0]])
    xi, rescaled = attention_weights(d2, alpha_k=2.0, sigma=1.0)
    assert [row for row, _ in rescaled] == [0, 1]  # row 2: 4·e^-50 ≪ 1, untouched
    np.testing.assert_allclose(xi[0], [0.0, 1.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(xi[2, :2], 2.0 * np.exp(-50.0))
    np.testing.assert_allclose(xi.sum(axis=1), 1.0)


def test_fedamp_state_round_three_and_guard_log(tmp_path: Path) -> None:
    """Round 3: u_i from the round-2 uploads with α_K of round 3 (decayed once at every=2);
    training from the stored w_i with CE + (λ/(2α_K))‖w − u_i‖² reproduces the stored model.
    α_K/σ is large enough here that the guard fires and is recorded."""
    alpha_k, sigma, lam = 5.0, 2.0, 3.0
    log = StateLog(PERSONAL)
    strategies: list[PersonalizedStrategy] = []
    overrides = [*BASE, "rounds=3", "strategy=fedamp", f"strategy.alpha_k={alpha_k}"]
    overrides += [f"strategy.sigma={sigma}", f"strategy.lam={lam}", "strategy.alpha_decay=0.5"]
    overrides += ["strategy.alpha_decay_every=2"]
    _, contexts = run_inprocess(overrides, tmp_path, log.make_client, strategies)
    (strategy,) = strategies
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    mask = strategy.trainable_mask
    alpha_3 = alpha_k * 0.5
    assert log.config[3, 0]["fedamp-alpha-k"] == alpha_3
    assert log.config[2, 0]["fedamp-alpha-k"] == alpha_k
    assert strategy.guard_events and strategy.guard_events[0][0] == 1  # round 1: all d = 0
    vectors = np.stack([flatten(log.uploaded[2, p], mask).astype(np.float32) for p in range(4)])
    xi, _ = attention_weights(pairwise_distances(vectors, squared=True), alpha_3, sigma)
    targets = mix(xi, vectors)
    for pid in range(4):
        expected = unflatten(targets[pid], log.uploaded[2, pid], mask)
        # a stiff pull (λ/α_K = 1.2) amplifies float summation order a little under Adam
        assert_pulled_toward_target(
            log, experiment, 3, pid, expected, lam / alpha_3, rtol=1e-4, atol=3e-5
        )


def test_fedamp_learns(tmp_path: Path) -> None:
    rows, _ = run_inprocess(
        ["dataset=digits", "num_clients=4", "rounds=2", "strategy=fedamp"], tmp_path
    )
    l1 = [r["acc_local"] for r in rows if r["stage"] == "L1" and r["round"] == 2]
    assert len(l1) == 4 and np.mean(l1) > 0.6
    assert [r["client_store_models"] for r in rows if r["stage"] == "server"] == [4, 4]
