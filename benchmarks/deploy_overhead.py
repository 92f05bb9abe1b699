"""Per-round overhead of a 3-SuperNode deployment on loopback against the same experiment simulated.

Workload: the embedded ``digits`` dataset, ``small_cnn``, an IID split over 3 clients, FedAvg, one
local epoch, evaluation (stages G, L1, L2) in every round, ``--rounds`` rounds (default 5).

(a) ``deployment``: pflower's own local deployment (:class:`pflower.deploy.local.Deployment`): one
    SuperLink and 3 SuperNodes as processes on free loopback ports, the run submitted with
    ``flwr run`` like ``pflower deploy run``. ``--launch plain`` starts the SuperNodes with
    ``flower-supernode`` itself (Flower's polling intervals, one fresh ``flwr-clientapp`` process
    per message), ``--launch fast`` (default) through :mod:`pflower.deploy.launcher` (fork server
    and short polling intervals); ``--launch both`` measures both, each against the simulation.
(b) ``simulation``: ``pflower <same overrides>`` (Ray backend), run right after (a) in the same
    invocation, so that the load of the machine affects both alike.

Round time: the time between the ends of consecutive training phases, from the ``time`` rows of
``metrics.jsonl``; a round so measured holds the previous round's evaluation (stage G, one
``evaluate`` message per client) and this round's training (one ``train`` message per client).
Steady state: the median over rounds 2..N. Overhead = deployment - simulation.

Breakdown of where a deployment's round goes:

- ``clientapp_cold_start_s``: a fresh Python process that imports Flower's ClientApp runtime and
  pflower's ClientApp (``import flwr.supernode.cli.flwr_clientapp, pflower.client.app``), the
  price of every message a plain SuperNode handles;
- ``fork_start_s``: the same through pflower's fork server (:mod:`pflower.runtime.forkserver`): the
  ``flwr-clientapp`` stand-in connects, the server forks a child that has everything imported
  already, the child imports pflower's ClientApp (a no-op) and exits, the stand-in exits;
- ``forked_task_s``: how long the forked children of the fast deployment's ClientApp tasks ran
  (from the fork server's log lines in the SuperNode logs);
- ``first_round_s``: seconds from submitting the run to the end of its first training phase, for
  the first run of the fresh deployment and for the same run submitted again once it ended (every
  process warm): the ServerApp's start (a new ``flwr-serverapp`` process, or with ``fast`` a fork of
  the SuperLink's fork server) plus one round's training;
- ``messages_per_round``: the messages SuperNodes received per round (``Receiving:`` lines of
  their logs), each a ClientApp process;
- ``polling_s``: Flower's polling intervals in the message path and the ones the fast launch sets.

Usage::

    python benchmarks/deploy_overhead.py [--rounds 5] [--launch fast|plain|both] [--out DIR]
        [--set key=value ...]

Writes ``deploy_overhead.json`` (the last run in full) and appends a row per launch mode to
``deploy_overhead.md`` in the output folder.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from pflower.config import RunRecord
from pflower.deploy.local import Deployment
from pflower.deploy.topology import Endpoints

WORKLOAD = [
    "dataset=digits",
    "partition=iid",
    "model=small_cnn",
    "strategy=fedavg",
    "num_clients=3",
    "train.local_epochs=1",
    "eval.every=1",
    "progress=false",
]

FLOWER_POLLING_S = {
    "supernode_pull_when_idle": 3.0,
    "supernode_reply_wait": 0.5,
    "superexec_task_poll": 1.0,
    "serverapp_reply_pull": 3.0,
}
"""Flower 1.39's intervals in the path of a message: the SuperNode asks the SuperLink for a
message every 3 s while it has none, waits for its ClientApp's reply in steps of 0.5 s, its
SuperExec asks it for a task to launch every second, and the ServerApp asks the SuperLink for
replies every 3 s."""

RUN_TIMEOUT = 1800.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def round_times(run_dir: Path) -> list[float]:
    """Seconds between the ends of consecutive training phases (rounds 2..N)."""
    ends = sorted(
        (row["round"], row["fit_done_unix_s"])
        for row in read_rows(run_dir)
        if row["stage"] == "time"
    )
    return [b - a for (_, a), (_, b) in itertools.pairwise(ends)]


def results_of(run_dir: Path) -> list[tuple]:
    """The accuracies and losses of every L1/L2/G row: what must not change between modes."""
    keep = ("acc", "loss")
    return sorted(
        (
            row["round"],
            row["stage"],
            row.get("client", -1),
            *(float(v) for k, v in sorted(row.items()) if k.startswith(keep)),
        )
        for row in read_rows(run_dir)
        if row["stage"] in ("G", "L1", "L2")
    )


def first_difference(deployed: list[tuple], simulated: list[tuple]) -> list | None:
    """The first (deployment, simulation) pair of result rows that differ, or None."""
    if len(deployed) != len(simulated):
        return [f"{len(deployed)} rows", f"{len(simulated)} rows"]
    for mine, theirs in zip(deployed, simulated, strict=True):
        if mine != theirs:
            return [list(mine), list(theirs)]
    return None


def messages_per_round(logs: list[Path]) -> float:
    """Messages the SuperNodes received per round of a run (the median over every run's
    rounds), from their logs."""
    per_round: dict[tuple[str, str], int] = {}
    for log in logs:
        current = None
        for line in log.read_text(errors="replace").splitlines():
            if match := re.search(r"\[RUN (\d+), ROUND (\d+)\]", line):
                current = (match.group(1), match.group(2))
            elif "Receiving:" in line and current is not None:
                per_round[current] = per_round.get(current, 0) + 1
    return statistics.median(per_round.values()) if per_round else float("nan")


def task_times(logs: list[Path]) -> list[float]:
    """How long each ClientApp task's forked child ran (the fork server's log lines)."""
    from pflower.runtime.forkserver import TASK_LOG_PREFIX

    pattern = re.compile(re.escape(TASK_LOG_PREFIX) + r" \d+ ran ([0-9.]+) s")
    return [
        float(match.group(1))
        for log in logs
        for match in pattern.finditer(log.read_text(errors="replace"))
    ]


def first_round_s(run_dir: Path, submitted: float) -> float:
    """Seconds from submitting a run to the end of its first training phase: the ServerApp's
    start (a new process, or a fork of the SuperLink's fork server) and one round's training."""
    return (
        min(row["fit_done_unix_s"] for row in read_rows(run_dir) if row["stage"] == "time")
        - submitted
    )


def run_deployment(directory: Path, overrides: list[str], fast: bool) -> dict[str, Any]:
    """(a): 3 SuperNodes on loopback, the run submitted and followed to its end; then the same
    run again on the same deployment (its start once every process is warm)."""
    endpoints = Endpoints(fleet_port=free_port(), control_port=free_port(), node_port=free_port())
    num_nodes = 3
    deployment = Deployment(directory / "deployment", num_nodes, endpoints, fast_rounds=fast)
    run_dir, again_dir = directory / "deployed", directory / "deployed-again"
    try:
        started = time.time()
        deployment.start_superlink()
        for index in range(num_nodes):
            deployment.start_supernode(index, runtime_port=free_port())
        deployment.control.wait_for_nodes(num_nodes, timeout=120)
        ready = time.time()
        run_id = deployment.control.submit(RunRecord((*overrides,), run_dir))
        status = deployment.control.wait_for_run(run_id, RUN_TIMEOUT)
        finished = time.time()
        again_id = deployment.control.submit(RunRecord((*overrides,), again_dir))
        again_status = deployment.control.wait_for_run(again_id, RUN_TIMEOUT)
    finally:
        deployment.stop_all()
    if status != "finished:completed" or again_status != "finished:completed":
        raise RuntimeError(
            f"the deployed runs ended {status}, {again_status}; logs in {deployment.logs}"
        )
    logs = [Path(deployment.processes[f"supernode-{i}"].log) for i in range(num_nodes)]
    times = round_times(run_dir)
    tasks = task_times(logs)
    return {
        "forked_task_s": {
            "count": len(tasks),
            "median": statistics.median(tasks) if tasks else None,
            "max": max(tasks) if tasks else None,
        },
        "launch": "fast" if fast else "plain",
        "round_times_s": times,
        "steady_round_s": statistics.median(times),
        "nodes_online_s": ready - started,
        "run_s": finished - ready,
        "first_round_s": {
            "first_run": first_round_s(run_dir, ready),
            "second_run": first_round_s(again_dir, finished),
        },
        "messages_per_round": messages_per_round(logs),
        "results": results_of(run_dir),
    }


def run_simulation(directory: Path, overrides: list[str]) -> dict[str, Any]:
    """(b): the Ray simulation of the same overrides."""
    run_dir = directory / "simulated"
    started = time.time()
    subprocess.run(
        [
            str(Path(sys.executable).parent / "pflower"),
            *overrides,
            f"output_dir={run_dir}",
            f"hydra.run.dir={directory / 'hydra'}",
        ],
        check=True,
        capture_output=True,
    )
    times = round_times(run_dir)
    return {
        "round_times_s": times,
        "steady_round_s": statistics.median(times),
        "run_s": time.time() - started,
        "results": results_of(run_dir),
    }


def clientapp_cold_start() -> float:
    """Wall time of a fresh process importing what every plain ClientApp process imports."""
    code = "import flwr.supernode.cli.flwr_clientapp, pflower.client.app"
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - began


def fork_start(repeats: int = 3) -> float:
    """Median wall time of a task through the fork server: connect, fork, exit, with pflower's
    ClientApp imported in the server; the server's own imports happen before and are not
    timed."""
    from pflower.deploy.launcher import CLIENTAPP_PRELOAD
    from pflower.runtime.forkserver import ForkServerProcess

    with tempfile.TemporaryDirectory(prefix="pff-") as tmp:
        server = ForkServerProcess.start(
            Path(tmp), target="pflower.runtime.forkapp:empty_task", app=CLIENTAPP_PRELOAD
        )
        try:
            server.wait_ready(timeout=300)
            samples = []
            for _ in range(repeats):
                began = time.perf_counter()
                subprocess.run([str(server.shim)], check=True, env=server.environment())
                samples.append(time.perf_counter() - began)
        finally:
            server.stop()
    return statistics.median(samples)


def machine() -> str:
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{psutil.cpu_count()} CPUs ({model}), {psutil.virtual_memory().total / 2**30:.0f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--launch", choices=["fast", "plain", "both"], default="fast")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument(
        "--keep", type=Path, default=None, help="run in this folder and keep it (logs, metrics)"
    )
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra Hydra overrides"
    )
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (the steady state is rounds 2..N)")
    overrides = [*WORKLOAD, *args.set, f"rounds={args.rounds}"]
    modes = {"fast": [True], "plain": [False], "both": [False, True]}[args.launch]
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "command": shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "workload": overrides,
        "load_average_before": os.getloadavg(),
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="pflower-deploy-bench-") as tmp:
        if args.keep is not None:
            tmp = str(args.keep.resolve())
        for fast in modes:
            root = Path(tmp) / ("fast" if fast else "plain")
            deployed = run_deployment(root, overrides, fast)
            simulated = run_simulation(root, overrides)
            result["runs"].append(
                {
                    "deployment": {k: v for k, v in deployed.items() if k != "results"},
                    "simulation": {k: v for k, v in simulated.items() if k != "results"},
                    "overhead_per_round_s": deployed["steady_round_s"]
                    - simulated["steady_round_s"],
                    "same_results": deployed["results"] == simulated["results"],
                    "first_difference": first_difference(deployed["results"], simulated["results"]),
                }
            )
    result["breakdown"] = {
        "clientapp_cold_start_s": clientapp_cold_start(),
        "fork_start_s": fork_start(),
        "polling_s": {"flower": FLOWER_POLLING_S, "fast": fast_polling()},
    }
    result["load_average_after"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "deploy_overhead.json").write_text(json.dumps(result, indent=2))
    write_table(args.out / "deploy_overhead.md", result)
    print(json.dumps(result, indent=2))


def fast_polling() -> dict[str, float]:
    from pflower.deploy.launcher import POLLING

    return POLLING.as_dict()


def write_table(table: Path, result: dict[str, Any]) -> None:
    header = (
        "| date (UTC) | machine | command | launch | deployment round (s) | simulation round (s) "
        "| overhead per round (s) | same results | messages per round | ClientApp cold start (s) "
        "| fork-server start (s) | round 1 after submit, 1st/2nd run (s) | load before/after |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    breakdown = result["breakdown"]
    load = f"{result['load_average_before'][0]:.1f}/{result['load_average_after'][0]:.1f}"
    lines = []
    for run in result["runs"]:
        deployed, simulated = run["deployment"], run["simulation"]
        lines.append(
            f"| {result['date']} | {result['machine']} | `{result['command']}` | "
            f"{deployed['launch']} | {deployed['steady_round_s']:.2f} | "
            f"{simulated['steady_round_s']:.2f} | **{run['overhead_per_round_s']:.2f}** | "
            f"{'yes' if run['same_results'] else 'NO'} | {deployed['messages_per_round']:g} | "
            f"{breakdown['clientapp_cold_start_s']:.2f} | {breakdown['fork_start_s']:.2f} | "
            f"{deployed['first_round_s']['first_run']:.2f}/"
            f"{deployed['first_round_s']['second_run']:.2f} | {load} |\n"
        )
    text = table.read_text() if table.exists() else ""
    if header.splitlines()[0] not in text:
        text += ("\n" if text else "") + header
    # New rows go under the table's last row (notes may follow the table).
    existing = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(existing) if line == header.splitlines(True)[0])
    end = start
    while end < len(existing) and existing[end].startswith("|"):
        end += 1
    table.write_text("".join(existing[:end] + lines + existing[end:]))


if __name__ == "__main__":
    main()
