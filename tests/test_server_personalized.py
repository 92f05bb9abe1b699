"""DiversiFed (Wu et al., arXiv 2407.15464) and the server's per-client model store.

- the server step (Eq. 6) in closed form equals W_i − η·∇L_M(W_i) by autograd (Eq. 4);
- equal distances exert no force; in the three-model example (Fig. 4) the near model attracts
  and the far one repels; equal models and huge d/τ are numerically safe;
- λ = 0 is local training, bit for bit;
- partial participation touches only the sampled clients (server store and client state);
- a state test recomputes round 3 from the stored w_i and the received u_i.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.common import NDArrays

from pflower.compose import config_from_run_config
from pflower.core.experiment import Experiment
from pflower.core.state import ClientState
from pflower.core.store import ClientModelStore
from pflower.core.strategy import PersonalizedStrategy
from pflower.core.training import evaluate, set_weights
from pflower.strategies.diversifed import (
    PERSONAL,
    Distance,
    GradMode,
    TauScale,
    force_coefficients,
    mixing_matrix,
)
from pflower.strategies.model_mixing import flatten, mix, pairwise_distances, unflatten
from tests.helpers import (
    ADAM_TINY,
    StateLog,
    assert_arrays_close,
    assert_pulled_toward_target,
)
from tests.inprocess import run_inprocess

BASE = ADAM_TINY


def model_distance_loss(
    w_i: torch.Tensor,
    others: torch.Tensor,
    tau: float,
    squared: bool,
    tau_scale: TauScale = TauScale.multiply,
):
    """Eq. 4 written directly: Σ_j log(exp(s·d_ij) / Σ_k exp(s·d_ik)), s = τ or 1/τ."""
    d = ((w_i - others) ** 2).sum(dim=1)
    if not squared:
        d = d.sqrt()
    scale = tau if tau_scale == TauScale.multiply else 1.0 / tau
    return torch.log_softmax(d * scale, dim=0).sum()


# ------------------------------------------------------------------ server step (Eq. 4, 6)
@pytest.mark.parametrize("tau_scale", list(TauScale))
@pytest.mark.parametrize("distance", [Distance.l2, Distance.l2_sq])
@pytest.mark.parametrize("grad_mode", [GradMode.per_client, GradMode.full])
def test_closed_form_step_equals_autograd_gradient_step(
    distance: Distance, grad_mode: GradMode, tau_scale: TauScale
) -> None:
    rng = np.random.default_rng(0)
    m, p, tau, eta = 6, 20, 0.7, 0.3
    w = rng.normal(size=(m, p)) * rng.uniform(0.2, 2.0, size=(m, 1))
    squared = distance == Distance.l2_sq
    xi = mixing_matrix(
        pairwise_distances(w, squared), tau, eta, distance, grad_mode, tau_scale=tau_scale
    )
    np.testing.assert_allclose(xi.sum(axis=1), np.ones(m), atol=1e-12)
    got = mix(xi, w)
    weights = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    for i in range(m):
        if grad_mode == GradMode.per_client:
            others = torch.cat([weights[:i], weights[i + 1 :]]).detach()
            loss = model_distance_loss(weights[i], others, tau, squared, tau_scale)
        else:  # Σ_k L_M(w_k), differentiated w.r.t. w_i only
            loss = sum(
                model_distance_loss(
                    weights[k], torch.cat([weights[:k], weights[k + 1 :]]), tau, squared, tau_scale
                )
                for k in range(m)
            )
        (grad,) = torch.autograd.grad(loss, weights)
        expected = w[i] - eta * grad[i].numpy()
        np.testing.assert_allclose(got[i], expected, rtol=1e-6, atol=1e-9)


def test_equal_distances_exert_no_force() -> None:
    """Regular simplex (scaled basis vectors): every d_ij equal, so u_i = W_i."""
    w = 3.0 * np.eye(5)
    xi = mixing_matrix(pairwise_distances(w), tau=0.5, eta=2.0)
    np.testing.assert_allclose(xi, np.eye(5), atol=1e-12)
    np.testing.assert_allclose(mix(xi, w), w, atol=1e-12)


def test_three_models_near_attracts_far_repels() -> None:
    """Fig. 4: w_2 near w_1, w_3 far: w_1 approaches w_2 and departs from w_3 (Lemma 1)."""
    w = np.array([[0.0, 0.0], [0.3, 0.0], [0.0, 2.0]])
    xi = mixing_matrix(pairwise_distances(w), tau=1.0, eta=0.05)  # a small step
    assert xi[0, 1] > 0 > xi[0, 2]
    u = mix(xi, w)
    assert np.linalg.norm(u[0] - w[1]) < np.linalg.norm(w[0] - w[1])
    assert np.linalg.norm(u[0] - w[2]) > np.linalg.norm(w[0] - w[2])
    c = force_coefficients(pairwise_distances(w), 1.0)
    np.testing.assert_allclose(c.sum(axis=1), 0.0, atol=1e-12)


def test_equal_models_and_huge_distances_are_safe() -> None:
    """Round 1 (all models Θ^0) sends Θ^0; d/τ = 200 does not overflow."""
    w = np.tile(np.arange(4.0), (3, 1))
    xi = mixing_matrix(pairwise_distances(w), tau=1.0, eta=1.0)
    np.testing.assert_array_equal(mix(xi, w), w)
    far = np.array([[0.0], [200.0], [1.0]])
    xi = mixing_matrix(pairwise_distances(far), tau=1.0, eta=1.0)
    assert np.all(np.isfinite(xi))
    np.testing.assert_allclose(xi.sum(axis=1), 1.0)


def test_flatten_unflatten_keeps_buffers() -> None:
    weights = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7.0, 8.0], np.float32)]
    mask = [True, False]
    vector = flatten(weights, mask)
    np.testing.assert_array_equal(vector, np.arange(6.0))
    back = unflatten(vector + 1, weights, mask)
    np.testing.assert_array_equal(back[0], weights[0] + 1)
    np.testing.assert_array_equal(back[1], weights[1])
    assert back[0].dtype == np.float32


def test_client_model_store_keeps_copies_counts_bytes_and_round_trips() -> None:
    store = ClientModelStore()
    weights = [np.ones(3, np.float32), np.zeros((2, 2), np.float64)]
    store.put(2, weights, server_round=1)
    weights[0][:] = 5.0  # the store holds a copy
    assert store.get(2)[0].tolist() == [1.0, 1.0, 1.0]
    assert store.nbytes == 3 * 4 + 4 * 8
    assert 2 in store and 1 not in store and store.get(1) is None
    assert store.round_of(2) == 1 and store.partition_ids == [2]
    restored = ClientModelStore.from_state(store.state())
    assert_arrays_close(restored.get(2), store.get(2), rtol=0, atol=0)
    assert restored.round_of(2) == 1


# -------------------------------------------------------------------- end-to-end behaviour
def test_lambda_zero_scores_the_mean_of_the_client_models_at_stage_g(tmp_path: Path) -> None:
    """λ = 0 is local training (``tests/test_collapses.py``); stage G still scores a model."""
    diversifed, _ = run_inprocess([*BASE, "strategy=diversifed", "strategy.lam=0"], tmp_path / "d")
    g_rows = [r for r in diversifed if r["stage"] == "G"]
    assert g_rows and all(r["model"] == "mean_of_client_models" for r in g_rows)


def test_diversifed_learns_and_records_the_store_size(tmp_path: Path) -> None:
    strategies: list[PersonalizedStrategy] = []
    rows, _ = run_inprocess(
        ["dataset=digits", "num_clients=4", "rounds=2", "strategy=diversifed"],
        tmp_path,
        strategies=strategies,
    )
    l1 = {r["round"]: [] for r in rows if r["stage"] == "L1"}
    for r in rows:
        if r["stage"] == "L1":
            l1[r["round"]].append(r["acc_local"])
    assert len(l1[2]) == 4 and np.mean(l1[2]) > 0.6
    server = [r for r in rows if r["stage"] == "server"]
    assert [r["round"] for r in server] == [1, 2]
    model_bytes = sum(a.nbytes for a in strategies[0].initial_weights)
    assert all(r["client_store_models"] == 4 for r in server)
    assert all(r["client_store_bytes"] == 4 * model_bytes for r in server)


def expected_targets(
    stored: dict[int, NDArrays], sampled: list[int], mask: list[bool], tau: float, eta: float
) -> dict[int, NDArrays]:
    """u_i of Eq. 6 for the sampled clients from the stored models (participants only)."""
    vectors = np.stack([flatten(stored[pid], mask).astype(np.float32) for pid in sampled])
    xi = mixing_matrix(pairwise_distances(vectors), tau, eta)
    targets = mix(xi, vectors)
    return {pid: unflatten(targets[k], stored[pid], mask) for k, pid in enumerate(sampled)}


def test_partial_participation_touches_only_sampled_clients(tmp_path: Path) -> None:
    """Half the clients per round: u_i is computed from this round's participants' latest
    uploads (Θ^0 for newcomers); an unsampled client's stored model and its state stay as they
    were, and a client sampled for the first time after round 1 starts from Θ^0."""
    log = StateLog(PERSONAL)
    strategies: list[PersonalizedStrategy] = []
    overrides = [*BASE, "rounds=4", "fraction=0.5", "min_clients=2", "strategy=diversifed"]
    overrides += ["strategy.lam=0.1", "strategy.tau=0.5"]
    run_inprocess(overrides, tmp_path, log.make_client, strategies)
    (strategy,) = strategies
    mask = strategy.trainable_mask
    w0 = strategy.initial_weights
    stored: dict[int, NDArrays] = {}
    last_state: dict[int, NDArrays] = {}
    for round_ in range(1, 5):
        sampled = log.sampled(round_)
        assert len(sampled) == 2
        models = {pid: stored.get(pid, w0) for pid in range(4)}
        expected = expected_targets(models, sampled, mask, 0.5, 1.0)
        for pid in sampled:
            assert_arrays_close(log.received[round_, pid], expected[pid], rtol=1e-5, atol=1e-6)
            before = log.before[round_, pid]
            if pid in last_state:  # untouched since the client's last fit (also by evaluate)
                assert_arrays_close(before, last_state[pid], rtol=0, atol=0)
            else:
                assert before is None
            assert_arrays_close(log.after[round_, pid], log.uploaded[round_, pid], rtol=0, atol=0)
        for pid in sampled:
            stored[pid] = log.uploaded[round_, pid]
            last_state[pid] = log.after[round_, pid]
    for pid in range(4):
        if pid in stored:
            assert_arrays_close(strategy.client_models.get(pid), stored[pid], rtol=0, atol=0)
            last = max(r for r, p in log.received if p == pid)
            assert strategy.client_models.round_of(pid) == last
        else:
            assert pid not in strategy.client_models


def test_state_round_three_recomputed_from_stored_model_and_target(tmp_path: Path) -> None:
    """Round 3: u_i = Eq. 6 over the round-2 uploads; the client trains its *stored* w_i with
    CE + (λ/2η)‖w − u_i‖² (recomputed with the shared loop), stores and uploads the result, and
    stage L1 evaluates it. Fails if the client stores u_i, starts from u_i, or the server mixes
    anything other than the latest uploads."""
    lam, eta, tau = 0.5, 2.0, 0.8
    log = StateLog(PERSONAL)
    strategies: list[PersonalizedStrategy] = []
    overrides = [*BASE, "rounds=3", "strategy=diversifed", f"strategy.lam={lam}"]
    overrides += [f"strategy.eta={eta}", f"strategy.tau={tau}"]
    rows, contexts = run_inprocess(overrides, tmp_path, log.make_client, strategies)
    (strategy,) = strategies
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    mask = strategy.trainable_mask
    clients = list(range(4))
    previous = {pid: log.uploaded[2, pid] for pid in clients}
    expected = expected_targets(previous, clients, mask, tau, eta)
    model = experiment.new_model()
    for pid in clients:
        assert_pulled_toward_target(
            log, experiment, 3, pid, expected[pid], lam / eta, rtol=1e-5, atol=1e-6
        )
        data = experiment.client_data(pid)
        stored = ClientState(contexts[pid].state).get_arrays(PERSONAL)
        set_weights(model, stored)
        result = evaluate(model, data.test, data.prepare, 512)
        (l1,) = [r for r in rows if r["stage"] == "L1" and r["round"] == 3 and r["client"] == pid]
        assert l1["acc_local"] == pytest.approx(result.accuracy)
        assert l1["loss_local"] == pytest.approx(result.loss, rel=1e-5)
