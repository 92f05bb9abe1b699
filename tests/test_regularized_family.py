"""FLAME, Ditto, pFedMe, APFL: closed forms on hand-built tensors, identities, state tests, and the
PM/GM/HM model selection (FLAME paper, Zhu et al., Sec. IV-D) shared by every algorithm that holds
a personalized and a global model.

The in-process runs use the embedded digits data with the tiny CNN (a few seconds each).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pflower.compose import config_from_run_config
from pflower.core.experiment import Experiment
from pflower.core.state import ClientState
from pflower.core.strategy import PersonalizedStrategy
from pflower.core.training import evaluate, set_weights
from pflower.registry import ConfigError
from pflower.strategies import apfl, ditto, flame, pfedme
from pflower.strategies.flame import (
    admm_average,
    dual_update,
    local_model_update,
    upload_vector,
)
from pflower.strategies.proximal import anchor_tensors, proximal_term
from tests.helpers import (
    REGULARIZED_TINY,
    StateLog,
    assert_arrays_close,
    retrain,
    stage_rows,
)
from tests.inprocess import run_inprocess

BASE = REGULARIZED_TINY
CLIENTS = range(4)


# ------------------------------------------------------------------------------ helpers


def accuracy_rows(rows: list[dict], stages: tuple[str, ...]) -> list[tuple]:
    keys = ("round", "stage", "client", "acc_local", "loss_local", "acc", "loss")
    return [tuple(r.get(k) for k in keys) for r in rows if r["stage"] in stages]


def run_with_proximal_state(
    overrides: list[str], output_dir: Path, key: str, lam: float, mu_l2: float
) -> tuple[list[dict], StateLog, Experiment]:
    """Run ``overrides`` in process and check every fit's stored personal model ``key``: local
    training on f + (λ/2)‖v − w^t‖² + (μ/2)‖v‖² from the stored one (from the received w^t in
    the first round). Returns the rows, the :class:`StateLog` and the experiment."""
    log = StateLog((key,))
    rows, contexts = run_inprocess(overrides, output_dir, log.make_client)
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    for round_, pid in log.uploaded:
        w_t = log.received[round_, pid]
        start = log.before[round_, pid][key] or w_t
        personal = retrain(
            experiment,
            pid,
            round_,
            start,
            lambda model, w_t=w_t: proximal_term(anchor_tensors(model, w_t), lam, mu_l2),
        )
        assert_arrays_close(log.after[round_, pid][key], personal, rtol=1e-5, atol=1e-6)
    return rows, log, experiment


# ---------------------------------------------------------------- FLAME: closed forms (12)-(13)
def test_flame_closed_forms_match_hand_computation() -> None:
    theta = [np.array([1.0, 2.0], dtype=np.float32)]
    w = [np.array([0.0, 4.0], dtype=np.float32)]
    pi = [np.array([0.5, -1.0], dtype=np.float32)]
    alpha_lambda, rho = 0.25, 0.5
    # Eq. 12: (0.25·θ + 0.5·w − π) / 0.75
    (w_i,) = local_model_update(theta, w, pi, alpha_lambda, rho)
    np.testing.assert_allclose(w_i, [(0.25 - 0.5) / 0.75, (0.5 + 2.0 + 1.0) / 0.75], rtol=1e-6)
    # Eq. 13: π + ρ (w_i − w)
    (pi_new,) = dual_update(pi, [w_i], w, rho)
    np.testing.assert_allclose(pi_new, [0.5 + 0.5 * (w_i[0] - 0.0), -1.0 + 0.5 * (w_i[1] - 4.0)])
    # Lemma 3: π^{k+1} = α_i λ (θ − w_i^{k+1}), whatever π^k was.
    np.testing.assert_allclose(pi_new, alpha_lambda * (theta[0] - w_i), rtol=1e-6)
    (z,) = upload_vector([w_i], [pi_new], rho)
    np.testing.assert_allclose(z, w_i + pi_new / rho, rtol=1e-6)
    # ρ = α_i λ: the upload is θ itself.
    (w_eq,) = local_model_update(theta, w, pi, 0.5, 0.5)
    (pi_eq,) = dual_update(pi, [w_eq], w, 0.5)
    np.testing.assert_allclose(upload_vector([w_eq], [pi_eq], 0.5)[0], theta[0], atol=1e-6)
    # The server step: the plain mean of the m uploads.
    np.testing.assert_allclose(
        admm_average([[np.array([1.0, 3.0])], [np.array([3.0, -1.0])]])[0], [2.0, 1.0]
    )


def test_proximal_term_gradient_is_lambda_pull_plus_l2() -> None:
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0]]))
        model.bias.copy_(torch.tensor([0.5]))
    anchors = anchor_tensors(model, [np.array([[0.0, 1.0]]), np.array([1.5])])
    term = proximal_term(anchors, lambda_=2.0, mu=0.1)(model)
    # (2/2)(1 + 9 + 1) + (0.1/2)(1 + 4 + 0.25)
    assert float(term) == pytest.approx(11.0 + 0.05 * 5.25)
    term.backward()
    np.testing.assert_allclose(model.weight.grad.numpy(), [[2 * 1 + 0.1, 2 * -3 - 0.2]], rtol=1e-6)
    np.testing.assert_allclose(model.bias.grad.numpy(), [2 * -1 + 0.05], rtol=1e-6)


def test_flame_admm_reaches_the_quadratic_fixed_point() -> None:
    """With L_i = ½‖A_iθ − b_i‖² and exact θ-steps, Algorithm 1 (persistent w_i) converges to
    θ_i = (A_iᵀA_i + λI)⁻¹(A_iᵀb_i + λw), w = mean θ_i, Σ π_i = 0 (Sec. IV-B)."""
    rng = np.random.default_rng(0)
    m, d, lam = 3, 4, 1.0
    rho = lam / m
    problems = [(rng.normal(size=(6, d)), rng.normal(size=6)) for _ in range(m)]
    w = np.zeros(d)
    w_local = [np.zeros(d) for _ in range(m)]
    duals = [np.zeros(d) for _ in range(m)]
    theta = [np.zeros(d) for _ in range(m)]
    for _ in range(500):
        uploads = []
        for i, (a, b) in enumerate(problems):
            theta[i] = np.linalg.solve(a.T @ a + lam * np.eye(d), a.T @ b + lam * w_local[i])
            (w_local[i],) = local_model_update([theta[i]], [w], [duals[i]], lam / m, rho)
            (duals[i],) = dual_update([duals[i]], [w_local[i]], [w], rho)
            uploads.append(upload_vector([w_local[i]], [duals[i]], rho))
        (w,) = admm_average(uploads)
    np.testing.assert_allclose(w, np.mean(theta, axis=0), atol=1e-8)
    np.testing.assert_allclose(np.sum(duals, axis=0), 0.0, atol=1e-8)
    for (a, b), th in zip(problems, theta, strict=True):
        np.testing.assert_allclose(
            th, np.linalg.solve(a.T @ a + lam * np.eye(d), a.T @ b + lam * w), atol=1e-8
        )


# ---------------------------------------------------------------------- FLAME: state and runs
FLAME = [*BASE, "strategy=flame", "strategy.lambda_=1.0", "strategy.rho=0.1", "rounds=3"]
FLAME_KEYS = (flame.THETA, flame.DUAL, flame.LOCAL_COPY)


@pytest.mark.slow
def test_flame_state_recomputes_from_what_was_stored_and_sent(tmp_path: Path) -> None:
    """Code cadence (reset w_i ← w^k, R = 1): θ_i^{k+1} is local SGD on (11) from the stored θ_i^k
    anchored at w^k; w_i and π_i follow (12)-(13) from the stored π_i^k; the upload is
    w_i + π_i/ρ; the server's next model is the mean of the uploads."""
    log = StateLog(FLAME_KEYS)
    strategies: list[PersonalizedStrategy] = []
    rows, contexts = run_inprocess(FLAME, tmp_path, log.make_client, strategies)
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    alpha_lambda, rho, mu = 1.0 / 4, 0.1, 0.01
    for round_ in (1, 2, 3):
        for pid in CLIENTS:
            key = (round_, pid)
            w_k = log.received[key]
            before, after = log.before[key], log.after[key]
            start = before[flame.THETA] or w_k
            theta = retrain(
                experiment,
                pid,
                round_,
                start,
                lambda model, w_k=w_k: proximal_term(anchor_tensors(model, w_k), 1.0, mu),
            )
            assert_arrays_close(after[flame.THETA], theta, rtol=1e-5, atol=1e-6)
            dual = before[flame.DUAL] or [np.zeros_like(a) for a in w_k]
            w_i = local_model_update(after[flame.THETA], w_k, dual, alpha_lambda, rho)
            assert_arrays_close(after[flame.LOCAL_COPY], w_i, rtol=1e-6, atol=1e-7)
            dual = dual_update(dual, w_i, w_k, rho)
            assert_arrays_close(after[flame.DUAL], dual, rtol=1e-6, atol=1e-7)
            assert_arrays_close(
                log.uploaded[key], upload_vector(w_i, dual, rho), rtol=1e-6, atol=1e-6
            )
    for round_ in (2, 3):
        mean = admm_average([log.uploaded[round_ - 1, p] for p in CLIENTS])
        assert_arrays_close(log.received[round_, 0], mean, rtol=1e-6, atol=1e-7)
    # Stage L1 evaluates θ_i (PM) and the aggregated model (GM).
    (strategy,) = strategies
    model = experiment.new_model()
    for pid in CLIENTS:
        data = experiment.client_data(pid)
        (row,) = [r for r in stage_rows(rows, "L1", 3) if r["client"] == pid]
        set_weights(model, log.after[3, pid][flame.THETA])
        pm = evaluate(model, data.test, data.prepare, 512)
        set_weights(model, strategy.global_weights)
        gm = evaluate(model, data.test, data.prepare, 512)
        assert (row["acc_pm"], row["acc_gm"]) == pytest.approx((pm.accuracy, gm.accuracy))


def test_flame_rho_equal_alpha_lambda_uploads_theta(tmp_path: Path) -> None:
    """ρ = α_i λ (= 1/4 here): z_i = θ_i to float precision (Lemma 3)."""
    log = StateLog(FLAME_KEYS)
    run_inprocess([*FLAME, "rounds=2", "strategy.rho=0.25"], tmp_path, log.make_client)
    for key, uploaded in log.uploaded.items():
        assert_arrays_close(uploaded, log.after[key][flame.THETA], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_flame_rho_to_zero_is_local_proximal_training(tmp_path: Path) -> None:
    """Algorithm 1 cadence (persistent w_i, updates once per round) with ρ → 0: w_i = θ_i and the
    global model drops out, so θ_i follows θ^{k+1} = argmin L_i(θ) + (λ/2)‖θ − θ^k‖² (local
    proximal-point training), whatever the other clients do."""
    log = StateLog(FLAME_KEYS)
    overrides = [
        *FLAME,
        "strategy.rho=1e-9",
        "strategy.admm_update=per_round",
        "strategy.reset_local_to_global=false",
    ]
    _, contexts = run_inprocess(overrides, tmp_path, log.make_client)
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    for pid in CLIENTS:
        theta = log.received[1, pid]  # θ^0 = w^0
        for round_ in (1, 2, 3):
            theta = retrain(
                experiment,
                pid,
                round_,
                theta,
                lambda model, anchor=theta: proximal_term(anchor_tensors(model, anchor), 1.0, 0.01),
            )
            assert_arrays_close(log.after[round_, pid][flame.THETA], theta, rtol=1e-4, atol=1e-5)
            assert_arrays_close(
                log.after[round_, pid][flame.LOCAL_COPY], theta, rtol=1e-4, atol=1e-5
            )


def test_flame_partial_participation_averages_the_stale_cache(tmp_path: Path) -> None:
    """Half the clients train per round; the server averages over all m, using each absent
    client's last upload, or w^0 before it has uploaded."""
    log = StateLog(FLAME_KEYS)
    strategies: list[PersonalizedStrategy] = []
    run_inprocess([*FLAME, "rounds=2", "fraction=0.5"], tmp_path, log.make_client, strategies)
    (strategy,) = strategies
    initial = log.received[min(log.received)]
    cache = {pid: initial for pid in CLIENTS}
    for round_ in (1, 2):
        trained = [pid for pid in CLIENTS if (round_, pid) in log.uploaded]
        assert len(trained) == 2
        for pid in trained:
            cache[pid] = log.uploaded[round_, pid]
        expected = admm_average([cache[pid] for pid in CLIENTS])
        if round_ == 1:
            sent = next(w for (r, _), w in log.received.items() if r == 2)
            assert_arrays_close(sent, expected, rtol=1e-6, atol=1e-7)
    assert_arrays_close(strategy.global_weights, expected, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------- PM / GM / HM selection
def test_hybrid_model_is_the_better_of_pm_and_gm(tmp_path: Path) -> None:
    rows, _ = run_inprocess([*FLAME, "rounds=2"], tmp_path)
    l1 = stage_rows(rows, "L1")
    assert len(l1) == 2 * 4
    for row in l1:
        assert row["acc_pm"] == row["acc_local"]
        assert row["acc_hm"] == max(row["acc_pm"], row["acc_gm"])
        assert row["hm_choice_pm"] == float(row["acc_pm"] >= row["acc_gm"])
        chosen = "pm" if row["hm_choice_pm"] else "gm"
        assert row["loss_hm"] == row[f"loss_{chosen}"]
        assert row["loss_hm_min"] == min(row["loss_pm"], row["loss_gm"])
    import json

    final = json.loads((tmp_path / "summary.json").read_text())["final"]["L1"]
    frac = np.mean([r["hm_choice_pm"] for r in stage_rows(rows, "L1", 2)])
    assert final["hm_choice_pm_frac"] == pytest.approx(frac)
    assert final["acc_hm"]["mean"] >= max(final["acc_pm"]["mean"], final["acc_gm"]["mean"]) - 1e-12
    # Algorithms with one model report no hybrid metrics.
    plain, _ = run_inprocess([*BASE, "strategy=fedavg", "rounds=1"], tmp_path / "fedavg")
    assert all("acc_hm" not in r for r in stage_rows(plain, "L1"))


def test_hybrid_model_chosen_on_validation_split(tmp_path: Path) -> None:
    overrides = [*FLAME, "rounds=2", "selection.split=val", "split.val_fraction=0.2"]
    log = StateLog(FLAME_KEYS)
    strategies: list[PersonalizedStrategy] = []
    rows, contexts = run_inprocess(overrides, tmp_path, log.make_client, strategies)
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    model = experiment.new_model()
    for pid in CLIENTS:
        data = experiment.client_data(pid)
        assert len(data.val) > 0
        set_weights(model, log.after[2, pid][flame.THETA])
        pm = evaluate(model, data.val, data.prepare, 512).accuracy
        set_weights(model, strategies[0].global_weights)
        gm = evaluate(model, data.val, data.prepare, 512).accuracy
        (row,) = [r for r in stage_rows(rows, "L1", 2) if r["client"] == pid]
        assert row["hm_choice_pm"] == float(pm >= gm)
        assert row["acc_hm"] == (row["acc_pm"] if pm >= gm else row["acc_gm"])


def test_validation_selection_without_validation_share_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="val_fraction"):
        run_inprocess([*FLAME, "rounds=1", "selection.split=val"], tmp_path)


def test_bad_options_are_rejected(tmp_path: Path) -> None:
    for bad in ("strategy.rho=0", "strategy.aggregation=weighted", "selection.split=best"):
        with pytest.raises(ConfigError):
            run_inprocess([*FLAME, "rounds=1", bad], tmp_path / bad)


# --------------------------------------------------------------------------------- Ditto
DITTO = [*BASE, "strategy=ditto", "rounds=3"]


def test_ditto_lambda0_is_local_personal_and_fedavg_global(tmp_path: Path) -> None:
    """λ = 0: v_k is pure local training (L1/L2 equal the ``local`` baseline's) while the global
    model follows FedAvg exactly (stage G equals FedAvg's)."""
    plain = ["strategy.lambda_=0.0", "strategy.mu_l2=0.0", "strategy.personal_epochs=1"]
    rows, _ = run_inprocess([*DITTO, *plain], tmp_path / "ditto")
    local, _ = run_inprocess([*BASE, "strategy=local", "rounds=3"], tmp_path / "local")
    fedavg, _ = run_inprocess([*BASE, "strategy=fedavg", "rounds=3"], tmp_path / "fedavg")
    assert accuracy_rows(rows, ("L1", "L2")) == accuracy_rows(local, ("L1", "L2"))
    assert accuracy_rows(rows, ("G",)) == accuracy_rows(fedavg, ("G",))
    assert len(stage_rows(rows, "G")) == 4


@pytest.mark.slow
def test_ditto_state_is_the_proximal_personal_model(tmp_path: Path) -> None:
    """v_k^{t} = SGD on F_k(v) + (λ/2)‖v − w^t‖² from the stored v_k^{t−1}; the upload is FedAvg's
    local update from w^t with ``global_lr``."""
    overrides = [*DITTO, "rounds=2", "strategy.lambda_=0.5", "strategy.global_lr=0.1"]
    rows, log, experiment = run_with_proximal_state(overrides, tmp_path, ditto.PERSONAL, 0.5, 0.0)
    for (round_, pid), uploaded in log.uploaded.items():
        w = retrain(experiment, pid, round_, log.received[round_, pid], lr=0.1)
        assert_arrays_close(uploaded, w, rtol=1e-5, atol=1e-6)
    for row in stage_rows(rows, "L1"):
        assert row["acc_hm"] == max(row["acc_pm"], row["acc_gm"])


# -------------------------------------------------------------------------------- pFedMe
PFEDME = [*BASE, "strategy=pfedme", "rounds=2"]


def test_pfedme_moreau_and_server_steps_match_hand_computation() -> None:
    w = [np.array([1.0, -1.0], dtype=np.float32)]
    theta = [np.array([3.0, 1.0], dtype=np.float32)]
    # w − ηλ (w − θ) with ηλ = 0.25
    np.testing.assert_allclose(pfedme.moreau_step(w, theta, 0.25)[0], [1.5, -0.5])
    np.testing.assert_array_equal(pfedme.moreau_step(w, theta, 1.0)[0], theta[0])
    # (1 − β) w + β mean with β = 2 (extrapolation, as pFedMe allows)
    np.testing.assert_allclose(pfedme.server_step(w, theta, 2.0)[0], [5.0, 3.0])


def test_pfedme_one_inner_step_with_unit_eta_lambda_is_fedavg(tmp_path: Path) -> None:
    """Original profile, K = 1, ηλ = 1, β = 1: θ̂ is one SGD step from w and the w-step copies it,
    so the uploads, the global model and the trained models are FedAvg's."""
    overrides = [
        *PFEDME,
        "strategy.profile=original",
        "strategy.inner_steps=1",
        "strategy.lambda_=2.0",
        "strategy.eta=0.5",
        "strategy.beta=1.0",
        "strategy.aggregation=weighted",
    ]
    rows, _ = run_inprocess(overrides, tmp_path / "pfedme")
    fedavg, _ = run_inprocess([*BASE, "strategy=fedavg", "rounds=2"], tmp_path / "fedavg")
    assert accuracy_rows(rows, ("G", "L2")) == accuracy_rows(fedavg, ("G", "L2"))
    assert all(
        r["acc_gm"] == f["acc_local"]
        for r, f in zip(stage_rows(rows, "L1"), stage_rows(fedavg, "L1"), strict=True)
    )


def test_pfedme_zero_inner_steps_leaves_the_global_model(tmp_path: Path) -> None:
    """K = 0: θ̂ = w, so w_i = w^t and, with β = 1, the global model never moves."""
    overrides = [*PFEDME, "strategy.profile=original", "strategy.inner_steps=0"]
    rows, _ = run_inprocess(overrides, tmp_path)
    stage_g = stage_rows(rows, "G")
    assert len(stage_g) == 3
    assert {(r["acc"], r["loss"]) for r in stage_g} == {(stage_g[0]["acc"], stage_g[0]["loss"])}


def test_pfedme_state_is_the_persistent_personal_model(tmp_path: Path) -> None:
    """FLAME-paper profile: θ_i^{t} = one pass of SGD on f + (λ/2)‖θ − w^t‖² from the stored
    θ_i^{t−1}; the upload is w^t − ηλ (w^t − θ_i^t); the server's next model is their mean."""
    overrides = [*PFEDME, "strategy.lambda_=0.5", "strategy.eta=0.4", "strategy.mu_l2=0.01"]
    _, log, _ = run_with_proximal_state(overrides, tmp_path, pfedme.THETA, 0.5, 0.01)
    for (round_, pid), uploaded in log.uploaded.items():
        theta = log.after[round_, pid][pfedme.THETA]
        w_t = log.received[round_, pid]
        assert_arrays_close(uploaded, pfedme.moreau_step(w_t, theta, 0.2), rtol=1e-5, atol=1e-6)
    mean = [
        np.mean(layer, axis=0) for layer in zip(*(log.uploaded[1, p] for p in CLIENTS), strict=True)
    ]
    assert_arrays_close(log.received[2, 0], mean, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------- APFL
APFL = [*BASE, "strategy=apfl", "rounds=2"]


def test_apfl_alpha0_is_fedavg_and_alpha1_keeps_a_local_model(tmp_path: Path) -> None:
    fixed = ["strategy.adaptive_alpha=false"]
    rows, _ = run_inprocess([*APFL, *fixed, "strategy.alpha_init=0.0"], tmp_path / "a0")
    fedavg, _ = run_inprocess([*BASE, "strategy=fedavg", "rounds=2"], tmp_path / "fedavg")
    assert accuracy_rows(rows, ("G", "L1", "L2")) == accuracy_rows(fedavg, ("G", "L1", "L2"))
    rows, _ = run_inprocess([*APFL, *fixed, "strategy.alpha_init=1.0"], tmp_path / "a1")
    local, _ = run_inprocess([*BASE, "strategy=local", "rounds=2"], tmp_path / "local")
    assert accuracy_rows(rows, ("L1",)) == accuracy_rows(local, ("L1",))
    assert accuracy_rows(rows, ("G",)) == accuracy_rows(fedavg, ("G",))


def test_apfl_learns_alpha_and_mixes_the_stored_local_model(tmp_path: Path) -> None:
    """α_i moves from its start by its gradient and stays in [0, 1]; stage L1 evaluates
    α_i v_i + (1 − α_i) w with the stored v_i, α_i and the received w."""
    strategies: list[PersonalizedStrategy] = []
    overrides = [*APFL, "strategy.alpha_lr=0.5"]
    rows, contexts = run_inprocess(overrides, tmp_path, strategies=strategies)
    experiment = Experiment.of(config_from_run_config(contexts[0].run_config))
    model = experiment.new_model()
    for pid, context in enumerate(contexts):
        state = ClientState(context.state)
        alpha = state.get_scalars(apfl.ALPHA)["alpha"]
        assert 0.0 <= alpha <= 1.0 and alpha != 0.5
        set_weights(
            model, apfl.mixture(alpha, state.get_arrays(apfl.LOCAL), strategies[0].global_weights)
        )
        data = experiment.client_data(pid)
        expected = evaluate(model, data.test, data.prepare, 512)
        (row,) = [r for r in stage_rows(rows, "L1", 2) if r["client"] == pid]
        assert row["acc_pm"] == pytest.approx(expected.accuracy)
        assert row["loss_pm"] == pytest.approx(expected.loss, rel=1e-5)


# ------------------------------------------------------------------------- all four learn
@pytest.mark.parametrize("name", ["flame", "pfedme", "ditto", "apfl"])
def test_each_algorithm_learns_with_default_options(name: str, tmp_path: Path) -> None:
    """``pflower strategy=<name> dataset=digits num_clients=4 rounds=2``, in-process."""
    rows, _ = run_inprocess(
        [f"strategy={name}", "dataset=digits", "num_clients=4", "rounds=2"], tmp_path
    )
    stage_g = stage_rows(rows, "G")
    assert stage_g[-1]["acc"] > stage_g[0]["acc"] + 0.2
    l1 = stage_rows(rows, "L1", 2)
    assert len(l1) == 4
    assert np.mean([r["acc_pm"] for r in l1]) > 0.5
    assert all(r["acc_hm"] >= max(r["acc_pm"], r["acc_gm"]) for r in l1)
