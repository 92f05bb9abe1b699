"""The search: Optuna studies over a method's declared space, every trial a normal pflower run.

For one setting of a suite and one method, [`tune`][pflower.tuning.search.tune] spends a study's
budget (``suite.trials`` trials, or the compute of ``search.budget_runs`` full runs) on draws of
the suite's sampler: the next point of a Halton sequence scrambled with the study's tuning seed,
or TPE seeded with it and the trial's number
([`trial_sampler`][pflower.tuning.search.trial_sampler]; `.schedule` has the plans). Each trial
is ``python -m pflower checkpoint.every=0 <setting overrides> <the method's per_method
overrides> strategy=<method> seed=<study seed> split.val_fraction=<v> split.evaluate_on=val
eval.stages=[L1] eval.client_global_test=off plots=false [eval.rounds=[...]] <sampled values>
output_dir=<trial folder> ...`` ([`trial_overrides`][pflower.tuning.search.trial_overrides],
[`run_command`][pflower.tuning.search.run_command]; the sampled values come last, so they win):
composed from the
same ``conf/`` tree as any other run, it evaluates on the clients' validation shares, so no
test sample is read ([`pflower.datasets.federation`][pflower.datasets.federation], step 6). Each
finished round's mean stage-L1 Acc(L) (the deployable model on validation) goes to the
scheduler (successive halving or the median pruner), which may stop it early. The objective is
the run's ``last10`` stage-L1 Acc(L) mean: the clients' mean validation accuracy of their
deployable models over the last 10% of rounds.

The study lives in ``<out>/<setting>/study.db`` (Optuna's SQLite storage, one study per method
and study number) and resumes where it stopped: finished trials count (complete, pruned, or
failed by their own run), and a trial whose run was not let finish (its ``pflower tune``
stopped, a signal from outside, a run refused before it started) is retried with the same
values (``RetryFailedTrialCallback``) and not counted; a retry runs even once the budget is
spent (its values were drawn while it had room), so a resumed study tries what it drew.
``workers`` trials run at once (threads of this process, each driving one trial process);
several ``pflower tune`` processes on one machine may share a study (a file lock keeps the
count exact).
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pflower.config import RunRecord
from pflower.results.rows import read_rows
from pflower.runtime.optuna_storage import (
    heartbeat,
    record_heartbeat,
    retry_callback,
)
from pflower.searchspace import Param, format_value
from pflower.tuning.layout import Layout
from pflower.tuning.ledger import (
    MAX_RETRY,
    QMC_ATTR,
    REPEAT_ATTR,
    REPEAT_LIMIT,
    ROUNDS_ATTR,
    check_study_space,
    driving,
    next_point,
    repeated,
    retry,
    search_record,
    spending,
)
from pflower.tuning.runner import (
    HEARTBEAT_S,
    POLL_S,
    Pruned,
    RunInterrupted,
    Runner,
    RunRefused,
    TrialFailed,
    objective_of,
    rounds_completed,
    run_pflower,
    runs_stop_together,
)
from pflower.tuning.schedule import (
    TPE_STARTUP_TRIALS,
    SearchPlan,
    pruned_at,
    quasi_random_point,
    space_size,
)
from pflower.tuning.suite import Setting, Suite

OBJECTIVE = (
    "last-10% mean of stage-L1 Acc(L) on the clients' validation shares, a client left out of "
    "an evaluation scored 0"
)
"""What a trial maximizes (`pflower.tuning.runner.objective_of`), as each chosen file records it.
Studies chosen before 2026-12-06 averaged the clients that replied instead (their chosen files
say so)."""
OBJECTIVE_ONLY = ("eval.stages=[L1]", "eval.client_global_test=off", "plots=false")
"""A tuning run measures what `OBJECTIVE` reads and nothing else: no stage G, no stage L2,
no Acc(G) (the same stage-L1 Acc(L) as a run that measures all: ``tests/test_search_plan.py``),
and draws no plots (0.4-0.8 s of a completed trial; its rows say what a plot would)."""
GRACE_S = 90


def study_name(method: str, study: int | None) -> str:
    """The name of ``method``'s study ``study`` in the setting's storage (``method`` alone for a
    suite of one study)."""
    return method if study is None else f"{method}@study_{study}"


# ---------------------------------------------------------------------------------- commands
def run_command(overrides: Sequence[str], run_dir: Path) -> list[str]:
    """The command of one pflower run of ``overrides`` writing into ``run_dir`` (its run
    record, [`RunRecord.to_overrides`][pflower.config.record.RunRecord.to_overrides], on the
    command line).

    Checkpoints are off (``checkpoint.every=0``) unless the overrides turn them on: a trial or a
    final run that stops before its ``summary.json`` is started afresh, never resumed, so its
    checkpoint and its clients' state snapshots would only fill the disk (37 of the cpu suite's
    37.3 GiB). They do not change what a run computes (``tests/test_resume.py``)."""
    record = RunRecord.from_overrides(overrides, run_dir=run_dir)
    return [
        sys.executable,
        "-m",
        "pflower",
        "checkpoint.every=0",
        *record.to_overrides(),
        f"hydra.run.dir={run_dir}",
        "progress=false",
    ]


def trial_overrides(
    suite: Suite,
    setting: Setting,
    method: str,
    values: Mapping[str, Any],
    seed: int | None = None,
    evaluated: Sequence[int] | None = None,
) -> list[str]:
    """A tuning run: the setting (with the method's own changes), the method, the tuning seed
    (``seed``, a study's: `Suite.study_seed`; default the suite's ``tune_seed``),
    validation only, the values; evaluated in the rounds ``evaluated`` alone (``eval.rounds``,
    `SearchPlan.evaluated_rounds`; None: every round)."""
    only = [] if evaluated is None else [f"eval.rounds=[{','.join(map(str, evaluated))}]"]
    return list(
        setting.overrides_for(
            method,
            [
                f"strategy={method}",
                f"seed={suite.tune_seed if seed is None else seed}",
                f"split.val_fraction={suite.val_fraction}",
                "split.evaluate_on=val",
                *OBJECTIVE_ONLY,
                *only,
                *(f"{key}={format_value(value)}" for key, value in values.items()),
            ],
        )
    )


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


def _storage(url: str) -> Any:
    import optuna

    keyword, callback = retry_callback()
    return optuna.storages.RDBStorage(
        url,
        engine_kwargs={"connect_args": {"timeout": 120}},
        heartbeat_interval=HEARTBEAT_S,
        grace_period=GRACE_S,
        **{keyword: callback(max_retry=MAX_RETRY)},
    )


def quiet_optuna() -> None:
    """Silence Optuna's notes on the experimental heartbeat API this module relies on (and its
    hint that heartbeats are meant for ``Study.optimize``: here ask/tell records them)."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")


def open_study(
    layout: Layout,
    setting: str,
    method: str,
    seed: int,
    parallel: bool,
    pruner: Any = None,
    study: int | None = None,
) -> Any:
    """The method's study ``study`` in the setting's SQLite storage, created or resumed."""
    import optuna

    quiet_optuna()
    layout.setting_dir(setting).mkdir(parents=True, exist_ok=True)
    return optuna.create_study(
        study_name=study_name(method, study),
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


def _one_trial(
    study: Any,
    trial: Any,
    values: Mapping[str, Any],
    suite: Suite,
    setting: Setting,
    method: str,
    layout: Layout,
    timeout_s: float | None,
    log: Callable[[str], None],
    runner: Runner,
    rounds: int,
    study_id: int | None = None,
) -> None:
    from optuna.exceptions import UpdateFinishedTrialError

    run_dir = layout.trial_dir(setting.name, method, trial.number, study_id)
    shutil.rmtree(run_dir, ignore_errors=True)  # left by a study that was deleted
    seed = suite.study_seed(study_id)
    evaluated = suite.search.evaluated_rounds(rounds)
    command = run_command(trial_overrides(suite, setting, method, values, seed, evaluated), run_dir)
    trial.set_user_attr("command", " ".join(command[2:]))
    trial.set_user_attr("run_dir", str(run_dir))

    def on_round(server_round: int, value: float) -> bool:
        return pruned_at(trial, server_round, value, rounds)

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

    name = f"{study.study_name} trial {trial.number}"

    def ran() -> None:
        trial.set_user_attr(ROUNDS_ATTR, rounds_completed(read_rows(run_dir)))

    try:
        summary = runner(
            command,
            run_dir,
            on_round,
            heartbeat=heartbeat(study, trial),
            timeout_s=timeout_s,
        )
    except Pruned as stop:
        ran()
        study.tell(trial, state=TrialState.PRUNED)
        log(f"{name}: {stop}")
        return
    except (RunRefused, RunInterrupted) as error:
        # not the values' doing: retried with them (a refused one once the cause is fixed), as
        # a trial left running is, and not counted toward the budget (see retried_numbers)
        refused = isinstance(error, RunRefused)
        retried = retry(study, trial, None if refused else MAX_RETRY)
        said = f"refused before it started: {error}" if refused else str(error)
        trial.set_user_attr("error", said[:2000])
        if not retried:  # it counts: at the rounds it ran
            ran()
        study.tell(trial, state=TrialState.FAIL)
        if refused:
            raise
        again = "retried with the same values" if retried else "counted as failed (retried enough)"
        log(f"{name}: {error}; {again}")
        return
    except TrialFailed as error:
        ran()
        trial.set_user_attr("error", str(error)[:2000])
        study.tell(trial, state=TrialState.FAIL)
        log(f"{name} failed: {error}")
        return
    except BaseException:
        # interrupted: leave the trial RUNNING; Optuna's heartbeat check fails and retries it
        raise
    ran()
    value = objective_of(summary)
    trial.set_user_attr("wall_time_s", summary.get("wall_time_s"))
    study.tell(trial, value)
    shown = ", ".join(f"{k}={format_value(v)}" for k, v in values.items())
    log(f"{name}: {value:.4f}  {shown}")


def _draw(
    study: Any, space: Mapping[str, Param], plan: SearchPlan, seed: int, parallel: bool
) -> tuple[Any, dict[str, Any], int | None]:
    """Ask ``study`` for its next trial and draw its values (under the study's lock, so that two
    workers never draw one configuration): a retried trial's own values first, else the next
    quasi-random point (``qmc``) or the seeded TPE draw. Returns the trial, its values and the
    number of the earlier trial it repeats (None: a new configuration)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    waiting = any(t.state == TrialState.WAITING for t in trials)
    if plan.sampler == "qmc" and not waiting:
        index = next_point(trials)
        point = quasi_random_point(space, seed, index)
        study.enqueue_trial(point, user_attrs={QMC_ATTR: index}, skip_if_exists=False)
    study.sampler = trial_sampler(seed, len(trials), parallel)
    trial = study.ask()
    record_heartbeat(study, trial)  # a dead driver leaves a stale trial
    values = {key: param.suggest(trial, key) for key, param in space.items()}
    return trial, values, repeated(study.get_trials(deepcopy=False), trial)


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
    study_id: int | None = None,
) -> Any:
    """Run (or resume) the method's study ``study_id`` until it has spent its budget (the
    suite's ``search``: [`SearchPlan`][pflower.tuning.schedule.SearchPlan]), or tried every point of
    a finite space (``runner``: how a run is executed, default `run_pflower`;
    `RayRunner`)."""
    runner = runner or run_pflower
    from optuna.storages import fail_stale_trials
    from optuna.trial import TrialState

    space = suite.space_for(method, setting)
    plan, seed, parallel = suite.search, suite.study_seed(study_id), workers > 1
    pruner = plan.pruner(suite.trials, rounds)
    limit, running_cost = plan.limit(suite.trials, rounds), plan.cost(rounds)
    size = space_size(space)
    lock = layout.lock_file(setting.name)
    errors: list[BaseException] = []
    ended, trials_ended = threading.Condition(), [0]  # a waiting worker wakes when one ends

    def worker() -> None:
        study = open_study(layout, setting.name, method, seed, parallel, pruner, study_id)
        while not errors:
            seen = trials_ended[0]
            with file_lock(lock):  # count and start under one lock: the budget stays exact
                fail_stale_trials(study)
                spent = spending(study.get_trials(deepcopy=False), plan)
                # a retry waiting holds values drawn while the budget had room: it runs even
                # past the budget, as the trial it retries would have, had it not been stopped
                done = spent.spent >= limit or (size is not None and spent.distinct >= size)
                if done and not spent.waiting:
                    return
                if spent.repeats >= REPEAT_LIMIT:
                    log(
                        f"{study.study_name}: {spent.repeats} draws repeated configurations it "
                        f"had tried; it stops with {spent.distinct} (the sampler has settled)"
                    )
                    return
                trial = None
                if spent.waiting or spent.spent + spent.running * running_cost < limit:
                    trial, values, repeat = _draw(study, space, plan, seed, parallel)
                    if repeat is not None:  # never run twice: recorded, costs nothing
                        trial.set_user_attr(REPEAT_ATTR, repeat)
                        study.tell(trial, state=TrialState.FAIL)
                        log(f"{study.study_name} trial {trial.number} repeats {repeat}: skipped")
                        continue
            if trial is None:  # others' trials are running: wait for one to end (another
                with ended:  # driver's, in another process, is seen at the next poll)
                    if trials_ended[0] == seen:
                        ended.wait(timeout=POLL_S * 5)
                continue
            try:
                _one_trial(
                    study,
                    trial,
                    values,
                    suite,
                    setting,
                    method,
                    layout,
                    timeout_s,
                    log,
                    runner,
                    rounds,
                    study_id,
                )
            except BaseException as error:  # raised below, once every worker has stopped
                errors.append(error)
                return
            finally:
                with ended:
                    trials_ended[0] += 1
                    ended.notify_all()

    with file_lock(lock):  # create the study once before the workers open it
        study = open_study(layout, setting.name, method, seed, parallel, None, study_id)
        record = search_record(space, setting, method, plan)
        check_study_space(study, record, setting.name)
    with (
        driving(layout.drivers_file(setting.name), study, log),
        runs_stop_together(),  # Ctrl-C stops the worker threads' runs too
    ):
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
    return open_study(layout, setting.name, method, seed, parallel, None, study_id)
