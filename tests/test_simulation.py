"""The `pflower` command end to end: a real Flower simulation on the Ray backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_pflower_runs_a_ray_simulation_that_learns(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pflower",
            "num_clients=4",
            "rounds=4",
            "strategy=fliu",
            f"output_dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for artifact in (
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
        "run.log",
        "plots/accuracy.png",
        "plots/clients.png",
    ):
        assert (run_dir / artifact).is_file(), artifact
    summary = json.loads((run_dir / "summary.json").read_text())
    l1 = summary["final"]["L1"]
    assert l1["num_clients"] == 4
    # 2 classes per client: local chance is 0.5, global chance 0.1.
    assert l1["acc_local"]["mean"] > 0.85
    assert summary["final"]["G"]["acc"] > 0.2
    assert "round 4/4" in result.stdout  # the live view reported every round


@pytest.mark.slow
def test_a_bad_override_fails_with_a_clear_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pflower",
            "strategy=fliu",
            "strategy.gamma=2",
            f"output_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "strategy.gamma must be in [0, 1], got 2" in result.stdout
