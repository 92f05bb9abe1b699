"""``benchmarks/gpu.py`` works end to end on the CPU (``--device cpu --smoke``): pflower against
the bare loop (its floor) and the concurrency scaling table, as the GPU script will run them; and
``benchmarks/gpu_all.sh``, the one device call, keeps to its time budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "gpu.py"
ALL = SCRIPT.parent / "gpu_all.sh"


@pytest.mark.slow
def test_smoke_run_on_the_cpu_records_the_floor_and_the_scaling(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--smoke",
            "--rounds",
            "3",
            "--cases",
            "flame",
            "--scaling-cases",
            "flame",
            "--workers",
            "1",
            "2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = json.loads((tmp_path / "gpu.json").read_text())
    floor = [r for r in records if r["measurement"] == "floor"]
    assert len(floor) == 1
    # 2 clients of 60 training images (160 pooled, 75/25 split), one epoch each
    assert floor[0]["floor"]["images_per_round"] == 120
    assert floor[0]["ratio_pflower_over_floor"] > 0
    assert floor[0]["pflower_images_per_s"] > 0 and floor[0]["floor"]["images_per_s"] > 0
    assert len(floor[0]["floor"]["round_times_s"]) == 3
    scaling = [r for r in records if r["measurement"] == "scaling"]
    assert [r["workers"] for r in scaling] == [1, 2]
    assert scaling[0]["speedup_over_one"] == 1.0
    assert all(r["rounds_per_s"] > 0 for r in scaling)
    assert "backend.workers=2" in scaling[1]["command"]
    table = (tmp_path / "gpu.md").read_text()
    assert "pflower / floor" in table and "rounds/s" in table
    assert "no GPU sampled" in table  # no NVML on a CPU machine: said, not faked


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_exits_2_before_running_anything(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--cases", "flame", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 2
    assert "no CUDA device" in result.stderr
    assert not (tmp_path / "gpu.json").exists()


def test_the_device_script_skips_and_logs_the_steps_its_budget_no_longer_holds(
    tmp_path: Path,
) -> None:
    """A lent GPU machine has minutes: a step that does not fit what is left of ``BUDGET_S`` is
    skipped with its name (for a second call), an unknown step is named, and the log is kept."""
    result = subprocess.run(
        ["bash", str(ALL), "floor-resnet", "options", "floor-everything"],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "OUT": str(tmp_path),
            "BUDGET_S": "44",  # under the 45 s a step needs to start
            "GPU_ARGS": "--device cpu --smoke",
            "PYTHON": sys.executable,
        },
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = (tmp_path / "gpu_all.log").read_text()
    assert "environment ready" in log
    for step in ("floor-resnet", "options-amp", "options-resident"):
        assert f"SKIPPED {step}:" in log
    assert "unknown step floor-everything" in log
    assert "gpu_all.sh: done" in log
    assert not (tmp_path / "gpu.json").exists()  # nothing ran, nothing recorded
