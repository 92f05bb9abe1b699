"""Ranks that show the search's luck: methods tuned in several independent studies, each study's
choice run with the same final seeds ([`pflower.tuning`][pflower.tuning]), compared with both
sources of variance.

A method's result on a setting is a table ``accuracy[study][seed]``: study ``k``'s chosen values
run with final seed ``s``. Two things vary that a reader must not mistake for a difference
between methods: which configuration the search happened to find (the studies) and how a run
happened to go (the seeds; a seed fixes the partition, the initial model and the batches for every
method alike, so seeds are paired across methods).

`rank_intervals` estimates both at once with a nested (two-level) bootstrap (Davison and Hinkley,
*Bootstrap Methods and their Application*, 1997, Sec. 3.8): each resample draws, with replacement,
the seeds (one draw for all methods: they stay paired) and, for each method separately, its studies
(studies of different methods are independent searches); a method's resampled score is its mean over
the drawn (study, seed) cells, and the methods are ranked by it. A method's **rank** is its rank by
the mean over all its runs; its **rank interval** holds the central 95% of its resampled ranks.
Ranking by the mean does not reward variance: a method with one diverging seed is ranked by what it
averages, and its interval, not its rank, widens. (The paired t-test rank of
[`pflower.reporting.leaderboard`][pflower.reporting.leaderboard], 1 + the methods significantly
above, gives a widely spread method rank 1, since nothing can be separated from it.)

A final run that failed by itself (it diverged, say) is scored `FAILED` (accuracy 0) in every
mean, rank, interval and difference here: the tuned configuration gave no model on that seed.
Leaving it out would rank the method by the seeds it survived against the others' means over all
seeds, and a failure tends to come on a hard seed, where every method scores lower, so the
method's mean would gain twice. (The one-study leaderboard, which ranks by paired tests over the
seeds both methods ran, leaves a failed seed out of each pair instead.) A run that failed for a
reason outside the method (a timeout on a loaded machine, memory) cannot be told apart here: it
is rerun with ``pflower tune --retry-failed`` before the ranks are read.

The percentile interval of a bootstrap over a few studies and seeds is narrower than the truth
(a resample cannot hold more spread than the sample), so `false_separation_rate` measures
how often two methods with the same true mean get disjoint intervals under this procedure, with
the setting's own numbers of studies and seeds and its own spreads; the leaderboard prints it
beside the intervals.

`detectable_difference` is the smallest difference of means that `difference` separates with 80%
power at the 5% level for two methods of the setting's typical spreads (the usual sample-size
formula with Student quantiles, e.g. Cohen, *Statistical Power Analysis*, 1988, ch. 2; with
three studies it overstates the power somewhat): a gap below it is one the studies and seeds
cannot resolve.

`agreement` says how far the studies agree over all methods (the rank correlation of their
study ranks): what a second search would change. The leaderboard's table and notes of such a
setting are [`pflower.reporting.studies_board`][pflower.reporting.studies_board]'s.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

Scores = Mapping[int, Mapping[int, float]]
"""A method's final accuracy by study, then by final seed."""

LEVEL = 0.95
"""Coverage of the rank intervals."""
RESAMPLES = 2000
"""Bootstrap resamples (33 methods, 3 studies, 5 seeds: about 0.1 s)."""
MIN_SEEDS = 3
"""Fewer final seeds than this per study is too few to rank on: the leaderboard warns."""
FAILED = 0.0
"""The score of a final run that failed by itself: it produced no model (see the module
docstring)."""


def scored(completed: Scores, failed: Mapping[int, Iterable[int]]) -> dict[int, dict[int, float]]:
    """A method's scores: its ``completed`` runs' accuracy and each ``failed`` run (study ->
    seeds) at `FAILED`."""
    scores = {study: dict(runs) for study, runs in completed.items()}
    for study, seeds in failed.items():
        for seed in seeds:
            scores.setdefault(study, {})[seed] = FAILED
    return {study: dict(sorted(runs.items())) for study, runs in sorted(scores.items())}


@dataclass(frozen=True)
class StudyRanks:
    """One method's standing over the studies and seeds of a setting."""

    method: str
    mean: float
    rank: int
    """1 + the number of methods with a higher mean over all their runs."""
    interval: tuple[int, int]
    """The central `LEVEL` of the method's resampled ranks."""
    study_means: dict[int, float]
    """The mean over the final seeds of each study's choice."""
    study_ranks: dict[int, int]
    """The rank of each study's mean among the other methods' same-numbered study means."""
    seeds: int
    """The fewest final seeds of any of its studies."""

    @property
    def between_studies(self) -> float:
        """The spread of the study means (their range): the search's luck, in accuracy."""
        values = list(self.study_means.values())
        return max(values) - min(values) if values else math.nan

    @property
    def rank_moves_with_the_study(self) -> bool:
        """Whether another study would have ranked it elsewhere (its study ranks differ)."""
        return len(set(self.study_ranks.values())) > 1

    @property
    def best_rank(self) -> int:
        return min(self.study_ranks.values())

    @property
    def worst_rank(self) -> int:
        return max(self.study_ranks.values())

    @property
    def rank_spread(self) -> int:
        """How many places its study ranks span (0: every study ranks it alike)."""
        return self.worst_rank - self.best_rank

    @property
    def too_few_seeds(self) -> bool:
        return self.seeds < MIN_SEEDS


def _cells(scores: Scores, seeds: Sequence[int]) -> np.ndarray:
    """``scores`` as a (studies x seeds) array over ``seeds`` (NaN where a run is missing)."""
    studies = sorted(scores)
    return np.array(
        [[scores[study].get(seed, np.nan) for seed in seeds] for study in studies], dtype=float
    )


def _ranks(means: np.ndarray) -> np.ndarray:
    """Competition ranks of the rows of ``means`` (last axis: methods), higher is better: 1 +
    the number of methods strictly above."""
    return 1 + (means[..., None, :] > means[..., :, None]).sum(axis=-1)


def _mean(scores: Scores) -> float:
    """A method's mean over all its runs."""
    return float(np.nanmean([v for runs in scores.values() for v in runs.values()]))


def _shared_seeds(results: Sequence[Scores]) -> list[int]:
    """The final seeds that every study of every method ran (the resamples' paired seeds)."""
    return sorted(set.intersection(*(set(runs) for r in results for runs in r.values())))


def _resampled_means(
    scores: Scores,
    shared: Sequence[int],
    seed_draw: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """A method's mean in each resample: its own studies drawn with replacement (``rng``),
    the paired seeds as ``seed_draw`` drew them for every method; its mean over all its runs
    where a resample holds no run of it."""
    mean = _mean(scores)
    table = _cells(scores, shared)
    resamples = seed_draw.shape[0]
    study_draw = rng.integers(0, table.shape[0], (resamples, table.shape[0]))
    cells = table[study_draw[:, :, None], seed_draw[:, None, :]]  # resample x study x seed
    with np.errstate(invalid="ignore"):
        drawn = np.nanmean(cells.reshape(resamples, -1), axis=1) if shared else mean
    return np.where(np.isfinite(drawn), drawn, mean)


def rank_intervals(
    results: Mapping[str, Scores], resamples: int = RESAMPLES, seed: int = 0
) -> list[StudyRanks]:
    """Rank the methods of a setting (``results[method][study][seed]``) by their mean over all
    their runs, with nested-bootstrap rank intervals (see the module docstring), each study's
    mean and rank among the others', best first. A failed run is in ``results`` at `FAILED`
    (`scored`). Seeds that not every method ran are left out of the resamples (they would
    unpair the methods) but count in the means."""
    methods = sorted(results)
    if not methods:
        return []
    shared = _shared_seeds([results[m] for m in methods])
    rng = np.random.default_rng(seed)
    means = np.array([_mean(results[m]) for m in methods])
    ranks = _ranks(means)
    seed_draw = rng.integers(0, len(shared), (resamples, len(shared)))  # one for all methods
    sampled = np.empty((resamples, len(methods)))
    for i, method in enumerate(methods):
        sampled[:, i] = _resampled_means(results[method], shared, seed_draw, rng)
    resampled_ranks = _ranks(sampled)
    tail = (1.0 - LEVEL) / 2 * 100
    low = np.percentile(resampled_ranks, tail, axis=0, method="lower")
    high = np.percentile(resampled_ranks, 100 - tail, axis=0, method="higher")
    study_means = {
        m: {k: float(np.mean(list(s.values()))) for k, s in results[m].items() if s}
        for m in methods
    }
    study_ranks = _study_ranks(study_means)
    out = [
        StudyRanks(
            method=m,
            mean=float(means[i]),
            rank=int(ranks[i]),
            interval=(int(low[i]), int(high[i])),
            study_means=study_means[m],
            study_ranks=study_ranks[m],
            seeds=min((len(s) for s in results[m].values()), default=0),
        )
        for i, m in enumerate(methods)
    ]
    return sorted(out, key=lambda r: (r.rank, r.method))


@dataclass(frozen=True)
class Difference:
    """One method's mean minus another's on a setting, with the uncertainty of both sources."""

    mean: float
    """The first method's mean minus the second's over the final seeds both ran (accuracy)."""
    interval: tuple[float, float]
    """The `LEVEL` confidence interval of the difference."""
    p_value: float
    """Two-sided, for a difference of 0."""
    df: float
    """The t distribution's degrees of freedom (Welch-Satterthwaite)."""
    studies: tuple[int, int]
    """How many studies each method has."""
    seeds: int
    """The paired final seeds."""

    @property
    def separated(self) -> bool:
        """Whether the interval leaves out 0."""
        return self.interval[0] > 0 or self.interval[1] < 0


def difference(first: Scores, second: Scores) -> Difference:
    """``first``'s mean minus ``second``'s over the final seeds both ran, with a t interval
    that counts both sources of variance: the paired seeds and each method's studies.

    With ``D_s`` the difference of the two methods' means over their studies at seed ``s``
    (``n`` seeds) and ``m_k`` a method's mean over the seeds in study ``k`` (``K`` studies), the
    variance of the difference is estimated as ``var(D_s)/n + var(m_A)/K_A + var(m_B)/K_B``
    (sample variances): the seeds are paired, so a seed that is hard for both cancels; each
    method's studies are independent searches, so a lucky study of either counts. The degrees of
    freedom follow Welch and Satterthwaite (``n - 1``, ``K_A - 1``, ``K_B - 1`` for the three
    terms). With one study per method it is the paired t-test over the seeds; a method with one
    study adds no study term (its search's luck cannot be estimated from one study, and is
    left out); a study term counts the seed-by-study noise that ``var(D_s)`` also holds, which
    errs on the wide side. A seed that either method has not run is left out (a failed run is
    in ``first`` or ``second`` at `FAILED`: see `scored`).
    Where the rank intervals resample (`rank_intervals`), which with 3 studies and 5 seeds is
    narrower than the truth, this is an interval for one chosen pair.

    Raises:
        ValueError: the two methods share fewer than 2 final seeds.
    """
    shared = _shared_seeds([first, second])
    if len(shared) < 2:
        raise ValueError("the two methods share fewer than 2 final seeds")
    tables = [_cells(scores, shared) for scores in (first, second)]
    per_seed = np.nanmean(tables[0], axis=0) - np.nanmean(tables[1], axis=0)
    terms = [(float(np.var(per_seed, ddof=1)) / len(shared), len(shared) - 1)]
    for table in tables:
        study_means = np.nanmean(table, axis=1)
        if len(study_means) > 1:
            terms.append(
                (float(np.var(study_means, ddof=1)) / len(study_means), len(study_means) - 1)
            )
    variance = sum(v for v, _ in terms)
    mean = float(np.mean(per_seed))
    counts = (len(first), len(second))
    if variance == 0:  # every seed and study alike: the difference is what it is
        return Difference(
            mean, (mean, mean), 1.0 if mean == 0 else 0.0, math.inf, counts, len(shared)
        )
    df = variance**2 / sum(v**2 / d for v, d in terms)
    half = float(stats.t.ppf(0.5 + LEVEL / 2, df)) * math.sqrt(variance)
    p_value = float(2 * stats.t.sf(abs(mean) / math.sqrt(variance), df))
    return Difference(mean, (mean - half, mean + half), p_value, df, counts, len(shared))


def _study_ranks(study_means: Mapping[str, Mapping[int, float]]) -> dict[str, dict[int, int]]:
    """Each method's rank in each study number, among the methods that have that study."""
    numbers = sorted({k for means in study_means.values() for k in means})
    ranks: dict[str, dict[int, int]] = {m: {} for m in study_means}
    for k in numbers:
        present = [m for m in study_means if k in study_means[m]]
        values = np.array([study_means[m][k] for m in present])
        for m, rank in zip(present, _ranks(values), strict=True):
            ranks[m][k] = int(rank)
    return ranks


def _scaled(values: Sequence[float] | np.ndarray, df: int) -> float:
    """The sample variance of ``values`` (``df`` degrees of freedom) over the median of its
    chi-square ratio (``chi2(df).median() / df``): its median is then the variance itself for
    normal data (a plain three-value variance's median is 0.69 of it)."""
    return float(np.var(values, ddof=1)) * df / float(stats.chi2.median(df))


def _typical(variances: Sequence[float]) -> float:
    """The median of scaled variances (`_scaled`): a group far out, such as a study with a
    diverged run, moves it no more than any other group; 0 with none."""
    return statistics.median(variances) if variances else 0.0


@dataclass(frozen=True)
class Spreads:
    """A setting's typical standard deviations of a final run's accuracy, in the model
    ``run[study k, seed s] = method + study_k + seed_s + own_s + remainder_ks``: ``between`` a
    method's studies (its search's luck), the seed's effect ``shared`` by every method (the
    seed's partition is hard for all), the seed's ``own`` effect on one method (the same in
    every study of it: the seed fixes its partition, initial model and batches), and the
    ``remainder`` of each run. The paired seeds cancel ``shared``; a difference between two
    methods keeps their ``own`` effects and remainders, and their studies."""

    between: float
    shared: float
    own: float
    remainder: float

    @property
    def within(self) -> float:
        """A method's spread over the seeds of one study."""
        return math.sqrt(self.shared**2 + self.own**2 + self.remainder**2)

    def difference_terms(self, studies: int, seeds: int) -> list[tuple[float, int]]:
        """`difference`'s variance terms for two methods of these spreads with ``studies``
        studies of ``seeds`` paired seeds each, with their degrees of freedom: the per-seed
        differences of the two methods' means over their studies, over the seeds, then each
        method's study means over its studies."""
        per_seed = 2 * self.own**2 + 2 * self.remainder**2 / studies
        terms = [(per_seed / seeds, seeds - 1)]
        if studies > 1:
            study_means = self.between**2 + self.remainder**2 / seeds
            terms += [(study_means / studies, studies - 1)] * 2
        return terms


def _complete(scores: Scores) -> np.ndarray:
    """A method's (studies x seeds) table over the seeds every study of it ran."""
    return _cells(scores, _shared_seeds([scores]))


def spreads(results: Mapping[str, Scores]) -> Spreads:
    """The setting's `Spreads`, from each method's table over the seeds all its studies ran:
    ``remainder`` from the study-by-seed interaction (two-way mean square), ``between`` from the
    variance of the study means less the remainder's share, ``own`` from the per-seed
    differences between methods (for each method its median over the others, then the median
    over methods, halved: a method far out moves it no more than any other), and ``shared``
    from the variance of a method's seed means less the rest. Each variance is typical over the
    methods (`_typical`); a part that comes out negative is 0."""
    tables = {m: _complete(scores) for m, scores in results.items()}
    tables = {m: t for m, t in tables.items() if t.shape[1] >= 2}
    interaction, rows, columns = [], [], []
    for table in tables.values():
        k, n = table.shape
        columns.append(_scaled(table.mean(axis=0), n - 1))
        if k > 1:
            rows.append(_scaled(table.mean(axis=1), k - 1))
            residual = table - table.mean(axis=0) - table.mean(axis=1)[:, None] + table.mean()
            df = (k - 1) * (n - 1)
            interaction.append(float((residual**2).sum()) / float(stats.chi2.median(df)))
    remainder = _typical(interaction)
    studies = statistics.median(t.shape[0] for t in tables.values()) if tables else 1
    seeds = statistics.median(t.shape[1] for t in tables.values()) if tables else 1
    partners = []
    for m in tables:
        differences = []
        for other in results:
            d = _per_seed_differences(results, m, other) if other != m else np.empty(0)
            if len(d) >= 2:
                differences.append(_scaled(d, len(d) - 1))
        if differences:
            partners.append(statistics.median(differences))
    own = _typical(partners) / 2 - remainder / studies
    seed_means = _typical(columns)
    return Spreads(
        between=math.sqrt(max(_typical(rows) - remainder / seeds, 0.0)),
        shared=math.sqrt(max(seed_means - max(own, 0.0) - remainder / studies, 0.0)),
        own=math.sqrt(max(own, 0.0)),
        remainder=math.sqrt(remainder),
    )


def _per_seed_differences(results: Mapping[str, Scores], a: str, b: str) -> np.ndarray:
    """``a``'s mean over its studies minus ``b``'s, at each final seed both ran."""
    shared = _shared_seeds([results[a], results[b]])
    tables = [_cells(results[m], shared) for m in (a, b)]
    return np.asarray(np.nanmean(tables[0], axis=0) - np.nanmean(tables[1], axis=0))


def detectable_difference(
    results: Mapping[str, Scores], alpha: float = 0.05, power: float = 0.8
) -> float | None:
    """The smallest difference of two methods' means that `difference` separates with ``power``
    at level ``alpha``, for two methods of the setting's typical `spreads`: `difference`'s
    variance terms (`Spreads.difference_terms`) with their Welch-Satterthwaite degrees of
    freedom, in the usual sample-size formula with Student quantiles (Cohen, 1988, ch. 2). The
    formula takes the variance as known; with three studies the estimated one varies, and
    simulated pairs of methods that far apart are separated somewhat less often than
    ``power`` says (`tests/test_study_ranks.py`). With one study per method it is the paired
    t-test's over the final seeds; None without two methods of 2 seeds or more."""
    tables = [_complete(scores) for scores in results.values()]
    tables = [t for t in tables if t.shape[1] >= 2]
    if len(tables) < 2:
        return None
    studies = min(t.shape[0] for t in tables)
    seeds = min(t.shape[1] for t in tables)
    terms = spreads(results).difference_terms(studies, seeds)
    variance = sum(v for v, _ in terms)
    if variance == 0:
        return 0.0
    df = variance**2 / sum(v**2 / d for v, d in terms)
    return float((stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * math.sqrt(variance))


SIMULATED = 1000
"""Simulated settings behind a `false_separation_rate` on the leaderboard: its binomial standard
error is at most 1.6 points, 0.9 at a rate near 9%."""


def false_separation_rate(
    studies: int,
    seeds: int,
    spread: Spreads,
    trials: int = SIMULATED,
    resamples: int = 400,
    seed: int = 0,
) -> float:
    """How often `rank_intervals` gives two methods of the same true mean disjoint rank
    intervals, simulated ``trials`` times with ``studies`` studies of ``seeds`` seeds each in the
    model of `Spreads`: each method's study effects, each seed's effect shared by the methods,
    each seed's own effect on a method (drawn once per method: the same in all its studies),
    and each run's remainder. A third method, far above, keeps ranks 1 and 2 or 2 and 3 apart
    from rank ties."""
    rng = np.random.default_rng(seed)
    disjoint = 0
    for trial in range(trials):
        seed_effect = rng.normal(0, spread.shared, seeds)
        results: dict[str, Scores] = {}
        for name, level in (("a", 0.0), ("b", 0.0), ("top", 1.0)):
            seed_part = seed_effect + rng.normal(0, spread.own, seeds)  # shared + its own
            results[name] = {
                k: {
                    s: level + study + seed_part[s] + rng.normal(0, spread.remainder)
                    for s in range(seeds)
                }
                for k, study in enumerate(rng.normal(0, spread.between, studies))
            }
        ranked = {r.method: r.interval for r in rank_intervals(results, resamples, trial)}
        (a_low, a_high), (b_low, b_high) = ranked["a"], ranked["b"]
        disjoint += a_high < b_low or b_high < a_low
    return disjoint / trials


@dataclass(frozen=True)
class Agreement:
    """How far independent searches agree on a setting's ranking: what a second search would
    change."""

    rhos: dict[tuple[int, int], float]
    """Spearman's rank correlation of the methods' study ranks, for each pair of studies."""
    median_move: float
    """The median over methods of the spread of its study ranks (best minus worst, in places)."""
    largest: tuple[str, int, int]
    """The method whose study ranks spread most, with its best and worst study rank."""
    methods: int
    """The methods with every study, over which the correlations are taken."""


def agreement(ranked: Sequence[StudyRanks]) -> Agreement | None:
    """`Agreement` of the methods that have every study (None with fewer than 3 such methods or
    fewer than 2 studies)."""
    numbers = sorted({k for r in ranked for k in r.study_ranks})
    full = [r for r in ranked if sorted(r.study_ranks) == numbers]
    if len(numbers) < 2 or len(full) < 3:
        return None
    rhos = {}
    for i, a in enumerate(numbers):
        for b in numbers[i + 1 :]:
            rho = stats.spearmanr(
                [r.study_ranks[a] for r in full], [r.study_ranks[b] for r in full]
            )
            rhos[a, b] = float(rho.statistic)
    widest = max(full, key=lambda r: (r.rank_spread, -r.rank))
    return Agreement(
        rhos=rhos,
        median_move=float(statistics.median(r.rank_spread for r in full)),
        largest=(widest.method, widest.best_rank, widest.worst_rank),
        methods=len(full),
    )
