"""Overhead of pflower's simulation against a bare PyTorch loop doing the same FedAvg work.

Workload (issue 3): MNIST, FedALA's 4-layer FedAvgCNN, 20 clients on a pathological split
(2 classes each), 1 local epoch, batch 10, SGD, 5 rounds, FedAvg.

(a) ``pflower``: the real simulation (Ray backend, one CPU per client worker), evaluation only in
    the last round. Round time = time between the ends of consecutive training phases, read from
    the ``time`` rows of metrics.jsonl; steady state = median over rounds 2..4 (round 1 carries
    the workers' start-up, round 5 the evaluation).
(b) ``bare``: one process, the same federation, the same initial model and the same per-client
    mini-batch order, plain ``for`` loops over clients and batches, FedAvg in numpy.

Usage::

    python benchmarks/overhead.py [--rounds 5] [--threads 2] [--out benchmarks/results]

Writes ``overhead.json`` and appends a line to ``overhead.md`` in the output folder.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import psutil
import torch

from pflower.compose import compose_config
from pflower.core.aggregation import weighted_mean
from pflower.core.experiment import Experiment
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
    """Samples the summed RSS of this process and all its descendants (Ray workers included)."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    continue
            self.peak_bytes = max(self.peak_bytes, total)
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_pflower(rounds: int, run_dir: Path) -> dict:
    """(a): the pflower simulation in a child process; round times from metrics.jsonl."""
    started = time.time()
    with PeakMemory() as memory:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pflower",
                *WORKLOAD,
                f"rounds={rounds}",
                f"output_dir={run_dir}",
            ],
            check=True,
        )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    done = [
        r["fit_done_unix_s"] for r in sorted(rows, key=lambda r: r["round"]) if r["stage"] == "time"
    ]
    round_times = list(np.diff(done))
    steady = statistics.median(round_times[: max(1, rounds - 2)])
    return {
        "round_times_s": round_times,
        "steady_round_s": steady,
        "startup_s": done[0] - started - steady,
        "total_s": time.time() - started,
        "peak_rss_mb": memory.peak_bytes / 2**20,
    }


def run_bare(rounds: int, threads: int) -> dict:
    """(b): the same FedAvg work as plain loops in this process."""
    torch.set_num_threads(threads)
    cfg = compose_config([*WORKLOAD, f"rounds={rounds}"])
    started = time.time()
    experiment = Experiment(cfg)
    federation = experiment.federation
    model = experiment.new_model()
    global_weights = get_weights(model)
    clients = [experiment.client_data(pid) for pid in range(cfg.num_clients)]
    criterion = torch.nn.CrossEntropyLoss()
    startup = time.time() - started
    round_times = []
    for server_round in range(1, rounds + 1):
        begin = time.perf_counter()
        uploads, sizes = [], []
        for data in clients:
            set_weights(model, global_weights)
            model.train()
            optimizer = torch.optim.SGD(model.parameters(), lr=cfg.train.lr)
            seed = np.random.SeedSequence([cfg.seed, server_round, data.partition_id])
            generator = torch.Generator().manual_seed(int(seed.generate_state(1)[0]))
            for index in batch_indices(len(data.train), 10, generator, epochs=1):
                optimizer.zero_grad(set_to_none=True)
                images = federation.dataset.normalize(data.train.images[index])
                loss = criterion(model(images), data.train.labels[index])
                loss.backward()
                optimizer.step()
            uploads.append(get_weights(model))
            sizes.append(len(data.train))
        global_weights = weighted_mean(uploads, np.asarray(sizes, dtype=np.float64))
        round_times.append(time.perf_counter() - begin)
    return {
        "threads": threads,
        "round_times_s": round_times,
        "steady_round_s": statistics.median(round_times[1:]),
        "startup_s": startup,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the bare loop")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--mode", choices=["both", "bare"], default="both")
    args = parser.parse_args()
    if args.mode == "bare":  # run in a child so its peak RSS is its own
        print(json.dumps(run_bare(args.rounds, args.threads)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        pflower = run_pflower(args.rounds, Path(tmp) / "run")
    bare = json.loads(
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--mode",
                "bare",
                "--rounds",
                str(args.rounds),
                "--threads",
                str(args.threads),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
        "workload": [*WORKLOAD, f"rounds={args.rounds}"],
        "pflower": pflower,
        "bare": bare,
        "steady_ratio_pflower_over_bare": pflower["steady_round_s"] / bare["steady_round_s"],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overhead.json").write_text(json.dumps(result, indent=2))
    line = (
        f"| {result['date']} | {result['machine']} | {pflower['steady_round_s']:.2f} | "
        f"{bare['steady_round_s']:.2f} ({bare['threads']} threads) | "
        f"{result['steady_ratio_pflower_over_bare']:.2f} | {pflower['startup_s']:.1f} | "
        f"{pflower['peak_rss_mb']:.0f} | {bare['peak_rss_mb']:.0f} |\n"
    )
    table = args.out / "overhead.md"
    if not table.exists():
        table.write_text(
            "| date | machine | pflower round (s) | bare round (s) | ratio | pflower start-up (s) "
            "| pflower peak RSS (MB) | bare peak RSS (MB) |\n|---|---|---|---|---|---|---|---|\n"
        )
    with table.open("a") as handle:
        handle.write(line)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
