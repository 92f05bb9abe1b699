"""pflower as a real deployment: a SuperLink and SuperNodes as separate processes over gRPC.

- the deployment reproduces a simulation of the same config (same partitions, same numbers), with
  each SuperNode in its own network namespace (a separate host) when the tests run as root with
  ``ip netns``, else on loopback ports;
- per-client state persists on the SuperNodes: each client's personalized model outlives the
  ClientApp process that trained it;
- a SuperNode killed during a run is recorded as failed in that round, the round completes with
  the remaining clients, and the restarted node rejoins and trains;
- TLS with the certificates of ``docker/certs.sh``, and SuperNode authentication: an unregistered
  node is refused, registered ones train; all started with ``pflower deploy up``.

Every process a test starts is stopped by the test's context managers, also when it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pflower.config import RunRecord
from pflower.core.checkpoint import CheckpointError, load_checkpoint
from pflower.deploy.cli import main, resume_record
from pflower.deploy.control import CONNECTION
from pflower.deploy.local import SERVERAPP_PROGRAM, Deployment
from pflower.deploy.processes import runs_program, tagged_pids
from pflower.results.rows import read_rows
from pflower.runtime.forkserver import TASK_LOG_PREFIX
from tests.deploy_helpers import (
    REPO,
    RUN_TIMEOUT,
    Federation,
    assert_same_results,
    deploy_up_arguments,
    diagnostics,
    federation,
    free_port,
    iid_digits,
    netns_unavailable,
    rows_by_client,
    simulation,
    wait_until,
)
from tests.inprocess import run_inprocess

pytestmark = [pytest.mark.deployment, pytest.mark.slow]

EXPERIMENT = [*iid_digits("fliu"), "progress=false"]
COMPARED = [*EXPERIMENT, "num_clients=3", "rounds=2", "eval.every=2"]
"""Two rounds, evaluated in the last: its L2 rows depend on the state kept from round 1."""


def assert_state_persisted(rows: list[dict]) -> None:
    """FLIU keeps each client's trained model in ``context.state`` on its SuperNode.

    Training (fit) and evaluation (L1) of a round are separate messages, each handled by a fresh
    ClientApp process, so the state crosses processes only through the SuperNode. At L1 a
    client evaluates γθ_k + (1-γ)Θ, with θ_k read from that state; had it been lost, the client
    would evaluate the global model Θ itself and report exactly the server's stage-G loss on
    the same global test set. (Across rounds: round 2 trains from γθ_k + (1-γ)Θ as well, and
    :func:`assert_same_results` holds round 2 to the simulation, where state persists.)
    """
    global_loss = {r["round"]: r["loss"] for r in rows if r["stage"] == "G"}
    l1 = rows_by_client(rows, "L1")
    assert l1, "no client was evaluated"
    for (round_, client), row in l1.items():
        assert abs(row["loss_global"] - global_loss[round_]) > 1e-6, (
            f"client {client} evaluated the bare global model in round {round_}: its state "
            "did not reach the evaluating ClientApp"
        )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Ray simulation of :data:`COMPARED`, started at once so it overlaps the deployments."""
    root = tmp_path_factory.mktemp("simulation")
    run_dir = root / "run"
    process = simulation(COMPARED, run_dir, root / "simulation.log")

    def rows() -> list[dict]:
        code = process.popen.wait(timeout=RUN_TIMEOUT)
        assert code == 0, (root / "simulation.log").read_text()[-3000:]
        return read_rows(run_dir)

    try:
        yield rows
    finally:
        process.stop()


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    """A SuperLink and 3 SuperNodes, shared by the tests of this module.

    Where the tests run as root with ``ip netns``, every SuperNode runs in a network namespace
    of its own (a separate host, reaching the SuperLink over a veth pair); elsewhere the
    SuperNodes use loopback ports, which the TLS test below exercises in any case.
    """
    in_namespaces = netns_unavailable() is None
    with federation(tmp_path_factory.mktemp("federation"), 3, in_namespaces) as fed:
        yield fed


def test_deployment_matches_simulation(
    three_nodes: Federation, reference: Any, tmp_path: Path
) -> None:
    if three_nodes.spaces is not None:
        for index in range(3):
            pid = three_nodes.deployment.processes[f"supernode-{index}"].pid
            identify = subprocess.run(
                ["ip", "netns", "identify", str(pid)], capture_output=True, text=True, check=True
            )
            assert identify.stdout.strip() == three_nodes.spaces.name(index)
    run_dir = tmp_path / "run"
    run_id = three_nodes.deployment.control.submit(RunRecord((*COMPARED,), run_dir))
    status = three_nodes.deployment.control.wait_for_run(run_id, RUN_TIMEOUT)
    assert status == "finished:completed", diagnostics(three_nodes.deployment)
    rows = read_rows(run_dir)
    assert (run_dir / "summary.json").is_file()
    assert_same_results(rows, reference())
    assert_state_persisted(rows)
    # The run's ServerApp was a child of the SuperLink's fork server (it reports each child it
    # reaped in the SuperLink's log), not a new flwr-serverapp process.
    superlink_log = Path(three_nodes.deployment.processes["superlink"].log)
    wait_until(
        lambda: TASK_LOG_PREFIX in superlink_log.read_text(errors="replace"),
        60,
        "the SuperLink's fork server to report the ServerApp it ran",
    )


def _received_train(log: Path, run_id: str, server_round: int) -> bool:
    """Whether a SuperNode's log shows it received a round's training message of a run."""
    text = log.read_text(errors="replace") if log.exists() else ""
    pattern = rf"RUN {run_id}, ROUND {server_round}\]\s*\n.*Receiving: train message"
    return re.search(pattern, text) is not None


REJOIN_ROUNDS = 60


def test_killed_supernode_is_recorded_and_rejoins(three_nodes: Federation, tmp_path: Path) -> None:
    """Kill supernode-2 while it trains in round 1, restart it, and finish the run.

    Only the last round is evaluated (fewer ClientApp processes); that round 1 went on with the
    two remaining clients shows in the ServerApp's log and in the recorded failure. Client 2
    missed round 1's deadline, so it is absent until it reconnects: the server does not wait for
    it (the next rounds take about a second each), and the restarted node is picked up at the
    first round that starts after it is back. Enough rounds for a SuperNode to restart on a
    loaded machine.
    """
    run_dir = tmp_path / "run"
    deployment = three_nodes.deployment
    run_id = deployment.control.submit(
        RunRecord(
            (
                *EXPERIMENT,
                "num_clients=3",
                f"rounds={REJOIN_ROUNDS}",
                f"eval.every={REJOIN_ROUNDS}",
                "round_timeout=120",
            ),
            run_dir,
        )
    )
    log = Path(deployment.processes["supernode-2"].log)
    wait_until(
        lambda: _received_train(log, run_id, 1),
        RUN_TIMEOUT,
        "round 1 to reach supernode-2",
        every=0.2,
    )
    deployment.stop("supernode-2", signal.SIGTERM)
    wait_until(
        lambda: any(r["stage"] == "failure" for r in read_rows(run_dir)),
        RUN_TIMEOUT,
        "the failure of client 2 to be recorded",
    )
    three_nodes.start_node(2)
    status = deployment.control.wait_for_run(run_id, RUN_TIMEOUT)
    assert status == "finished:completed", diagnostics(deployment)

    rows = read_rows(run_dir)
    failure_rows = [r for r in rows if r["stage"] == "failure"]
    failures = [(r["round"], r["phase"], r["client"]) for r in failure_rows]
    assert failures == [(1, "fit", 2)], failure_rows
    aggregated = re.findall(
        r"aggregate_fit: received (\d+) results and (\d+) failures",
        (run_dir / "run.log").read_text(),
    )
    assert aggregated[0] == ("2", "1"), "round 1 aggregated the 2 remaining clients"
    assert aggregated[-1] == ("3", "0"), "the restarted client trained in the last round"
    last = REJOIN_ROUNDS
    assert {c for (rnd, c) in rows_by_client(rows, "L2") if rnd == last} == {0, 1, 2}
    assert {c for (rnd, c) in rows_by_client(rows, "L1") if rnd == last} == {0, 1, 2}
    assert "partition(s) 2 reconnected" in (run_dir / "run.log").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(f["round"], f["client"]) for f in summary["failures"]] == [(1, 2)]


CONNECT_TIMEOUT = 60


def test_a_dead_supernode_is_waited_for_once_not_in_every_phase(
    three_nodes: Federation, tmp_path: Path
) -> None:
    """Kill supernode-2 (SIGKILL) after round 1's fit and never restart it during the run.

    The server waits at most ``connect_timeout`` for it once, marks partition 2 absent, and the
    remaining rounds take the live nodes' time: before, every phase of every later round waited
    ``connect_timeout`` again (2 x 60 s per evaluated round here). The node is restarted after
    the run for the module's other tests.
    """
    run_dir = tmp_path / "run"
    deployment = three_nodes.deployment
    rounds = 4
    run_id = deployment.control.submit(
        RunRecord(
            (
                *EXPERIMENT,
                "num_clients=3",
                f"rounds={rounds}",
                f"connect_timeout={CONNECT_TIMEOUT}",
                "connect_log_every=5",
                "round_timeout=120",
            ),
            run_dir,
        )
    )
    wait_until(
        lambda: any(r["stage"] == "time" and r["round"] == 1 for r in read_rows(run_dir)),
        RUN_TIMEOUT,
        "round 1's fit to be aggregated",
        every=0.2,
    )
    deployment.stop("supernode-2", signal.SIGKILL)
    try:
        status = deployment.control.wait_for_run(run_id, RUN_TIMEOUT + 4 * CONNECT_TIMEOUT)
    finally:
        three_nodes.start_node(2)
    assert status == "finished:completed", diagnostics(deployment)
    rows = read_rows(run_dir)
    done = {r["round"]: r["fit_done_unix_s"] for r in rows if r["stage"] == "time"}
    durations = {rnd: done[rnd] - done[rnd - 1] for rnd in range(2, rounds + 1)}
    print(f"round durations after supernode-2 died (s): {durations}")
    for rnd in range(3, rounds + 1):
        assert durations[rnd] < CONNECT_TIMEOUT, (
            f"round {rnd} took {durations[rnd]:.0f} s: it waited for the dead node again"
        )
    assert {c for (rnd, c) in rows_by_client(rows, "L2") if rnd == rounds} == {0, 1}
    assert "marked absent" in (run_dir / "run.log").read_text()


def _tls_handshake(port: int, ca: Path) -> str:
    """Open a TLS connection to ``127.0.0.1:port`` verified against ``ca``; the TLS version."""
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        return str(tls.version())


def _answers_plain_http(port: int) -> bool:
    """Whether ``127.0.0.1:port`` answers an unencrypted HTTP request."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
        try:
            return raw.recv(16).startswith(b"HTTP/")
        except OSError:
            return False


@pytest.mark.skipif(
    shutil.which("openssl") is None or shutil.which("ssh-keygen") is None,
    reason="docker/certs.sh needs openssl and ssh-keygen",
)
def test_tls_and_supernode_authentication_with_deploy_cli(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    subprocess.run(
        [str(REPO / "docker" / "certs.sh"), "-o", str(certs), "-n", "3"],
        check=True,
        capture_output=True,
    )
    directory = tmp_path / "deploy"
    fleet, control = free_port(), free_port()
    up = [
        *deploy_up_arguments(directory, 2, fleet, control),
        "--certificates",
        str(certs),
        "--node-keys",
        str(certs),
        "--timeout",
        "90",
    ]
    run_dir = tmp_path / "run"
    assert main(up) == 0, "pflower deploy up failed"
    deployment = Deployment.load(directory)
    try:
        assert main(["status", "--dir", str(directory)]) == 0
        assert {p.name for p in (directory / "logs").iterdir()} >= {
            "superlink.log",
            "supernode-0.log",
            "supernode-1.log",
        }

        # TLS: both APIs speak only TLS, with a certificate that the CA vouches for
        for port in (fleet, control):
            assert _tls_handshake(port, certs / "ca.crt").startswith("TLS")
        assert not _answers_plain_http(control)

        # authentication: supernode-2's key was never registered (`up` registered 0 and 1);
        # it tries to join while the registered nodes train, over TLS
        deployment.start_supernode(2, runtime_port=free_port())
        run_id = deployment.control.submit(
            RunRecord(
                (
                    *EXPERIMENT,
                    "num_clients=2",
                    "rounds=1",
                ),
                run_dir,
            )
        )
        wait_until(lambda: not deployment.alive("supernode-2"), 60, "supernode-2 to be refused")
        assert (
            "Failed to activate SuperNode"
            in Path(deployment.processes["supernode-2"].log).read_text()
        )
        assert deployment.control.online_nodes() == 2
        status = deployment.control.wait_for_run(run_id, RUN_TIMEOUT)
        assert status == "finished:completed", diagnostics(deployment)
        assert {c for (_, c) in rows_by_client(read_rows(run_dir), "L2")} == {0, 1}
    finally:
        assert main(["down", "--dir", str(directory)]) == 0
    assert main(["status", "--dir", str(directory)]) == 1
    assert not tagged_pids(deployment.tag)


def _serverapp_pids(deployment: Deployment) -> list[int]:
    """The deployment's ServerApp processes (the SuperLink starts one per run): the
    ``flwr-serverapp`` stand-ins of the SuperLink's fork server, whose end ends the ServerApp
    (not the fork server itself, which would take the other runs' ServerApps with it)."""
    return [pid for pid in tagged_pids(deployment.tag) if runs_program(pid, SERVERAPP_PROGRAM)]


def test_killed_serverapp_resumes_to_the_same_results(
    three_nodes: Federation, tmp_path: Path
) -> None:
    """Kill the ServerApp with SIGKILL after a checkpoint, submit the run again with
    ``pflower deploy run --resume``'s overrides, and end with the results of the same experiment
    run without interruption (in-process). The SuperNodes stay up but the resumed run is a new
    Flower run with empty node state: FLIU's personal models come back from the clients'
    snapshots, and without them the L1 rows after the checkpoint would differ."""
    experiment = [
        *EXPERIMENT,
        "num_clients=3",
        "rounds=3",
        "checkpoint.every=1",
    ]
    reference, _ = run_inprocess(experiment, tmp_path / "reference")
    deployment = three_nodes.deployment
    run_dir = tmp_path / "run"
    run_id = deployment.control.submit(RunRecord((*experiment,), run_dir))

    def checkpointed() -> int:
        with contextlib.suppress(CheckpointError):
            return load_checkpoint(run_dir).round
        return 0

    wait_until(lambda: checkpointed() >= 1, RUN_TIMEOUT, "the checkpoint of round 1", every=0.05)
    pids = _serverapp_pids(deployment)
    assert pids, diagnostics(deployment)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    assert 1 <= checkpointed() < 3 and not (run_dir / "summary.json").exists()
    deployment.control.flwr("stop", run_id, CONNECTION, check=False)  # the SuperLink's record of it

    resumed_id = deployment.control.submit(resume_record(run_dir, []))
    status = deployment.control.wait_for_run(resumed_id, RUN_TIMEOUT)
    assert status == "finished:completed", diagnostics(deployment)
    rows = read_rows(run_dir)
    assert_same_results(rows, reference)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_round"] == 3
