"""Deployment coverage of the three kinds of per-client state, on one SuperLink and 3 SuperNodes
(started once for the module) that run each experiment for 2 rounds. Every deployed run must
match the same experiment run in-process (same client_fn, state kept in each client's context).

- control variates (SCAFFOLD): server-held arrays that travel with the model (c down, Δc_i up)
  and a per-client array in ``context.state`` on the SuperNode (c_i), used again in the next
  round: round 2 trains with the correction c − c_i;
- ADMM duals (FLAME): three per-client arrays in ``context.state`` on each SuperNode (the
  personalized model θ_i, the local copy w_i and the dual π_i), read back at the next round's
  training and at evaluation, with the server averaging w_i + π_i/ρ: round 2 trains from the
  stored θ_i and updates w_i with the stored π_i (ρ ≠ α_i λ, so the dual matters), and stage L1
  evaluates the stored θ_i;
- server-side per-client state (the ClientModelStore; DiversiFed, Wu et al., arXiv 2407.15464,
  Sec. III-D): every client's fit message is computed on the server from the *other* clients'
  stored uploads (Eq. 6), and every client trains from its personalized model kept in
  ``context.state`` on its SuperNode.

The first two must also differ from an in-process run in which every client forgets its state
between messages (:func:`tests.inprocess.forgetful_client_fn`): had a SuperNode lost the state,
the deployment would reproduce that run instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pflower.strategies.flame import DUAL, LOCAL_COPY, THETA
from tests.deploy_helpers import (
    Federation,
    assert_same_results,
    deployed_rows,
    federation,
    netns_unavailable,
)
from tests.helpers import TINY_DIGITS, stage_rows
from tests.inprocess import forgetful_client_fn, run_inprocess

pytestmark = [pytest.mark.deployment, pytest.mark.slow]

TWO_ROUNDS = [*TINY_DIGITS, "train.local_epochs=1", "num_clients=3", "rounds=2", "progress=false"]
SCAFFOLD = [*TWO_ROUNDS, "strategy=scaffold", "eval.every=2"]
FLAME = [*TWO_ROUNDS, "strategy=flame", "strategy.rho=0.1", "eval.every=2"]
DIVERSIFED = [*TWO_ROUNDS, "strategy=diversifed", "strategy.lam=0.5", "strategy.tau=0.5"]


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    """A SuperLink and 3 SuperNodes (each in a network namespace where the tests may create
    them), shared by the tests of this module."""
    in_namespaces = netns_unavailable() is None
    with federation(tmp_path_factory.mktemp("federation"), 3, in_namespaces) as fed:
        yield fed


def assert_differs_from_forgetful(
    deployed: list[dict], forgetful: list[dict], stage: str, round_: int, what: str
) -> None:
    """Some client's ``loss_local`` of ``stage`` in ``round_`` differs from the forgetful run's."""
    got = {r["client"]: r["loss_local"] for r in stage_rows(deployed, stage, round_)}
    lost = {r["client"]: r["loss_local"] for r in stage_rows(forgetful, stage, round_)}
    assert got and any(abs(got[c] - lost[c]) > 1e-4 for c in got), (
        f"round-{round_} {stage} results equal those of clients that lost their {what}"
    )


def test_scaffold_control_variates_survive_deployment(
    three_nodes: Federation, tmp_path: Path
) -> None:
    reference, contexts = run_inprocess(SCAFFOLD, tmp_path / "reference")
    assert all("scaffold_ci" in context.state for context in contexts)
    forgetful, _ = run_inprocess(SCAFFOLD, tmp_path / "forgetful", forgetful_client_fn)
    rows = deployed_rows(three_nodes, SCAFFOLD, tmp_path / "run")
    assert_same_results(rows, reference)
    # control variates on the wire: two model-sized messages each way
    l2 = [r for r in rows if r["stage"] == "L2"]
    assert l2 and all(r["bytes_up"] == r["bytes_down"] for r in l2)
    # the deployment kept c_i: its round-2 training differs from the state-losing run
    assert_differs_from_forgetful(rows, forgetful, "L2", 2, "control variates")


def test_flame_admm_state_survives_deployment(three_nodes: Federation, tmp_path: Path) -> None:
    reference, contexts = run_inprocess(FLAME, tmp_path / "reference")
    assert all(key in context.state for context in contexts for key in (THETA, DUAL, LOCAL_COPY))
    forgetful, _ = run_inprocess(FLAME, tmp_path / "forgetful", forgetful_client_fn)
    rows = deployed_rows(three_nodes, FLAME, tmp_path / "run")
    assert_same_results(rows, reference)
    l1 = [r for r in rows if r["stage"] == "L1"]
    assert len(l1) == 3 and all({"acc_pm", "acc_gm", "acc_hm"} <= set(r) for r in l1)
    # the deployment kept θ_i, w_i and π_i: its round-2 results differ from the state-losing run
    for stage in ("L1", "L2"):
        assert_differs_from_forgetful(rows, forgetful, stage, 2, "ADMM state")


def test_deployment_with_a_server_side_client_store_matches_in_process(
    three_nodes: Federation, tmp_path: Path
) -> None:
    """Round 2's messages depend on every client's round-1 upload being stored under the right
    partition id, and its training on the state kept on each node."""
    expected, _ = run_inprocess(DIVERSIFED, tmp_path / "inprocess")
    rows = deployed_rows(three_nodes, DIVERSIFED, tmp_path / "run")
    stages = ("L1", "L2", "G", "server")
    assert {r["stage"] for r in expected} >= set(stages)
    assert_same_results(rows, expected, stages, ("acc", "loss", "train_loss", "client_store"))
    # round 2's L2 rows exist for every client: its message came from the others' stored models
    assert sorted(r["client"] for r in rows if r["stage"] == "L2" and r["round"] == 2) == [0, 1, 2]
