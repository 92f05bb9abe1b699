"""What holding a dataset costs per process when several processes build the same experiment.

Starts ``--processes`` fresh interpreters (as Ray starts its ClientApp workers), each of which
builds the overhead benchmark's experiment (MNIST, 20 pathological clients), its global test set
and the data of every client, as a worker does over the rounds. When all of them are done and
still alive, it reads ``/proc/<pid>/smaps_rollup`` of each: ``Rss`` counts every resident page the
process maps (pages shared with other processes counted in full in each), ``Pss`` divides each
shared page among the processes that map it (the honest per-process share; the sum of Pss is the
machine's real use), ``Private`` is what no other process shares. A baseline process that only
imports the same modules shows what torch and pflower cost without any data.

Usage::

    python benchmarks/dataset_memory.py [--processes 3] [--set key=value ...]

Nothing is written; the figures are printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import time

WORKLOAD = [
    "dataset=mnist",
    "model=fedavg_cnn",
    "partition=pathological",
    "partition.classes_per_client=2",
    "num_clients=20",
    "eval.global_test_max_samples=1000",
]


def smaps_rollup(pid: int) -> dict[str, float]:
    """Rss, Pss, private and shared figures of a process in MB (Linux only)."""
    fields: dict[str, float] = {}
    with open(f"/proc/{pid}/smaps_rollup") as stream:
        for line in stream:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) / 1024
    return {
        "rss_mb": fields["Rss"],
        "pss_mb": fields["Pss"],
        "private_mb": fields["Private_Clean"] + fields["Private_Dirty"],
        "shared_mb": fields["Shared_Clean"] + fields["Shared_Dirty"],
    }


def _worker(build: bool, workload: list[str], ready, done) -> None:
    import torch

    from pflower.compose import compose_config
    from pflower.core.experiment import Experiment

    torch.set_num_threads(1)
    cfg = compose_config(workload)
    started = time.perf_counter()
    if build:
        experiment = Experiment(cfg)
        _ = experiment.global_test
        for pid in range(cfg.num_clients):
            data = experiment.client_data(pid)
            del data
    ready.put(
        (
            os.getpid(),
            time.perf_counter() - started,
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        )
    )
    done.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    workload = [*WORKLOAD, *args.set]
    context = multiprocessing.get_context("spawn")
    ready, done = context.Queue(), context.Event()
    baseline = context.Process(target=_worker, args=(False, workload, ready, done))
    builders = [
        context.Process(target=_worker, args=(True, workload, ready, done))
        for _ in range(args.processes)
    ]
    baseline.start()
    base_pid, _, base_peak = ready.get()
    reports = {}
    for index, process in enumerate(builders):
        process.start()
        if index == 0:  # the first builds alone (and fills any cache), as the server does first
            pid, seconds, peak = ready.get()
            reports[pid] = (seconds, peak)
    for _ in builders[1:]:
        pid, seconds, peak = ready.get()
        reports[pid] = (seconds, peak)
    figures = {"baseline (imports only)": {**smaps_rollup(base_pid), "peak_rss_mb": base_peak}}
    for index, process in enumerate(builders):
        seconds, peak = reports[process.pid]
        figures[f"builder {index}"] = {
            **smaps_rollup(process.pid),
            "peak_rss_mb": peak,
            "build_s": seconds,
        }
    done.set()
    for process in [baseline, *builders]:
        process.join()
    builders_only = [value for key, value in figures.items() if key.startswith("builder")]
    summary = {
        "processes": args.processes,
        "workload": workload,
        "load_average": os.getloadavg(),
        "per_process": figures,
        "sum_rss_mb": sum(f["rss_mb"] for f in builders_only),
        "sum_pss_mb": sum(f["pss_mb"] for f in builders_only),
        "rss_over_baseline_mb": [
            f["rss_mb"] - figures["baseline (imports only)"]["rss_mb"] for f in builders_only
        ],
        "private_over_baseline_mb": [
            f["private_mb"] - figures["baseline (imports only)"]["private_mb"]
            for f in builders_only
        ],
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
