"""FedCAC (Wu et al., ICCV 2023): critical masks, overlaps and collaborators on hand-built
arrays, and a state test recomputing round 2's start model, mask and the server's messages."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pflower.core.strategy import PersonalizedStrategy
from pflower.strategies.fedcac import (
    MASK,
    collaborators,
    critical_mask,
    overlaps,
)
from tests.helpers import ADAM_TINY as BASE
from tests.helpers import (
    StateLog,
    assert_arrays_close,
)
from tests.inprocess import run_inprocess


def test_critical_mask_marks_the_most_sensitive_half() -> None:
    start = np.array([[1.0, 1.0], [1.0, 1.0]], np.float32)
    trained = np.array([[3.0, 1.5], [0.0, -2.0]], np.float32)
    # |Δθ ⊙ θ| = [[6, 0.75], [0, 6]]: the top half are entries (0, 0) and (1, 1)
    np.testing.assert_array_equal(critical_mask(start, trained, 0.5), [[1, 0], [0, 1]])
    assert critical_mask(start, trained, 0.0).sum() == 0


def test_overlap_and_collaborators_by_hand() -> None:
    masks = [np.array([1.0, 1.0, 0, 0]), np.array([1.0, 1.0, 0, 0]), np.array([0, 0, 1.0, 1.0])]
    overlap = overlaps(masks)
    np.testing.assert_allclose(overlap, [[1, 1, 0], [1, 1, 0], [0, 0, 1]])
    # off-diagonal mean 1/3, max 1: threshold at t=1, β=2 is 1/3 + (1/2)(2/3) = 2/3
    assert collaborators(overlap, 1, 2.0) == [[0, 1], [0, 1], [2]]
    # t = β: threshold = max, still the identical masks; t > β: above the max, nobody
    assert collaborators(overlap, 2, 2.0) == [[0, 1], [0, 1], [2]]
    assert collaborators(overlap, 5, 2.0) == [[0], [1], [2]]
    partial = np.array([[1.0, 0.5, 0.2], [0.5, 1.0, 0.9], [0.2, 0.9, 1.0]])
    # mean of off-diagonals 0.5333, max 0.9: at t=1, β=100 threshold ≈ 0.537
    assert collaborators(partial, 1, 100.0) == [[0], [1, 2], [1, 2]]


def test_fedcac_state_round_two(tmp_path: Path) -> None:
    tau_c, beta = 0.5, 4.0
    log = StateLog(MASK)
    strategies: list[PersonalizedStrategy] = []
    overrides = [*BASE, "rounds=2", "strategy=fedcac", f"strategy.tau_c={tau_c}"]
    overrides += [f"strategy.beta={beta}", "partition=iid"]
    rows, _ = run_inprocess(overrides, tmp_path, log.make_client, strategies)
    (strategy,) = strategies
    mask = strategy.trainable_mask
    size = len(mask)
    models = {pid: log.uploaded[1, pid][:size] for pid in range(4)}
    masks = {pid: log.uploaded[1, pid][size:] for pid in range(4)}
    sizes = strategy.client_sizes
    glob = [
        sum(sizes[p] * models[p][k].astype(np.float64) for p in range(4)) / sum(sizes.values())
        for k in range(size)
    ]
    groups = collaborators(
        overlaps([np.concatenate([m.ravel() for m in masks[p]]) for p in range(4)]), 2, beta
    )
    for pid in range(4):
        # round 1: both halves are Θ^0; the mask is computed from Θ^0 and the trained model
        received = log.received[1, pid]
        assert_arrays_close(received[:size], received[size:], rtol=0, atol=0)
        trained = log.uploaded[1, pid][:size]
        expected = [
            critical_mask(s, t, tau_c)
            for s, t, m in zip(received[:size], trained, mask, strict=True)
            if m
        ]
        assert_arrays_close(log.after[1, pid], expected, rtol=0, atol=0)
        assert_arrays_close(masks[pid], expected, rtol=0, atol=0)
        # round 2: global = FedAvg of round 1, customized = mean over the collaborators
        message = log.received[2, pid]
        assert_arrays_close(message[:size], glob, rtol=1e-6, atol=1e-7)
        custom = [np.mean([models[m][k] for m in groups[pid]], axis=0) for k in range(size)]
        assert_arrays_close(message[size:], custom, rtol=1e-6, atol=1e-7)
        assert log.before[2, pid] is not None
        start = [
            m_ * c + (1 - m_) * g
            for m_, c, g in zip(log.before[2, pid], message[size:], message[:size], strict=True)
        ]
        trained2 = log.uploaded[2, pid][:size]
        expected2 = [critical_mask(s, t, tau_c) for s, t in zip(start, trained2, strict=True)]
        assert_arrays_close(log.after[2, pid], expected2, rtol=0, atol=0)
    assert any(len(g) > 1 for g in groups), "no collaboration: the test is vacuous"
    g_rows = [r for r in rows if r["stage"] == "G"]
    assert len(g_rows) == 3


def test_fedcac_learns(tmp_path: Path) -> None:
    rows, _ = run_inprocess(
        ["dataset=digits", "num_clients=4", "rounds=2", "strategy=fedcac"], tmp_path
    )
    l1 = [r["acc_local"] for r in rows if r["stage"] == "L1" and r["round"] == 2]
    assert len(l1) == 4 and np.mean(l1) > 0.6
