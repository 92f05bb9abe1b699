"""The `pflower` command end to end: a real Flower simulation on forked workers (the default
backend) and on Ray."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from tests.helpers import (
    comparable,
)
from tests.inprocess import run_inprocess


def _run_pflower_and_watch(
    overrides: list[str], timeout: float = 600
) -> tuple[int, str, str, set[str]]:
    """Run ``python -m pflower <overrides>``; returns its exit code, stdout, stderr and the
    command lines of every process below it, sampled twice a second while it runs."""
    command = [sys.executable, "-m", "pflower", *overrides]
    seen: set[str] = set()
    with (
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as process,
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        reader = pool.submit(process.communicate, timeout=timeout)
        while not reader.done():
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(process.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        seen.add(" ".join(child.cmdline()))
            time.sleep(0.5)
        try:
            stdout, stderr = reader.result()
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    return process.returncode, stdout, stderr, seen


@pytest.mark.slow
def test_pflower_runs_a_ray_simulation_that_learns(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    returncode, stdout, stderr, processes = _run_pflower_and_watch(
        ["num_clients=4", "rounds=4", "strategy=fliu", "backend=ray", f"output_dir={run_dir}"]
    )
    assert returncode == 0, stdout[-3000:] + stderr[-3000:]
    # Ray's head ran without the autoscaler monitor and the API server (pflower.runtime.engine.
    # lean_ray_head), and those two were all it left out
    assert any("raylet" in command for command in processes), processes
    assert any("log_monitor.py" in command for command in processes), processes
    assert not any("dashboard/dashboard.py" in command for command in processes), processes
    assert not any("autoscaler/_private/monitor.py" in command for command in processes)
    for artifact in (
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
        "run.log",
        "plots/accuracy.png",
        "plots/clients.png",
    ):
        assert (run_dir / artifact).is_file(), artifact
    summary = json.loads((run_dir / "summary.json").read_text())
    l1 = summary["final"]["L1"]
    assert l1["num_clients"] == 4
    # 2 classes per client: local chance is 0.5, global chance 0.1.
    assert l1["acc_local"]["mean"] > 0.85
    assert summary["final"]["G"]["acc"] > 0.2
    assert "round 4/4" in stdout  # the live view reported every round
    # Flower's simulation engine as pflower runs it (nodes' partitions read from the engine's
    # node map, messages delivered only to nodes that have one; see pflower.runtime.engine) gives
    # the rows of the in-process run, whose server asks every node for its partition
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    asked, _ = run_inprocess(["num_clients=4", "rounds=4", "strategy=fliu"], tmp_path / "inprocess")
    assert sorted(comparable(rows)) == sorted(comparable(asked))


@pytest.mark.slow
def test_a_bad_override_fails_with_a_clear_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pflower",
            "strategy=fliu",
            "strategy.gamma=2",
            f"output_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "strategy.gamma must be in [0, 1], got 2" in result.stdout


def test_messages_are_delivered_to_the_nodes_that_have_one_in_node_order() -> None:
    import threading
    from queue import Queue
    from types import SimpleNamespace

    from pflower.runtime.engine import deliver_pending_messages

    def message(node_id: int, delivered: str = "") -> SimpleNamespace:
        return SimpleNamespace(
            metadata=SimpleNamespace(dst_node_id=node_id, delivered_at=delivered)
        )

    stop = threading.Event()

    class State:
        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.message_ins_store = {
                "a": message(30),
                "b": message(10),
                "c": message(20, delivered="earlier"),
                "d": message(99),  # not a node of this simulation
            }
            self.asked: list[int] = []

        def get_message_ins(self, node_id: int, limit: int) -> list[SimpleNamespace]:
            self.asked.append(node_id)
            found = [
                m
                for m in self.message_ins_store.values()
                if m.metadata.dst_node_id == node_id and not m.metadata.delivered_at
            ]
            for m in found[:limit]:
                m.metadata.delivered_at = "now"
            stop.set()  # one pass
            return found[:limit]

    state, queue = State(), Queue()
    deliver_pending_messages(state, queue, {10: 0, 20: 1, 30: 2, 40: 3}, stop)  # type: ignore[arg-type]
    assert state.asked == [10, 30], "only nodes with an undelivered message, in node order"
    assert [queue.get().metadata.dst_node_id for _ in range(queue.qsize())] == [10, 30]


@pytest.mark.slow
def test_the_default_fork_backend_runs_the_same_simulation_without_ray(tmp_path: Path) -> None:
    """``backend=fork``, the default: the ClientApps run in processes forked from the driver
    (two on this machine's count of CPUs, or ``backend.workers``), Ray never starts, and every
    row is the in-process run's (personal state kept across rounds in the nodes' contexts)."""
    run_dir = tmp_path / "run"
    overrides = ["num_clients=4", "rounds=3", "strategy=fliu"]
    returncode, stdout, stderr, processes = _run_pflower_and_watch(
        [*overrides, "backend.workers=2", f"output_dir={run_dir}"]
    )
    assert returncode == 0, stdout[-3000:] + stderr[-3000:]
    ray_parts = ("raylet", "gcs_server", "default_worker.py")
    assert not any(part in command for part in ray_parts for command in processes), processes
    assert "round 3/3" in stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    asked, _ = run_inprocess(overrides, tmp_path / "inprocess")
    assert sorted(comparable(rows)) == sorted(comparable(asked))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["config"]["backend"]["name"] == "fork"


FORKED_RUNS_SCRIPT = """
import functools, sys
from pathlib import Path
from pflower.compose import compose_record, validate
from pflower.runtime.forkbackend import run_in_forked_process
from pflower.simulation import _simulate

for seed in (0, 1):
    overrides = ["num_clients=2", "rounds=2", "backend.workers=2", f"seed={seed}"]
    record = compose_record(overrides, run_dir=Path(sys.argv[1]) / str(seed))
    settings = validate(record.composed)
    run_in_forked_process(functools.partial(_simulate, settings, record))
"""


@pytest.mark.slow
def test_runs_in_forked_processes_fork_their_own_workers_one_after_another(
    tmp_path: Path,
) -> None:
    """What a GPU sweep on forked workers does (``run_experiment`` with ``train.device=cuda``),
    here on the CPU: each job runs in a process forked from the driver, which forks the job's
    workers in turn; the second job runs as the first did."""
    done = subprocess.run(
        [sys.executable, "-c", FORKED_RUNS_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for seed in ("0", "1"):
        summary = json.loads((tmp_path / seed / "summary.json").read_text())
        assert summary["status"] == "completed"
        rounds = [json.loads(line)["round"] for line in (tmp_path / seed / "metrics.jsonl").open()]
        assert max(rounds) == 2
