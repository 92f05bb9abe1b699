"""The leaderboard of a setting tuned in several studies
([`pflower.reporting.studies`][pflower.reporting.studies] ranks it): its table, one row per
method with its rank interval, spread between studies, rank by study, runs and choices, and the
notes under it, which say how far its ranks can be trusted (the false separation rate at the
setting's spreads, the smallest difference its seeds detect, how far the studies agree) and
which methods are ranked on too few seeds."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pflower.reporting.studies import (
    FAILED,
    LEVEL,
    MIN_SEEDS,
    RESAMPLES,
    SIMULATED,
    Scores,
    StudyRanks,
    agreement,
    detectable_difference,
    false_separation_rate,
    spreads,
)


@dataclass(frozen=True)
class MethodRow:
    """What the leaderboard knows of one method beyond its scores (`table`)."""

    label: str
    collapse: str
    final: str
    """Final accuracy over all its runs (every study's seeds, a failed run at `FAILED`),
    ``mean ± sd``, percent."""
    last10: str
    """The same for the mean over each run's last 10% of rounds."""
    chosen: Mapping[int, str]
    """Each study's chosen values, in words."""
    searched: Mapping[int, Mapping[str, Any]]
    """Each study's ``search`` record (its chosen file's: configurations, run to the end)."""
    seconds_per_round: str
    mb_per_client_round: str
    failed: int = 0
    """Its final runs that failed by themselves, in the scores at `FAILED`."""
    short: int = 0
    """Its completed final runs whose final evaluation left out some clients (a client's
    reply rejected or lost: in the scores at 0 each)."""


def table(ranked: Sequence[StudyRanks], rows: Mapping[str, MethodRow]) -> list[list[str]]:
    """The leaderboard table of a setting tuned in several studies, best first."""
    header = [
        "rank",
        f"{LEVEL:.0%} rank interval",
        "method",
        "final Acc(L) %",
        "last-10% Acc(L) %",
        "between studies (pts)",
        "rank by study",
        "runs",
        "configurations (to the end)",
        "chosen per study",
        "s / round",
        "MB / client-round",
        "collapse",
    ]
    body = [header]
    for r in ranked:
        row = rows[r.method]
        tried = sum(int(s.get("configurations", 0)) for s in row.searched.values())
        ended = sum(int(s.get("to_the_end", 0)) for s in row.searched.values())
        body.append(
            [
                str(r.rank),
                f"{r.interval[0]}-{r.interval[1]}",
                row.label + (" (!)" if r.too_few_seeds else ""),
                row.final,
                row.last10,
                f"{100 * r.between_studies:.2f}" if len(r.study_means) > 1 else "-",
                "/".join(str(r.study_ranks[k]) for k in sorted(r.study_ranks))
                + (" (moves)" if r.rank_moves_with_the_study else ""),
                _runs(r, row),
                f"{tried} ({ended})" if row.searched else "-",
                "; ".join(f"{k}: {row.chosen[k]}" for k in sorted(row.chosen)) or "-",
                row.seconds_per_round,
                row.mb_per_client_round,
                row.collapse,
            ]
        )
    return body


def _runs(ranked: StudyRanks, row: MethodRow) -> str:
    """The runs column: studies x seeds, the failed runs and those short of clients."""
    notes = [f"{row.failed} failed (scored {FAILED:.0%})"] if row.failed else []
    notes += [f"{row.short} short of clients"] if row.short else []
    return f"{len(ranked.study_means)} x {ranked.seeds}" + "".join(f", {n}" for n in notes)


def _moves(ranked: Sequence[StudyRanks], name: Mapping[str, str]) -> list[str]:
    """The note naming the ranks that another study would have changed, those that move most
    first; where most methods move, only those that move more than the median method, and how
    far the rest move at most."""
    moving = sorted(
        (r for r in ranked if r.rank_moves_with_the_study), key=lambda r: (-r.rank_spread, r.rank)
    )
    if not moving:
        return []
    studies = max(len(r.study_ranks) for r in ranked)  # the methods the agreement note counts
    median = statistics.median(r.rank_spread for r in ranked if len(r.study_ranks) == studies)
    shown = [r for r in moving if r.rank_spread > median] or moving
    rest = len(moving) - len(shown)
    named = ", ".join(f"{name[r.method]} ({r.best_rank} to {r.worst_rank})" for r in shown)
    most = max((r.rank_spread for r in moving[len(shown) :]), default=0)
    more = f"; {rest} more by at most {most} place{'s' if most > 1 else ''}" if rest else ""
    return [
        f"Ranks that another study would have changed ('moves'), most first: {named}{more}.",
        "",
    ]


def _agreement(ranked: Sequence[StudyRanks], name: Mapping[str, str]) -> list[str]:
    """The note that says how far a second search would change the ranking."""
    found = agreement(ranked)
    if found is None:
        return []
    pairs = ", ".join(f"{a} and {b}: {rho:.2f}" for (a, b), rho in found.rhos.items())
    method, best, worst = found.largest
    return [
        f"Agreement between the studies (what a second search changes): Spearman's rank "
        f"correlation of the {found.methods} methods' study ranks, for studies {pairs}; a "
        f"method's study ranks spread over a median of {found.median_move:g} "
        f"place{'' if found.median_move == 1 else 's'}, most "
        f"for {name[method]} ({best} to {worst}).",
        "",
    ]


def notes(
    results: Mapping[str, Scores],
    ranked: Sequence[StudyRanks],
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """What qualifies a setting's ranks: the procedure with its simulated false separation rate
    at the setting's own spreads, the smallest difference its seeds detect, the methods whose
    rank moves with the study (most first), and those ranked on too few seeds. ``labels``:
    the methods' names in the table (default: their config names)."""
    if not ranked:
        return []
    name = {r.method: r.method for r in ranked} | dict(labels or {})
    studies = max(len(r.study_means) for r in ranked)
    seeds = min(r.seeds for r in ranked)
    spread = spreads(results)
    rate = false_separation_rate(studies, max(seeds, 2), spread)
    error = math.sqrt(rate * (1 - rate) / SIMULATED)
    lines = [
        f"Ranks are by the mean over every study's final runs; the {LEVEL:.0%} rank interval "
        f"comes from a nested bootstrap over the studies and the paired seeds ({RESAMPLES} "
        f"resamples). With {studies} studies of {seeds} seeds and this setting's spreads "
        f"(between studies {100 * spread.between:.2f} points; between seeds "
        f"{100 * spread.within:.2f}, of which the pairing of seeds cancels the part every "
        f"method shares and leaves a seed's own effect on a method, {100 * spread.own:.2f}, "
        f"the same in all its studies, and each run's remainder, {100 * spread.remainder:.2f}), "
        f"two methods of equal mean get disjoint intervals in {rate:.1%} "
        f"(± {error:.1%}) of {SIMULATED} simulated settings: read a disjoint pair as separated "
        "at about that error rate.",
        "",
    ]
    smallest = detectable_difference(results)
    if smallest is not None:
        lines += [
            "Smallest difference `pflower report --compare` detects between two methods of this "
            "setting's typical spreads (80% power, 5% level; the paired seeds and each method's "
            f"studies): {100 * smallest:.2f} points.",
            "",
        ]
    lines += _moves(ranked, name)
    lines += _agreement(ranked, name)
    few = [name[r.method] for r in ranked if r.too_few_seeds]
    if few:
        lines += [
            f"(!) Ranked on fewer than {MIN_SEEDS} final seeds per study, too few to rank on: "
            f"{', '.join(few)}.",
            "",
        ]
    return lines
