"""A run folder belongs to one run (docs: guide, reliability, "One run per folder").

A run claims its folder (``claim_run_dir``) before it writes anything there, and keeps the
claim until it ends:

- a folder that holds another run's files (``RUN_FILES``) is refused, unless the run resumes
  it (``checkpoint.resume=true``, what ``pflower resume`` sets) or the user asks to replace it
  (``overwrite=true``: the other run's files are deleted first, so nothing of it mixes in);
- a folder another live process is writing is refused, whatever the options: the claim holds an
  exclusive ``flock`` on ``.pflower.lock`` in the folder, removed when the claim is released.
  The operating system releases the lock when the holder's last descriptor of the file closes,
  so a run killed by any signal, SIGKILL included, leaves no lock that blocks the next one
  (only the file, unlocked).

A claim is re-entrant within a process: ``pflower`` claims the folder before the simulation
starts, and the ServerApp, which runs in the same process (or in a process forked from it, which
shares the lock), claims it again, and only the first claim checks the folder (the run's own
files are not another run's); a deployment's ServerApp process claims it alone. Each claim is
released once (``RunDirClaim.release``); the lock goes with the last.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from pflower.registry import ConfigError

LOCK_FILE = ".pflower.lock"
"""The file a live run holds locked (its first line: the holder's process id)."""

RUN_FILES = (
    "config.yaml",
    "metrics.jsonl",
    "summary.json",
    "checkpoint.pkl",
    "run.log",
    "error.txt",
    "plots",
    "tensorboard",
    "mlflow.db",
    "client_state",
)
"""What a run writes into its folder (``pflower.results.rundir``): a folder holding any of
these holds a run. Other files (a tuner's ``tune_stdout.log``, the user's notes) do not count."""


class RunDirTakenError(ConfigError):
    """The run folder holds another run, or a live run is writing it (exit code 2)."""


@dataclass
class _Held:
    descriptor: int
    claims: int


_HELD: dict[Path, _Held] = {}
"""The run folders this process has claimed: the lock is per process, and re-entrant."""
_HELD_LOCK = threading.Lock()


def other_runs_files(run_dir: Path) -> list[str]:
    """The ``RUN_FILES`` that ``run_dir`` holds, in that order."""
    return [name for name in RUN_FILES if (run_dir / name).exists()]


def refuse_another_run(run_dir: Path, found: list[str] | None = None) -> None:
    """Raise ``RunDirTakenError`` if ``run_dir`` holds another run's files (``found``, or
    ``other_runs_files``): a check that writes nothing, for a command to refuse the folder
    before it prepares the run; the claim checks again."""
    found = other_runs_files(run_dir) if found is None else found
    if found:
        raise RunDirTakenError(
            f"{run_dir} holds another run ({', '.join(found)}): continue it with "
            f"`pflower resume {run_dir}`, choose a fresh output_dir, or pass overwrite=true to "
            "replace it"
        )


def _lock(run_dir: Path) -> int:
    """An open descriptor of ``run_dir``'s lock file, locked exclusively; raises
    ``RunDirTakenError`` if another process holds the lock. A lock file that its holder
    removed (``RunDirClaim.release``) between this process's ``open`` and ``flock`` is
    opened again: the lock is on the file the path names."""
    path = run_dir / LOCK_FILE
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(descriptor)
            raise RunDirTakenError(
                f"{run_dir} is being written by a live run (process {holder}): wait for it to "
                "end, or choose another output_dir"
            ) from None
        except BaseException:
            os.close(descriptor)
            raise
        if _same_file(descriptor, path):
            break
        os.close(descriptor)
    with contextlib.suppress(OSError):  # the holder's id is for the message above only
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
    return descriptor


def _same_file(descriptor: int, path: Path) -> bool:
    """Does ``path`` still name the file open as ``descriptor``?"""
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    opened = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


@dataclass
class RunDirClaim:
    """One claim on a run folder (``claim_run_dir``); a context manager that releases it."""

    run_dir: Path
    _released: bool = False

    def release(self) -> None:
        """Give this claim up (once); the last of the process's claims unlocks the folder."""
        with _HELD_LOCK:
            if self._released:
                return
            self._released = True
            held = _HELD[self.run_dir]
            held.claims -= 1
            if held.claims == 0:
                del _HELD[self.run_dir]
                with contextlib.suppress(FileNotFoundError):  # removed while still locked
                    (self.run_dir / LOCK_FILE).unlink()
                os.close(held.descriptor)  # closing the descriptor releases the flock

    def __enter__(self) -> RunDirClaim:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def claim_run_dir(run_dir: Path, *, overwrite: bool, resuming: bool) -> RunDirClaim:
    """Claim ``run_dir`` (made if missing) for this run; see the module docstring.

    Raises:
        RunDirTakenError: another process is writing the folder, or it holds another run's
            files and the run neither resumes it nor was asked to overwrite it.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    key = run_dir.resolve()
    with _HELD_LOCK:
        held = _HELD.get(key)
        first = held is None
        if held is None:
            held = _HELD[key] = _Held(_lock(run_dir), 0)
        held.claims += 1
    claim = RunDirClaim(key)
    try:  # a claim within the process's first claim adds nothing: that one checked the folder
        found = other_runs_files(run_dir) if first and not resuming else []
        if not overwrite:
            refuse_another_run(run_dir, found)
        for name in found:
            path = run_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    except BaseException:
        claim.release()
        raise
    return claim
