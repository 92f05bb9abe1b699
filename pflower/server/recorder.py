"""Writes a run's results: metrics.jsonl, summary.json, plots, and a live terminal view.

Layout of a run directory (DESIGN.md §6)::

    config.yaml      the resolved configuration
    metrics.jsonl    one row per round x client x stage (L1, L2), one per round for stage G,
                     one per failed client, and one per round marking when training was done
    summary.json     final-round aggregates per stage (see pflower.metrics), the global model's
                     accuracy, failures, wall time
    plots/           accuracy.png (per round, by stage), clients.png (final per-client accuracy)
    run.log          the log
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from pflower.metrics import summarize_stage
from pflower.strategies.base import Recorder


class RunRecorder(Recorder):
    """Appends rows to ``metrics.jsonl`` as they arrive and writes the summary at the end."""

    def __init__(self, run_dir: Path, cfg: DictConfig, console: Console | None = None) -> None:
        self.run_dir = run_dir
        self.cfg = cfg
        self.thresholds = list(cfg.eval.rho_thresholds)
        self.console = (console or Console()) if cfg.progress else None
        self.rows: list[dict[str, Any]] = []
        self._started = time.monotonic()
        run_dir.mkdir(parents=True, exist_ok=True)
        self._log_handler = logging.FileHandler(run_dir / "run.log")
        self._log_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logging.getLogger("flwr").addHandler(self._log_handler)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        self._metrics_file = (run_dir / "metrics.jsonl").open("w", encoding="utf-8")

    def _write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self._metrics_file.write(json.dumps(row) + "\n")
        self._metrics_file.flush()

    def client_stage(self, server_round: int, stage: str, rows: Sequence[dict[str, Any]]) -> None:
        for row in rows:
            self._write({"round": server_round, "stage": stage, **row})

    def global_stage(self, server_round: int, metrics: dict[str, float]) -> None:
        self._write({"round": server_round, "stage": "G", **metrics})

    def failures(self, server_round: int, phase: str, failed: dict[int | str, str]) -> None:
        for client, error in failed.items():
            self._write(
                {
                    "round": server_round,
                    "stage": "failure",
                    "phase": phase,
                    "client": client,
                    "error": error,
                }
            )
            if self.console:
                self.console.print(
                    f"[red]round {server_round}: client {client} failed ({phase}): {error}"
                )

    def fit_done(self, server_round: int) -> None:
        self._write({"round": server_round, "stage": "time", "fit_done_unix_s": time.time()})

    def fail(self, error: str) -> None:
        """The run stops with ``error``: record it in summary.json and release the files."""
        failures = [r for r in self.rows if r["stage"] == "failure"]
        summary = {"status": "failed", "error": error, "failures": failures}
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self._close()

    def _close(self) -> None:
        self._metrics_file.close()
        logging.getLogger("flwr").removeHandler(self._log_handler)
        self._log_handler.close()

    def stage_rows(self, server_round: int, stage: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["round"] == server_round and r["stage"] == stage]

    def round_summary(self, server_round: int) -> dict[str, Any]:
        """Aggregates of every stage evaluated in ``server_round``."""
        summary: dict[str, Any] = {}
        for stage in ("L1", "L2"):
            rows = self.stage_rows(server_round, stage)
            if rows:
                summary[stage] = summarize_stage(rows, self.thresholds)
        global_rows = self.stage_rows(server_round, "G")
        if global_rows:
            summary["G"] = {k: v for k, v in global_rows[0].items() if k not in ("round", "stage")}
        return summary

    def round_done(self, server_round: int) -> None:
        if not self.console:
            return
        summary = self.round_summary(server_round)
        parts = [
            f"round {server_round}/{self.cfg.rounds}",
            f"{time.monotonic() - self._started:6.1f}s",
        ]
        for stage in ("L1", "L2"):
            if stage in summary and "acc_local" in summary[stage]:
                parts.append(
                    f"{stage} acc(L) {summary[stage]['acc_local']['mean']:.3f} "
                    f"acc(G) {summary[stage]['acc_global']['mean']:.3f}"
                )
        if "G" in summary:
            parts.append(f"G acc {summary['G']['acc']:.3f}")
        self.console.print(" | ".join(parts))

    def finish(self) -> None:
        """Write summary.json and the plots (the last round is complete)."""
        final = self.cfg.rounds
        failures = [r for r in self.rows if r["stage"] == "failure"]
        summary = {
            "status": "completed",
            "final_round": final,
            "stages": self.round_summary(final),
            "failures": failures,
            "wall_time_s": time.monotonic() - self._started,
            "strategy": self.cfg.strategy.name,
            "dataset": self.cfg.dataset.name,
            "partition": self.cfg.partition.name,
            "num_clients": self.cfg.num_clients,
            "seed": self.cfg.seed,
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self._close()
        from pflower.server.plots import plot_run  # matplotlib only when a run ends

        plot_run(self.rows, final, self.run_dir / "plots")
        if self.console:
            self.console.print(f"[green]results written to {self.run_dir}")
