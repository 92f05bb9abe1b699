"""What a study's trials say: which count toward its budget, what they spent, which repeat
another's configuration, and where the quasi-random sequence stands (`.search` asks,
`.finals` and the leaderboard read); and what a study searches, so that a resumed study searches
the same space."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pflower.registry import ConfigError
from pflower.results.rows import read_rows
from pflower.runtime.optuna_storage import (
    fail_running_trials,
    retry_callback,
    stored_trial,
    trials_of,
)
from pflower.searchspace import Param
from pflower.tuning.runner import rounds_completed
from pflower.tuning.schedule import SearchPlan, configuration, distinct
from pflower.tuning.suite import Setting

MAX_RETRY = 3
"""How many times a trial's values run again after runs that were not let finish (left running
by a stopped command, or interrupted by a signal from outside it); one more such end counts
toward the budget as a failed trial: a configuration whose every run is killed (by an
out-of-memory watchdog, say) must not be retried forever."""


def retried_numbers(trials: Sequence[Any]) -> set[int]:
    """Trials failed for staleness (their run was interrupted), interrupted by a signal
    ([`RunInterrupted`][pflower.tuning.runner.RunInterrupted]) or refused before their run
    started ([`RunRefused`][pflower.tuning.runner.RunRefused]), and re-enqueued with their
    values: every trial of a retry's history (Optuna's ``failed_trial`` names only the first of
    a chain, so a retry that was itself retried would count)."""
    _, callback = retry_callback()
    return {number for t in trials for number in callback.retry_history(t)}


def retry(study: Any, trial: Any, limit: int | None = MAX_RETRY) -> bool:
    """Enqueue the values of ``trial``, still running, again (Optuna's retry callback, which
    records the retries' history), unless they already ran again ``limit`` times; return whether
    it did. A trial that is no longer running was failed as stale by the heartbeat check, which
    enqueued it: nothing to do."""
    from optuna.trial import TrialState

    stored = stored_trial(study, trial)
    _, callback = retry_callback()
    if stored.state != TrialState.RUNNING or (
        limit is not None and len(callback.retry_history(stored)) >= limit
    ):
        return False
    callback()(study, stored)
    return True


def counted_trials(trials: Sequence[Any]) -> tuple[list[Any], set[int]]:
    """The trials that count toward the budget, and the numbers of those that do not: the
    interrupted ones, retried with the same values. Repeats (a draw of a configuration the study
    had tried, never run: `REPEAT_ATTR`) are in neither."""
    interrupted = retried_numbers(trials)
    counted = [t for t in trials if t.number not in interrupted and REPEAT_ATTR not in t.user_attrs]
    return counted, interrupted


@contextlib.contextmanager
def driving(path: Path, study: Any, log: Callable[[str], None]) -> Iterator[None]:
    """Hold ``path`` shared while this process runs trials of ``study``'s setting. A driver
    that finds nobody else holding it (an exclusive lock is free: the kernel drops the lock of a
    process that ended, however it ended) knows that a trial still RUNNING was left by a
    ``pflower tune`` that was stopped: it fails such trials at once, and Optuna's retry
    callback enqueues their values again, instead of waiting out the heartbeat's grace period
    (``GRACE_S``, which still covers a driver whose lock this one cannot see, e.g. on a file
    system without shared locks)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another driver is running: its trials are its own
        else:
            left = fail_running_trials(study)
            if left:
                numbers = ", ".join(str(n) for n in left)
                which = f"trial {numbers} was" if len(left) == 1 else f"trials {numbers} were"
                log(
                    f"{study.study_name}: {which} left running by a stopped pflower tune "
                    "(retried with the same values)"
                )
        fcntl.flock(handle, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


REPEAT_LIMIT = 200
"""A study whose sampler drew this many repeats has, for that sampler, no new configuration
left (TPE can settle on a small finite space): it stops instead of drawing forever."""
REPEAT_ATTR = "repeat_of"
"""The user attribute of a trial whose draw repeated trial N's configuration: not run, no cost."""
ROUNDS_ATTR = "rounds_run"
"""The user attribute holding the rounds a finished trial's run completed (its compute)."""
QMC_ATTR = "qmc_index"
"""The user attribute holding the index of a quasi-random trial's point (`.schedule`)."""


def rounds_run(trial: Any) -> int:
    """The rounds ``trial``'s run completed. A trial told without them (failed as stale after
    its retries, or told before pflower recorded them): the rounds its run folder's rows show
    (`rounds_completed`: a trial evaluates only some rounds), else its last reported round."""
    recorded = trial.user_attrs.get(ROUNDS_ATTR)
    if recorded is not None:
        return int(recorded)
    run_dir = trial.user_attrs.get("run_dir")
    rows = read_rows(Path(run_dir)) if run_dir else []
    return rounds_completed(rows) if rows else max(trial.intermediate_values, default=0)


@dataclass(frozen=True)
class Spending:
    """What a study has spent: budget units of its finished trials, trials running, distinct
    configurations tried (running ones included), those run to the end, repeated draws (not
    run), and retries waiting to run (the values of an interrupted trial, enqueued again)."""

    spent: float
    running: int
    distinct: int
    to_the_end: int
    repeats: int
    waiting: int


def spending(trials: Sequence[Any], plan: SearchPlan) -> Spending:
    """What the study of ``trials`` has spent under ``plan``."""
    from optuna.trial import TrialState

    counted, _ = counted_trials(trials)
    ended = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return Spending(
        spent=sum(plan.cost(rounds_run(t)) for t in counted if t.state in ended),
        running=sum(t.state == TrialState.RUNNING for t in trials),
        distinct=distinct(
            [configuration(t.params) for t in counted if t.state != TrialState.WAITING]
        ),
        to_the_end=sum(t.state == TrialState.COMPLETE for t in counted),
        repeats=sum(REPEAT_ATTR in t.user_attrs for t in trials),
        waiting=sum(t.state == TrialState.WAITING for t in trials),
    )


def repeated(trials: Sequence[Any], trial: Any) -> int | None:
    """The number of an earlier counted trial with ``trial``'s configuration, if any."""
    from optuna.trial import TrialState

    mine = configuration(trial.params)
    counted, _ = counted_trials(trials)
    for other in counted:
        if (
            other.number != trial.number
            and other.state != TrialState.WAITING
            and configuration(other.params) == mine
        ):
            return int(other.number)
    return None


def next_point(trials: Sequence[Any]) -> int:
    """The index of the next quasi-random point of a study (one past the highest drawn)."""
    return 1 + max((int(t.user_attrs.get(QMC_ATTR, -1)) for t in trials), default=-1)


def budget_counts(study: Any) -> tuple[int, int]:
    """(finished trials that count toward the budget, running trials)."""
    from optuna.trial import TrialState

    trials = trials_of(study)  # past Optuna's per-process trial cache
    counted, _ = counted_trials(trials)
    finished = sum(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) for t in counted
    )
    running = sum(t.state == TrialState.RUNNING for t in trials)
    return finished, running


SEARCH_ATTR = "search"
"""The study's user attribute holding what it searches (see
[`check_study_space`][pflower.tuning.ledger.check_study_space])."""


def search_record(
    space: Mapping[str, Param], setting: Setting, method: str, plan: SearchPlan | None = None
) -> dict[str, Any]:
    """What a study searches: every key's range and the method's own overrides here, and how
    it draws and stops trials (`SearchPlan.how`; not recorded for TPE with the median
    pruner, the only search before plans existed, so those studies still resume)."""
    record: dict[str, Any] = {
        "space": {key: param.describe() for key, param in space.items()},
        "method_overrides": list(setting.own_overrides(method)),
    }
    if plan is not None and (plan.sampler, plan.scheduler) != ("tpe", "median"):
        record["plan"] = plan.how()
    return record


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
