"""What ``pflower tune`` asks of an Optuna study's storage that Optuna's ``Study`` and ``Trial``
do not offer: a trial's heartbeat, a trial as stored, every trial as the database holds it, and
failing the trials a stopped ``pflower tune`` left running.

Heartbeats are meant for ``Study.optimize``; pflower's tuning runs its trials with ask and tell
(several ``pflower tune`` processes may share one study), so it records a running trial's
heartbeat itself, which only the study's storage can do, by the trial's storage id. Both live in
private attributes (``Study._storage``, ``Study._study_id``, ``Trial._trial_id``), and the storage
a study holds is a per-process cache in front of the database (``_CachedStorage._backend``), so
these functions are in the fence, with
[`retry_callback`][pflower.runtime.optuna_storage.retry_callback], which follows a renaming in
Optuna ([`pflower.runtime.fence`][pflower.runtime.fence]:
`OPTUNA_RECORD_HEARTBEAT`, `OPTUNA_GET_TRIAL`, `OPTUNA_ALL_TRIALS`, `OPTUNA_FAIL_TRIAL`); tuning
code calls only them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def retry_callback() -> tuple[str, Any]:
    """Optuna's callback that re-enqueues a heartbeat-stale trial, and the storage keyword that
    takes it (renamed in Optuna 4.9)."""
    import optuna

    if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback"):
        callback = optuna.storages.RetryHeartbeatStaleTrialCallback
        return "heartbeat_stale_trial_callback", callback
    return "failed_trial_callback", optuna.storages.RetryFailedTrialCallback


def _storage_id(trial: Any) -> int:
    """The storage's id of an ``optuna.Trial`` or ``FrozenTrial`` (not its number in the study)."""
    trial_id: int = trial._trial_id
    return trial_id


def record_heartbeat(study: Any, trial: Any) -> None:
    """Record that ``trial`` of ``study`` is alive now (a trial whose heartbeat is older than the
    storage's grace period is failed as stale by ``optuna.storages.fail_stale_trials``)."""
    study._storage.record_heartbeat(_storage_id(trial))


def heartbeat(study: Any, trial: Any) -> Callable[[], None]:
    """A function that records ``trial``'s heartbeat each time it is called."""
    return lambda: record_heartbeat(study, trial)


def stored_trial(study: Any, trial: Any) -> Any:
    """``trial`` as ``study``'s storage holds it now (a ``FrozenTrial``: what Optuna's
    heartbeat-stale callbacks take)."""
    return study._storage.get_trial(_storage_id(trial))


def trials_of(study: Any) -> list[Any]:
    """Every trial of ``study`` as its database holds it now, also those another process added
    or finished since this process last looked (past Optuna's per-process trial cache); not
    copies, so not to be changed."""
    storage = study._storage
    backend = getattr(storage, "_backend", storage)
    trials: list[Any] = backend.get_all_trials(study._study_id, deepcopy=False)
    return trials


def fail_running_trials(study: Any) -> list[int]:
    """Fail every trial of ``study`` that is RUNNING now and pass each to the storage's
    heartbeat-stale callback, as ``optuna.storages.fail_stale_trials`` does for a trial whose
    heartbeat is late: for a caller that knows no live process runs them. Returns their numbers
    (a trial another process finished meanwhile is left as it is)."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    storage = study._storage
    failed = []
    for trial in trials_of(study):
        if trial.state != TrialState.RUNNING:
            continue
        try:
            if storage.set_trial_state_values(_storage_id(trial), state=TrialState.FAIL):
                failed.append(trial)
        except UpdateFinishedTrialError:
            continue
    callback = storage.get_heartbeat_stale_trial_callback()
    for trial in failed:
        if callback is not None:
            callback(study, stored_trial(study, trial))
    return [trial.number for trial in failed]
