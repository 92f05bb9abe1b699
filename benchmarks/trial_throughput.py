"""Tuning trials per hour, before and after (issue 59): a new Python process measuring every stage
against a run forked from the tuner's fork server measuring only what the objective reads.

For each method, ``--trials`` tuning runs of a suite's setting (the values of the study's
quasi-random points 0, 1, ...), each run twice in alternation:

- ``before``: ``python -m pflower`` as a new process, every stage measured (G, L1, L2, Acc(G)),
  as ``pflower tune`` ran trials until now (``--cold`` and no ``OBJECTIVE_ONLY``);
- ``after``: the same command plus :data:`~pflower.tuning.search.OBJECTIVE_ONLY`, forked from
  the fork server of :func:`~pflower.tuning.runner.warm_runner` (``pflower tune``'s default).

With ``--before-code PATH`` both run as ``after`` does (warm, objective only), ``before`` with
the pflower of the checkout at ``PATH`` (its fork server imports that code): a change of the
code, timed trial by trial. ``after`` evaluates only the rounds its study's pruner and objective
read (``eval.rounds``, as ``pflower tune`` runs trials since 2026-12-07), ``before`` every round.

It records each run's wall time (command start to summary) and objective, checks that both give
the same objective to the last digit, and writes ``benchmarks/results/<--name>.{md,json}``
(or ``--out``). Run on a quiet machine; the pairs alternate, so a load that comes and goes falls
on both alike::

    python benchmarks/trial_throughput.py --suite cpu --setting fmnist_dir01 \\
        --methods fedavg,ditto,fedala --trials 2 [--before-code ../main]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from pflower.provenance import code_version
from pflower.tuning.runner import WarmRunner, objective_of, run_pflower, warm_runner
from pflower.tuning.schedule import quasi_random_point
from pflower.tuning.search import OBJECTIVE_ONLY, run_command, trial_overrides
from pflower.tuning.suite import load_suite


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="cpu")
    parser.add_argument("--setting", default="fmnist_dir01")
    parser.add_argument("--methods", default="fedavg,ditto,fedala")
    parser.add_argument("--trials", type=int, default=2, help="trials per method")
    parser.add_argument("--extra", default="", help="overrides for every run, e.g. rounds=10")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument(
        "--before-code", type=Path, help="checkout whose pflower runs the 'before' trials"
    )
    parser.add_argument("--name", default="trial_throughput", help="the results' file name")
    parser.add_argument(
        "--title", default="Tuning trial throughput, before and after", help="their heading"
    )
    args = parser.parse_args(argv)
    suite = load_suite(args.suite)
    # the extra overrides go last in every run, as `pflower tune`'s command-line ones do
    setting = dataclasses.replace(suite.setting(args.setting), extra=tuple(args.extra.split()))
    runs: list[dict[str, object]] = []
    with contextlib.ExitStack() as stack:
        scratch = stack.enter_context(tempfile.TemporaryDirectory())
        warm = stack.enter_context(warm_runner())
        before = stack.enter_context(warm_runner_of(args.before_code)) if args.before_code else None
        for method in args.methods.split(","):
            space = suite.space_for(method, setting)
            evaluated = suite.search.evaluated_rounds(setting.rounds(method))
            for index in range(args.trials):
                values = quasi_random_point(space, suite.tune_seed, index)
                overrides = trial_overrides(suite, setting, method, values, evaluated=evaluated)
                every_round = [o for o in overrides if not o.startswith("eval.rounds=")]
                lean = [o for o in every_round if o not in OBJECTIVE_ONLY]
                before_overrides = lean if before is None else every_round
                for label, command_overrides, runner in (
                    ("before", before_overrides, before or run_pflower),
                    ("after", overrides, warm),
                ):
                    run_dir = Path(scratch) / f"{method}-{index}-{label}"
                    start = time.perf_counter()
                    summary = runner(run_command(command_overrides, run_dir), run_dir)
                    seconds = time.perf_counter() - start
                    runs.append(
                        {
                            "method": method,
                            "trial": index,
                            "label": label,
                            "seconds": round(seconds, 2),
                            "objective": objective_of(summary),
                        }
                    )
                    print(f"{method} trial {index} {label}: {seconds:.1f} s", flush=True)
    write(args, runs)


@contextlib.contextmanager
def warm_runner_of(code: Path) -> Iterator[WarmRunner]:
    """A [`warm_runner`][pflower.tuning.runner.warm_runner] whose fork server imports pflower
    from the checkout at ``code`` (its ``PYTHONPATH``; the runs it forks inherit that import)."""
    with contextlib.ExitStack() as stack:
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(code.resolve())
        try:
            warm = stack.enter_context(warm_runner())
        finally:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved
        yield warm


def kinds(before_code: Path | None) -> str:
    """What ``before`` and ``after`` were, in a sentence."""
    if before_code is None:
        return (
            "before: a new process measuring every stage in every round; after: forked warm, "
            "measuring only the objective, in the rounds it reads."
        )
    return (
        f"before: the code at `{before_code}`, after: this code; both forked warm and measuring "
        "only the objective, both timed by this code's runner."
    )


def write(args: argparse.Namespace, runs: list[dict[str, object]]) -> None:
    """The results, as JSON and as a markdown table with the ratio per method and in all."""
    pairs: dict[tuple[object, object], dict[object, dict[str, object]]] = {}
    for run in runs:
        pairs.setdefault((run["method"], run["trial"]), {})[run["label"]] = run
    same = all(p["before"]["objective"] == p["after"]["objective"] for p in pairs.values())
    machine = f"{platform.node()}, {platform.machine()}, {platform.processor() or '?'}"
    lines = [
        f"# {args.title}",
        "",
        f"`python benchmarks/trial_throughput.py {' '.join(sys.argv[1:])}` at pflower "
        f"{code_version()['fingerprint']} on {machine}; {len(pairs)} trials of each kind, "
        "alternating. Objectives equal to the last digit: " + ("yes" if same else "NO") + ".",
        "",
        kinds(args.before_code),
        "",
        "| method | before s / trial | after s / trial | speed-up |",
        "|---|---|---|---|",
    ]
    methods = sorted({str(m) for m, _ in pairs})
    total = {"before": 0.0, "after": 0.0}
    for method in methods:
        times = {
            label: [float(str(p[label]["seconds"])) for (m, _), p in pairs.items() if m == method]
            for label in ("before", "after")
        }
        for label in total:
            total[label] += sum(times[label])
        before, after = statistics.mean(times["before"]), statistics.mean(times["after"])
        lines.append(f"| {method} | {before:.1f} | {after:.1f} | {before / after:.2f}x |")
    lines.append(f"| all | | | {total['before'] / total['after']:.2f}x |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    (args.out / f"{args.name}.json").write_text(json.dumps(runs, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
