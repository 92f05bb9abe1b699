"""Overhead of pflower's simulation against a bare PyTorch loop doing the same FedAvg work.

Workload (issue 3): MNIST, FedALA's 4-layer FedAvgCNN, 20 clients on a pathological split
(2 classes each), 1 local epoch, batch 10, SGD (momentum 0.9, pflower's default), 5 rounds, FedAvg.

(a) ``pflower``: the real simulation (the default backend, workers forked from the driver, one
    per CPU; ``--set backend=ray`` for Ray's actors), evaluation only in the last round. Round
    time = time between the ends of consecutive training phases, read from the ``time`` rows of
    metrics.jsonl; steady state = median over rounds 2..4 (round 1 carries
    the workers' start-up, round 5 the evaluation).
(b) ``bare``: one process, the same federation, the same initial model and the same per-client
    mini-batch order and optimizer (``train.*``), plain ``for`` loops over clients and batches,
    FedAvg in numpy.
(c) ``floor`` (the parallel floor): ``--workers`` processes (default: one per CPU, as many as
    pflower's Ray workers with one CPU per client), each with one torch thread, each training its
    share of the same clients with the same batches (shares balanced by training-set size, largest
    first); per round the driver sends every worker the global model and averages what they send
    back. Round time = from sending the model to having the new one; steady state = median over
    rounds 2.. (as for the bare loop).

Both ratios are reported: pflower over the parallel floor, and pflower over the single loop.
A shared VM's speed drifts by minutes (the same floor took 10.6 s and 29.3 s on one day), so
``--pairs K`` runs (a) and (c) alternately K times: the row gives the medians of their steady
rounds and the median of the K ratios, each measured minutes apart, and ``overhead.json`` every
run. The single loop runs once, after the pairs.

Usage::

    python benchmarks/overhead.py [--rounds 5] [--pairs 3] [--threads 2] [--workers N]
        [--out DIR] [--set key=value ...] [--mode both|pflower|floor|bare]

``--set`` appends Hydra overrides to the workload (e.g. a tiny check: ``--set dataset=digits
model=small_cnn num_clients=4 --rounds 2``). Writes ``overhead.json`` and appends a line to
``overhead.md`` in the output folder; ``--mode pflower`` runs (a) alone and only prints it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import psutil
import torch

from pflower.compose import compose_config
from pflower.core.aggregation import weighted_mean
from pflower.core.experiment import ClientData, Experiment
from pflower.core.training import batch_indices, get_weights, set_weights

WORKLOAD = [
    "dataset=mnist",
    "model=fedavg_cnn",
    "partition=pathological",
    "partition.classes_per_client=2",
    "strategy=fedavg",
    "num_clients=20",
    "train.local_epochs=1",
    "train.batch_size=10",
    "train.optimizer=sgd",
    "train.lr=0.01",
    "eval.every=1000",
    "eval.global_test_max_samples=1000",
    "progress=false",
]


class PeakMemory:
    """Samples the memory of this process and all its descendants (Ray workers included): the
    peak of the summed RSS (pages shared between processes, such as a memory-mapped dataset or
    the libraries, count once per process) and the peak of the summed PSS (each shared page split
    among its sharers: what the processes take from the machine together)."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.peak_pss_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            rss = pss = 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    info = proc.memory_full_info()
                except psutil.Error:
                    continue
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
            self.peak_bytes = max(self.peak_bytes, rss)
            self.peak_pss_bytes = max(self.peak_pss_bytes, pss)
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def machine_description() -> str:
    """The machine a benchmark ran on, as recorded beside its figures."""
    return (
        f"{platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    )


def append_row(table: Path, header: str, row: str) -> None:
    """Append ``row`` to the Markdown results ``table``, under ``header`` (a new table follows
    the old ones when the columns changed)."""
    text = table.read_text() if table.exists() else ""
    if header.splitlines()[0] not in text:
        text += ("\n" if text else "") + header
    table.write_text(text + row)


STARTUP_MARKS = {
    "driver": "Starting Flower ServerApp",
    "ray": "Constructed ActorPool",
}
"""run.log lines that end the start-up phases: the driver (interpreter, imports, configuration,
dataset and federation; with ``backend=fork`` also forking the workers) hands over to the
ServerApp; Ray is up with its client actors (``backend=ray`` only)."""


def startup_phases(
    log: Path, started: float, first_fit_done: float, steady: float
) -> dict[str, float | None]:
    """Where the start-up went, from the timestamps of run.log: ``driver`` (process start to the
    ServerApp), ``ray`` (to Ray and its actor pool being up; None without Ray), ``workers`` (the
    first round less a steady round: the actors' processes starting, importing torch, Flower and
    pflower, reading their data, and torch's first-use costs such as ``torch.optim`` importing
    ``torch._dynamo``; forked workers start with all of that done but torch's first use).
    """
    marks: dict[str, float] = {}
    for line in log.read_text().splitlines():
        for phase, text in STARTUP_MARKS.items():
            if text in line and phase not in marks:
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                marks[phase] = stamp.timestamp()
    if "driver" not in marks:
        return {}
    workers_from = marks.get("ray", marks["driver"])
    return {
        "driver": marks["driver"] - started,
        "ray": marks["ray"] - marks["driver"] if "ray" in marks else None,
        "workers": first_fit_done - workers_from - steady,
    }


class RunUnfinished(Exception):
    """The pflower run was stopped at its time limit after ``rounds_done`` training rounds."""

    def __init__(self, rounds_done: int, time_limit_s: float) -> None:
        super().__init__(f"{rounds_done} rounds done within {time_limit_s:.0f} s")
        self.rounds_done = rounds_done
        self.time_limit_s = time_limit_s


def fit_done_times(run_dir: Path) -> list[float]:
    """When each round's training phase ended (metrics.jsonl ``time`` rows), in round order."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return []
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [
        r["fit_done_unix_s"] for r in sorted(rows, key=lambda r: r["round"]) if r["stage"] == "time"
    ]


def run_pflower(
    rounds: int,
    run_dir: Path,
    workload: list[str],
    time_limit_s: float | None = None,
    steady_intervals: slice | None = None,
) -> dict:
    """(a): the pflower simulation in a child process; round times from metrics.jsonl.

    The steady round is the median of ``round_times[steady_intervals]`` (interval k ends round
    k + 2; default: all but the last two), the start-up the first round less one steady round.
    With ``time_limit_s``, a run still going then is killed and :class:`RunUnfinished` says how
    many rounds it had done."""
    started = time.time()
    with PeakMemory() as memory:
        try:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pflower",
                    *workload,
                    f"rounds={rounds}",
                    f"output_dir={run_dir}",
                ],
                check=True,
                timeout=time_limit_s,
            )
        except subprocess.TimeoutExpired as stopped:
            raise RunUnfinished(len(fit_done_times(run_dir)), stopped.timeout) from None
    done = fit_done_times(run_dir)
    round_times = list(np.diff(done))
    steady_slice = steady_intervals or slice(None, max(1, rounds - 2))
    steady = statistics.median(round_times[steady_slice] or round_times)
    return {
        "round_times_s": round_times,
        "steady_round_s": steady,
        "startup_s": done[0] - started - steady,
        "startup_phases_s": startup_phases(run_dir / "run.log", started, done[0], steady),
        "total_s": time.time() - started,
        "peak_rss_mb": memory.peak_bytes / 2**20,
        "peak_pss_mb": memory.peak_pss_bytes / 2**20,
    }


def train_client(
    model: torch.nn.Module,
    data: ClientData,
    global_weights: list[np.ndarray],
    experiment: Experiment,
    server_round: int,
    normalize: Callable[[torch.Tensor], torch.Tensor],
) -> list[np.ndarray]:
    """One client's local epoch from ``global_weights``: the batches pflower's clients draw and
    the optimizer they build (``train.*``: SGD with pflower's default momentum 0.9 here)."""
    criterion = torch.nn.CrossEntropyLoss()
    set_weights(model, global_weights)
    model.train()
    settings = experiment.train_settings(server_round)
    optimizer = settings.make_optimizer(model.parameters())
    seed = np.random.SeedSequence([experiment.settings.seed, server_round, data.partition_id])
    generator = torch.Generator().manual_seed(int(seed.generate_state(1)[0]))
    for index in batch_indices(len(data.train), settings.batch_size, generator, epochs=1):
        optimizer.zero_grad(set_to_none=True)
        images = normalize(data.train.images[index])
        loss = criterion(model(images), data.train.labels[index])
        loss.backward()
        optimizer.step()
    return get_weights(model)


def run_bare(rounds: int, threads: int, workload: list[str]) -> dict:
    """(b): the same FedAvg work as plain loops in this process."""
    torch.set_num_threads(threads)
    cfg = compose_config([*workload, f"rounds={rounds}"])
    started = time.time()
    experiment = Experiment(cfg)
    federation = experiment.federation
    model = experiment.new_model()
    global_weights = get_weights(model)
    clients = [experiment.client_data(pid) for pid in range(cfg.num_clients)]
    startup = time.time() - started
    round_times = []
    for server_round in range(1, rounds + 1):
        begin = time.perf_counter()
        uploads, sizes = [], []
        for data in clients:
            uploads.append(
                train_client(
                    model,
                    data,
                    global_weights,
                    experiment,
                    server_round,
                    federation.dataset.normalize,
                )
            )
            sizes.append(len(data.train))
        global_weights = weighted_mean(uploads, np.asarray(sizes, dtype=np.float64))
        round_times.append(time.perf_counter() - begin)
    return {
        "threads": threads,
        "round_times_s": round_times,
        "steady_round_s": statistics.median(round_times[1:]),
        "startup_s": startup,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "final_model_sum": model_sum(global_weights),
    }


def model_sum(weights: list[np.ndarray]) -> float:
    """Sum of every entry of a model: the floor and the single loop must end at the same model
    (up to summation order), which shows they did the same work."""
    return float(sum(np.sum(np.asarray(a, dtype=np.float64)) for a in weights))


def balanced_shares(sizes: list[int], workers: int) -> list[list[int]]:
    """Client ids per worker: largest training set first, each to the least loaded worker."""
    shares: list[list[int]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for pid in sorted(range(len(sizes)), key=lambda p: (-sizes[p], p)):
        worker = loads.index(min(loads))
        shares[worker].append(pid)
        loads[worker] += sizes[pid]
    return shares


def _floor_worker(
    share: list[int],
    workload: list[str],
    commands: multiprocessing.Queue,
    results: multiprocessing.Queue,
) -> None:
    """One process of the parallel floor: one torch thread, its share of the clients."""
    torch.set_num_threads(1)
    cfg = compose_config(workload)
    experiment = Experiment(cfg)
    normalize = experiment.federation.dataset.normalize
    model = experiment.new_model()
    clients = [experiment.client_data(pid) for pid in share]
    results.put(("ready", None, None))
    while (message := commands.get()) is not None:
        server_round, global_weights = message
        summed: list[np.ndarray] | None = None
        total = 0
        for data in clients:
            trained = train_client(model, data, global_weights, experiment, server_round, normalize)
            size = len(data.train)
            scaled = [np.asarray(a, dtype=np.float64) * size for a in trained]
            summed = (
                scaled if summed is None else [s + a for s, a in zip(summed, scaled, strict=True)]
            )
            total += size
        results.put(("round", summed, total))
    results.put(("rss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, None))


def run_floor(rounds: int, workers: int, workload: list[str]) -> dict:
    """(c): the parallel floor, ``workers`` single-thread processes (see the module docstring)."""
    cfg = compose_config([*workload, f"rounds={rounds}"])
    experiment = Experiment(cfg)
    sizes = [len(experiment.federation.clients[pid].train) for pid in range(cfg.num_clients)]
    global_weights = experiment.initial_weights()
    shares = [share for share in balanced_shares(sizes, workers) if share]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    commands = [context.Queue() for _ in shares]
    started = time.time()
    with PeakMemory() as memory:
        processes = [
            context.Process(
                target=_floor_worker, args=(share, [*workload, f"rounds={rounds}"], queue, results)
            )
            for share, queue in zip(shares, commands, strict=True)
        ]
        for process in processes:
            process.start()
        for _ in processes:
            assert results.get()[0] == "ready"
        startup = time.time() - started
        round_times = []
        for server_round in range(1, rounds + 1):
            begin = time.perf_counter()
            for queue in commands:
                queue.put((server_round, global_weights))
            replies = [results.get() for _ in processes]
            total = sum(reply[2] for reply in replies)
            summed = [
                sum(reply[1][index] for reply in replies) for index in range(len(global_weights))
            ]
            global_weights = [
                (s / total).astype(np.asarray(g).dtype)
                for s, g in zip(summed, global_weights, strict=True)
            ]
            round_times.append(time.perf_counter() - begin)
        for queue in commands:
            queue.put(None)
        worker_rss = [results.get()[1] for _ in processes]
        for process in processes:
            process.join()
    return {
        "workers": len(processes),
        "clients_per_worker": [len(share) for share in shares],
        "samples_per_worker": [sum(sizes[pid] for pid in share) for share in shares],
        "round_times_s": round_times,
        "steady_round_s": statistics.median(round_times[1:] or round_times),
        "startup_s": startup,
        "peak_rss_mb": memory.peak_bytes / 2**20,
        "worker_peak_rss_mb": worker_rss,
        "final_model_sum": model_sum(global_weights),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the bare loop")
    parser.add_argument(
        "--pairs", type=int, default=3, help="pflower and floor runs, alternating (medians)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes of the parallel floor (default: one per CPU)",
    )
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra Hydra overrides"
    )
    parser.add_argument(
        "--mode",
        choices=["both", "bare", "floor", "pflower"],
        default="both",
        help="both: all three and a results row; pflower/bare/floor: that one, as JSON only",
    )
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error(f"--pairs must be at least 1, got {args.pairs}")
    workload = [*WORKLOAD, *args.set]
    if args.mode == "pflower":  # e.g. an A/B of two backends, alternating
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run_pflower(args.rounds, Path(tmp) / "run", workload)))
        return
    if args.mode == "bare":  # run in a child so its peak RSS is its own
        print(json.dumps(run_bare(args.rounds, args.threads, workload)))
        return
    if args.mode == "floor":
        print(json.dumps(run_floor(args.rounds, args.workers, workload)))
        return
    pflower_runs, floor_runs = [], []
    for _ in range(args.pairs):
        with tempfile.TemporaryDirectory() as tmp:
            pflower_runs.append(run_pflower(args.rounds, Path(tmp) / "run", workload))
        floor_runs.append(run_child("floor", args, workload))
    bare = run_child("bare", args, workload)
    pflower, floor = typical_run(pflower_runs), typical_run(floor_runs)
    pair_ratios = [
        p["steady_round_s"] / f["steady_round_s"]
        for p, f in zip(pflower_runs, floor_runs, strict=True)
    ]
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_description(),
        "workload": [*workload, f"rounds={args.rounds}"],
        "pflower": pflower,
        "floor": floor,
        "bare": bare,
        "pflower_runs": pflower_runs,
        "floor_runs": floor_runs,
        "pair_ratios_pflower_over_floor": pair_ratios,
        "steady_ratio_pflower_over_floor": statistics.median(pair_ratios),
        "steady_ratio_pflower_over_bare": pflower["steady_round_s"] / bare["steady_round_s"],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overhead.json").write_text(json.dumps(result, indent=2))
    phases = (
        " / ".join("-" if v is None else f"{v:.1f}" for v in pflower["startup_phases_s"].values())
        or "-"
    )
    ratios = " ".join(f"{r:.2f}" for r in pair_ratios)
    pairs = f" ({args.pairs} pairs, ratios {ratios})" if args.pairs > 1 else ""
    line = (
        f"| {result['date']} | {result['machine']}{pairs} | "
        f"{pflower['steady_round_s']:.2f} | "
        f"{floor['steady_round_s']:.2f} ({floor['workers']} workers) | "
        f"{bare['steady_round_s']:.2f} ({bare['threads']} threads) | "
        f"{result['steady_ratio_pflower_over_floor']:.2f} | "
        f"{result['steady_ratio_pflower_over_bare']:.2f} | {pflower['startup_s']:.1f} "
        f"({phases}) | "
        f"{pflower['peak_rss_mb']:.0f} | {pflower['peak_pss_mb']:.0f} | "
        f"{floor['peak_rss_mb']:.0f} | {bare['peak_rss_mb']:.0f} |\n"
    )
    header = (
        "| date | machine | pflower round (s) | parallel floor round (s) | single loop round (s) "
        "| pflower / floor | pflower / single loop "
        "| pflower start-up (s) (driver / Ray / workers) "
        "| pflower peak RSS (MB) | pflower peak PSS (MB) | floor peak RSS (MB) "
        "| single loop peak RSS (MB) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    append_row(args.out / "overhead.md", header, line)
    print(json.dumps(result, indent=2))


def typical_run(runs: list[dict]) -> dict:
    """The run whose steady round is the median of ``runs`` (the lower one of an even count),
    with the peak memory of all of them."""
    ordered = sorted(runs, key=lambda run: run["steady_round_s"])
    typical = dict(ordered[(len(ordered) - 1) // 2])
    for key in ("peak_rss_mb", "peak_pss_mb"):
        if key in typical:
            typical[key] = max(run[key] for run in runs)
    return typical


def run_child(mode: str, args: argparse.Namespace, workload: list[str]) -> dict:
    """Run ``--mode bare`` or ``--mode floor`` in a child, so that its peak RSS is its own."""
    extra = ["--set", *args.set] if args.set else []
    return json.loads(
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--mode",
                mode,
                "--rounds",
                str(args.rounds),
                "--threads",
                str(args.threads),
                "--workers",
                str(args.workers),
                *extra,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )


if __name__ == "__main__":
    main()
