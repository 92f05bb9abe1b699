"""Time per round and peak memory of pflower's simulation as the population grows.

Workload: MNIST, FLIU with its defaults, 100 clients trained per round (``fraction = 100 / N``,
all of them when N <= 100), evaluation every 5 rounds on 100 clients (``eval.fraction`` the same),
1 local epoch, batch 10, with the default evaluation protocol (each client's Acc(G) on its own
slice of the global test set, L2 on the evaluated clients). Cases:

- ``10``, ``100``, ``1000``: FedAvgCNN (about 580k parameters of personal state per client), the
  clients' state in memory (``client_state.store=memory``);
- ``1000-resnet18``: 1,000 clients whose personal model is a ResNet-18 (11.2M parameters, 45 MB:
  45 GB for the population; its ImageNet stem, which shrinks 28x28 inputs early, keeps the compute
  of a CPU run small without changing the state's size), state on disk
  (``client_state.store=disk``);
- ``10000``: 10,000 FedAvgCNN clients, state on disk.

Every case runs the real ``pflower`` command (the default backend: one forked worker per CPU;
``--set backend=ray`` for Ray's actors, which the rows before 2026-11-27 used) in a child
process. Round times come from metrics.jsonl's ``time`` rows (the end of each training phase):
a training round is the median of the rounds without evaluation work; an evaluation round (round
5) is its training phase plus the evaluation that follows it, i.e. the time from the end of
round 4's training to the end of round 6's, minus one training round. Peak memory is sampled
over the whole process tree: summed RSS (shared pages counted in every process) and summed PSS
(shared pages split among their sharers). ``state_on_disk_gb`` is the size of the client state
folder at the end.

Usage::

    python benchmarks/scale.py [--cases 10 100 1000 1000-resnet18 10000] [--rounds 10]
        [--out DIR] [--set key=value ...]

Writes ``scale.json`` and appends one row per case to ``scale.md`` in the output folder (its
``case`` column followed by the ``--set`` overrides, e.g.
``1000 eval.server_test_max_samples=2000``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from overhead import append_row, machine_description, run_pflower

PER_ROUND = 100
EVAL_EVERY = 5

COMMON = [
    "dataset=mnist",
    "strategy=fliu",
    "train.local_epochs=1",
    "train.batch_size=10",
    f"eval.every={EVAL_EVERY}",
    "progress=false",
    "checkpoint.every=0",
]

CASES: dict[str, tuple[int, list[str]]] = {
    "10": (10, ["model=fedavg_cnn"]),
    "100": (100, ["model=fedavg_cnn"]),
    "1000": (1000, ["model=fedavg_cnn"]),
    "1000-resnet18": (1000, ["model=resnet18", "model.stem=imagenet", "client_state.store=disk"]),
    "10000": (10000, ["model=fedavg_cnn", "client_state.store=disk"]),
}


def overrides(case: str, extra: list[str]) -> list[str]:
    clients, specific = CASES[case]
    share = min(1.0, PER_ROUND / clients)
    return [
        *COMMON,
        *specific,
        f"num_clients={clients}",
        f"fraction={share}",
        f"eval.fraction={share}",
        *extra,
    ]


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def run_case(case: str, rounds: int, extra: list[str], workdir: Path) -> dict:
    run_dir = workdir / case
    measured = run_pflower(rounds, run_dir, overrides(case, extra))
    took = dict(enumerate(measured["round_times_s"], start=2))  # round r: end of r-1 to end of r
    # rounds whose interval holds no evaluation work: not an evaluation round (its training
    # clients measure L2), nor the one after it (it starts with the evaluate phase)
    plain = [t for r, t in took.items() if r % EVAL_EVERY not in (0, 1) and r != rounds]
    train_round = statistics.median(plain)
    eval_round = took[EVAL_EVERY] + took[EVAL_EVERY + 1] - train_round
    state_dir = run_dir / "client_state"
    result = {
        "case": case,
        "clients": CASES[case][0],
        "command": " ".join(["pflower", *overrides(case, extra), f"rounds={rounds}"]),
        "train_round_s": train_round,
        "eval_round_s": eval_round,
        "eval_over_train": eval_round / train_round,
        "round_times_s": took,
        "startup_s": measured["startup_s"],
        "total_s": measured["total_s"],
        "peak_rss_gb": measured["peak_rss_mb"] / 2**10,
        "peak_pss_gb": measured["peak_pss_mb"] / 2**10,
        "state_on_disk_gb": folder_bytes(state_dir) / 2**30 if state_dir.exists() else 0.0,
    }
    shutil.rmtree(run_dir, ignore_errors=True)  # client state can be tens of GB
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--workdir", type=Path, default=None, help="where runs are written")
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra Hydra overrides"
    )
    args = parser.parse_args()
    if args.rounds < EVAL_EVERY + 3:
        parser.error(f"--rounds must be at least {EVAL_EVERY + 3}")
    machine = machine_description()
    args.out.mkdir(parents=True, exist_ok=True)
    table = args.out / "scale.md"
    header = (
        "| date | machine | case | clients | training round (s) | evaluation round (s) "
        "| eval / train | start-up (s) | peak RSS (GiB) | peak PSS (GiB) | state on disk (GiB) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    store = args.out / "scale.json"
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for case in args.cases:
            result = run_case(case, args.rounds, args.set, Path(tmp))
            result["date"] = datetime.now(UTC).isoformat(timespec="seconds")
            result["machine"] = machine
            print(json.dumps(result, indent=2), flush=True)
            earlier = json.loads(store.read_text()) if store.exists() else []
            store.write_text(json.dumps([*earlier, result], indent=2))  # kept if a later case fails
            append_row(
                table,
                header,
                f"| {result['date']} | {machine} | {' '.join([case, *args.set])} | "
                f"{result['clients']} | "
                f"{result['train_round_s']:.1f} | {result['eval_round_s']:.1f} | "
                f"{result['eval_over_train']:.2f} | {result['startup_s']:.0f} | "
                f"{result['peak_rss_gb']:.1f} | {result['peak_pss_gb']:.1f} | "
                f"{result['state_on_disk_gb']:.1f} |\n",
            )


if __name__ == "__main__":
    main()
