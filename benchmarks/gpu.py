"""Time per round of the papers' presets with the clients on a GPU.

Each case is a paper's full-scale preset (``+experiment=<paper>_paper``: its dataset, model,
clients, local epochs and batch size) run for a few rounds with ``train.device=cuda`` by the real
``pflower`` command. ``--backend fork`` (the default, as in pflower) runs them on pflower's
forked workers (one per CPU, all on the one GPU), in a run process forked from a driver that never
initializes CUDA; ``--backend ray`` runs the clients as Ray actors with
``backend.num_gpus_per_client`` set so that several simulated clients share the GPU
(``--clients-per-gpu``). The ``resnet18-cifar`` case times
FedMPR's ResNet-18 (CIFAR stem) on synthetic data of CIFAR-10's shape (50,000 train / 10,000
test images of 3x32x32, 10 classes): timing needs the right shapes, not the real images.

Round time = time between the ends of consecutive training phases (metrics.jsonl ``time`` rows),
steady state = median over rounds 3..R (``STEADY_INTERVALS``): the first round carries the
workers' start-up and CUDA initialization, and the second an algorithm's one-off work (FedALA's
start phase trains the ALA weights to convergence there: 22-30 s of a 4.5-7 s round on an H200).
``--device cpu`` runs the same cases on the CPU, for a ratio measured on the same machine.

Usage::

    python benchmarks/gpu.py [--cases fliu fedala flame fedmpr diversifed resnet18-cifar]
        [--rounds 4] [--backend fork|ray] [--clients-per-gpu 4] [--device cuda|cpu] [--out DIR]
        [--case-limit SECONDS] [--set KEY=VALUE ...]

Writes ``gpu.json`` and appends one row per case to ``gpu.md`` in the output folder. With
``--case-limit``, a case still running after that many seconds is stopped, and its row says how
many rounds it did, so that a slow case cannot take a short GPU lease with it. Without a
CUDA device (and ``--device cuda``) it says so and exits 2 before running anything.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import torch
from overhead import RunUnfinished, append_row, machine_description, run_pflower

STEADY_INTERVALS = slice(1, None)
"""Round intervals of the steady state: all but the first (round 2), which holds one-off work."""

CASES: dict[str, list[str]] = {
    "fliu": ["+experiment=fliu_table1_paper"],
    "fedala": ["+experiment=fedala_table2_paper"],
    "flame": ["+experiment=flame_table3_paper"],
    "fedmpr": ["+experiment=fedmpr_table2_paper"],
    "diversifed": ["+experiment=diversifed_table2_paper"],
    "resnet18-cifar": [
        "+experiment=fedmpr_table2_paper",
        "dataset=synthetic",
        "dataset.image_shape=[3,32,32]",
        "dataset.num_train=50000",
        "dataset.num_test=10000",
        "split=default",
        "partition=iid",
    ],
}


def gpu_name() -> str:
    if not torch.cuda.is_available():
        return "no CUDA device"
    return ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))


def nvidia_smi() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--backend", choices=["fork", "ray"], default="fork")
    parser.add_argument("--clients-per-gpu", type=int, default=4, help="Ray only")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument(
        "--case-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop a case still running after this long and record how many rounds it did",
    )
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra Hydra overrides"
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu.py: no CUDA device here; nothing was run", file=sys.stderr)
        raise SystemExit(2)
    execution = [
        f"backend={args.backend}",
        f"train.device={args.device}",
        "progress=false",
        "checkpoint.every=0",
    ]
    if args.device == "cuda" and args.backend == "ray":
        execution.append(f"backend.num_gpus_per_client={1 / args.clients_per_gpu}")
    machine = f"{machine_description()}, GPU: {gpu_name()}"
    args.out.mkdir(parents=True, exist_ok=True)
    table = args.out / "gpu.md"
    header = (
        "| date | machine | case | device | steady round (s) | first round incl. start-up (s) "
        "| command |\n|---|---|---|---|---|---|---|\n"
    )
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            workload = [*CASES[case], *execution, *args.set]
            command = " ".join(["pflower", *workload, f"rounds={args.rounds}"])
            try:
                measured = run_pflower(
                    args.rounds, Path(tmp) / case, workload, args.case_limit, STEADY_INTERVALS
                )
                cells = (
                    f"{measured['steady_round_s']:.2f} | "
                    f"{measured['startup_s'] + measured['steady_round_s']:.1f}"
                )
            except RunUnfinished as stopped:
                measured = {"unfinished": str(stopped), "rounds_done": stopped.rounds_done}
                cells = f"not reached: stopped at {stopped.time_limit_s:.0f} s | {stopped}"
            result = {
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "machine": machine,
                "nvidia_smi": nvidia_smi(),
                "case": case,
                "device": args.device,
                "command": command,
                **measured,
            }
            results.append(result)
            print(json.dumps(result, indent=2), flush=True)
            append_row(
                table,
                header,
                f"| {result['date']} | {machine} | {case} | {args.device} | {cells} "
                f"| `{command}` |\n",
            )
    store = args.out / "gpu.json"
    earlier = json.loads(store.read_text()) if store.exists() else []
    store.write_text(json.dumps([*earlier, *results], indent=2))


if __name__ == "__main__":
    main()
