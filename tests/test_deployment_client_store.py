"""Deployment coverage for server-side per-client state (the ClientModelStore): DiversiFed
(Wu et al., arXiv 2407.15464, Sec. III-D) over gRPC with 3 SuperNodes.

Every client's fit message is computed on the server from the *other* clients' stored uploads
(Eq. 6), and every client trains from its personalized model kept in ``context.state`` on its
SuperNode. The deployment must reproduce the in-process run of the same config (same seeds,
same partitions): round 2's messages depend on every client's round-1 upload being stored
under the right partition id, and its training on the state kept on each node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pflower.config import RunRecord
from pflower.results.rundir import read_rows
from tests.deploy_helpers import (
    ACC_TOLERANCE,
    LOSS_RTOL,
    RUN_TIMEOUT,
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
    "strategy=diversifed",
    "strategy.lam=0.5",
    "strategy.tau=0.5",
    "train.local_epochs=1",
    "num_clients=3",
    "rounds=2",
    "progress=false",
]


def _fields(row: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in row.items()
        if k.startswith(("acc", "loss", "train_loss", "client_store"))
    }


def test_deployment_with_a_server_side_client_store_matches_in_process(tmp_path: Path) -> None:
    expected, _ = run_inprocess(COMPARED, tmp_path / "inprocess")
    in_namespaces = netns_unavailable() is None
    with federation(tmp_path / "federation", 3, in_namespaces) as fed:
        run_dir = tmp_path / "run"
        run_id = fed.deployment.control.submit(RunRecord((*COMPARED,), run_dir))
        status = fed.deployment.control.wait_for_run(run_id, RUN_TIMEOUT)
        assert status == "finished:completed", diagnostics(fed.deployment)
        logs = diagnostics(fed.deployment)
    rows = read_rows(run_dir)
    failures = [r for r in rows if r["stage"] == "failure"]
    keyed = {(r["round"], r["stage"], r.get("client")): r for r in rows}
    compared = [r for r in expected if r["stage"] in ("L1", "L2", "G", "server")]
    assert {r["stage"] for r in compared} == {"L1", "L2", "G", "server"}
    for want in compared:
        key = (want["round"], want["stage"], want.get("client"))
        assert key in keyed, (
            f"the deployment has no row for round/stage/client {key}; failures: {failures}\n{logs}"
        )
        got = _fields(keyed[key])
        for name, value in _fields(want).items():
            tolerance = ACC_TOLERANCE if name.startswith("acc") else LOSS_RTOL * abs(value)
            assert abs(got[name] - value) <= tolerance, f"{key} {name}: {got[name]} vs {value}"
    # round 2's L2 rows exist for every client: its message came from the others' stored models
    assert sorted(r["client"] for r in rows if r["stage"] == "L2" and r["round"] == 2) == [0, 1, 2]
