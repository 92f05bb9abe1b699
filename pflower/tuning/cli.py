"""``pflower tune``: tune methods on validation with the same budget, then run them on test.

::

    pflower tune --show fedprox [--suite cpu [--setting mnist_path]]   # the search space
    pflower tune fedavg fedprox --suite cpu --setting fmnist_dir01 --workers 2
    pflower tune --suite cpu                           # the whole suite (resumes; accumulates)
    pflower tune --suite cpu rounds=3 --trials 2       # overrides (key=value) go to every run
    pflower tune --overrides tuning/cpu/fmnist_dir01/chosen/fedprox.yaml
    pflower tune fedala --suite cpu --setting mnist_path --profile strategy.eta --workers 2
    pflower tune --suite cpu --profile ends            # every value chosen at a range's end
    pflower tune --suite cpu --ray auto --workers 16     # one Ray task per run on a cluster
    pflower tune my_method --suite cpu --out results/tuning/cpu   # one more method, ranked
    pflower report --leaderboard tuning/cpu

For each setting and method it runs (or resumes) the Optuna study
([`.search`][pflower.tuning.search]), writes the
chosen values to ``<out>/<setting>/chosen/<method>.yaml`` (``chosen/<method>/study_<k>.yaml``
for each study of a suite of several) and runs them with the suite's final
seeds on test (``--no-final`` skips that). With ``--profile KEY`` it tunes nothing: it runs the
chosen values with KEY varied over a grid, on validation (`.profile`). Every invocation is
appended to ``<out>/commands.log``, which the leaderboard shows. Named methods are added to the
folder's stored runs of the other methods only where those are what the installed code makes
under the suite's protocol (`.baselines`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import yaml

from pflower.commands import HelpFormatter
from pflower.config import TrainConfig
from pflower.core.algorithm import ALGORITHMS
from pflower.provenance import kernel_caps
from pflower.registry import ConfigError
from pflower.searchspace import declared_space, format_value, number_or_text
from pflower.tuning.baselines import check_protocol, check_stored_runs
from pflower.tuning.layout import Layout
from pflower.tuning.runner import RunRefused
from pflower.tuning.search import Runner
from pflower.tuning.suite import Setting, Suite, check_suite, load_suite


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pflower tune",
        description="Tune methods on the clients' validation shares with Optuna (the same "
        "number of trials for each), then run the chosen values with new seeds on test.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "items", nargs="*", help="methods (default: the suite's) and key=value overrides"
    )
    parser.add_argument("--suite", default="cpu", help="conf/suite/<name>.yaml or a path")
    parser.add_argument("--setting", action="append", help="only these settings (repeatable)")
    parser.add_argument("--trials", type=int, help="trials per method (default: the suite's)")
    parser.add_argument("--final-seeds", help="comma-separated seeds (default: the suite's)")
    parser.add_argument("--workers", type=int, default=1, help="trials run at once (default 1)")
    parser.add_argument("--out", type=Path, help="results folder (default tuning/<suite>)")
    parser.add_argument("--timeout", type=float, help="seconds one run may take")
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run every trial and final run as a Ray task on this running cluster ('auto': "
        "the local node's); --workers tasks at a time; run folders must be shared",
    )
    parser.add_argument("--ray-cpus", type=float, default=1.0, help="CPUs per Ray task")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="start every run as a new Python process (default: forked from a process that "
        "imported torch and pflower once; the same numbers, seconds sooner)",
    )
    parser.add_argument("--no-final", action="store_true", help="tune only; no final runs")
    parser.add_argument(
        "--trust-unchecked",
        action="store_true",
        help="rank the named methods against stored final runs recorded before pflower kept "
        "per-part code fingerprints (never against runs whose recorded parts differ)",
    )
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="run failed final runs again (kept by default: a diverged run diverges again)",
    )
    parser.add_argument(
        "--profile",
        action="append",
        metavar="KEY",
        help="run the chosen values with KEY varied over a grid, on validation, instead of "
        "tuning (repeatable; 'ends': every key chosen at an end of its range)",
    )
    parser.add_argument(
        "--profile-values",
        metavar="V1,V2,...",
        help="the values of the one --profile KEY (default: its range's grid)",
    )
    parser.add_argument("--show", metavar="METHOD", help="print METHOD's search space and exit")
    parser.add_argument("--overrides", type=Path, help="print a chosen file's overrides")
    return parser


def show(method: str, suite: Suite | None, setting: str | None = None) -> str:
    """The method's search space as a table: key, range, default, source (in ``setting`` of
    ``suite`` where one is named: its own knobs and ranges)."""
    from pflower.core.algorithm import get_algorithm

    options = get_algorithm(method).options
    if suite is not None:
        chosen = None if setting is None else suite.setting(setting)
        space = suite.space_for(method, chosen)
        where = f"suite {suite.name}" + ("" if setting is None else f", setting {setting}")
        title = f"search space of {method} in {where} ({suite.trials} trials)"
    else:
        space = {**declared_space(TrainConfig, "train"), **declared_space(options, "strategy")}
        title = f"search space of {method} (shared train knobs: the suite picks which are tuned)"
    defaults = {f"strategy.{k}": v for k, v in vars(options(name=method)).items()}
    defaults.update({f"train.{k}": v for k, v in vars(TrainConfig()).items()})
    lines = [title]
    width = max([len(k) for k in space] + [3])
    for key, param in space.items():
        default = format_value(defaults.get(key))
        lines.append(
            f"  {key:<{width}}  {param.describe():<36} default {default:<8} {param.source}"
        )
    if not declared_space(options, "strategy"):
        lines.append(f"  ({method} declares no tunable option of its own)")
    return "\n".join(lines)


def _record_invocation(out: Path, argv: Sequence[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # the kernel caps are part of what the runs compute (pflower.provenance.numerics)
    prefix = "".join(f"{name}={shlex.quote(value)} " for name, value in kernel_caps().items())
    entry = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": prefix + "pflower tune " + shlex.join(argv),
        "cwd": os.getcwd(),
        "machine": machine(),
    }
    with (out / "commands.log").open("a") as handle:
        handle.write(json.dumps(entry) + "\n")


def machine() -> str:
    """This machine in words: host, OS, CPU count and the GPU where torch sees one."""
    words = f"{platform.node()}, {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs"
    try:
        import torch

        if torch.cuda.is_available():
            words += f", {torch.cuda.get_device_name(0)}"
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return words


def _rounds_unless_refused(setting: Setting, method: str, layout: Layout) -> int | None:
    """The rounds of ``method``'s runs here, or None where the setting's configuration refuses
    the method (why: written to the layout's refusal file and printed). A setting that does not
    compose at all (a typo), or a method whose ``per_method`` change still fails, is an error,
    not a refusal."""
    refusal = layout.refusal_file(setting.name, method)
    try:
        rounds = setting.rounds(method)
    except ConfigError as error:
        if method in setting.per_method:
            raise ConfigError(
                f"setting {setting.name}: {method} with its per_method change fails: {error}"
            ) from error
        setting.rounds("fedavg")  # the setting itself composes, or this raises
        refusal.parent.mkdir(parents=True, exist_ok=True)
        refusal.write_text(f"{error}\n")
        print(f"[{setting.name}] {method} cannot run here: {error}")
        return None
    refusal.unlink(missing_ok=True)
    return rounds


def run_suite(
    suite: Suite,
    methods: Sequence[str] | None,
    settings: Sequence[Setting],
    out: Path,
    workers: int,
    final: bool,
    timeout_s: float | None,
    runner: Runner | None = None,
    retry_failed: bool = False,
) -> None:
    """Tune every method (None: each setting's) on every setting, write the chosen values, run
    the final seeds. ``<out>/suite.yaml`` records the whole suite, whichever settings run."""
    from pflower.tuning.finals import final_runs, write_chosen
    from pflower.tuning.search import study_name, tune

    layout = Layout(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "suite.yaml").write_text(
        yaml.safe_dump(
            {
                "name": suite.name,
                "source": suite.source,
                "budget": suite.budget,
                "trials": suite.trials,
                "tune_seed": suite.tune_seed,
                "studies": suite.studies,
                "tune_seeds": suite.tune_seeds,
                "search": suite.search.describe(suite.trials),
                "final_seeds": list(suite.final_seeds),
                "val_fraction": suite.val_fraction,
                "train_knobs": list(suite.train_knobs),
                "settings": {s.name: list(s.overrides) for s in suite.settings},
                "setting_methods": {s.name: list(suite.methods_of(s)) for s in suite.settings},
                "per_method": {
                    s.name: {
                        m: {"overrides": list(c.overrides), "reason": c.reason}
                        for m, c in s.per_method.items()
                    }
                    for s in suite.settings
                    if s.per_method
                },
                "methods": list(suite.methods),
            },
            sort_keys=False,
        )
    )
    for setting in settings:
        for method in suite.methods_of(setting) if methods is None else methods:
            rounds = _rounds_unless_refused(setting, method, layout)
            if rounds is None:  # the setting refuses the method: said so; go on
                continue
            for study_id in suite.study_ids():
                name = study_name(method, study_id)
                plan = suite.search.describe(suite.trials)
                print(f"[{setting.name}] tuning {name}: {plan}, {rounds} rounds")
                study = tune(
                    suite,
                    setting,
                    method,
                    layout,
                    rounds,
                    workers,
                    timeout_s,
                    print,
                    runner,
                    study_id,
                )
                chosen = write_chosen(study, suite, setting, method, layout, study_id)
                values = " ".join(f"{k}={format_value(v)}" for k, v in chosen["params"].items())
                print(f"[{setting.name}] {name} chose {values or 'the defaults'}")
                if final:
                    final_runs(
                        suite,
                        setting,
                        method,
                        layout,
                        workers,
                        timeout_s,
                        print,
                        runner,
                        retry_failed,
                        study_id,
                    )


def run_profiles(
    suite: Suite,
    methods: Sequence[str] | None,
    settings: Sequence[Setting],
    out: Path,
    keys: Sequence[str],
    values: Sequence[object] | None,
    workers: int,
    timeout_s: float | None,
    runner: Runner | None = None,
) -> None:
    """Profile ``keys`` (``ends``: the keys chosen at an end of their range) at the chosen
    values of every method (None: each setting's) that has them, each study's in a suite of
    several (`.profile`)."""
    from pflower.tuning.finals import read_chosen
    from pflower.tuning.profile import chosen_at_ends, describe_profile, run_profile

    layout = Layout(out)
    for setting in settings:
        for method in suite.methods_of(setting) if methods is None else methods:
            for study in suite.study_ids():
                named = method if study is None else f"{method} (study {study})"
                chosen_path = layout.chosen_file(setting.name, method, study)
                if not chosen_path.exists():
                    print(f"[{setting.name}] {named} has no chosen values yet: not profiled")
                    continue
                at_ends = [key for key, *_ in chosen_at_ends(read_chosen(chosen_path))]
                for key in at_ends if list(keys) == ["ends"] else keys:
                    print(f"[{setting.name}] profile of {key} at {named}'s chosen values")
                    record = run_profile(
                        suite,
                        setting,
                        method,
                        key,
                        layout,
                        values,
                        workers,
                        timeout_s,
                        print,
                        runner,
                        study,
                    )
                    print(f"[{setting.name}] {named}: {describe_profile(record)}")


def _profile_values(keys: Sequence[str] | None, values: str | None) -> list[object] | None:
    """``--profile-values`` as numbers (or text), checked against ``--profile``."""
    if values is None:
        return None
    if not keys or len(keys) != 1 or keys[0] == "ends":
        raise ConfigError("--profile-values goes with exactly one --profile KEY (not 'ends')")
    return [number_or_text(value) for value in values.split(",")]


def _exit_with(error: ConfigError) -> int:
    """Say why the command stopped and return its exit code, 2 (a refused run's text is the run's
    own message, which names its kind of error)."""
    print(
        error if isinstance(error, RunRefused) else f"configuration error: {error}", file=sys.stderr
    )
    return 2


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_intermixed_args(list(argv))
    try:
        if args.overrides is not None:
            data = yaml.safe_load(args.overrides.read_text())
            print(" ".join(shlex.quote(o) for o in data["overrides"]))
            return 0
        if args.show is not None:
            explicit = args.setting or any(a.split("=")[0] == "--suite" for a in argv)
            suite = load_suite(args.suite) if explicit else None
            for name in (args.setting or [None]) if suite is not None else [None]:
                print(show(args.show, suite, name))
            return 0
        suite = load_suite(args.suite)
        methods = [i for i in args.items if "=" not in i] or None
        unknown = sorted(set(methods or ()) - set(ALGORITHMS))
        if unknown:
            raise ConfigError(f"unknown methods {unknown}; known: {', '.join(sorted(ALGORITHMS))}")
        extra = tuple(i for i in args.items if "=" in i)
        if args.trials is not None:
            suite = replace(suite, trials=args.trials)
        if args.final_seeds is not None:
            seeds = tuple(int(s) for s in args.final_seeds.split(","))
            suite = replace(suite, final_seeds=seeds)
        check_suite(suite)  # again: --trials and --final-seeds may have changed it
        settings = [suite.setting(n) for n in args.setting] if args.setting else suite.settings
        settings = [replace(s, extra=extra) for s in settings]
        profile_values = _profile_values(args.profile, args.profile_values)
        out = args.out or Path("tuning") / suite.name
        if methods is not None and not args.profile:
            check_stored_runs(out, suite, args.suite, settings, methods, args.trust_unchecked)
        elif not args.profile:
            check_protocol(out, suite, settings)
    except ConfigError as error:
        return _exit_with(error)
    _record_invocation(out, argv)
    with contextlib.ExitStack() as stack:
        runner = _runner(args, stack)
        try:
            if args.profile:
                run_profiles(
                    suite,
                    methods,
                    settings,
                    out,
                    args.profile,
                    profile_values,
                    args.workers,
                    args.timeout,
                    runner,
                )
            else:
                run_suite(
                    suite,
                    methods,
                    settings,
                    out,
                    args.workers,
                    not args.no_final,
                    args.timeout,
                    runner,
                    retry_failed=args.retry_failed,
                )
        except ConfigError as error:
            return _exit_with(error)
        except KeyboardInterrupt as stop:
            return _stopped(stop, out)
    return 0


def _stopped(stop: KeyboardInterrupt, out: Path) -> int:
    """Say in one line that Ctrl-C or SIGTERM stopped the command and how to go on (not a
    traceback: the stop is the user's), and return 130, the shell's code for SIGINT."""
    how = str(stop).removeprefix("stopped by ") if "SIG" in str(stop) else "Ctrl-C"
    print(
        f"pflower tune: stopped by {how}. Finished trials and final runs are kept in {out}; "
        "run the same command again to go on (a trial that was running starts again with the "
        "same values).",
        file=sys.stderr,
    )
    return 130


def _runner(args: argparse.Namespace, stack: contextlib.ExitStack) -> Runner:
    """How the runs are executed: Ray tasks (``--ray``), new processes (``--cold``), or children
    of a fork server that imported torch and pflower once (the default; it ends with
    ``stack``)."""
    from pflower.tuning.runner import RayRunner, run_pflower, warm_runner

    if args.ray:
        import ray

        ray.init(address=args.ray)
        return RayRunner(args.ray_cpus)
    if args.cold:
        return run_pflower
    return stack.enter_context(warm_runner())
