"""Starting, finding and stopping the processes of a deployment.

Every process started here carries the environment variable
[`TAG_VARIABLE`][pflower.deploy.processes.TAG_VARIABLE]; Flower's own
child processes (SuperExec, ServerApp and ClientApp processes, which start new sessions) inherit
it. Stopping a deployment ends exactly the processes that carry its tag, and no others.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pflower.runtime.forkclient import pid_alive, stands_in_for

TAG_VARIABLE = "PFLOWER_DEPLOY_TAG"
"""Environment variable naming the deployment and process a process belongs to."""

_PROC = Path("/proc")


@dataclass
class ManagedProcess:
    """A process started by a deployment; ``tag`` marks it and all its descendants."""

    name: str
    pid: int
    command: list[str]
    log: str
    tag: str


def executable(name: str) -> str:
    """A Flower executable of this Python environment (the one running pflower)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def process_environment(tag: str, flwr_home: Path) -> dict[str, str]:
    """The environment of a deployment process.

    ``PATH`` starts with this interpreter's scripts directory because SuperLink and SuperNode
    start ``flower-superexec`` by name; ``FLWR_HOME`` keeps each process's installed apps
    apart, like on separate hosts, and away from the user's ``~/.flwr``. Flower's usage telemetry
    is off unless ``FLWR_TELEMETRY_ENABLED`` is set.
    """
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["FLWR_HOME"] = str(flwr_home)
    env["PYTHONUNBUFFERED"] = "1"
    env[TAG_VARIABLE] = tag
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # no usage telemetry unless asked for
    return env


def launch(
    name: str,
    command: Sequence[str],
    log: Path,
    tag: str,
    flwr_home: Path,
    wrapper: Sequence[str] = (),
) -> tuple[ManagedProcess, subprocess.Popen[bytes]]:
    """Start ``command`` in a new session, its output appended to ``log``.

    ``wrapper`` is prepended (e.g. ``ip netns exec <ns>`` to run it in a network namespace).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    flwr_home.mkdir(parents=True, exist_ok=True)
    argv = [*wrapper, *command]
    with log.open("ab") as out:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=process_environment(tag, flwr_home),
            start_new_session=True,
        )
    return ManagedProcess(name, popen.pid, argv, str(log), tag), popen


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment carries ``tag`` or a tag below it (``tag/...``).

    Reads ``/proc/<pid>/environ`` (Linux); processes of other users and zombies are skipped.
    Without ``/proc`` the answer is empty.
    """
    if not _PROC.is_dir():
        return []
    wanted = f"{TAG_VARIABLE}={tag}".encode()
    below = f"{TAG_VARIABLE}={tag}/".encode()
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            variables = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(v == wanted or v.startswith(below) for v in variables):
            found.append(int(entry.name))
    return found


def runs_program(pid: int, program: str) -> bool:
    """Whether process ``pid`` runs ``program``: the name of its executable or, for a Python
    entry point (``python /venv/bin/flwr-serverapp ...``), of its script, or the command that a
    fork server's stand-in stands in for
    ([`stands_in_for`][pflower.runtime.forkclient.stands_in_for]; Linux's ``/proc``)."""
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    words = [word.decode(errors="replace") for word in raw]
    return any(Path(word).name == program for word in words[:2]) or stands_in_for(words) == program


def _targets(tag: str, leaders: Sequence[int], program: str | None = None) -> list[int]:
    """The processes to signal: tagged ones (only those running ``program``, if given), or
    without ``/proc`` the live session leaders (none, for a ``program``)."""
    if _PROC.is_dir():
        pids = tagged_pids(tag)
        return pids if program is None else [pid for pid in pids if runs_program(pid, program)]
    return [] if program is not None else [pid for pid in leaders if pid_alive(pid)]


def any_running(tag: str, leaders: Sequence[int] = ()) -> bool:
    """Whether a process carrying ``tag`` still runs (without ``/proc``: one of ``leaders``)."""
    return bool(_targets(tag, leaders))


def _signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    kill = os.kill if _PROC.is_dir() else os.killpg
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            kill(pid, sig)


def terminate(
    tag: str,
    leaders: Sequence[int] = (),
    grace: float = 10.0,
    sig: signal.Signals = signal.SIGTERM,
    program: str | None = None,
) -> None:
    """End every process carrying ``tag`` (that runs ``program``, if given: see
    `runs_program`): ``sig`` first, SIGKILL after ``grace`` seconds.

    Flower's processes start their own sessions, so process groups do not reach them all;
    the tag does, also after a parent died and its children were re-parented. Where there is
    no ``/proc`` (macOS), the process groups of ``leaders`` (the processes we started, each a
    session leader) are signalled instead; Flower's child processes follow their parents.
    """
    _signal_all(_targets(tag, leaders, program), sig)
    deadline = time.monotonic() + grace
    while (remaining := _targets(tag, leaders, program)) and time.monotonic() < deadline:
        time.sleep(0.2)
    _signal_all(remaining, signal.SIGKILL)
    while _targets(tag, leaders, program) and time.monotonic() < deadline + 5:
        time.sleep(0.1)


def wait_for_port(
    host: str, port: int, timeout: float, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Block until ``host:port`` accepts TCP connections (fail early if ``process`` died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            args = process.args
            name = args[0] if isinstance(args, list | tuple) else args
            raise RuntimeError(f"process {name!s} exited with {process.returncode}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f}s")
