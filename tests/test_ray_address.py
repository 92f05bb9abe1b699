"""Which Ray a Ray-backed run uses (issue 61, item 7): ``backend=ray`` starts a local instance of
its own whatever Ray's record of a dead cluster says; a cluster that was asked for must answer
within a deadline, or the run fails with one line naming the address and where it came from;
and SIGTERM ends a Ray run as it ends a forked one (failed summary, ``interrupted by SIGTERM``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pflower.compose import compose_config, validate
from pflower.results.rows import read_rows
from pflower.runtime.raycluster import (
    ClusterAddress,
    RayClusterUnreachable,
    check_reachable,
    cluster_record,
    local_ray_under_flwr_simulation,
    ray_address,
    requested_cluster,
)
from pflower.simulation import ray_backend_config
from tests.deploy_helpers import free_port, simulation, wait_until

DEAD = "127.0.0.1:9"
"""An address where nothing listens (the discard port)."""


@pytest.fixture
def stale_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Ray's temp folder of this test, holding the record of a cluster that is gone."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    record = tmp_path / "ray" / "ray_current_cluster"
    record.parent.mkdir()
    record.write_text(f"{DEAD}\n")
    assert cluster_record() == record  # where ray.init() looks
    yield record


def test_backend_ray_starts_its_own_ray_whatever_the_record_says(stale_record: Path) -> None:
    settings = validate(compose_config(["backend=ray", "dataset=digits"]), check_scheme=False)
    assert ray_backend_config(settings)["init_args"]["address"] == "local"


def test_a_dead_cluster_in_the_record_fails_ray_cluster_in_one_line(stale_record: Path) -> None:
    started = time.monotonic()
    with pytest.raises(RayClusterUnreachable) as error:
        ray_address("auto", timeout=1.0)
    assert time.monotonic() - started < 30
    message = str(error.value)
    assert "\n" not in message
    assert DEAD in message and str(stale_record) in message and "backend=ray" in message


def test_ray_address_asks_for_a_cluster_and_is_named_when_it_is_dead(
    stale_record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", DEAD)
    assert requested_cluster(None) == ClusterAddress(DEAD, "the environment variable RAY_ADDRESS")
    with pytest.raises(RayClusterUnreachable, match=r"127\.0\.0\.1:9 \(from the environment"):
        ray_address(None, timeout=0.5)
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert ray_address(None) == "local"


def test_the_configured_address_comes_first_and_must_answer(stale_record: Path) -> None:
    port = free_port()
    assert requested_cluster(f"127.0.0.1:{port}") == ClusterAddress(
        f"127.0.0.1:{port}", "backend.address"
    )
    with pytest.raises(RayClusterUnreachable, match=r"from backend\.address"):
        check_reachable(ClusterAddress(f"127.0.0.1:{port}", "backend.address"), timeout=0.5)
    with pytest.raises(RayClusterUnreachable, match="not host:port"):
        ray_address("nohost", timeout=0.5)


def test_auto_without_any_cluster_says_how_to_start_one(stale_record: Path) -> None:
    stale_record.unlink()
    with pytest.raises(RayClusterUnreachable, match="ray start --head"):
        ray_address("auto")


def test_a_listening_head_is_reached(stale_record: Path) -> None:
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        stale_record.write_text(address)
        assert ray_address("auto", timeout=5) == address


def test_flwr_simulation_gets_a_local_ray_through_the_environment(
    stale_record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["/venv/bin/pflower"])
    local_ray_under_flwr_simulation()
    assert "RAY_ADDRESS" not in os.environ  # pflower's own runs pass the address themselves
    monkeypatch.setattr(sys, "argv", ["/venv/bin/flwr-simulation", "--insecure"])
    local_ray_under_flwr_simulation()
    assert os.environ["RAY_ADDRESS"] == "local"


def _end_ray_processes_of(ray_tmp: Path) -> None:
    """SIGKILL this test's Ray processes: those whose environment names ``ray_tmp``."""
    marker = f"RAY_TMPDIR={ray_tmp}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue


@pytest.mark.slow
def test_a_ray_run_beside_a_dead_clusters_record_completes_and_ends_on_sigterm(
    tmp_path: Path,
) -> None:
    """The issue's reproduction: with a stale ``ray_current_cluster`` the run hung after
    "configure_fit" and ignored SIGTERM. Now it runs on a local Ray, and a SIGTERM in its second
    round records it as interrupted and ends it. (Ray's dashboard and runtime-env agents outlive
    a driver ended by a signal by about a minute, until their own check of the raylet ends
    them; this test ends them at once, by the Ray temp folder in their environment.)"""
    ray_tmp = Path(tempfile.mkdtemp(prefix="pfray", dir="/tmp"))  # Ray's sockets: a short path
    (ray_tmp / "ray").mkdir(parents=True)
    (ray_tmp / "ray" / "ray_current_cluster").write_text(DEAD)
    env = {"RAY_TMPDIR": str(ray_tmp)}
    run_dir = tmp_path / "run"
    overrides = [
        "backend=ray",
        "dataset=digits",
        "partition=iid",
        "strategy=fedavg",
        "num_clients=3",
        "rounds=40",
    ]
    previous = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        run = simulation(overrides, run_dir, tmp_path / "run.log")
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value
    try:
        wait_until(
            lambda: (
                any(r["round"] >= 1 and r["stage"] == "L2" for r in read_rows(run_dir))
                or run.popen.poll() is not None
            ),
            300,
            "the Ray run's first round",
        )
        assert run.popen.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        os.kill(run.popen.pid, signal.SIGTERM)
        code = run.popen.wait(timeout=60)
    finally:
        run.stop()
        _end_ray_processes_of(ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert code == -signal.SIGTERM
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["error"]) == ("failed", "interrupted by SIGTERM")
