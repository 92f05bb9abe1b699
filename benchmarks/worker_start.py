"""What a client process pays before its first message: imports, configuration and its data.

Every Ray worker of a simulation and every ClientApp process of a deployment starts by importing
pflower, composing the run's configuration and building its client's data. This benchmark starts
fresh interpreters that do exactly that (``config_from_run_config``, ``Experiment.client_data``) for
the overhead benchmark's workload (MNIST, 20 pathological clients, FedAvgCNN), alternating two
cases in one invocation so that they see the same machine load:

- ``cold``: an empty federation cache: the process computes the federation, which imports the
  partition schemes (and with them Flower Datasets, Hugging Face ``datasets``, pandas, seaborn);
- ``warm``: the federation is in the cache (the server, or the first worker, computed it), as for
  every client process after the first.

The dataset cache is warm in both (decoded once beforehand). Reported per case: median wall time
of imports and of configuration plus data, peak RSS of the process, and whether Flower Datasets
was imported.

Usage::

    python benchmarks/worker_start.py [--repeats 3] [--out benchmarks/results]

Appends a line to ``worker_start.md`` and writes ``worker_start.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OVERRIDES = "dataset=mnist partition=pathological num_clients=20 model=fedavg_cnn"

PROBE = f"""
import json, resource, sys, time
started = time.perf_counter()
import pflower.client.app
from pflower.compose import config_from_run_config
from pflower.core.experiment import Experiment
imported = time.perf_counter()
cfg = config_from_run_config({{"overrides": "{OVERRIDES}"}})
Experiment.of(cfg).client_data(3)
built = time.perf_counter()
print(json.dumps({{
    "imports_s": imported - started,
    "config_and_data_s": built - imported,
    "total_s": built - started,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "flower_datasets_imported": "flwr_datasets" in sys.modules,
}}))
"""


def probe(cache: Path) -> dict[str, float | bool]:
    """One fresh interpreter doing a client process's start-up against ``cache``."""
    env = {**os.environ, "PFLOWER_CACHE": str(cache)}
    output = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, check=True, capture_output=True, text=True
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def summarize(runs: list[dict[str, float | bool]]) -> dict[str, float | bool]:
    keys = ("imports_s", "config_and_data_s", "total_s", "peak_rss_mb")
    summary: dict[str, float | bool] = {
        key: statistics.median(float(run[key]) for run in runs) for key in keys
    }
    summary["flower_datasets_imported"] = any(run["flower_datasets_imported"] for run in runs)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pflower-worker-start-"))
    try:
        warm_cache = root / "warm"
        probe(warm_cache)  # decodes MNIST and computes the federation once
        runs: dict[str, list[dict[str, float | bool]]] = {"cold": [], "warm": []}
        for repeat in range(args.repeats):
            cold_cache = root / f"cold{repeat}"
            shutil.copytree(warm_cache, cold_cache)
            shutil.rmtree(cold_cache / "federations")  # the dataset stays decoded
            runs["cold"].append(probe(cold_cache))
            runs["warm"].append(probe(warm_cache))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_1min": os.getloadavg()[0],
        "command": f"python benchmarks/worker_start.py --repeats {args.repeats}",
        "cases": {case: summarize(case_runs) for case, case_runs in runs.items()},
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "worker_start.json").write_text(json.dumps(result, indent=2) + "\n")
    cold, warm = result["cases"]["cold"], result["cases"]["warm"]
    line = (
        f"| {result['date']} | {result['load_1min']:.1f} | {cold['total_s']:.2f} | "
        f"{warm['total_s']:.2f} | {warm['total_s'] / cold['total_s']:.2f} | "
        f"{cold['peak_rss_mb']:.0f} | {warm['peak_rss_mb']:.0f} | "
        f"{cold['flower_datasets_imported']} / {warm['flower_datasets_imported']} |\n"
    )
    table = args.out / "worker_start.md"
    if not table.exists():
        table.write_text(
            "# worker_start (`python benchmarks/worker_start.py`)\n\n"
            "Medians over the repeats; cold = federation computed in the process, warm = read "
            "from the cache.\n\n"
            "| date | load (1 min) | cold start-up (s) | warm start-up (s) | warm / cold | "
            "cold peak RSS (MB) | warm peak RSS (MB) | Flower Datasets imported (cold / warm) |\n"
            "|---|---|---|---|---|---|---|---|\n"
        )
    with table.open("a") as stream:
        stream.write(line)
    print(json.dumps(result["cases"], indent=2))


if __name__ == "__main__":
    main()
