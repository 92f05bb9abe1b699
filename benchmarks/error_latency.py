"""How long ``pflower`` takes to report a bad key, value or name (issue 39), and to print its
help (issue 62).

Runs ``pflower strategy.gama=0.3``, ``pflower rounds=ten``, ``pflower strategy=nope`` (exit code
2) and ``pflower --help`` (exit code 0) five times each, alternating the source trees given as
``label=path`` (put on ``PYTHONPATH``), and prints the median and every run's wall time, and
the median CPU time (user + system: on a loaded machine, the wall time is mostly waiting for a
core). Each command must end with its exit code.

    python benchmarks/error_latency.py before=/path/to/old/tree after=/path/to/new/tree

The check before imports (:mod:`pflower.quickcheck`) needs the option-shape cache of the code it
runs; run any ``pflower`` command of the new tree once first (the full check writes it).
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = [
    (["strategy.gama=0.3"], 2),
    (["rounds=ten"], 2),
    (["strategy=nope"], 2),
    (["--help"], 0),
]
"""Each command and the exit code it must end with."""
REPEATS = 5


def main(argv: list[str]) -> None:
    trees = dict(argument.split("=", 1) for argument in argv)
    executable = shutil.which("pflower") or "pflower"
    times: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    for _ in range(REPEATS):
        for command, code in COMMANDS:
            for label, path in trees.items():
                env = {**os.environ, "PYTHONPATH": path}
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                start = time.perf_counter()
                result = subprocess.run([executable, *command], env=env, capture_output=True)
                elapsed = time.perf_counter() - start
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                if result.returncode != code:
                    raise SystemExit(f"{label}: pflower {command} exited {result.returncode}")
                key = (label, " ".join(command))
                times.setdefault(key, []).append(elapsed)
                cpu.setdefault(key, []).append(
                    after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                )
    for (label, command), runs in times.items():
        listed = ", ".join(f"{run:.2f}" for run in runs)
        print(
            f"{label:8s} pflower {command:20s} median {statistics.median(runs):.2f} s ({listed}), "
            f"CPU {statistics.median(cpu[label, command]):.2f} s"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
