"""Deployment coverage of the "ADMM duals" kind of state (FLAME): three per-client arrays in
``context.state`` on each SuperNode (the personalized model θ_i, the local copy w_i and the dual
π_i), read back at the next round's training and at evaluation, with the server averaging
w_i + π_i/ρ.

A SuperLink and 3 SuperNodes run FLAME for 2 rounds; the run must match the same experiment run
in-process (same client_fn, state kept in each client's context), including the PM/GM/HM rows of
stage L1, and must differ from an in-process run in which every client forgets its state between
messages: round 2 trains from the stored θ_i and updates w_i with the stored π_i (ρ ≠ α_i λ, so
the dual matters), and stage L1 evaluates the stored θ_i.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from flwr.app import RecordDict

from pflower.client.app import client_fn
from pflower.config import RunRecord
from pflower.results.rundir import read_rows
from pflower.strategies.flame import DUAL, LOCAL_COPY, THETA
from tests.deploy_helpers import (
    RUN_TIMEOUT,
    assert_same_results,
    diagnostics,
    federation,
    netns_unavailable,
)
from tests.inprocess import run_inprocess

pytestmark = [pytest.mark.deployment, pytest.mark.slow]

COMPARED = [
    "dataset=digits",
    "partition=pathological",
    "model=small_cnn",
    "strategy=flame",
    "strategy.rho=0.1",
    "train.local_epochs=1",
    "num_clients=3",
    "rounds=2",
    "eval.every=2",
    "progress=false",
]


def forgetful_client_fn(context):
    """client_fn whose client never sees what an earlier message stored (state lost)."""
    context.state = RecordDict()
    return client_fn(context)


def test_flame_admm_state_survives_deployment(tmp_path: Path) -> None:
    reference, contexts = run_inprocess(COMPARED, tmp_path / "reference")
    assert all(key in context.state for context in contexts for key in (THETA, DUAL, LOCAL_COPY))
    forgetful, _ = run_inprocess(COMPARED, tmp_path / "forgetful", make_client=forgetful_client_fn)

    in_namespaces = netns_unavailable() is None
    with contextlib.ExitStack() as stack:
        fed = stack.enter_context(federation(tmp_path / "federation", 3, in_namespaces))
        run_dir = tmp_path / "run"
        run_id = fed.deployment.control.submit(RunRecord((*COMPARED,), run_dir))
        status = fed.deployment.control.wait_for_run(run_id, RUN_TIMEOUT)
        assert status == "finished:completed", diagnostics(fed.deployment)
    rows = read_rows(run_dir)
    assert_same_results(rows, reference)
    l1 = [r for r in rows if r["stage"] == "L1"]
    assert len(l1) == 3 and all({"acc_pm", "acc_gm", "acc_hm"} <= set(r) for r in l1)
    # the deployment kept θ_i, w_i and π_i: its round-2 results differ from the state-losing run
    for stage in ("L1", "L2"):
        deployed = {r["client"]: r["loss_local"] for r in rows if r["stage"] == stage}
        lost = {r["client"]: r["loss_local"] for r in forgetful if r["stage"] == stage}
        assert any(abs(deployed[c] - lost[c]) > 1e-4 for c in deployed), (
            f"stage {stage} results equal those of clients that lost their ADMM state"
        )
