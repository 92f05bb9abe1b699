"""How a study spends its compute (``pflower.tuning.schedule``): quasi-random draws, a budget in
round-equivalents, successive halving, no configuration evaluated twice, and several independent
studies per method.

The runs here are simulated by :func:`_curve_runner`: it writes a run's ``metrics.jsonl`` round by
round with an accuracy that rises toward a value set by the run's learning rate, and reports
each round to the pruner as :func:`pflower.tuning.runner.run_pflower` does, so the study's
bookkeeping (rounds run, pruning, budget) is exercised exactly, without training.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from optuna.trial import TrialState

from pflower.compose import compose_config
from pflower.registry import ConfigError
from pflower.results.rows import last_round_done
from pflower.searchspace import Param
from pflower.tuning import finals, search
from pflower.tuning.ledger import REPEAT_ATTR, rounds_run, spending
from pflower.tuning.runner import (
    Pruned,
    objective_of,
    read_summary,
    round_means,
    rounds_completed,
    run_pflower,
    warm_runner,
)
from pflower.tuning.schedule import (
    SearchPlan,
    configuration,
    quasi_random_point,
    space_size,
    value_at,
)
from pflower.tuning.search import OBJECTIVE_ONLY, Layout, open_study, run_command
from pflower.tuning.suite import Suite, load_suite
from tests.inprocess import run_inprocess

ROUNDS = 9

SUITE = f"""\
name: plan
trials: 4
tune_seed: 0
final_seeds: [1, 2]
val_fraction: 0.25
train_knobs: [lr]
search: {{sampler: qmc, scheduler: halving, budget_runs: 4, min_fraction: 0.12,
  reduction_factor: 3}}
methods: [fedprox]
settings:
  - name: digits
    overrides: [dataset=digits, num_clients=4, rounds={ROUNDS}, train.local_epochs=1]
"""


def _suite(tmp_path: Path, text: str = SUITE) -> Suite:
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    return load_suite(str(path))


def _value(command: list[str], key: str) -> float:
    return next(float(c.split("=", 1)[1]) for c in command if c.startswith(f"{key}="))


def _evaluated(command: list[str]) -> set[int]:
    """The rounds a run of ``command`` evaluates (``eval.rounds`` and the last; every one
    without it)."""
    given = next((c.split("=", 1)[1] for c in command if c.startswith("eval.rounds=")), None)
    if given is None:
        return set(range(1, ROUNDS + 1))
    return {int(r) for r in given.strip("[]").split(",")} | {ROUNDS}


def _curve_runner(command, run_dir, on_round=None, heartbeat=None, timeout_s=None):
    """A run whose round-r accuracy is q * (1 - 0.5 ** r), q = 1 - |log10(lr / 0.01)| / 3: best
    at lr = 0.01, the same ordering at every round (what successive halving assumes)."""
    lr = _value(command, "train.lr")
    quality = 1.0 - abs(math.log10(lr / 0.01)) / 3.0
    evaluated = _evaluated(command)
    run_dir.mkdir(parents=True, exist_ok=True)
    accuracy = 0.0
    with (run_dir / "metrics.jsonl").open("w") as rows:
        for server_round in range(1, ROUNDS + 1):
            rows.write(json.dumps({"round": server_round, "stage": "time"}) + "\n")
            if server_round not in evaluated:
                continue
            accuracy = quality * (1.0 - 0.5**server_round)
            row = {"round": server_round, "stage": "L1", "client": 0, "acc_local": accuracy}
            rows.write(json.dumps(row) + "\n")
            rows.flush()
            if on_round is not None and server_round < ROUNDS and on_round(server_round, accuracy):
                raise Pruned(f"pruned after round {server_round}")
    return {"status": "completed", "last10": {"L1": {"acc_local": {"mean": accuracy}}}}


# ------------------------------------------------------------------------- quasi-random draws
def test_values_map_the_unit_interval_onto_each_kind_of_range() -> None:
    log = Param("float", 1e-4, 1.0, log=True)
    assert value_at(log, 0.0) == pytest.approx(1e-4)
    assert value_at(log, 0.5) == pytest.approx(1e-2)  # a log range's middle: geometric mean
    assert value_at(log, 1.0) <= 1.0
    grid = Param("float", 0.0, 1.0, step=0.25)  # 5 points, each a fifth of the unit interval
    assert [value_at(grid, u) for u in (0.0, 0.19, 0.5, 0.6, 0.99)] == [0.0, 0.0, 0.5, 0.75, 1.0]
    assert [value_at(Param("int", 1, 3), u) for u in (0.0, 0.34, 0.67, 0.99)] == [1, 2, 3, 3]
    assert [value_at(Param("choice", choices=("a", "b")), u) for u in (0.1, 0.9)] == ["a", "b"]


def test_quasi_random_points_are_a_function_of_seed_and_index_and_fill_the_space() -> None:
    space = {"train.lr": Param("float", 1e-4, 1.0, log=True), "strategy.mu": Param("float", 0, 1)}
    first = [quasi_random_point(space, seed=7, index=i) for i in range(16)]
    assert first[5] == quasi_random_point(space, seed=7, index=5)  # any process, any order
    assert first != [quasi_random_point(space, seed=8, index=i) for i in range(16)]
    # a low-discrepancy sequence: 16 points put one in each sixteenth of a dimension, where
    # independent draws leave about a third of them empty
    bins = {int(16 * (math.log10(p["train.lr"]) + 4) / 4) for p in first}
    assert len(bins) == 16, sorted(bins)


def test_a_space_counts_its_points_when_it_has_finitely_many() -> None:
    assert space_size({"a": Param("choice", choices=(1, 2, 3)), "b": Param("int", 0, 4)}) == 15
    assert space_size({"a": Param("float", 0.0, 1.0, step=0.5)}) == 3
    assert space_size({"a": Param("float", 0.0, 1.0)}) is None


# --------------------------------------------------------------------------- suite entries
def test_a_suite_refuses_an_unknown_plan_and_two_ways_of_saying_the_pruner(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"search\.sampler must be one of"):
        _suite(tmp_path, SUITE.replace("sampler: qmc", "sampler: grid"))
    with pytest.raises(ConfigError, match="unknown search keys"):
        _suite(tmp_path, SUITE.replace("budget_runs: 4", "budget: 4"))
    with pytest.raises(ConfigError, match="not under pruner as well"):
        _suite(tmp_path, SUITE.replace("methods:", "pruner: {enabled: false}\nmethods:"))


def test_a_suite_of_before_plans_reads_as_tpe_with_its_median_pruner(tmp_path: Path) -> None:
    start = SUITE.index("search:")
    end = SUITE.index("methods:")
    old = SUITE[:start] + "pruner: {startup_trials: 5, warmup_fraction: 0.5}\n" + SUITE[end:]
    suite = _suite(tmp_path, old)
    assert suite.search == SearchPlan("tpe", "median", startup_trials=5, warmup_fraction=0.5)
    assert suite.study_ids() == [None] and suite.tune_seeds == [0]
    pruner = suite.search.pruner(suite.trials, ROUNDS)
    assert type(pruner).__name__ == "MedianPruner"


# ------------------------------------------------------------------------------ the budget
def test_a_compute_budget_with_halving_tries_more_configurations_in_the_same_rounds(
    tmp_path: Path,
) -> None:
    suite = _suite(tmp_path)
    setting = suite.settings[0]
    layout = Layout(tmp_path / "out")
    study = search.tune(suite, setting, "fedprox", layout, ROUNDS, runner=_curve_runner)
    trials = study.get_trials()
    spent = spending(trials, suite.search)
    limit = 4 * ROUNDS  # budget_runs full runs, in rounds
    assert limit <= spent.spent < limit + ROUNDS, spent  # overshot by less than one run
    assert spent.spent == sum(rounds_run(t) for t in trials)
    assert spent.distinct > 4, spent  # more configurations than 4 full runs would try
    assert 1 <= spent.to_the_end < spent.distinct
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    # halving's rungs: floor(0.12 x 9) = 1 round, then x 3; nothing else stops a trial here
    assert pruned and {rounds_run(t) for t in pruned} <= {1, 3}
    # a trial evaluates the rungs and the last-10% window alone; its rounds are its compute
    assert {t.user_attrs["command"].split("eval.rounds=")[1].split()[0] for t in trials} == {
        "[1,3,9]"
    }
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert {rounds_run(t) for t in complete} == {ROUNDS}
    # the draws are the quasi-random points of the study's seed, in order
    space = suite.space_for("fedprox", setting)
    assert [configuration(t.params) for t in trials] == [
        configuration(quasi_random_point(space, 0, i)) for i in range(len(trials))
    ]
    chosen = finals.write_chosen(study, suite, setting, "fedprox", layout)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert chosen["value"] == max(t.value for t in complete)  # only full runs compete
    assert chosen["search"]["configurations"] == spent.distinct
    assert chosen["search"]["to_the_end"] == len(complete)
    assert chosen["search"]["rounds_run"] == spent.spent
    assert "successive halving" in chosen["search"]["plan"]
    # the budget is spent: a second command runs nothing
    again = search.tune(suite, setting, "fedprox", layout, ROUNDS, runner=_curve_runner)
    assert len(again.get_trials()) == len(trials)


FINITE = """\
    space:
      train.lr: {choices: [0.001, 0.01]}
      strategy.mu: {choices: [0.0, 0.1]}
"""


@pytest.mark.parametrize("sampler", ["qmc", "tpe"])
def test_no_study_evaluates_a_configuration_twice(tmp_path: Path, sampler: str) -> None:
    """Four configurations and a budget of ten trials: each is run once, the draws that repeat
    one are recorded (naming it) and cost nothing, and the study ends when all four ran."""
    text = SUITE.replace("sampler: qmc", f"sampler: {sampler}").replace("budget_runs: 4, ", "")
    suite = _suite(tmp_path, text.replace("trials: 4", "trials: 10") + FINITE)
    setting = suite.settings[0]
    study = search.tune(
        suite, setting, "fedprox", Layout(tmp_path / "out"), ROUNDS, runner=_curve_runner
    )
    trials = study.get_trials()
    ran = [t for t in trials if REPEAT_ATTR not in t.user_attrs]
    assert len(ran) == 4 and len({configuration(t.params) for t in ran}) == 4
    by_number = {t.number: t for t in trials}
    for repeat in (t for t in trials if REPEAT_ATTR in t.user_attrs):
        original = by_number[repeat.user_attrs[REPEAT_ATTR]]
        assert configuration(original.params) == configuration(repeat.params)
        assert original.number < repeat.number and REPEAT_ATTR not in original.user_attrs
        assert "run_dir" not in repeat.user_attrs  # never run
    assert spending(trials, suite.search).spent == 4


# ------------------------------------------------------------------------------ studies
def _final_runner(command, run_dir, on_round=None, heartbeat=None, timeout_s=None):
    run_dir.mkdir(parents=True, exist_ok=True)
    return {"status": "completed", "final": {"L1": {"acc_local": {"mean": 0.5}}}}


def test_each_study_has_its_own_seed_draws_chosen_values_and_final_runs(tmp_path: Path) -> None:
    text = SUITE.replace("trials: 4", "trials: 4\nstudies: 2").replace(
        "budget_runs: 4", "budget_runs: 2"
    )
    suite = _suite(tmp_path, text)
    setting = suite.settings[0]
    assert suite.study_ids() == [0, 1] and suite.tune_seeds == [0, 1000]
    layout = Layout(tmp_path / "out")
    draws = {}
    for study_id in suite.study_ids():
        study = search.tune(
            suite, setting, "fedprox", layout, ROUNDS, runner=_curve_runner, study_id=study_id
        )
        assert study.study_name == f"fedprox@study_{study_id}"
        trials = study.get_trials()
        own = layout.setting_dir("digits") / "trials" / "fedprox" / f"study_{study_id}"
        for trial in trials:
            assert f"seed={1000 * study_id}" in trial.user_attrs["command"].split()
            assert Path(trial.user_attrs["run_dir"]).parent == own
        draws[study_id] = [configuration(t.params) for t in trials]
        chosen = finals.write_chosen(study, suite, setting, "fedprox", layout, study_id)
        path = layout.setting_dir("digits") / "chosen" / "fedprox" / f"study_{study_id}.yaml"
        assert layout.chosen_file("digits", "fedprox", study_id) == path and path.is_file()
        assert chosen["search"]["study"] == study_id
        assert chosen["search"]["tune_seed"] == 1000 * study_id
        runs = finals.final_runs(
            suite, setting, "fedprox", layout, runner=_final_runner, study_id=study_id
        )
        final = layout.setting_dir("digits") / "final" / "fedprox" / f"study_{study_id}"
        assert runs == [final / "seed_1", final / "seed_2"]
    assert draws[0][0] != draws[1][0]  # independent draws
    # the two studies live side by side in one storage, apart
    assert len(open_study(layout, "digits", "fedprox", 0, False, study=1).trials) == len(draws[1])


def test_a_final_seed_may_not_be_any_study_s_tuning_seed(tmp_path: Path) -> None:
    text = SUITE.replace("trials: 4", "trials: 4\nstudies: 3").replace("[1, 2]", "[1, 2000]")
    with pytest.raises(ConfigError, match=r"not the tuning seeds \[0, 1000, 2000\]"):
        _suite(tmp_path, text)


def test_the_study_record_refuses_to_resume_with_another_plan(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    setting = suite.settings[0]
    layout = Layout(tmp_path / "out")
    search.tune(suite, setting, "fedprox", layout, ROUNDS, runner=_curve_runner)
    other = dataclasses.replace(suite, search=dataclasses.replace(suite.search, sampler="tpe"))
    with pytest.raises(ConfigError, match="searched"):
        search.tune(other, setting, "fedprox", layout, ROUNDS, runner=_curve_runner)
    # a larger budget resumes the same study
    more = dataclasses.replace(suite, search=dataclasses.replace(suite.search, budget_runs=6))
    study = search.tune(more, setting, "fedprox", layout, ROUNDS, runner=_curve_runner)
    assert spending(study.get_trials(), more.search).spent >= 6 * ROUNDS
    assert np.isfinite([t.value for t in study.get_trials() if t.value is not None]).all()


# ------------------------------------------------------------------------------ warm runs
def _rows(run_dir: Path) -> list[dict[str, object]]:
    """A run's rows less its wall-clock ones (stage ``time``)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row.get("stage") != "time"]


@pytest.mark.slow
def test_a_warm_run_computes_every_row_a_new_process_computes(tmp_path: Path) -> None:
    """A run forked from the fork server (``pflower tune``'s default) and the same command as a
    new process give the same rows; two runs in a row from one server do too."""
    overrides = [
        "dataset=digits",
        "num_clients=4",
        "rounds=2",
        "train.local_epochs=1",
        "strategy=fedavg",
        "seed=0",
        "split.val_fraction=0.25",
        "split.evaluate_on=val",
    ]
    cold = tmp_path / "cold"
    run_pflower(run_command(overrides, cold), cold)
    with warm_runner() as runner:
        for name in ("warm", "again"):
            summary = runner(run_command(overrides, tmp_path / name), tmp_path / name)
            assert summary["status"] == "completed"
    assert _rows(cold) == _rows(tmp_path / "warm") == _rows(tmp_path / "again")
    assert len(_rows(cold)) > 10


# ------------------------------------------------------------------ only what the objective reads
def _stage_rows(rows: list[dict[str, object]], stage: str) -> list[dict[str, object]]:
    """A stage's rows without Acc(G) (what a trial leaves out)."""
    left_out = ("acc_global", "loss_global")
    return [
        {k: v for k, v in row.items() if k not in left_out} for row in rows if row["stage"] == stage
    ]


@pytest.mark.parametrize("method", ["fedavg", "ditto", "fedproto", "fedala"])
def test_a_trial_measures_only_its_objective_and_the_objective_is_unchanged(
    tmp_path: Path, method: str
) -> None:
    """A tuning run leaves out stage G, stage L2 and Acc(G) (``OBJECTIVE_ONLY``), which only
    read the models: its stage-L1 Acc(L) rows equal those of the run that measures everything
    (FedAvg; Ditto, two models a client; FedProto, its own stage metrics; FedALA, a stage-L1
    personalization step). It draws no plots, and marks each round complete for the pruner."""
    overrides = [
        "dataset=digits",
        "num_clients=4",
        "rounds=2",
        "train.local_epochs=1",
        f"strategy={method}",
        "seed=0",
        "split.val_fraction=0.25",
        "split.evaluate_on=val",
    ]
    full, _ = run_inprocess(overrides, tmp_path / "full")
    lean, _ = run_inprocess([*overrides, "plots=true", *OBJECTIVE_ONLY], tmp_path / "lean")
    assert _stage_rows(full, "L1") == _stage_rows(lean, "L1")
    assert len(_stage_rows(lean, "L1")) == 4 * 2  # 4 clients, rounds 1 and 2
    assert {row["stage"] for row in full} >= {"L1", "L2"}
    assert not [row for row in lean if row["stage"] in ("G", "L2")]
    assert not [row for row in lean if "acc_global" in row]
    # the pruner's mark of the last complete round; no plots
    assert last_round_done(tmp_path / "lean") == 2
    assert not (tmp_path / "lean" / "plots").exists()


@pytest.mark.parametrize(
    ("plan", "rounds", "read"),
    [
        (SearchPlan(scheduler="halving"), 15, [1, 3, 9, 14, 15]),  # rungs 1, 3, 9; window 2
        (SearchPlan(scheduler="halving"), 30, [3, 9, 27, 28, 29, 30]),
        (SearchPlan(scheduler="halving", min_fraction=0.5, reduction_factor=2), 4, [2, 4]),
        (SearchPlan(scheduler="none"), 20, [19, 20]),
        (SearchPlan(scheduler="median"), 15, None),  # it reads every round's best
    ],
)
def test_a_trial_evaluates_only_the_rounds_its_pruner_and_objective_read(
    plan: SearchPlan, rounds: int, read: list[int] | None
) -> None:
    assert plan.evaluated_rounds(rounds) == read


@pytest.mark.parametrize("method", ["fedavg_ft", "fedproto"])
def test_a_trial_evaluated_at_its_rungs_alone_has_the_values_of_one_evaluated_every_round(
    tmp_path: Path, method: str
) -> None:
    """Leaving rounds unevaluated (``eval.rounds``) changes no value of a round evaluated and
    not the objective: FedAvg-FT's evaluation fine-tunes a copy of the model (the dearest
    evaluation of the suite), FedProto's reads its prototypes. Every round is still trained and
    counted (`rounds_completed`)."""
    overrides = [
        "dataset=digits",
        "num_clients=4",
        "rounds=5",
        "train.local_epochs=1",
        f"strategy={method}",
        "seed=0",
        "split.val_fraction=0.25",
        "split.evaluate_on=val",
        *OBJECTIVE_ONLY,
    ]
    every, _ = run_inprocess(overrides, tmp_path / "every")
    some, _ = run_inprocess([*overrides, "eval.rounds=[1,3]"], tmp_path / "some")
    assert sorted(round_means(some)) == [1, 3, 5]
    assert {r: v for r, v in round_means(every).items() if r in (1, 3, 5)} == round_means(some)
    assert _stage_rows(some, "L1") == [
        r for r in _stage_rows(every, "L1") if r["round"] in (1, 3, 5)
    ]
    assert rounds_completed(some) == rounds_completed(every) == 5
    summaries = [read_summary(tmp_path / name) for name in ("every", "some")]
    assert objective_of(summaries[0]) == objective_of(summaries[1])  # type: ignore[arg-type]


def test_eval_rounds_past_the_runs_last_or_out_of_order_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"eval.rounds=\[2, 7\] lists rounds past"):
        compose_config(["rounds=5", "eval.rounds=[2,7]"])
    for given in ("[3,1]", "[2,2]", "[0,2]"):
        with pytest.raises(ConfigError, match="each once and ascending"):
            compose_config(["rounds=5", f"eval.rounds={given}"])


def test_a_trial_told_without_its_rounds_counts_those_its_rows_show(tmp_path: Path) -> None:
    """A trial failed as stale after its retries is told without ``rounds_run``: it costs the
    rounds its run trained (``time`` rows), not its last evaluated round."""
    rows = [{"round": r, "stage": "time"} for r in range(1, 9)]
    rows.append({"round": 3, "stage": "L1", "client": 0, "acc_local": 0.5})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    told = dataclasses.make_dataclass("Told", ["user_attrs", "intermediate_values"])
    assert rounds_run(told({"run_dir": str(tmp_path)}, {3: 0.5})) == 8
    assert rounds_run(told({"run_dir": str(tmp_path / "gone")}, {3: 0.5})) == 3
    assert rounds_run(told({}, {})) == 0


@pytest.mark.parametrize(
    ("plan", "said"),
    [
        (None, "8 trials per method and setting, each a seeded random draw from the method"),
        (
            SearchPlan(),
            "8 trials, TPE draws, median pruner, per method and setting (Optuna's TPE sampler "
            "draws its first 10 at random: a seeded random search)",
        ),
        (
            SearchPlan(scheduler="halving", budget_runs=4),
            "4 full runs of compute, TPE draws, successive halving (first rung 0.1 of the "
            "rounds, 1/3 go on), per method and setting",
        ),
        (
            SearchPlan(sampler="qmc", scheduler="halving", budget_runs=4),
            "4 full runs of compute, quasi-random (scrambled Halton) draws, successive halving "
            "(first rung 0.1 of the rounds, 1/3 go on), per method and setting",
        ),
        (
            SearchPlan(sampler="qmc", scheduler="none"),
            "8 trials, quasi-random (scrambled Halton) draws, no early stopping, per method",
        ),
    ],
    ids=["before-search-plans", "tpe", "tpe-halving", "qmc-halving", "qmc-count"],
)
def test_a_one_study_leaderboard_says_how_its_suite_drew_the_trials(
    plan: SearchPlan | None, said: str
) -> None:
    """The leaderboard's intro describes the search plan the results folder's suite.yaml
    records: a one-study suite that draws quasi-randomly was described as TPE's random start."""
    from pflower.reporting.leaderboard_table import trials_drawn

    suite: dict[str, object] = {"trials": 8}
    if plan is not None:
        suite["search"] = plan.describe(8)  # as pflower tune writes it
    text = trials_drawn(suite)
    assert text.startswith(said), text
    assert ("TPE" in text) is (plan is None or plan.sampler == "tpe")
    assert ("seeded random" in text) is (plan is None or plan == SearchPlan())


def test_a_trial_scores_a_client_left_out_of_its_evaluation_zero() -> None:
    """What the pruner sees each round and what the study maximizes count a client whose
    evaluation reply was rejected or lost at 0, as the leaderboard does; a client held out of
    training (stage U) is not L1's."""
    nan = "metric loss_local=nan is not finite"
    rows = [
        {"round": 1, "stage": "L1", "client": 0, "acc_local": 0.8},
        {"round": 1, "stage": "L1", "client": 1, "acc_local": 0.6},
        {"round": 1, "stage": "failure", "phase": "evaluate", "client": 2, "error": nan},
        {"round": 1, "stage": "failure", "phase": "fit", "client": 2, "error": nan},
        {"round": 1, "stage": "U", "client": 5, "acc_local": 0.4},
        {"round": 2, "stage": "L1", "client": 0, "acc_local": 0.9},
        {"round": 2, "stage": "L1", "client": 1, "acc_local": 0.7},
        {"round": 2, "stage": "L1", "client": 2, "acc_local": 0.5},
        {"round": 2, "stage": "failure", "phase": "evaluate", "client": 5, "error": "timed out"},
    ]
    assert round_means(rows) == pytest.approx({1: 1.4 / 3, 2: 0.7})
    summary = {
        "final_round": 2,
        "last10_rounds": [2],
        "last10": {"L1": {"num_clients": 2, "acc_local": {"mean": 0.9}}},
        "failures": [{"round": 2, "phase": "evaluate", "client": 1, "error": nan}],
    }
    assert objective_of(summary) == pytest.approx(0.6)
