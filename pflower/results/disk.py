"""Writing a run's files on a disk that may fail: a file is replaced atomically, space is set
aside for the ``summary.json`` of a run whose write failed on a full disk, a folder is probed
for writability before a run starts, and the errors that count as a failed write are named
with the reason a run records for them (docs: guide, reliability, "One run per folder").
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Literal


def write_atomic(path: Path, data: str | bytes, reserve: Path | None = None) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through a flushed temporary file and a rename:
    a crash leaves the previous file, never a half-written one, and a write that fails (a full
    disk, a file-size limit) raises with the temporary file removed.

    ``reserve``: a file whose space was set aside for this write (``reserve_space``); where
    the temporary file cannot be written, ``data`` is written over the reserve, which then
    becomes ``path``: on a full disk that needs no new space up to the reserve's size."""
    payload = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        _write_synced(temporary, payload, "wb")
    except OSError as error:
        temporary.unlink(missing_ok=True)
        if reserve is None or not reserve.is_file():
            error.filename = error.filename or str(path)
            raise
        _write_synced(reserve, payload, "r+b")
        temporary = reserve
    os.replace(temporary, path)


def _write_synced(path: Path, payload: bytes, mode: Literal["wb", "r+b"]) -> None:
    """Write ``payload`` as all of ``path`` (opened with ``mode``), flushed to the disk."""
    with path.open(mode) as file:
        file.write(payload)
        file.truncate()
        file.flush()
        os.fsync(file.fileno())


RESERVE_FILE = ".summary.reserve"
"""Space a live run sets aside in its folder for the ``summary.json`` of its failure."""
RESERVE_BYTES = 64 * 1024
"""The size of ``RESERVE_FILE``: several times a summary's (about 8 kB)."""


def reserve_space(run_dir: Path) -> Path | None:
    """Write ``RESERVE_FILE`` (``RESERVE_BYTES`` of zeros, so that writing over it takes
    no new space) and return its path; None, leaving nothing, where it cannot be written (a
    file-size limit below its size: a summary, smaller, may still be written as usual)."""
    path = run_dir / RESERVE_FILE
    try:
        _write_synced(path, bytes(RESERVE_BYTES), "wb")
    except OSError:
        path.unlink(missing_ok=True)
        return None
    return path


def check_writable(run_dir: Path) -> None:
    """Make ``run_dir`` (if it does not exist) and write and remove a file in it; the
    ``OSError`` says why a run could not write its results there."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=run_dir) as probe:
        probe.write(b"pflower")


WRITE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS}
)
"""Why a write of a run's results fails: no space, a quota or file-size limit, permissions, a
read-only file system."""


def is_write_failure(error: BaseException) -> bool:
    """Is ``error`` a write that failed for one of the reasons in ``WRITE_ERRNOS``?"""
    return isinstance(error, OSError) and error.errno in WRITE_ERRNOS


def write_failure(error: OSError) -> str:
    """The reason recorded for a run stopped by a write that failed with ``error``."""
    return (
        f"writing the run's results failed: {error} (free space, or raise the file-size limit "
        "or the permissions; `pflower resume` continues the run from its last checkpoint)"
    )
