"""The search: Optuna studies over a method's declared space, every trial a normal pflower run.

For one setting of a suite and one method, [`tune`][pflower.tuning.search.tune] runs
``suite.trials`` trials of Optuna's
TPE sampler (each trial's draw seeded with ``suite.tune_seed`` and the trial's number:
[`trial_sampler`][pflower.tuning.search.trial_sampler]; ``constant_liar`` when trials run in
parallel). TPE draws its first
[`TPE_STARTUP_TRIALS`][pflower.tuning.search.TPE_STARTUP_TRIALS] trials at random, so a suite with
no more trials per method than that
(the cpu and claims suites' 8) is a seeded random search over each method's space.
Each trial is ``python -m pflower checkpoint.every=0 <setting overrides> strategy=<method>
<sampled values> seed=<tune_seed> split.val_fraction=<v> split.evaluate_on=val`` in its own
process ([`run_command`][pflower.tuning.search.run_command]), so the run is composed from the same
``conf/`` tree as any other
and evaluates every stage on the clients' validation shares: no test sample is read
([`pflower.datasets.federation`][pflower.datasets.federation], step 6). While it runs, the mean
stage-L1 Acc(L) of each
finished round (the deployable model on validation) is reported to Optuna's median pruner, which
may stop it early. The objective is the run's ``last10`` stage-L1 Acc(L) mean: the clients' mean
validation accuracy of their deployable models, averaged over the last 10% of rounds.

The study lives in ``<out>/<setting>/study.db`` (Optuna's SQLite storage, one study per method)
and resumes where it stopped: finished trials count, a trial that was running when its
``pflower tune`` was stopped is failed by Optuna's heartbeat check and retried with the same
values (``RetryFailedTrialCallback``), and a method's budget counts finished trials
(complete, pruned, or failed by its own run) until it reaches ``suite.trials``, the same for every
method. ``workers`` trials run at once (threads of this process, each driving one trial
process); several ``pflower tune`` processes on one machine may share a study (a file lock keeps
the count exact).
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pflower.registry import ConfigError
from pflower.results.rundir import error_line, failed_by_itself
from pflower.searchspace import Param, format_value
from pflower.tuning.runner import (
    HEARTBEAT_S,
    POLL_S,
    Pruned,
    Runner,
    RunRefused,
    TrialFailed,
    objective_of,
    read_summary,
    run_pflower,
    runs_stop_together,
)
from pflower.tuning.suite import Setting, Suite

OBJECTIVE = "last-10% mean of stage-L1 Acc(L) on the clients' validation shares"
GRACE_S = 90


# ----------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Layout:
    """Where a suite's results live: ``<root>/<setting>/...``."""

    root: Path

    def setting_dir(self, setting: str) -> Path:
        return self.root / setting

    def storage_url(self, setting: str) -> str:
        return f"sqlite:///{(self.setting_dir(setting) / 'study.db').resolve()}"

    def trial_dir(self, setting: str, method: str, number: int) -> Path:
        return self.setting_dir(setting) / "trials" / method / f"{number:03d}"

    def chosen_file(self, setting: str, method: str) -> Path:
        return self.setting_dir(setting) / "chosen" / f"{method}.yaml"

    def final_dir(self, setting: str, method: str, seed: int) -> Path:
        return self.setting_dir(setting) / "final" / method / f"seed_{seed}"

    def profile_file(self, setting: str, method: str, key: str) -> Path:
        """The profile of ``key`` at ``method``'s chosen values
        ([`.profile`][pflower.tuning.profile])."""
        return self.setting_dir(setting) / "profiles" / method / f"{key}.yaml"

    def profile_runs_dir(self, setting: str, method: str, key: str) -> Path:
        """The runs of ``key``'s profile, one folder per value."""
        return self.setting_dir(setting) / "profiles" / method / key

    def profile_run_dir(self, setting: str, method: str, key: str, value: Any) -> Path:
        return self.profile_runs_dir(setting, method, key) / format_value(value)

    def refusal_file(self, setting: str, method: str) -> Path:
        """Why the setting's configuration refuses ``method`` (written instead of tuning it)."""
        return self.setting_dir(setting) / "refused" / f"{method}.txt"

    def lock_file(self, setting: str) -> Path:
        return self.setting_dir(setting) / ".study.lock"


# ---------------------------------------------------------------------------------- commands
def run_command(overrides: Sequence[str], run_dir: Path) -> list[str]:
    """The command of one pflower run writing into ``run_dir``.

    Checkpoints are off (``checkpoint.every=0``) unless the overrides turn them on: a trial or a
    final run that stops before its ``summary.json`` is started afresh, never resumed, so its
    checkpoint and its clients' state snapshots would only fill the disk (37 of the cpu suite's
    37.3 GiB). They do not change what a run computes (``tests/test_resume.py``)."""
    return [
        sys.executable,
        "-m",
        "pflower",
        "checkpoint.every=0",
        *overrides,
        f"output_dir={run_dir}",
        f"hydra.run.dir={run_dir}",
        "progress=false",
    ]


def trial_overrides(
    suite: Suite, setting: Setting, method: str, values: Mapping[str, Any]
) -> list[str]:
    """A tuning run: the setting (with the method's own changes), the method, the tuning seed,
    validation only, the values."""
    return list(
        setting.overrides_for(
            method,
            [
                f"strategy={method}",
                f"seed={suite.tune_seed}",
                f"split.val_fraction={suite.val_fraction}",
                "split.evaluate_on=val",
                *(f"{key}={format_value(value)}" for key, value in values.items()),
            ],
        )
    )


def final_overrides(suite: Suite, setting: Setting, chosen: Sequence[str], seed: int) -> list[str]:
    """A final run: the setting, the chosen file's overrides (the method's own changes, the
    method, the chosen values), a new seed, scored on test, the command line's overrides last.
    The validation share is still carved out, so the clients train on exactly the data they were
    tuned on."""
    return [
        *setting.overrides,
        *chosen,
        f"seed={seed}",
        f"split.val_fraction={suite.val_fraction}",
        "split.evaluate_on=test",
        *setting.extra,
    ]


# ------------------------------------------------------------------------------------ study
@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock across the processes of this machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _retry_callback() -> tuple[str, Any]:
    """Optuna's callback that re-enqueues a heartbeat-stale trial, and the storage keyword that
    takes it (renamed in Optuna 4.9)."""
    import optuna

    if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback"):
        callback = optuna.storages.RetryHeartbeatStaleTrialCallback
        return "heartbeat_stale_trial_callback", callback
    return "failed_trial_callback", optuna.storages.RetryFailedTrialCallback


def _storage(url: str) -> Any:
    import optuna

    keyword, callback = _retry_callback()
    return optuna.storages.RDBStorage(
        url,
        engine_kwargs={"connect_args": {"timeout": 120}},
        heartbeat_interval=HEARTBEAT_S,
        grace_period=GRACE_S,
        **{keyword: callback(max_retry=3)},
    )


def quiet_optuna() -> None:
    """Silence Optuna's notes on the experimental heartbeat API this module relies on (and its
    hint that heartbeats are meant for ``Study.optimize``: here ask/tell records them)."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")


TPE_STARTUP_TRIALS = 10
"""Trials Optuna's TPE sampler draws at random before it models the finished ones (Optuna's
default, stated here): a suite of at most this many trials per method searches at random."""


def open_study(
    layout: Layout, setting: str, method: str, seed: int, parallel: bool, pruner: Any = None
) -> Any:
    """The method's study in the setting's SQLite storage, created or resumed."""
    import optuna

    quiet_optuna()
    layout.setting_dir(setting).mkdir(parents=True, exist_ok=True)
    return optuna.create_study(
        study_name=method,
        storage=_storage(layout.storage_url(setting)),
        sampler=_tpe(seed, parallel),
        pruner=pruner,
        direction="maximize",
        load_if_exists=True,
    )


def trial_sampler(tune_seed: int, number: int, parallel: bool) -> Any:
    """The TPE sampler that draws trial ``number`` of a study, seeded with (``tune_seed``,
    ``number``): each trial draws from a stream of its own, whichever thread or ``pflower tune``
    process asks for it and however often the study was resumed, and a study run again from
    scratch draws the same values. A sampler seeded once per process drew a resumed study's
    first values again, trial by trial (seen in this project's own tuning: a study stopped and
    started again held 3 distinct points in its first 6 trials), and every process sharing a
    study would draw the same ones."""
    import numpy as np

    return _tpe(int(np.random.SeedSequence([tune_seed, number]).generate_state(1)[0]), parallel)


def _tpe(seed: int, parallel: bool) -> Any:
    """Optuna's TPE sampler as pflower uses it (``constant_liar`` for trials run in parallel)."""
    import optuna

    return optuna.samplers.TPESampler(
        seed=seed, constant_liar=parallel, n_startup_trials=TPE_STARTUP_TRIALS
    )


def retried_numbers(trials: Sequence[Any]) -> set[int]:
    """Trials failed for staleness (their run was interrupted) or refused before their run
    started ([`RunRefused`][pflower.tuning.runner.RunRefused]), and re-enqueued with their
    values."""
    _, callback = _retry_callback()
    numbers = {callback.retried_trial_number(t) for t in trials}
    return {n for n in numbers if n is not None}


def counted_trials(trials: Sequence[Any]) -> tuple[list[Any], set[int]]:
    """The trials that count toward the budget, and the numbers of those that do not: the
    interrupted ones, retried with the same values."""
    interrupted = retried_numbers(trials)
    return [t for t in trials if t.number not in interrupted], interrupted


def budget_counts(study: Any) -> tuple[int, int]:
    """(finished trials that count toward the budget, running trials)."""
    from optuna.trial import TrialState

    storage = study._storage
    backend = getattr(storage, "_backend", storage)  # past Optuna's per-process trial cache
    trials = backend.get_all_trials(study._study_id, deepcopy=False)
    counted, _ = counted_trials(trials)
    finished = sum(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) for t in counted
    )
    running = sum(t.state == TrialState.RUNNING for t in trials)
    return finished, running


def _median_pruner(suite: Suite, rounds: int) -> Any:
    import optuna

    startup = int(suite.pruner.get("startup_trials", max(3, suite.trials // 4)))
    warmup = int(float(suite.pruner.get("warmup_fraction", 0.3)) * rounds)
    if not suite.pruner.get("enabled", True):
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=warmup)


def _one_trial(
    study: Any,
    trial: Any,
    space: Mapping[str, Param],
    suite: Suite,
    setting: Setting,
    method: str,
    layout: Layout,
    timeout_s: float | None,
    log: Callable[[str], None],
    runner: Runner,
) -> None:
    from optuna.exceptions import UpdateFinishedTrialError

    values = {key: param.suggest(trial, key) for key, param in space.items()}
    run_dir = layout.trial_dir(setting.name, method, trial.number)
    shutil.rmtree(run_dir, ignore_errors=True)  # left by a study that was deleted
    command = run_command(trial_overrides(suite, setting, method, values), run_dir)
    trial.set_user_attr("command", " ".join(command[2:]))
    trial.set_user_attr("run_dir", str(run_dir))

    def on_round(server_round: int, value: float) -> bool:
        trial.report(value, server_round)
        return bool(trial.should_prune())

    try:
        _run_and_tell(study, trial, command, run_dir, on_round, timeout_s, values, log, runner)
    except UpdateFinishedTrialError:
        log(
            f"{setting.name} {method} trial {trial.number} was failed as stale while it ran "
            "(its heartbeat came late, e.g. on a loaded machine); Optuna retries its values"
        )


def _run_and_tell(
    study: Any,
    trial: Any,
    command: Sequence[str],
    run_dir: Path,
    on_round: Callable[[int, float], bool],
    timeout_s: float | None,
    values: Mapping[str, Any],
    log: Callable[[str], None],
    runner: Runner,
) -> None:
    from optuna.trial import TrialState

    storage = study._storage
    name = f"{Path(run_dir).parents[2].name} {Path(run_dir).parent.name} trial {trial.number}"
    try:
        summary = runner(
            command,
            run_dir,
            on_round,
            heartbeat=lambda: storage.record_heartbeat(trial._trial_id),
            timeout_s=timeout_s,
        )
    except Pruned as stop:
        study.tell(trial, state=TrialState.PRUNED)
        log(f"{name}: {stop}")
        return
    except TrialFailed as error:
        trial.set_user_attr("error", str(error)[:2000])
        study.tell(trial, state=TrialState.FAIL)
        log(f"{name} failed: {error}")
        return
    except RunRefused as error:
        # not the values' doing: retried with them, as an interrupted trial is, once the
        # cause is fixed, and not counted toward the budget (see retried_numbers)
        _, callback = _retry_callback()
        callback()(study, storage.get_trial(trial._trial_id))
        trial.set_user_attr("error", f"refused before it started: {error}"[:2000])
        study.tell(trial, state=TrialState.FAIL)
        raise
    except BaseException:
        # interrupted: leave the trial RUNNING; Optuna's heartbeat check fails and retries it
        raise
    value = objective_of(summary)
    trial.set_user_attr("wall_time_s", summary.get("wall_time_s"))
    study.tell(trial, value)
    shown = ", ".join(f"{k}={format_value(v)}" for k, v in values.items())
    log(f"{name}: {value:.4f}  {shown}")


def tune(
    suite: Suite,
    setting: Setting,
    method: str,
    layout: Layout,
    rounds: int,
    workers: int = 1,
    timeout_s: float | None = None,
    log: Callable[[str], None] = print,
    runner: Runner | None = None,
) -> Any:
    """Run (or resume) the method's study until ``suite.trials`` trials have finished
    (``runner``: how a run is executed, default [`run_pflower`][pflower.tuning.runner.run_pflower];
    `RayRunner`)."""
    runner = runner or run_pflower
    from optuna.storages import fail_stale_trials

    space = suite.space_for(method, setting)
    pruner = _median_pruner(suite, rounds)
    lock = layout.lock_file(setting.name)
    errors: list[BaseException] = []

    def worker() -> None:
        study = open_study(layout, setting.name, method, suite.tune_seed, workers > 1, pruner)
        while not errors:
            with file_lock(lock):  # count and start under one lock: the budget stays exact
                fail_stale_trials(study)
                finished, running = budget_counts(study)
                if finished >= suite.trials:
                    return
                trial = None
                if finished + running < suite.trials:
                    number = len(study.get_trials(deepcopy=False))  # the next one's, if new
                    study.sampler = trial_sampler(suite.tune_seed, number, workers > 1)
                    trial = study.ask()
                    # a dead driver leaves a stale trial from now on
                    study._storage.record_heartbeat(trial._trial_id)
            if trial is None:
                time.sleep(POLL_S * 5)  # others' trials are running; wait for them
                continue
            try:
                _one_trial(
                    study, trial, space, suite, setting, method, layout, timeout_s, log, runner
                )
            except BaseException as error:  # raised below, once every worker has stopped
                errors.append(error)
                return

    with file_lock(lock):  # create the study once before the workers open it
        study = open_study(layout, setting.name, method, suite.tune_seed, workers > 1)
        check_study_space(study, search_record(space, setting, method), setting.name)
    with runs_stop_together():  # Ctrl-C stops the worker threads' runs too
        if workers == 1:
            worker()
        else:
            threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    if errors:
        raise errors[0]
    return open_study(layout, setting.name, method, suite.tune_seed, workers > 1)


SEARCH_ATTR = "search"
"""The study's user attribute holding what it searches (see
[`check_study_space`][pflower.tuning.search.check_study_space])."""


def search_record(space: Mapping[str, Param], setting: Setting, method: str) -> dict[str, Any]:
    """What a study searches: every key's range and the method's own overrides here."""
    return {
        "space": {key: param.describe() for key, param in space.items()},
        "method_overrides": list(setting.own_overrides(method)),
    }


def check_study_space(study: Any, record: Mapping[str, Any], setting: str) -> None:
    """Record what a new study searches; refuse to resume one that searched something else (a
    changed range or a changed per-method override would mix trials of two searches, and the
    best of them would be run with the new overrides)."""
    stored = study.user_attrs.get(SEARCH_ATTR)
    if stored is None:
        study.set_user_attr(SEARCH_ATTR, dict(record))
    elif stored != dict(record):
        raise ConfigError(
            f"the study of {study.study_name} in setting {setting} searched {stored}, but the "
            f"suite now says {dict(record)}: restore the suite's entry, or delete the study "
            f"(optuna delete-study --study-name {study.study_name} --storage <setting>/study.db) "
            "and its chosen file to search again"
        )


# ---------------------------------------------------------------------------------- chosen
def write_chosen(
    study: Any, suite: Suite, setting: Setting, method: str, layout: Layout
) -> dict[str, Any]:
    """Write ``chosen/<method>.yaml``: the best trial's values as Hydra overrides, after the
    method's own changes to the setting (``per_method``), so that the setting's overrides plus
    these reproduce the method's runs."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    counted, interrupted = counted_trials(trials)
    states = {s.name.lower(): sum(t.state == s for t in counted) for s in TrialState}
    states["interrupted"] = len(interrupted)
    if complete:
        best = max(complete, key=lambda t: t.value)
        params = dict(best.params)
        value, number = float(best.value), best.number
    else:  # every trial failed or was pruned: fall back to the declared defaults
        params, value, number = {}, None, None
    change = setting.per_method.get(method)
    own = list(setting.own_overrides(method))
    values = [f"{k}={format_value(v)}" for k, v in params.items()]
    overrides = [*own, f"strategy={method}", *values]
    chosen = {
        "method": method,
        "setting": setting.name,
        "suite": suite.name,
        "objective": OBJECTIVE,
        "value": value,
        "best_trial": number,
        "budget": {"trials": suite.trials, **{k: v for k, v in states.items() if v}},
        "space": {k: p.describe() for k, p in suite.space_for(method, setting).items()},
        "params": {k: v for k, v in params.items()},
        "method_overrides": own,
        "reason": change.reason if change else "",
        "overrides": overrides,
    }
    path = layout.chosen_file(setting.name, method)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# pflower tune: the values chosen for {method} on {setting.name} (suite {suite.name}).\n"
        "# Use them as Hydra overrides: pflower <setting overrides> $(pflower tune --overrides "
        f"{path.name})\n"
    )
    path.write_text(header + yaml.safe_dump(chosen, sort_keys=False, allow_unicode=True))
    return chosen


def read_chosen(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


# ----------------------------------------------------------------------------------- finals
def final_runs(
    suite: Suite,
    setting: Setting,
    method: str,
    layout: Layout,
    workers: int = 1,
    timeout_s: float | None = None,
    log: Callable[[str], None] = print,
    runner: Runner | None = None,
    retry_failed: bool = False,
) -> list[Path]:
    """Run the chosen values with every final seed on test. Completed runs are kept, and so are
    failed ones (a run that diverged diverges again: the leaderboard reports it) unless
    ``retry_failed`` (a run stopped by ``timeout_s`` counts as failed); a run that never finished
    or was interrupted (a signal: Ctrl-C, ``kill``) runs again."""
    execute = runner or run_pflower
    from concurrent.futures import ThreadPoolExecutor

    chosen = read_chosen(layout.chosen_file(setting.name, method))
    todo = []
    for seed in suite.final_seeds:
        run_dir = layout.final_dir(setting.name, method, seed)
        summary = read_summary(run_dir) or {}
        failed = failed_by_itself(summary)
        if summary.get("status") == "completed" or (failed and not retry_failed):
            if failed:
                log(
                    f"{setting.name} {method} final seed {seed} failed before, kept "
                    f"(--retry-failed runs it again): {error_line(summary)}"
                )
            continue
        shutil.rmtree(run_dir, ignore_errors=True)  # unfinished, interrupted or retried: rerun
        todo.append((seed, run_dir))

    def run(item: tuple[int, Path]) -> Path:
        seed, run_dir = item
        command = run_command(final_overrides(suite, setting, chosen["overrides"], seed), run_dir)
        try:
            summary = execute(command, run_dir, timeout_s=timeout_s)
            acc = summary["final"]["L1"]["acc_local"]["mean"]
            log(f"{setting.name} {method} final seed {seed}: L1 Acc(L) {acc:.4f}")
        except TrialFailed as error:
            log(f"{setting.name} {method} final seed {seed} failed: {error}")
        return run_dir

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool, runs_stop_together():
        list(pool.map(run, todo))
    return [layout.final_dir(setting.name, method, seed) for seed in suite.final_seeds]
