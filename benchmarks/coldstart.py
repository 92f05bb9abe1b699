"""The first local epoch of a fresh process against a warm one: what torch imports lazily.

torch's optimizers import ``torch._dynamo`` the first time one is built and stepped
(``Optimizer.add_param_group`` and ``zero_grad`` are wrapped in ``torch._disable_dynamo``, and
``step`` in ``_use_grad_for_differentiable``, both of which import ``torch._dynamo``: 2.5-3 s on
a 2-core machine, about 900 modules with sympy and parts of ``torch.distributed``). The import
cannot be avoided by optimizer flags (``foreach``/``fused`` change neither wrapper); it can only
be paid where it costs least: once in a process that forks the training processes
(:func:`pflower.core.training.import_first_step_modules`).

Workload (issue 39): FedALA's MNIST CNN (``+experiment=fedala_table2_paper``: Dir(0.1)-style
practical partition of PFLlib, 20 clients, batch 10, SGD lr 0.1) on client 0, one torch thread,
two local epochs timed separately (the first is "cold", the second "warm"). Cases, alternated in
one invocation so that they see the same machine load:

- ``fresh``: a fresh interpreter imports pflower, builds the client, trains: what a Ray actor, a
  deployment ClientApp started without the fork server, or a test process paid before.
- ``fresh-preloaded``: the same with :func:`~pflower.core.training.import_first_step_modules`
  called right after the imports: the cost moves from the first epoch to the start-up.
- ``forked``: a parent that imported pflower and built the client forks a child that trains
  (the fork backend and the deployment's fork server before they pre-imported it).
- ``forked-preloaded``: the parent also called ``import_first_step_modules`` before forking (what
  both do now): the child's first epoch is a warm one.

Reported per run: ``startup_s`` (interpreter start to the client being built, preloading
included; ``preload_s`` is the preloading alone), ``epoch1_s``, ``epoch2_s`` and ``total_s``;
for the forked cases the parent's start-up is not part of the child's total (it is paid once
for all children).

Usage::

    python benchmarks/coldstart.py [--pairs 3] [--cases fresh fresh-preloaded forked ...]
        [--out benchmarks/results] [--set KEY=VALUE ...]

Appends one row per case (medians over the pairs) to ``coldstart.md`` and writes
``coldstart.json`` (every run) in ``--out``. ``--set dataset=digits`` etc. gives a quick check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

WORKLOAD = ["+experiment=fedala_table2_paper", "train.threads=1"]

CASES = ("fresh", "fresh-preloaded", "forked", "forked-preloaded")

PROBE = """
import json, os, sys, time
started = float(sys.argv[1]); case = sys.argv[2]; overrides = json.loads(sys.argv[3])
import torch
from pflower.compose import compose_config
from pflower.core.experiment import Experiment
from pflower.core.training import import_first_step_modules, train
torch.set_num_threads(1)
experiment = Experiment(compose_config(overrides))
data = experiment.client_data(0)
model = experiment.new_model()
preload = time.perf_counter()
if case.endswith("preloaded"):
    import_first_step_modules()
preload = time.perf_counter() - preload
def epochs(start):
    generator = torch.Generator().manual_seed(0)
    settings = experiment.train_settings(1)
    times = []
    for _ in range(2):
        begin = time.perf_counter()
        train(model, data.train, data.prepare, settings, generator)
        times.append(time.perf_counter() - begin)
    return {"startup_s": start, "epoch1_s": times[0], "epoch2_s": times[1],
            "total_s": start + sum(times), "preload_s": preload,
            "dynamo_before_epoch1": dynamo}
dynamo = "torch._dynamo" in sys.modules
ready = time.time() - started
if case.startswith("forked"):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, json.dumps(epochs(0.0)).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.waitpid(pid, 0)
    result = json.loads(b"".join(chunks))
    result["parent_startup_s"] = ready
else:
    result = epochs(ready)
print(json.dumps(result))
"""


def run_case(case: str, overrides: list[str]) -> dict:
    """One fresh interpreter running ``case``; its figures."""
    started = time.time()
    output = subprocess.run(
        [sys.executable, "-c", PROBE, repr(started), case, json.dumps(overrides)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    ).stdout
    return {"case": case, **json.loads(output.strip().splitlines()[-1])}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from overhead import append_row, machine_description

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=CASES)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    overrides = [*WORKLOAD, *args.set]
    run_case(args.cases[0], overrides)  # fills the dataset and federation caches: not counted
    runs = []
    for _ in range(args.pairs):
        for case in args.cases:
            load = os.getloadavg()[0]
            runs.append({**run_case(case, overrides), "load_before": load})
            print(json.dumps(runs[-1]), flush=True)
    date = datetime.now(UTC).isoformat(timespec="seconds")
    machine = machine_description()
    args.out.mkdir(parents=True, exist_ok=True)
    header = (
        "| date | machine | case | runs | start-up (s) | epoch 1 (s) | epoch 2 (s) "
        "| total (s) | loads before runs | overrides |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for case in args.cases:
        mine = [run for run in runs if run["case"] == case]

        def cell(key: str, mine: list[dict] = mine) -> str:
            values = [run[key] for run in mine]
            listed = ", ".join(f"{v:.2f}" for v in values)
            return f"{statistics.median(values):.2f} ({listed})"

        startup = cell("startup_s")
        if "parent_startup_s" in mine[0]:
            startup = f"0 (parent once: {cell('parent_startup_s')})"
        if case.endswith("preloaded"):
            startup += f"; preload {cell('preload_s')}"
        loads = ", ".join(f"{run['load_before']:.1f}" for run in mine)
        append_row(
            args.out / "coldstart.md",
            header,
            f"| {date} | {machine} | {case} | {len(mine)} | {startup} | {cell('epoch1_s')} "
            f"| {cell('epoch2_s')} | {cell('total_s')} | {loads} | `{' '.join(overrides)}` |\n",
        )
    store = args.out / "coldstart.json"
    earlier = json.loads(store.read_text()) if store.exists() else []
    store.write_text(
        json.dumps([*earlier, {"date": date, "machine": machine, "runs": runs}], indent=2)
    )


if __name__ == "__main__":
    main()
