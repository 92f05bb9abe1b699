"""How a study spends its compute: which configurations it tries, how long each one runs, and
when the study has spent its budget (a suite's ``search`` entry;
[`pflower.tuning.search`][pflower.tuning.search] runs it).

Two ways to draw configurations:

- ``tpe``: Optuna's TPE sampler, each trial's draw seeded with the study's seed and the trial's
  number ([`pflower.tuning.search.trial_sampler`][pflower.tuning.search.trial_sampler]). TPE draws
  its first `TPE_STARTUP_TRIALS` at random, so a study of fewer trials is a seeded random search.
- ``qmc``: quasi-random search, the configurations of a scrambled Halton sequence over the
  method's declared space (`quasi_random_point`), the external-tuning procedure of
  MLCommons' AlgoPerf (Dahl et al., "Benchmarking Neural Network Training Algorithms", 2023,
  Sec. 4.1, after Bousquet et al., "Critical hyper-parameters: no random, no cry", 2017): the
  points cover the space evenly at every budget, need no model of the finished trials (which a
  budget of a few dozen noisy trials cannot fit), and point ``i`` of a study is a pure function
  of the study's seed and ``i``, whichever process draws it.

Three ways to stop a trial early (the step is the round; the value the round's mean stage-L1
Acc(L) on validation):

- ``median``: Optuna's median pruner (a trial below the median of earlier trials at the same
  round, after a warm-up, stops);
- ``halving``: asynchronous successive halving (Li et al., "A System for Massively Parallel
  Hyperparameter Tuning", MLSys 2020; Optuna's ``SuccessiveHalvingPruner``): rungs at
  ``min_fraction`` of the rounds times powers of ``reduction_factor``; a trial goes on past a
  rung only if it is in the best 1/``reduction_factor`` of the trials that reached it;
- ``none``: every trial runs to the end.

A trial evaluates only the rounds that its scheduler and the objective read
([`SearchPlan.evaluated_rounds`][pflower.tuning.schedule.SearchPlan.evaluated_rounds]).

The budget is either a count of trials (``trials``, the suite's; every trial counts one,
however early it stopped) or compute (``budget_runs``): the rounds that the study's trials ran,
added up, in units of one full run of the setting. With compute as the budget every method of a
setting gets the same round-equivalents, and a scheduler that stops weak configurations early
spends what they did not use on more configurations. A study never evaluates one configuration
twice: a draw equal to an earlier one is recorded as a repeat, not run, and costs nothing; a
space with finitely many points is finished once each has been tried.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pflower.registry import ConfigError
from pflower.results.summary import last_rounds
from pflower.searchspace import Param, format_value

TPE_STARTUP_TRIALS = 10
"""Trials Optuna's TPE sampler draws at random before it models the finished ones (Optuna's
default, stated here): a suite of at most this many trials per method searches at random."""

SAMPLERS = ("tpe", "qmc")
SCHEDULERS = ("median", "halving", "none")


@dataclass(frozen=True)
class SearchPlan:
    """A suite's ``search`` entry (see the module docstring).

    Attributes:
        sampler: ``tpe`` or ``qmc``.
        scheduler: ``median``, ``halving`` or ``none``.
        budget_runs: the compute of one study, in full runs of the setting (None: the suite's
            ``trials``, a count).
        min_fraction: ``halving``: the first rung, as a share of the rounds.
        reduction_factor: ``halving``: the share of a rung's trials that go on is 1 / this.
        startup_trials: ``median``: trials that finish before it prunes (None: a quarter of the
            suite's trials, at least 3).
        warmup_fraction: ``median``: the share of a trial's rounds it never prunes in.
    """

    sampler: str = "tpe"
    scheduler: str = "median"
    budget_runs: float | None = None
    min_fraction: float = 0.1
    reduction_factor: int = 3
    startup_trials: int | None = None
    warmup_fraction: float = 0.3

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"search.sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if self.scheduler not in SCHEDULERS:
            raise ConfigError(
                f"search.scheduler must be one of {SCHEDULERS}, got {self.scheduler!r}"
            )
        if self.budget_runs is not None and not self.budget_runs > 0:
            raise ConfigError(f"search.budget_runs must be > 0, got {self.budget_runs}")
        if not 0.0 < self.min_fraction <= 1.0 or self.reduction_factor < 2:
            raise ConfigError(
                "search: halving needs 0 < min_fraction <= 1 and reduction_factor >= 2, got "
                f"{self.min_fraction} and {self.reduction_factor}"
            )

    @classmethod
    def from_suite(cls, search: Mapping[str, Any], pruner: Mapping[str, Any]) -> SearchPlan:
        """The plan of a suite file's ``search`` mapping; ``pruner`` (the median pruner's
        options, the form suites had before ``search``) is read as ``scheduler: median`` (or
        ``none`` with ``enabled: false``)."""
        allowed = set(cls.__dataclass_fields__)
        unknown = sorted(set(search) - allowed)
        if unknown:
            raise ConfigError(f"unknown search keys {unknown}; allowed: {sorted(allowed)}")
        values = dict(search)
        if pruner:
            if "scheduler" in values or {"startup_trials", "warmup_fraction"} & set(values):
                raise ConfigError(
                    "give the median pruner's options under search (scheduler: median, "
                    "startup_trials, warmup_fraction), not under pruner as well"
                )
            values["scheduler"] = "median" if pruner.get("enabled", True) else "none"
            for key in ("startup_trials", "warmup_fraction"):
                if key in pruner:
                    values[key] = pruner[key]
        return cls(**values)

    def limit(self, trials: int, rounds: int) -> float:
        """The study's budget in the unit `cost` counts: trials, or rounds."""
        return trials if self.budget_runs is None else self.budget_runs * rounds

    def cost(self, rounds_run: int) -> float:
        """What a finished trial that ran ``rounds_run`` rounds spent, in the budget's unit: one
        trial, or its rounds, at least one (a run that failed before its first round spent its
        start-up, and a study of such runs must still end). A running trial is counted at a
        whole run until it ends."""
        return 1.0 if self.budget_runs is None else float(max(1, rounds_run))

    def first_rung(self, rounds: int) -> int:
        """``halving``: the round of the first rung of a trial of ``rounds`` rounds."""
        return max(1, math.floor(self.min_fraction * rounds))

    def pruner(self, trials: int, rounds: int) -> Any:
        """The Optuna pruner of this plan, for runs of ``rounds`` rounds."""
        import optuna

        if self.scheduler == "none":
            return optuna.pruners.NopPruner()
        if self.scheduler == "halving":
            return optuna.pruners.SuccessiveHalvingPruner(
                min_resource=self.first_rung(rounds), reduction_factor=self.reduction_factor
            )
        startup = self.startup_trials if self.startup_trials is not None else max(3, trials // 4)
        warmup = int(self.warmup_fraction * rounds)
        return optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=warmup)

    def evaluated_rounds(self, rounds: int) -> list[int] | None:
        """The rounds of a trial of ``rounds`` rounds whose stage-L1 values its pruner and
        objective read, so the only ones it evaluates (``eval.rounds``); None: every round.

        Successive halving judges a trial at its rungs alone (Optuna compares the value of the
        rung's round: ``first * reduction_factor ** k``, before the last round) and the
        objective reads the last 10% of rounds; no early stopping reads only those. The median
        pruner compares a trial's best value over every round it reported, so its trials
        evaluate every round. Where every client trains in every round (the suites'
        ``fraction=1``), evaluating fewer rounds changes no value of those evaluated
        (``tests/test_search_plan.py``): a trial of a method whose evaluation fine-tunes (the
        -FT baselines) costs a fraction of one evaluated every round. Under partial
        participation a client of FedALA, FedProx+ALA or FedRep+ALA evaluated in a round it did
        not train in keeps the ALA of the model it received, so there the evaluated rounds also
        decide later ones."""
        if self.scheduler == "median":
            return None
        read = set(last_rounds(rounds))
        if self.scheduler == "halving":
            rung = self.first_rung(rounds)
            while rung < rounds:
                read.add(rung)
                rung *= self.reduction_factor
        return sorted(read)

    def describe(self, trials: int) -> str:
        """The plan in words, budget included, for the chosen files and the leaderboard."""
        budget = (
            f"{trials} trials"
            if self.budget_runs is None
            else f"{format_value(self.budget_runs)} full runs of compute"
        )
        return f"{budget}, {self.how()}"

    def how(self) -> str:
        """How the study draws and stops its trials, in words (the budget aside: a study may be
        resumed with a larger one)."""
        draws = "quasi-random (scrambled Halton)" if self.sampler == "qmc" else "TPE"
        stops = {
            "median": "median pruner",
            "halving": (
                f"successive halving (first rung {format_value(self.min_fraction)} of the "
                f"rounds, 1/{self.reduction_factor} go on)"
            ),
            "none": "no early stopping",
        }[self.scheduler]
        return f"{draws} draws, {stops}"


# ------------------------------------------------------------------------- quasi-random draws
def value_at(param: Param, u: float) -> Any:
    """The value of ``param`` at ``u`` in [0, 1): uniform in the range (in log space for a log
    range), on its grid where it has a step; the ``floor(u * n)``-th of ``n`` choices."""
    u = min(max(u, 0.0), math.nextafter(1.0, 0.0))
    if param.kind == "choice":
        return param.choices[int(u * len(param.choices))]
    assert param.low is not None and param.high is not None
    low, high = float(param.low), float(param.high)
    if param.kind == "int":
        step = int(param.step or 1)
        if param.log:
            value = math.exp(math.log(low) + u * (math.log(high + 1) - math.log(low)))
            return min(int(high), max(int(low), int(value)))
        count = (int(high) - int(low)) // step + 1
        return int(low) + step * int(u * count)
    if param.log:
        value = math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
    else:
        value = low + u * (high - low)
    if param.step:
        count = math.floor((high - low) / param.step + 1e-9) + 1
        value = low + param.step * min(count - 1, int(u * count))
    return min(high, max(low, value))


def quasi_random_point(space: Mapping[str, Param], seed: int, index: int) -> dict[str, Any]:
    """Point ``index`` of the scrambled Halton sequence seeded with ``seed`` (one dimension per
    key of ``space``, in order), as values of the keys."""
    from scipy.stats import qmc

    keys = list(space)
    if not keys:
        return {}
    sequence = qmc.Halton(d=len(keys), scramble=True, seed=seed)
    if index:
        sequence.fast_forward(index)
    point = sequence.random(1)[0]
    return {key: value_at(space[key], float(u)) for key, u in zip(keys, point, strict=True)}


# ----------------------------------------------------------------------- distinct configurations
def configuration(values: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A configuration's identity: its keys and values as the runs' overrides spell them (two
    draws that give the same overrides run the same experiment)."""
    return tuple(sorted((key, format_value(value)) for key, value in values.items()))


def space_size(space: Mapping[str, Param]) -> int | None:
    """How many configurations ``space`` holds, or None if infinitely many (a continuous
    range)."""
    size = 1
    for param in space.values():
        if param.kind == "choice":
            size *= len(param.choices)
            continue
        assert param.low is not None and param.high is not None
        if param.kind == "int" and not param.log:
            size *= (int(param.high) - int(param.low)) // int(param.step or 1) + 1
        elif param.kind == "int":
            size *= int(param.high) - int(param.low) + 1
        elif param.step:
            size *= math.floor((param.high - param.low) / param.step + 1e-9) + 1
        elif param.low == param.high:
            continue
        else:
            return None
    return size


def distinct(configurations: Sequence[tuple[tuple[str, str], ...]]) -> int:
    """The number of distinct configurations among ``configurations``."""
    return len(set(configurations))


def pruned_at(trial: Any, server_round: int, value: float, rounds: int) -> bool:
    """Report a trial's round to its study; whether the pruner stops the trial there. Never at
    the run's last round (``rounds``): the run has computed all it will, its result is its
    objective, and a stop would only cut off its summary (the median pruner judges every
    round past its warm-up)."""
    trial.report(value, server_round)
    return server_round < rounds and bool(trial.should_prune())
