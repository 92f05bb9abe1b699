"""Continuous fault testing (issue 61, "Nothing lost, even by mistake"): a simulation and a
deployment run while processes are killed at random, each resumed from its checkpoint after
every fault, and each must end with the rows of the same experiment run without interruption,
no process of its own left and no temporary file left behind.

- Simulation (``backend=fork``): the fault is SIGKILL or SIGTERM to the driver, or SIGKILL to a
  forked worker while the driver is frozen (SIGSTOP), then to the driver (a lost worker fails its
  message and the run would go on with a gap: it is ended and resumed instead); ``pflower
  resume`` continues it.
- Deployment (``pflower deploy`` machinery): the fault is SIGKILL to a SuperNode, to the
  SuperLink or to the ServerApp (the deployment's driver). After a SuperNode or the SuperLink
  the deployment is brought back (every process the fault left is stopped, the SuperLink and the
  SuperNodes start again on the same ports); then the run resumes with ``pflower deploy run
  --resume``'s overrides.

Each seed draws the faults (what, when within a round); the rows are compared with an in-process
run of the same experiment. Timing is random, the outcome must not be: the run is small (digits,
3 clients, 4 rounds, a checkpoint every round) so each case fits well under two minutes on a
loaded 2-core machine, and every wait is generous.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from pflower.config import RunRecord
from pflower.core.checkpoint import CheckpointError, load_checkpoint
from pflower.deploy.cli import resume_record
from pflower.deploy.control import CONNECTION
from pflower.deploy.local import SERVERAPP_PROGRAM
from pflower.deploy.processes import launch, tagged_pids, terminate
from pflower.results.rows import read_rows
from tests.deploy_helpers import (
    RUN_TIMEOUT,
    assert_same_results,
    diagnostics,
    federation,
    wait_until,
)
from tests.helpers import results, tiny
from tests.inprocess import run_inprocess

pytestmark = pytest.mark.slow

SEEDS = (1, 12, 13)
"""The random seeds CI runs (one case per seed and system). Between them they kill every kind of
process: the deployments' SuperLink, SuperNode 2 and ServerApp; the simulations' driver by
SIGKILL and by SIGTERM, and a worker."""

FAULTS = 2
"""Faults injected per simulation; the run then finishes undisturbed."""

DEPLOYMENT_FAULTS = 1
"""Faults injected per deployment: each one restarts the deployment and submits the run again
(``flwr run`` packs and uploads the app), which costs a minute on a loaded 2-core machine."""

ROUNDS = 4

EXPERIMENT = tiny("strategy=fliu", "checkpoint.every=1", "progress=false", clients=3, rounds=ROUNDS)
"""FLIU keeps personal models on the clients, so a resume that lost a client's state shows in
the L1 rows."""


def checkpointed(run_dir: Path) -> int:
    """The round of ``run_dir``'s checkpoint (0 before the first)."""
    with contextlib.suppress(CheckpointError):
        return load_checkpoint(run_dir).round
    return 0


def finished(run_dir: Path) -> bool:
    """Whether the run completed (a failed summary, an interrupted run's, does not count)."""
    path = run_dir / "summary.json"
    with contextlib.suppress(OSError, ValueError):
        return bool(json.loads(path.read_text())["status"] == "completed")
    return False


def in_the_next_round(run_dir: Path, rng: random.Random, alive: Callable[[], bool]) -> bool:
    """Wait until the run has checkpointed one more round than now, then a random moment of the
    round after (its clients at work); False if the run completed (or ``alive()`` turned false)
    first."""
    start = checkpointed(run_dir)
    wait_until(
        lambda: checkpointed(run_dir) > start or finished(run_dir) or not alive(),
        RUN_TIMEOUT,
        f"the checkpoint after round {start}",
        every=0.05,
    )
    time.sleep(rng.uniform(0.0, 0.5))
    return not finished(run_dir) and alive()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The rows of :data:`EXPERIMENT` run in-process without interruption (once for all cases)."""
    rows, _ = run_inprocess(EXPERIMENT, tmp_path_factory.mktemp("reference"))
    return rows


@pytest.fixture
def private_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The temporary folder of every process the test starts (``TMPDIR``), checked empty at the
    end: a fault must not leave a fork server's folder or a partial file behind. A short path
    under /tmp: the fork servers' Unix sockets go inside it, and a socket's path may not exceed
    107 bytes (pytest's folders under xdist come close)."""
    folder = Path(tempfile.mkdtemp(prefix="chaos-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------------- simulation
def _start_driver(arguments: list[str], log: Path, tag: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "pflower", *arguments]
    _, popen = launch("driver", command, log, tag, log.parent / "flwr")
    return popen


def _running(popen: subprocess.Popen[bytes]) -> Callable[[], bool]:
    """Whether ``popen`` still runs, asked later."""
    return lambda: popen.poll() is None


def _fault_the_simulation(popen: subprocess.Popen[bytes], rng: random.Random) -> str:
    """One fault to a running simulation's driver (see the module docstring); its name."""
    kind = rng.choice(("driver SIGKILL", "driver SIGTERM", "worker SIGKILL"))
    if kind == "worker SIGKILL":
        # The driver is frozen first: left running, it would record the lost message as a
        # failure and might checkpoint that round before its own SIGKILL came.
        popen.send_signal(signal.SIGSTOP)
        with contextlib.suppress(psutil.NoSuchProcess):
            workers = psutil.Process(popen.pid).children()
            if workers:
                rng.choice(workers).kill()
        time.sleep(rng.uniform(0.0, 0.3))
    popen.send_signal(signal.SIGTERM if kind == "driver SIGTERM" else signal.SIGKILL)
    popen.wait(timeout=120)
    return kind


@pytest.mark.parametrize("seed", SEEDS)
def test_a_simulation_killed_at_random_ends_with_the_uninterrupted_rows(
    seed: int, reference: list[dict[str, Any]], tmp_path: Path, private_tmp: Path
) -> None:
    rng = random.Random(seed)
    run_dir = tmp_path / "run"
    tag = f"pflower-chaos-{uuid.uuid4().hex[:8]}"
    arguments = [*EXPERIMENT, f"output_dir={run_dir}", f"hydra.run.dir={tmp_path / 'hydra'}"]
    faults = []
    popen = _start_driver(arguments, tmp_path / "driver-0.log", tag)
    try:
        for attempt in range(1, FAULTS + 1):
            if not in_the_next_round(run_dir, rng, _running(popen)):
                break
            faults.append(_fault_the_simulation(popen, rng))
            log = tmp_path / f"driver-{attempt}.log"
            popen = _start_driver(["resume", str(run_dir)], log, tag)
        code = popen.wait(timeout=RUN_TIMEOUT)
    finally:
        terminate(tag, grace=5)
    logs = "\n".join(p.read_text()[-1500:] for p in sorted(tmp_path.glob("driver-*.log")))
    assert code == 0, f"faults {faults}:\n{logs}"
    assert results(read_rows(run_dir)) == results(reference), f"faults {faults}"
    assert finished(run_dir)
    assert not tagged_pids(tag)
    assert not list(private_tmp.iterdir()), f"faults {faults} left {list(private_tmp.iterdir())}"


# --------------------------------------------------------------------------------- deployment
@pytest.mark.deployment
@pytest.mark.parametrize("seed", SEEDS)
def test_a_deployment_killed_at_random_ends_with_the_uninterrupted_rows(
    seed: int, reference: list[dict[str, Any]], tmp_path: Path, private_tmp: Path
) -> None:
    rng = random.Random(seed)
    run_dir = tmp_path / "run"
    faults = []
    with federation(tmp_path / "deploy", 3) as fed:
        deployment = fed.deployment
        tag = deployment.tag
        run_id = deployment.control.submit(RunRecord((*EXPERIMENT,), run_dir))
        for _ in range(DEPLOYMENT_FAULTS):
            if not in_the_next_round(run_dir, rng, lambda: deployment.alive("superlink")):
                break
            nodes = [name for name in deployment.processes if name.startswith("supernode-")]
            victim = rng.choice(("superlink", SERVERAPP_PROGRAM, *nodes))
            faults.append(victim)
            if victim == SERVERAPP_PROGRAM:
                terminate(tag, grace=5, sig=signal.SIGKILL, program=SERVERAPP_PROGRAM)
                # the SuperLink's run
                deployment.control.flwr("stop", run_id, CONNECTION, check=False)
            else:  # the process itself: what it started ends with it, as after an OOM kill
                os.kill(deployment.processes[victim].pid, signal.SIGKILL)
                # bring the deployment back: what the fault left is stopped, all start again
                deployment.stop_all(grace=5)
                deployment.start_superlink()
                for index in range(3):
                    fed.start_node(index)
                deployment.control.wait_for_nodes(3, timeout=180)
            run_id = deployment.control.submit(resume_record(run_dir, []))
        status = deployment.control.wait_for_run(run_id, RUN_TIMEOUT)
        assert status == "finished:completed", f"faults {faults}\n{diagnostics(deployment)}"
    assert_same_results(read_rows(run_dir), reference)
    assert finished(run_dir)
    assert not tagged_pids(tag)
    assert not list(private_tmp.iterdir()), f"faults {faults} left {list(private_tmp.iterdir())}"
