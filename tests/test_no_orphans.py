"""Nothing is left running when the process that started a run is killed (``kill -9``, which no
handler sees): the fork backend's workers, a GPU run's forked run process and its workers, and a
ClientApp fork server and its task children all end with it (pflower.runtime.processes). Real
processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from pflower.runtime.launcher import SUPERLINK_IN_MEMORY_DB
from tests.deploy_helpers import free_port

GONE_WITHIN_S = 30.0
"""How long the killed driver's processes may take to end (the kernel signals them at once; a
loaded 2-core machine may take a while to schedule them)."""


def _ended(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE  # ended, not yet reaped by its adopter
    except psutil.NoSuchProcess:
        return True


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def _assert_kill_leaves_no_survivor(
    driver: subprocess.Popen[str], expected: int, what: str
) -> None:
    """SIGKILL ``driver`` once it has at least ``expected`` descendants; none of them may still be
    running ``GONE_WITHIN_S`` later (survivors are killed here, so none outlives the test)."""
    parent = psutil.Process(driver.pid)
    _wait_until(
        lambda: len(parent.children(recursive=True)) >= expected,
        120,
        f"{expected} processes under the driver",
    )
    descendants = parent.children(recursive=True)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(timeout=60)
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline and not all(_ended(p) for p in descendants):
        time.sleep(0.2)
    survivors = [p for p in descendants if not _ended(p)]
    described = []
    for process in survivors:
        try:
            described.append(f"{process.pid} {' '.join(process.cmdline())[:120]}")
            process.kill()
        except psutil.NoSuchProcess:
            pass
    assert described == [], f"left running after {what} was killed: {described}"


@contextmanager
def _driver(command: list[str], **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """``command`` started as a process for the block to kill; killed at its end in any case."""
    driver = subprocess.Popen(command, text=True, **popen)
    try:
        yield driver
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


@pytest.mark.slow
def test_a_killed_pflower_leaves_no_fork_worker(tmp_path: Path) -> None:
    """Issue: ``kill -9`` of a SCAFFOLD run left its two workers (PPID 1) running for good."""
    run_dir = tmp_path / "run"
    command = [
        *(sys.executable, "-m", "pflower", "strategy=scaffold", "dataset=digits"),
        *("num_clients=4", "rounds=50", f"output_dir={run_dir}", "seed=5", "backend.workers=2"),
    ]
    with _driver(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as driver:
        metrics = run_dir / "metrics.jsonl"
        _wait_until(
            lambda: (metrics.is_file() and metrics.stat().st_size > 0) or driver.poll() is not None,
            600,
            "the run's first rows",
        )
        assert driver.poll() is None, f"the run ended early ({driver.returncode})"
        _assert_kill_leaves_no_survivor(driver, 2, "the driver")


FORKED_RUN = """
import time
from pflower.runtime.forkbackend import ForkWorkers, run_in_forked_process

def run():  # a GPU run's process: it forks its own workers, then works
    workers = ForkWorkers(lambda message, context: (message, context), 2)
    time.sleep(600)

run_in_forked_process(run)
"""


@pytest.mark.slow
def test_a_killed_driver_leaves_no_forked_run_process_nor_its_workers(tmp_path: Path) -> None:
    with _driver([sys.executable, "-c", FORKED_RUN]) as driver:
        _assert_kill_leaves_no_survivor(driver, 3, "the driver")


PROBE = """
import time

def main():
    time.sleep(600)  # a ClientApp task that is still running
"""

STARTER = """
import os, subprocess, sys, time
from pathlib import Path
from pflower.runtime.forkserver import ForkServerProcess

server = ForkServerProcess.start(
    Path(sys.argv[1]), target="probe:main", watch_pid=os.getpid(), preload_modules=()
)
server.wait_ready(timeout=120)
subprocess.Popen([str(server.shim), "--insecure"], env=server.environment())
time.sleep(600)
"""


@pytest.mark.slow
def test_a_killed_supernode_leaves_no_fork_server_nor_task(tmp_path: Path) -> None:
    """The process that started a fork server (a SuperNode's launcher) is killed while a task
    runs: the server, the task's child and its stand-in all end."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "probe.py").write_text(textwrap.dedent(PROBE))
    path = os.pathsep.join([str(modules), os.environ.get("PYTHONPATH", "")])
    command = [sys.executable, "-c", STARTER, str(tmp_path / "server")]
    with _driver(command, env={**os.environ, "PYTHONPATH": path}) as driver:
        # the server, the stand-in, and the server's child running the task
        _assert_kill_leaves_no_survivor(driver, 3, "the starter")
    assert not (tmp_path / "server").exists(), "the server removes its directory as it ends"


@pytest.mark.slow
@pytest.mark.deployment
def test_a_killed_launcher_supernode_leaves_neither_its_fork_server_nor_its_superexec() -> None:
    """``python -m pflower.deploy.launcher supernode`` (its SuperLink unreachable: it keeps
    retrying) has started its fork server and Flower's SuperExec; ``kill -9`` ends all three."""
    command = [
        sys.executable,
        "-m",
        "pflower.deploy.launcher",
        "supernode",
        "--",
        "--insecure",
        "--superlink",
        f"127.0.0.1:{free_port()}",
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "--node-config",
        "partition-id=0 num-partitions=1",
    ]
    with _driver(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as driver:
        _assert_kill_leaves_no_survivor(driver, 2, "the SuperNode")


@pytest.mark.slow
@pytest.mark.deployment
def test_a_killed_launcher_superlink_leaves_neither_its_fork_server_nor_its_superexec() -> None:
    """``python -m pflower.deploy.launcher superlink`` has started its ServerApp fork server and
    Flower's SuperExec (which starts the runs' ServerApps); ``kill -9`` ends all three."""
    command = [
        sys.executable,
        "-m",
        "pflower.deploy.launcher",
        "superlink",
        "--",
        "--insecure",
        "--isolation",
        "subprocess",
        "--database",
        SUPERLINK_IN_MEMORY_DB,
        "--fleet-api-address",
        f"127.0.0.1:{free_port()}",
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "--disable-runtime-dependency-installation",
    ]
    with _driver(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as driver:
        _assert_kill_leaves_no_survivor(driver, 2, "the SuperLink")
