"""The statistics of a leaderboard's ranks: the paired t-test over the final seeds, the rank
with ties (1 + the methods significantly better), the same with the false discovery rate
controlled, and the methods ranked above a higher mean (see
[`pflower.reporting.leaderboard`][pflower.reporting.leaderboard] for why the seeds pair up).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from scipy import stats

from pflower.reporting.leaderboard_runs import Entry

ALPHA = 0.05
"""Significance level of the paired t-tests that separate ranks."""


def paired_test(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[float, float] | None:
    """The mean difference ``a - b`` over the final seeds both ran and the two-sided p-value of a
    paired t-test on the differences (see the module docstring); None with fewer than two common
    seeds. Equal differences give p = 0 (1 when they are all zero)."""
    # rounded: equal differences stay equal, and twins one ulp apart are not "separated"
    differences = [round(a[seed] - b[seed], 12) for seed in sorted(a.keys() & b.keys())]
    if len(differences) < 2:
        return None
    mean = statistics.fmean(differences)
    if statistics.stdev(differences) == 0:
        return mean, 1.0 if mean == 0 else 0.0
    p_value = float(stats.ttest_1samp(differences, 0.0).pvalue)
    return mean, p_value if math.isfinite(p_value) else 1.0


def significantly_better(
    a: Mapping[int, float], b: Mapping[int, float], alpha: float = ALPHA
) -> bool:
    """Is ``a`` above ``b`` beyond the seeds' noise? Both map a final seed to an accuracy: a
    positive mean paired difference with p < ``alpha``
    ([`paired_test`][pflower.reporting.leaderboard_ranks.paired_test]; equal positive
    differences count as separated, fewer than two common seeds never do)."""
    test = paired_test(a, b)
    return test is not None and test[0] > 0 and test[1] < alpha


def fdr_better_counts(entries: Sequence[Entry], alpha: float = ALPHA) -> dict[str, int]:
    """Per method, how many methods are significantly better when the p-values of all the
    setting's pairs are adjusted together with Benjamini and Hochberg's procedure
    (``scipy.stats.false_discovery_control``): of all the separations the table then makes,
    about a fraction ``alpha`` at most is expected to be chance (approximately: see the module
    docstring), where the plain rank allows each pair that chance on its own (528 pairs among 33
    methods)."""
    pairs = [
        (a, b, test)
        for i, a in enumerate(entries)
        for b in entries[i + 1 :]
        if (test := paired_test(a.by_seed, b.by_seed)) is not None
    ]
    counts = {entry.method: 0 for entry in entries}
    if not pairs:
        return counts
    adjusted = stats.false_discovery_control([p_value for *_, (_, p_value) in pairs])
    for (a, b, (mean, _)), q_value in zip(pairs, adjusted, strict=True):
        if q_value < alpha and mean != 0:
            counts[(b if mean > 0 else a).method] += 1
    return counts


def rank_with_ties(entries: Sequence[Entry]) -> None:
    """rank = 1 + the number of methods significantly better (see the module docstring), and
    rank_fdr the same with the false discovery rate controlled
    ([`fdr_better_counts`][pflower.reporting.leaderboard_ranks.fdr_better_counts])."""
    fdr = fdr_better_counts(entries)
    for entry in entries:
        entry.rank = 1 + sum(
            significantly_better(other.by_seed, entry.by_seed)
            for other in entries
            if other is not entry
        )
        entry.rank_fdr = 1 + fdr[entry.method]


def ranked_above_higher_means(entries: Sequence[Entry]) -> list[tuple[Entry, list[Entry]]]:
    """The methods holding a better rank than some method with a higher mean, each with those
    methods. A rank counts the methods significantly better, and with few seeds a method whose
    differences to the others vary widely across seeds (one bad seed, say) is separated from few:
    it can share rank 1 far below the leaders, above a steadier method with a higher mean.
    Listed under the table so the rank is read with its per-seed values. Every entry has final runs
    ([`load_setting`][pflower.reporting.leaderboard.load_setting] keeps no other).
    """
    means = [statistics.fmean(e.final) for e in entries]
    inversions = []
    for entry, mean in zip(entries, means, strict=True):
        higher = [
            o for o, m in zip(entries, means, strict=True) if o.rank > entry.rank and m > mean
        ]
        if higher:
            inversions.append((entry, higher))
    return sorted(inversions, key=lambda item: -len(item[1]))
