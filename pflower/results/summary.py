"""A run's ``summary.json``: the per-round aggregates of ``metrics.jsonl``, the final-round and
last-10% headline numbers, the run's cost, and the one function that writes the file.

Headline numbers are final-round values, shown beside the last-10% mean; never the best round.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
from omegaconf import DictConfig, OmegaConf

from pflower.provenance import code_version, numerics
from pflower.results.disk import write_atomic
from pflower.results.rows import CLIENT_STAGES, FAILURE, L2, STAGES, TIME, G, Row, read_rows
from pflower.results.statistics import summarize_stage

LAST_FRACTION = 0.1
"""Share of the final rounds whose evaluated rounds are averaged into ``last10``."""


Status = Literal["completed", "failed", "interrupted", "incomplete"]
"""A run as read back: ``interrupted`` is a failed ``summary.json`` of a run stopped by a signal
([`was_interrupted`][pflower.results.failures.was_interrupted]), ``incomplete`` a run without one
(still running, or killed)."""


def last_rounds(rounds: int) -> range:
    """The last 10% of ``rounds`` (at least the final round): the ``last10`` window."""
    width = max(1, math.ceil(LAST_FRACTION * rounds))
    return range(rounds - width + 1, rounds + 1)


def round_summary(rows: Iterable[Row], server_round: int, thresholds: Sequence[float]) -> Row:
    """Aggregates of every stage evaluated in ``server_round`` (see
    [`.statistics`][pflower.results.statistics])."""
    in_round = [r for r in rows if r["round"] == server_round]
    summary: Row = {}
    for stage in CLIENT_STAGES:
        stage_rows = [r for r in in_round if r["stage"] == stage]
        if stage_rows:
            summary[stage] = summarize_stage(stage_rows, thresholds)
    global_rows = [r for r in in_round if r["stage"] == G]
    if global_rows:
        summary[G] = {k: v for k, v in global_rows[0].items() if k not in ("round", "stage")}
    return summary


def mean_of_summaries(summaries: Sequence[Row]) -> Row:
    """Leaf-wise mean of round summaries; a leaf missing from some rounds is averaged over the
    rounds that have it."""
    merged: Row = {}
    keys = dict.fromkeys(key for summary in summaries for key in summary)
    for key in keys:
        values = [summary[key] for summary in summaries if key in summary]
        if isinstance(values[0], Mapping):
            merged[key] = mean_of_summaries(values)
        elif all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            merged[key] = float(np.mean(values))
    return merged


def evaluated_rounds(rows: Iterable[Row]) -> list[int]:
    """Rounds (> 0) that have stage rows, ascending."""
    return sorted({r["round"] for r in rows if r["stage"] in STAGES and r["round"] > 0})


def headline(rows: Sequence[Row], rounds: int, thresholds: Sequence[float]) -> Row:
    """``final_round``, ``final`` and ``last10`` of a run with ``rounds`` planned rounds.

    ``final`` holds the aggregates of the last evaluated round; ``last10`` their mean over the
    evaluated rounds in [`last_rounds`][pflower.results.summary.last_rounds] (evaluated every round,
    that is the last 10% of rounds; with ``eval.every > 1`` or ``eval.rounds``, only the
    evaluated ones among them, or the last evaluated round where none of them is).
    """
    evaluated = evaluated_rounds(rows)
    if not evaluated:
        return {"final_round": None, "final": {}, "last10": {}, "last10_rounds": []}
    window = [r for r in evaluated if r in last_rounds(rounds)] or evaluated[-1:]
    return {
        "final_round": evaluated[-1],
        "final": round_summary(rows, evaluated[-1], thresholds),
        "last10": mean_of_summaries([round_summary(rows, r, thresholds) for r in window]),
        "last10_rounds": window,
    }


def run_cost(rows: Iterable[Row]) -> dict[str, float]:
    """The run's cost figures (``summary.json``'s ``cost``), each left out where the rows do not
    give it:

    - ``seconds_per_round``: the median time between the ends of successive rounds' training
      phases (``time`` rows), so the start-up, the first round's imports and a resume's gap are
      left out and the rounds that also evaluate count as they come;
    - ``mb_down_per_client_round`` / ``mb_up_per_client_round``: the mean array megabytes
      (10^6 bytes) one training client receives with its fit instruction and sends back, per
      round (``bytes_down``/``bytes_up`` of the stage-L2 rows).
    """
    rows = list(rows)
    done = sorted(
        (int(r["round"]), float(r["fit_done_unix_s"])) for r in rows if r["stage"] == TIME
    )
    gaps = [t1 - t0 for (r0, t0), (r1, t1) in itertools.pairwise(done) if r1 == r0 + 1]
    cost = {"seconds_per_round": float(np.median(gaps))} if gaps else {}
    for key in ("bytes_down", "bytes_up"):
        sizes = [float(r[key]) for r in rows if r["stage"] == L2 and key in r]
        if sizes:
            cost[f"mb_{key.removeprefix('bytes_')}_per_client_round"] = float(np.mean(sizes)) / 1e6
    return cost


def recorded_cost(
    run_dir: Path, summary: Mapping[str, Any], rows: Iterable[Row] | None = None
) -> dict[str, float]:
    """A finished run's cost figures: its ``summary.json``'s, or, for a run made before pflower
    recorded them there, computed from its ``metrics.jsonl`` (none where that is gone too).
    ``rows``: that file's rows, where the caller has read them already."""
    if summary.get("cost"):
        return dict(summary["cost"])
    return run_cost(read_rows(run_dir) if rows is None else rows)


def resolved_config(cfg: DictConfig) -> dict[str, Any]:
    """The configuration as plain JSON/YAML values (enums as their names)."""
    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert isinstance(container, dict)
    return cast(dict[str, Any], container)


def write_summary(
    run_dir: Path,
    cfg: DictConfig,
    rows: Sequence[Row],
    status: Literal["completed", "failed"],
    error: str | None = None,
    wall_time_s: float | None = None,
    reserve: Path | None = None,
) -> Path:
    """Write ``summary.json`` (the same shape for completed and failed runs), over ``reserve``
    where the disk has no room for it (``write_atomic``)."""
    config = resolved_config(cfg)
    summary = {
        "status": status,
        "error": error,
        "rounds": config.get("rounds"),
        "scored_on": config.get("split", {}).get("evaluate_on", "test"),
        **headline(rows, int(config.get("rounds", 0)), config["eval"]["rho_thresholds"]),
        "failures": [r for r in rows if r["stage"] == FAILURE],
        "wall_time_s": wall_time_s,
        "cost": run_cost(rows),
        "config": config,
        "code": code_version(str((config.get("strategy") or {}).get("name") or "") or None),
        "numerics": numerics(),
    }
    path = run_dir / "summary.json"
    write_atomic(path, json.dumps(summary, indent=2), reserve)
    return path
