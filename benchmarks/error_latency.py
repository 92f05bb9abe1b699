"""How long ``pflower`` takes to report a bad key, value or name (issue 39).

Runs ``pflower strategy.gama=0.3``, ``pflower rounds=ten`` and ``pflower strategy=nope`` five times
each, alternating the source trees given as ``label=path`` (put on ``PYTHONPATH``), and prints the
median and every run's wall time. Each command must end with exit code 2.

    python benchmarks/error_latency.py before=/path/to/old/tree after=/path/to/new/tree

The check before imports (:mod:`pflower.quickcheck`) needs the option-shape cache of the code it
runs; run any ``pflower`` command of the new tree once first (the full check writes it).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = [["strategy.gama=0.3"], ["rounds=ten"], ["strategy=nope"]]
REPEATS = 5


def main(argv: list[str]) -> None:
    trees = dict(argument.split("=", 1) for argument in argv)
    executable = shutil.which("pflower") or "pflower"
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(REPEATS):
        for command in COMMANDS:
            for label, path in trees.items():
                env = {**os.environ, "PYTHONPATH": path}
                start = time.perf_counter()
                result = subprocess.run([executable, *command], env=env, capture_output=True)
                elapsed = time.perf_counter() - start
                if result.returncode != 2:
                    raise SystemExit(f"{label}: pflower {command} exited {result.returncode}")
                times.setdefault((label, " ".join(command)), []).append(elapsed)
    for (label, command), runs in times.items():
        listed = ", ".join(f"{run:.2f}" for run in runs)
        print(f"{label:8s} pflower {command:20s} median {statistics.median(runs):.2f} s ({listed})")


if __name__ == "__main__":
    main(sys.argv[1:])
