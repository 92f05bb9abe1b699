"""A run folder belongs to one run, and a failed write ends the run as failed (issue 61, items 1
and 2; the reliability guide, "One run per folder").

- A run refuses a folder that holds another run's files, and one that a live process is writing
  (an ``flock`` the OS releases when that process dies, SIGKILL included); ``overwrite=true``
  replaces the other run, leaving nothing of it; resuming a run's own folder still works.
- A write of the results that fails for lack of space or a file-size limit ends the run as
  ``failed`` with the reason in ``summary.json`` (written over space reserved when the run
  started, where the disk is full), a row cut off mid-write is cut from ``metrics.jsonl``, and
  no temporary file or half-written plot is left.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pflower.core.errors import ResultsNotWrittenError
from pflower.results.disk import RESERVE_FILE
from pflower.results.ownership import LOCK_FILE, RunDirTakenError, claim_run_dir
from pflower.results.rows import read_rows
from pflower.results.rundir import RunRecorder
from tests.helpers import tiny
from tests.inprocess import run_inprocess

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = tiny("strategy=fedavg", "checkpoint.every=1", clients=2, rounds=2)
START_S = 300.0
"""Most seconds a subprocess may take to import pflower and start on a loaded 2-core machine."""


def files_of(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def leftovers(run_dir: Path) -> list[str]:
    """Temporary files, the reserve and the lock: none may outlive a run."""
    return sorted(
        str(p.relative_to(run_dir))
        for p in run_dir.rglob("*")
        if p.name.endswith(".tmp") or p.name in (RESERVE_FILE, LOCK_FILE)
    )


# --------------------------------------------------------------------------- one run per folder
def test_a_second_run_into_a_run_folder_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_inprocess(EXPERIMENT, run_dir)
    assert leftovers(run_dir) == []
    before = files_of(run_dir)
    with pytest.raises(RunDirTakenError) as refused:
        run_inprocess([*EXPERIMENT, "seed=1", "rounds=1"], run_dir)
    message = str(refused.value)
    assert "holds another run" in message
    assert f"pflower resume {run_dir}" in message and "overwrite=true" in message
    assert files_of(run_dir) == before


def test_overwrite_replaces_the_run_and_leaves_nothing_of_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_inprocess(EXPERIMENT, run_dir)
    (run_dir / "notes.txt").write_text("the user's own file\n")
    run_inprocess([*EXPERIMENT, "rounds=1", "checkpoint.every=0", "overwrite=true"], run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] == 1
    assert {r["round"] for r in read_rows(run_dir)} == {0, 1}  # none of the first run's rows
    assert not (run_dir / "checkpoint.pkl").exists()  # the first run's, not rewritten
    assert (run_dir / "notes.txt").read_text() == "the user's own file\n"  # not a run's file
    assert leftovers(run_dir) == []


def test_a_run_resumes_its_own_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_inprocess(EXPERIMENT, run_dir)
    rows, _ = run_inprocess([*EXPERIMENT, "rounds=3", "checkpoint.resume=true"], run_dir)
    assert max(r["round"] for r in rows) == 3


@contextlib.contextmanager
def held_by_another_process(run_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """A process that claims ``run_dir`` and sleeps; killed with SIGKILL on exit."""
    code = (
        "import sys, time; from pathlib import Path\n"
        "from pflower.results.ownership import claim_run_dir\n"
        "claim_run_dir(Path(sys.argv[1]), overwrite=False, resuming=False)\n"
        "print('claimed', flush=True); time.sleep(600)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(run_dir)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "claimed\n"
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_folder_a_live_run_writes_is_refused_until_that_run_is_killed(tmp_path: Path) -> None:
    """Even ``overwrite=true`` or a resume may not take a folder from a live run; SIGKILL, which
    no handler sees, ends the claim with the process."""
    run_dir = tmp_path / "run"
    with held_by_another_process(run_dir) as holder:
        for overwrite, resuming in ((False, False), (True, False), (False, True)):
            with pytest.raises(RunDirTakenError, match=f"live run \\(process {holder.pid}\\)"):
                claim_run_dir(run_dir, overwrite=overwrite, resuming=resuming)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (run_dir / LOCK_FILE).exists()  # what SIGKILL leaves: a file, not a lock
    with claim_run_dir(run_dir, overwrite=False, resuming=False):
        pass
    assert leftovers(run_dir) == []


def test_a_claim_is_reentrant_in_its_process_and_checks_the_folder_once(tmp_path: Path) -> None:
    """``pflower`` claims the folder, then its ServerApp does: the second claim neither refuses
    the run's own files nor, with ``overwrite=true``, deletes them."""
    run_dir = tmp_path / "run"
    with claim_run_dir(run_dir, overwrite=True, resuming=False):
        (run_dir / "metrics.jsonl").write_text("{}\n")
        with claim_run_dir(run_dir, overwrite=True, resuming=False):
            assert (run_dir / "metrics.jsonl").exists()
    with pytest.raises(RunDirTakenError):  # released: the next run is another run
        claim_run_dir(run_dir, overwrite=False, resuming=False)


# -------------------------------------------------------------------------- failed writes
FSIZE_LIMIT = 32 * 1024
"""Bytes: more than config.yaml, run.log, the rows or a summary take, less than a checkpoint."""


@pytest.mark.slow
def test_a_file_size_limit_ends_the_run_as_failed_with_the_reason(tmp_path: Path) -> None:
    """``ulimit -f``: the checkpoint cannot be written. Python ignores SIGXFSZ (from its start
    on, and in the processes it starts), so the write raises EFBIG instead of the signal
    killing the process; the run must still end recorded as failed."""
    run_dir = tmp_path / "run"
    code = (
        "import sys; from pathlib import Path\n"
        "from pflower.core.errors import ResultsNotWrittenError\n"
        "from tests.inprocess import run_inprocess\n"
        "try:\n"
        "    run_inprocess(sys.argv[2:], Path(sys.argv[1]))\n"
        "except ResultsNotWrittenError as error:\n"
        "    print('stopped:', error); sys.exit(3)\n"
    )

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, resource.RLIM_INFINITY))

    result = subprocess.run(
        [sys.executable, "-c", code, str(run_dir), *EXPERIMENT],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=limit_file_size,
        capture_output=True,
        text=True,
        timeout=START_S,
    )
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "[Errno 27] File too large" in summary["error"]
    assert str(run_dir / "checkpoint.pkl") in summary["error"]
    assert summary["final_round"] == 1  # what was recorded before
    assert not (run_dir / "checkpoint.pkl").exists()
    assert leftovers(run_dir) == []


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, mounted for the test (root, and a kernel that lets the test mount)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


def fill(disk: Path) -> None:
    """Write until the disk is full."""
    with (
        (disk / f"filler-{uuid.uuid4().hex}").open("wb", buffering=0) as filler,
        contextlib.suppress(OSError),
    ):
        while True:
            filler.write(bytes(4096))


def complete_png(path: Path) -> bool:
    return path.read_bytes().endswith(b"IEND\xaeB`\x82")


@pytest.mark.parametrize("full_after", ["fit_done", "finish"])
def test_a_full_disk_ends_the_run_as_failed_with_the_reason(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch, full_after: str
) -> None:
    """The disk fills up in round 1 (``fit_done``: the round's next rows or its checkpoint
    cannot be written), or after the last round was recorded as ``completed`` with its plots
    (``finish``: the last checkpoint cannot be written): either way ``summary.json`` then says
    failed and why, written over the space the run reserved, as the disk has none left."""
    run_dir = small_disk / "run"
    original = getattr(RunRecorder, full_after)

    def then_fill(self: RunRecorder, *args: int) -> None:
        original(self, *args)
        fill(small_disk)

    monkeypatch.setattr(RunRecorder, full_after, then_fill)
    with pytest.raises(ResultsNotWrittenError, match="No space left on device"):
        run_inprocess(EXPERIMENT, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert f"[Errno {errno.ENOSPC}] No space left on device" in summary["error"]
    assert summary["final_round"] == (1 if full_after == "fit_done" else 2)
    assert leftovers(run_dir) == []
    assert all(complete_png(plot) for plot in run_dir.glob("plots/*"))
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in rows)  # no row cut off mid-write
