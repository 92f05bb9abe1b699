"""Run directories read back (for ``pflower report``): see
[`pflower.results.rundir`][pflower.results.rundir] for the
layout these functions read."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from omegaconf import OmegaConf

from pflower.results.failures import Rejected, rejected_replies, was_interrupted
from pflower.results.rows import STAGES, Row, read_rows
from pflower.results.summary import Status, evaluated_rounds, last_rounds, recorded_cost


@dataclass(frozen=True)
class RunResult:
    """One run directory as read back: configuration, status and evaluation rows."""

    path: Path
    config: dict[str, Any]
    status: Status
    error: str | None = None
    final_round: int | None = None
    rows: list[Row] = field(default_factory=list)
    cost: dict[str, float] = field(default_factory=dict)
    """The run's cost figures
    ([`pflower.results.summary.run_cost`][pflower.results.summary.run_cost]): ``summary.json``'s, or
    computed from ``metrics.jsonl`` for a run made before pflower recorded them there."""
    code: dict[str, Any] | None = None
    """The pflower code that made the run (``summary.json``'s ``code``), None for an incomplete
    run or one made before pflower recorded it."""
    rejected: Rejected | None = None
    """The client replies a completed run went on without
    ([`rejected_replies`][pflower.results.failures.rejected_replies]), if any."""
    recorded: dict[str, Any] = field(default_factory=dict)
    """``summary.json``'s ``final`` and ``last10`` (each stage's aggregates at the final round
    and over the last 10% of rounds, [`headline`][pflower.results.summary.headline]): the
    values of a run kept without its ``metrics.jsonl``, as the final runs stored in the
    repository are."""

    @property
    def seed(self) -> Any:
        """The run's seed."""
        return self.config.get("seed")

    @property
    def rounds(self) -> int:
        """The planned number of rounds."""
        return int(self.config.get("rounds", self.final_round or 0))

    def stage_rows(self, stage: str, server_round: int) -> list[Row]:
        """Rows of ``stage`` in ``server_round``."""
        return [r for r in self.rows if r["stage"] == stage and r["round"] == server_round]

    def window(self) -> list[int]:
        """The evaluated rounds averaged into the last-10% values."""
        evaluated = evaluated_rounds(self.rows)
        return [r for r in evaluated if r in last_rounds(self.rounds)] or evaluated[-1:]


def find_run_dirs(paths: Iterable[Path]) -> list[Path]:
    """Run directories at or below ``paths`` (sweep directories are searched recursively),
    each once, in path order. Hydra's own ``.hydra/config.yaml`` copies are not runs."""
    found: set[Path] = set()
    for path in paths:
        if not path.is_dir():
            raise FileNotFoundError(f"{path} is not a directory (expected a sweep or run dir)")
        for config in path.rglob("config.yaml"):
            if ".hydra" not in config.relative_to(path).parts:
                found.add(config.parent.resolve())
    return sorted(found)


def load_run(run_dir: Path) -> RunResult:
    """Read one run directory; evaluation rows are kept only for completed runs.

    A directory with a configuration but no summary is *incomplete* (still running, or killed);
    a failed one stopped by a signal (``kill``, Ctrl-C) is *interrupted*, not failed: it says
    nothing about the method, and rerunning it is the remedy.
    """
    loaded = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=True)
    assert isinstance(loaded, dict)
    config = cast(dict[str, Any], loaded)
    summary_path = run_dir / "summary.json"
    if not summary_path.exists():
        return RunResult(run_dir, config, "incomplete")
    summary = json.loads(summary_path.read_text())
    code = summary.get("code")
    if summary["status"] == "failed":
        status: Status = "interrupted" if was_interrupted(summary) else "failed"
        return RunResult(run_dir, config, status, error=summary.get("error"), code=code)
    every = read_rows(run_dir)
    rows = [row for row in every if row["stage"] in STAGES]
    return RunResult(
        run_dir,
        config,
        "completed",
        final_round=summary["final_round"],
        rows=rows,
        cost=recorded_cost(run_dir, summary, every),
        code=code,
        rejected=rejected_replies(summary),
        recorded={key: summary.get(key) or {} for key in ("final", "last10")},
    )


def load_runs(paths: Iterable[Path]) -> list[RunResult]:
    """Every run at or below ``paths``."""
    return [load_run(run_dir) for run_dir in find_run_dirs(paths)]
