"""The stored tuning results searched what their protocol says, however often their commands
were stopped and resumed.

For every suite folder under ``results/tuning`` and ``results/rerun`` (its ``<setting>/study.db``
and final runs):

- a study that chose its values (its chosen file is written) drew, under a quasi-random plan,
  exactly the points of its tuning seed's sequence, in order (index ``i`` is point ``i``);
- every configuration it drew ran (a trial that counts, ended) or repeats one that ran, and no
  retry is left waiting: an interruption cost it nothing (a resumed study of the cpu suite once
  left its last configuration's retry waiting, and another, stopped twice in a row, skipped
  two configurations as repeats of their own interrupted retries);
- every final run holds the values its study chose (`holds_chosen`), and every one that did
  not complete failed by itself (diverged, raised): one a signal stopped has not run yet and
  would have run again;
- and the cpu suite's folder is one a new method can be ranked against with this code (its runs
  recorded by code whose parts equal this code's, or verified under it).

The folder's studies are read from the committed files only; the test runs no trial.
"""

from __future__ import annotations

import csv
import json
import logging
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pflower.results.failures import failed_by_itself
from pflower.tuning.baselines import check_stored_runs
from pflower.tuning.finals import holds_chosen
from pflower.tuning.ledger import QMC_ATTR, counted_trials
from pflower.tuning.schedule import configuration, quasi_random_point
from pflower.tuning.suite import load_suite

RESULTS = Path(__file__).resolve().parent.parent / "results" / "tuning"
RERUNS = RESULTS.parent / "rerun"  # suites being re-run, committed as they go
SUITES = sorted(p.parent for folder in (RESULTS, RERUNS) for p in folder.glob("*/suite.yaml"))


def _chosen_file(setting_dir: Path, method: str, study: str | None) -> Path:
    chosen = setting_dir / "chosen"
    return chosen / f"{method}.yaml" if study is None else chosen / method / f"study_{study}.yaml"


def _completed_studies(setting_dir: Path) -> Iterator[tuple[str, str | None, list[Any]]]:
    """(method, study number or None, trials) of each study of the setting that chose."""
    import optuna

    optuna.logging.set_verbosity(logging.WARNING)
    url = f"sqlite:///{setting_dir / 'study.db'}"
    for summary in optuna.get_all_study_summaries(url):
        method, _, study = summary.study_name.partition("@study_")
        if _chosen_file(setting_dir, method, study or None).exists():
            trials = optuna.load_study(study_name=summary.study_name, storage=url).get_trials()
            yield method, study or None, trials


def _settings() -> list[Path]:
    return sorted(p.parent for suite in SUITES for p in suite.glob("*/study.db"))


@pytest.mark.parametrize(
    "setting_dir", _settings(), ids=lambda p: f"{p.parent.name}/{p.name}" if p else ""
)
def test_every_drawn_configuration_of_a_stored_study_ran(setting_dir: Path) -> None:
    from optuna.trial import TrialState

    suite = load_suite(yaml.safe_load((setting_dir.parent / "suite.yaml").read_text())["name"])
    setting = next((s for s in suite.settings if s.name == setting_dir.name), None)
    ended = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    problems: list[str] = []
    studies = 0
    for method, study, trials in _completed_studies(setting_dir):
        studies += 1
        name = f"{method}@study_{study}" if study is not None else method
        counted, _ = counted_trials(trials)
        ran = {configuration(t.params) for t in counted if t.state in ended}
        waiting = [t.number for t in trials if t.state == TrialState.WAITING]
        problems += [f"{name}: trial {n} waits" for n in waiting]
        problems += [
            f"{name}: trial {t.number} ({t.params}) never ran"
            for t in trials
            if configuration(t.params) not in ran  # a repeat's configuration ran as the first
        ]
        points = {int(t.user_attrs[QMC_ATTR]) for t in trials if QMC_ATTR in t.user_attrs}
        if not points:  # a TPE study (the previous protocol): its draws are TPE's
            continue
        assert setting is not None, f"{setting_dir}: no such setting in suite {suite.name}"
        assert points == set(range(len(points))), f"{name}: points {sorted(points)}"
        space = suite.space_for(method, setting)
        seed = suite.study_seed(int(study) if study is not None else None)
        for trial in trials:
            point = quasi_random_point(space, seed, int(trial.user_attrs[QMC_ATTR]))
            if configuration(trial.params) != configuration(point):
                problems.append(f"{name}: trial {trial.number} is not its point of the sequence")
    assert studies, f"{setting_dir}: no study chose"
    assert problems == []


@pytest.mark.parametrize("suite_dir", SUITES, ids=lambda p: p.name if p else "")
def test_every_stored_final_run_holds_its_study_s_chosen_values(suite_dir: Path) -> None:
    runs = sorted(suite_dir.glob("*/final/**/seed_*/summary.json"))
    assert runs
    mismatched, interrupted = [], []
    for path in runs:
        parts = path.parent.relative_to(suite_dir).parts  # setting, final, method, [study], seed
        study = parts[3].removeprefix("study_") if len(parts) == 5 else None
        chosen = yaml.safe_load(_chosen_file(suite_dir / parts[0], parts[2], study).read_text())
        summary = json.loads(path.read_text())
        if not holds_chosen(summary, chosen):
            mismatched.append(str(path.parent.relative_to(suite_dir)))
        if summary["status"] != "completed" and not failed_by_itself(summary):
            interrupted.append(str(path.parent.relative_to(suite_dir)))
    assert mismatched == [] and interrupted == []


def _searches(setting_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Each method's studies' ``search`` records (its chosen files'), by method."""
    return {
        folder.name: [
            yaml.safe_load(path.read_text())["search"]
            for path in sorted(folder.glob("study_*.yaml"))
        ]
        for folder in sorted((setting_dir / "chosen").iterdir())
        if folder.is_dir()
    }


def test_the_tuning_guide_quotes_the_stored_searches() -> None:
    """The tuning guide's figures on how the cpu suite's recorded studies spent their budget:
    fmnist_dir01's configurations per method (range, rank correlation with the seconds per round
    and with the final accuracy), its studies' rounds against the budget, FedAvg's three studies,
    and mnist_path's studies within a run or two of their budget with configurations that do
    not clearly rise with the seconds per round.
    The four fmnist_dir01 tuned sections quote the same range of configurations."""
    from scipy import stats

    guide = " ".join((RESULTS.parent.parent / "docs" / "guide" / "tuning.md").read_text().split())
    root = RESULTS / "cpu"
    with (root / "leaderboard.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    budgets = {"fmnist_dir01": 8 * 30, "mnist_path": 8 * 15}
    for setting, budget in budgets.items():
        board = [r for r in rows if r["setting"] == setting and r["rank"].isdigit()]
        tried = [int(r["configurations (to the end)"].split()[0]) for r in board]
        speed = stats.spearmanr(tried, [float(r["s / round"]) for r in board]).statistic
        accuracy = stats.spearmanr(tried, [float(r["final Acc(L) %"].split()[0]) for r in board])
        spent = [s["rounds_run"] for v in _searches(root / setting).values() for s in v]
        one_run = budget // 8
        assert budget - 1 <= min(spent) and max(spent) <= budget + 2 * one_run
        if setting == "fmnist_dir01":
            assert len(board) == 33
            assert (
                f"tried {min(tried)} to {max(tried)} configurations, in step with their seconds "
                f"per round (Spearman's rank correlation {speed:.2f}) and with their final "
                f"accuracy ({accuracy.statistic:.2f})"
            ) in guide
            assert (
                f"ran {min(spent)} to {max(spent)} rounds (median {statistics.median(spent):g}) "
                f"of `fmnist_dir01`'s budget of {budget}"
            ) in guide
            fedavg = [s["configurations"] for s in _searches(root / setting)["fedavg"]]
            assert "tried {}, {} and {} configurations in FedAvg's".format(*fedavg) in guide
            quoted = f"tried {min(tried)} to {max(tried)} configurations, a slower method more"
            for name in ("fliu", "fedmpr", "fedala", "diversifed"):  # their tuned sections
                page = RESULTS.parent.parent / "docs" / "results" / f"{name}.md"
                assert quoted in " ".join(page.read_text().split()), name
        else:
            assert speed < 0.5, speed  # no clear rise with the seconds per round


def test_a_new_method_can_be_ranked_against_the_cpu_suite_s_stored_runs() -> None:
    """What the rank-your-method tutorial promises at every commit: `pflower tune <a new method>
    --suite cpu --out results/tuning/cpu` accepts the committed runs. Each stored method's
    recorded code parts equal this code's, or `verified.yaml` records one of its runs rerun by
    this code with every value equal; and `suite.yaml` holds the suite's protocol. A change to a
    part that decides the numbers, or a method whose runs are newly stored, fails here until
    `pflower reproduce --stored results/tuning/cpu --suite cpu` has verified it."""
    suite = load_suite("cpu")
    check_stored_runs(RESULTS / "cpu", suite, "cpu", suite.settings, ["a_new_method"])
