"""Deployment coverage of the "control variates" kind of state (SCAFFOLD): server-held arrays
that travel with the model (c down, Δc_i up) and a per-client array in ``context.state`` on the
SuperNode (c_i), used again in the next round.

A SuperLink and 3 SuperNodes run SCAFFOLD for 2 rounds; the run must match the same experiment
run in-process (same client_fn, state kept in each client's context) and must differ from an
in-process run in which every client forgets its state between messages: round 2 trains with
the correction c − c_i, so a lost c_i changes its results.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from flwr.app import RecordDict

from pflower.client.app import client_fn
from pflower.config import RunRecord
from pflower.results.rundir import read_rows
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
    "strategy=scaffold",
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


def test_scaffold_control_variates_survive_deployment(tmp_path: Path) -> None:
    reference, contexts = run_inprocess(COMPARED, tmp_path / "reference")
    assert all("scaffold_ci" in context.state for context in contexts)
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
    # control variates on the wire: two model-sized messages each way
    l2 = [r for r in rows if r["stage"] == "L2"]
    assert l2 and all(r["bytes_up"] == r["bytes_down"] for r in l2)
    # the deployment kept c_i: its round-2 training differs from the state-losing run
    deployed = {(r["client"]): r["loss_local"] for r in l2 if r["round"] == 2}
    lost = {(r["client"]): r["loss_local"] for r in forgetful if r["stage"] == "L2"}
    assert any(abs(deployed[c] - lost[c]) > 1e-4 for c in deployed), (
        "round-2 results equal those of clients that lost their control variates"
    )
