"""Run directories as the report reads them, and the failure record a sweep job leaves behind.

A run directory (see :mod:`pflower.server.recorder`) holds ``config.yaml`` (the resolved
configuration), ``metrics.jsonl`` (per round x client x stage rows) and, once the run finished,
``summary.json``. A sweep job that failed holds ``summary.json`` with ``"status": "failed"`` and
the error, plus ``error.txt`` with the traceback (:func:`record_failure`). A directory with a
configuration but no summary is *incomplete* (still running, or killed).
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf

Status = Literal["ok", "failed", "incomplete"]

STAGES = ("L1", "L2", "G")
"""The evaluation stages; other row kinds (``failure``, ``time``) carry no accuracy."""


@dataclass(frozen=True)
class Run:
    """One run directory: its flattened configuration, status and evaluation rows."""

    path: Path
    config: dict[str, Any]
    status: Status
    error: str | None = None
    final_round: int | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def seed(self) -> Any:
        return self.config.get("seed")


def record_failure(run_dir: Path, cfg: DictConfig, error: BaseException) -> None:
    """Mark ``run_dir`` as a failed run: ``summary.json`` (status and message), ``error.txt``
    (traceback), and ``config.yaml`` if the run died before its recorder wrote one, so that a
    report can still say which configuration failed."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.yaml"
    if not config_path.exists():
        config_path.write_text(OmegaConf.to_yaml(cfg))
    message = f"{type(error).__name__}: {error}"
    (run_dir / "error.txt").write_text("".join(traceback.format_exception(error)))
    (run_dir / "summary.json").write_text(
        json.dumps({"status": "failed", "error": message}, indent=2)
    )


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys to hashable leaf values; lists become their JSON text."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{dotted}."))
        elif isinstance(value, list):
            flat[dotted] = json.dumps(value)
        else:
            flat[dotted] = value
    return flat


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


def load_run(run_dir: Path) -> Run:
    """Read one run directory; evaluation rows are kept only for completed runs."""
    config = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=True)
    assert isinstance(config, dict)
    flat = flatten(config)
    summary_path = run_dir / "summary.json"
    if not summary_path.exists():
        return Run(run_dir, flat, "incomplete")
    summary = json.loads(summary_path.read_text())
    if summary.get("status") == "failed":
        return Run(run_dir, flat, "failed", error=summary.get("error"))
    return Run(
        run_dir, flat, "ok", final_round=int(summary["final_round"]), rows=_stage_rows(run_dir)
    )


def _stage_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    with (run_dir / "metrics.jsonl").open(encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            if row["stage"] in STAGES:
                rows.append(row)
    return rows


def load_runs(paths: Iterable[Path]) -> list[Run]:
    """Every run at or below ``paths``."""
    return [load_run(run_dir) for run_dir in find_run_dirs(paths)]
