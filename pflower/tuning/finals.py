"""A study's outcome: the chosen values (``chosen/<method>.yaml``) and the final runs that run
them with new seeds on test (`.search` finds the values; [`pflower.tuning.cli`][pflower.tuning.cli]
calls both)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from pflower.results.failures import error_line, failed_by_itself
from pflower.searchspace import format_value
from pflower.tuning.layout import Layout
from pflower.tuning.ledger import counted_trials, rounds_run, spending
from pflower.tuning.runner import (
    RunInterrupted,
    Runner,
    TrialFailed,
    read_summary,
    run_pflower,
    runs_stop_together,
)
from pflower.tuning.search import OBJECTIVE, run_command, study_name
from pflower.tuning.suite import Setting, Suite


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


# ---------------------------------------------------------------------------------- chosen
def write_chosen(
    study: Any,
    suite: Suite,
    setting: Setting,
    method: str,
    layout: Layout,
    study_id: int | None = None,
) -> dict[str, Any]:
    """Write ``chosen/<method>.yaml`` (``chosen/<method>/study_<k>.yaml``): the best trial's
    values as Hydra overrides, after the method's own changes to the setting (``per_method``),
    so that the setting's overrides plus these reproduce the method's runs; and what the study
    spent (``search``: its plan, seed, distinct configurations, those run to the end, rounds
    run and repeats skipped). Only trials run to the end compete: a pruned trial's value is
    that of fewer rounds."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    counted, interrupted = counted_trials(trials)
    spent = spending(trials, suite.search)
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
        "budget": {
            **(
                {"trials": suite.trials}
                if suite.search.budget_runs is None
                else {"full_runs": suite.search.budget_runs}
            ),
            **{k: v for k, v in states.items() if v},
        },
        "search": {
            "plan": suite.search.describe(suite.trials),
            "study": study_id,
            "tune_seed": suite.study_seed(study_id),
            "configurations": spent.distinct,
            "to_the_end": spent.to_the_end,
            "rounds_run": sum(rounds_run(t) for t in counted),
            "repeats": spent.repeats,
        },
        "space": {k: p.describe() for k, p in suite.space_for(method, setting).items()},
        "params": {k: v for k, v in params.items()},
        "method_overrides": own,
        "reason": change.reason if change else "",
        "overrides": overrides,
    }
    path = layout.chosen_file(setting.name, method, study_id)
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
def holds_chosen(summary: Mapping[str, Any], chosen: Mapping[str, Any]) -> bool:
    """Whether a final run's recorded configuration holds every value ``chosen`` names, as its
    overrides spell them (a run recorded without its configuration is taken to)."""
    config = summary.get("config")
    if not isinstance(config, Mapping):
        return True
    for key, value in (chosen.get("params") or {}).items():
        node: Any = config
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return False
            node = node[part]
        if format_value(node) != format_value(value):
            return False
    return True


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
    study_id: int | None = None,
) -> list[Path]:
    """Run the chosen values of study ``study_id`` with every final seed on test. Completed
    runs are kept, and so are failed ones (a run that diverged diverges again: the leaderboard
    reports it) unless ``retry_failed`` (a run stopped by ``timeout_s`` counts as failed); a run
    that never finished or was interrupted (a signal: Ctrl-C, ``kill``) runs again, and so does
    one of values the study no longer chooses (`holds_chosen`: a resumed study chose anew)."""
    execute = runner or run_pflower
    from concurrent.futures import ThreadPoolExecutor

    chosen = read_chosen(layout.chosen_file(setting.name, method, study_id))
    where = f"{setting.name} {study_name(method, study_id)}"
    todo = []
    for seed in suite.final_seeds:
        run_dir = layout.final_dir(setting.name, method, seed, study_id)
        summary = read_summary(run_dir) or {}
        failed = failed_by_itself(summary)
        if not holds_chosen(summary, chosen):
            log(f"{where} final seed {seed} ran values the study no longer chooses: it runs again")
        elif summary.get("status") == "completed" or (failed and not retry_failed):
            if failed:
                log(
                    f"{where} final seed {seed} failed before, kept "
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
            log(f"{where} final seed {seed}: L1 Acc(L) {acc:.4f}")
        except RunInterrupted as error:
            log(f"{where} final seed {seed} {error}: it runs again at the next pflower tune")
        except TrialFailed as error:
            log(f"{where} final seed {seed} failed: {error}")
        return run_dir

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool, runs_stop_together():
        list(pool.map(run, todo))
    return [layout.final_dir(setting.name, method, seed, study_id) for seed in suite.final_seeds]
