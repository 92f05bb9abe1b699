"""A simulation attaches to an existing Ray cluster through ``backend.address``.

The test starts a Ray head of its own (private temp dir and ports, so it never meets another Ray
instance on the machine), runs a short simulation with ``backend=ray_cluster`` pointing at it,
and checks that the run's driver and ClientApp workers ran in that cluster.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pflower.deploy.processes import executable, launch, terminate, wait_for_port
from pflower.results.rows import read_rows
from tests.deploy_helpers import free_port, simulation

pytestmark = [pytest.mark.deployment, pytest.mark.slow]


@pytest.fixture
def ray_head(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A one-machine Ray cluster: its address and its session root; stopped afterwards.

    Ray's Unix sockets need a short path, hence a temp dir directly under /tmp.
    """
    temp = Path(tempfile.mkdtemp(prefix="pfray", dir="/tmp"))
    port = free_port()
    tag = f"pflower-ray-{uuid.uuid4().hex[:8]}"
    ports = {
        "--ray-client-server-port": free_port(),
        "--node-manager-port": free_port(),
        "--object-manager-port": free_port(),
        "--metrics-export-port": free_port(),
        "--runtime-env-agent-port": free_port(),
        "--dashboard-agent-listen-port": free_port(),
        "--dashboard-agent-grpc-port": free_port(),
    }
    command = [
        executable("ray"),
        "start",
        "--head",
        "--block",
        "--port",
        str(port),
        "--num-cpus",
        "2",
        "--node-ip-address",
        "127.0.0.1",
        "--temp-dir",
        str(temp),
        "--include-dashboard",
        "false",
        "--disable-usage-stats",
        *[str(token) for flag, value in ports.items() for token in (flag, value)],
    ]
    _, popen = launch("ray-head", command, tmp_path / "ray-head.log", tag, temp / "flwr")
    try:
        wait_for_port("127.0.0.1", port, 60, popen)
        yield f"127.0.0.1:{port}", temp
    finally:
        terminate(tag, [popen.pid], grace=15)
        popen.wait(timeout=20)
        shutil.rmtree(temp, ignore_errors=True)


def test_simulation_runs_on_existing_ray_cluster(
    ray_head: tuple[str, Path], tmp_path: Path
) -> None:
    address, session_root = ray_head
    run_dir = tmp_path / "run"
    overrides = [
        "dataset=digits",
        "partition=iid",
        "model=small_cnn",
        "strategy=fliu",
        "num_clients=3",
        "rounds=2",
        "train.local_epochs=1",
        "backend=ray_cluster",
        f"backend.address={address}",
    ]
    process = simulation(overrides, run_dir, tmp_path / "simulation.log")
    try:
        code = process.popen.wait(timeout=300)
        assert code == 0, (tmp_path / "simulation.log").read_text()[-3000:]
    finally:
        process.stop()
    rows = read_rows(run_dir)
    assert {r["client"] for r in rows if r["stage"] == "L2" and r["round"] == 2} == {0, 1, 2}
    assert (run_dir / "summary.json").is_file()
    logs = session_root / "session_latest" / "logs"
    assert list(logs.glob("python-core-driver-*")), "the simulation's driver did not join"
    assert list(logs.glob("worker-*")), "no ClientApp worker ran in the cluster"
