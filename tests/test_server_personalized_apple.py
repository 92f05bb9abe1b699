"""APPLE (Luo and Wu, IJCAI 2022): the fade-out schedule, the relationship gradient by hand,
every client receives all N cores, and a state test recomputing round 2's per-batch core and
relationship steps from the received cores and the stored p_i."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from pflower.compose import config_from_run_config
from pflower.core.experiment import Experiment
from pflower.core.state import ClientState
from pflower.core.strategy import PersonalizedStrategy
from pflower.core.training import (
    batch_indices,
    data_order,
    get_weights,
    set_weights,
    trainable_mask,
)
from pflower.strategies.apple import (
    P_KEY,
    PERSONAL,
    AppleUpload,
    RelationshipGradient,
    proximal_weight,
    relationship_gradient,
    relationship_weights,
)
from tests.helpers import ADAM_TINY as BASE
from tests.helpers import (
    StateLog,
    assert_arrays_close,
)
from tests.inprocess import run_inprocess

APPLE = [*BASE, "strategy=apple", "train.optimizer=sgd", "train.lr=0.05"]


def test_fade_schedule() -> None:
    assert proximal_weight(0, 10.0) == 1.0
    assert proximal_weight(5, 10.0) == pytest.approx(0.5)
    assert proximal_weight(10, 10.0) == 0.0 and proximal_weight(12, 10.0) == 0.0


def test_relationship_gradient_by_hand() -> None:
    # two trainable tensors of 2 and 1 elements, flattened
    grad = torch.tensor([1.0, 2.0, 3.0])
    cores = torch.tensor([[1.0, 1.0, 0.0], [2.0, 0.0, 1.0]])
    # exact: core 0: 1 + 2 + 0 = 3; core 1: 2 + 0 + 3 = 5
    assert relationship_weights([2, 1], RelationshipGradient.exact) is None
    exact = relationship_gradient(grad, cores)
    assert exact.dtype == torch.float64
    np.testing.assert_allclose(exact.numpy(), [3.0, 5.0])
    # PFLlib: core 0: layer means 1.5 and 0 -> 0.75; core 1: 1.0 and 3.0 -> 2.0
    weights = relationship_weights([2, 1], RelationshipGradient.pfllib_mean)
    pfllib = relationship_gradient(grad, cores, weights)
    np.testing.assert_allclose(pfllib.numpy(), [0.75, 2.0])


@pytest.mark.parametrize("upload", list(AppleUpload))
def test_apple_state_round_two(tmp_path: Path, upload: AppleUpload) -> None:
    """Round 2 recomputed from what each client received and stored: p_i, its core, and its
    upload, the core (the paper) or ŵ_i (PFLlib), which the others then receive as its core."""
    drlr, mu = 0.01, 0.1
    log = StateLog(P_KEY)
    strategies: list[PersonalizedStrategy] = []
    overrides = [
        *APPLE,
        "rounds=2",
        f"strategy.drlr={drlr}",
        f"strategy.mu={mu}",
        f"strategy.upload={upload}",
    ]
    _, contexts = run_inprocess(overrides, tmp_path, log.make_client, strategies)
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    model = experiment.new_model()
    mask = trainable_mask(model)
    per_model = len(mask)
    initial = strategies[0].initial_weights
    for round_, pid in [(r, c) for r in (1, 2) for c in (0, 2)]:  # two clients keep it fast
        settings = experiment.train_settings(round_)
        # λ_r over L·R = 0.2·2 = 0.4 rounds: cos(0)=1 in the first trained round, then 0
        lam_r = (math.cos(0.0) + 1) / 2 if round_ == 1 else 0.0
        received = log.received[round_, pid]
        assert len(received) == 4 * per_model
        for j in range(4):  # every core is client j's latest upload (Θ^0 in round 1)
            expected = initial if round_ == 1 else log.uploaded[1, j]
            assert_arrays_close(
                received[j * per_model : (j + 1) * per_model], expected, rtol=0, atol=0
            )
        before = log.before[round_, pid]
        assert (before is None) == (round_ == 1)
        p = torch.full((4,), 0.25, dtype=torch.float64)
        if before is not None:
            p = torch.from_numpy(before[0]).double()
        cores = [
            [
                torch.from_numpy(a).float()
                for a, m in zip(received[j * per_model : (j + 1) * per_model], mask, strict=True)
                if m
            ]
            for j in range(4)
        ]
        data = experiment.client_data(pid)
        set_weights(model, received[pid * per_model : (pid + 1) * per_model])
        order = data_order(0, round_, pid)
        generator = order
        for index in batch_indices(
            len(data.train), settings.batch_size, generator, settings.epochs
        ):
            with torch.no_grad():
                for k, param in enumerate(model.parameters()):
                    param.copy_(sum(float(p[j]) * cores[j][k] for j in range(4)))
            model.zero_grad()
            nn.functional.cross_entropy(
                model(data.prepare(data.train.images[index])), data.train.labels[index]
            ).backward()
            grads = [param.grad.clone() for param in model.parameters()]
            cores[pid] = [
                w - settings.lr * 4 * float(p[pid]) * g  # η · N · p_ii · g, N = 4 clients
                for w, g in zip(cores[pid], grads, strict=True)
            ]
            p_grad = torch.tensor(  # ∂L/∂p_ij = Σ ⟨g, w_j⟩ over all trainable elements
                [
                    sum(float((g * w).sum()) for g, w in zip(grads, core, strict=True))
                    for core in cores
                ],
                dtype=torch.float64,
            )
            p = p - drlr * (p_grad + lam_r * mu * (p - 0.25))
        np.testing.assert_allclose(log.after[round_, pid][0], p.numpy(), rtol=1e-5, atol=1e-8)
        expected_upload = cores[pid]
        if upload == AppleUpload.personalized:
            expected_upload = [
                sum(float(p[j]) * cores[j][k] for j in range(4)) for k in range(len(cores[pid]))
            ]
        uploaded = [a for a, m in zip(log.uploaded[round_, pid], mask, strict=True) if m]
        for a, b in zip(uploaded, expected_upload, strict=True):
            np.testing.assert_allclose(a, b.numpy(), rtol=1e-4, atol=2e-5)
        if round_ == 1:
            continue
        personal = ClientState(contexts[pid].state).get_arrays(PERSONAL)
        with torch.no_grad():
            for k, param in enumerate(model.parameters()):
                param.copy_(sum(float(p[j]) * cores[j][k] for j in range(4)))
        mixed = [a for a, m in zip(get_weights(model), mask, strict=True) if m]
        stored = [a for a, m in zip(personal, mask, strict=True) if m]
        for a, b in zip(stored, mixed, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)
    assert not np.allclose(log.after[2, 0][0], 0.25), "p did not move: the test is vacuous"


def test_apple_learns(tmp_path: Path) -> None:
    rows, _ = run_inprocess(
        ["dataset=digits", "num_clients=4", "rounds=2", "strategy=apple"], tmp_path
    )
    l1 = [r["acc_local"] for r in rows if r["stage"] == "L1" and r["round"] == 2]
    assert len(l1) == 4 and np.mean(l1) > 0.5
