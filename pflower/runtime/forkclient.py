"""The ``flwr-clientapp`` stand-in (and ``flwr-serverapp``'s, and ``pflower``'s for
``pflower tune``): hands the task to pflower's fork server, else runs Flower's program.

A SuperExec runs every ClientApp task as a new ``flwr-clientapp`` process, found on ``PATH``
(every run's ServerApp as a new ``flwr-serverapp``).
[`pflower.runtime.forkserver`][pflower.runtime.forkserver] puts a script of that name first on the
SuperExec's ``PATH``
which runs this file (``python -I -S``: the standard library only, nothing of pflower, torch or
Flower is imported here, so it starts in milliseconds). It

1. connects to the fork server's Unix socket (environment variable
   [`SOCKET_VARIABLE`][pflower.runtime.forkclient.SOCKET_VARIABLE]) and
   sends its command line, environment, working directory and standard streams (the file
   descriptors themselves, ``SCM_RIGHTS``);
2. receives the pid of the child the server forked to run the task (Flower's own
   ``flwr-clientapp`` entry point, in a process that has torch and Flower imported already),
   passes SIGTERM/SIGINT/SIGHUP on to it, and
3. exits as the child did (its exit code, or the signal that ended it). Killed itself (SIGKILL),
   it takes the child with it: the server kills a child whose stand-in's connection closed.

If the server cannot be reached, or closes the connection before it started a child, nothing
was started and this process replaces itself (``exec``) by the real ``flwr-clientapp`` next on
``PATH``: the task runs exactly as without the server.

Message framing (both ways): a 4-byte big-endian length, then that many bytes of JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys
import time

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs this stand-in ~5 ms
if TYPE_CHECKING:
    from typing import Any

SOCKET_VARIABLE = "PFLOWER_FORKSERVER_SOCKET"
"""Environment variable holding the path of the fork server's Unix socket."""

COMMAND = "flwr-clientapp"
"""The command this file stands in for."""

MAX_MESSAGE = 64 * 2**20
"""Largest message accepted (the environment of a process is far smaller)."""

_HEADER = struct.Struct("!I")


def send_message(
    sock: socket.socket, payload: dict[str, Any], fds: list[int] | None = None
) -> None:
    """Send ``payload`` as one framed JSON message, with ``fds`` attached to its header."""
    data = json.dumps(payload).encode()
    header = _HEADER.pack(len(data))
    if fds:
        socket.send_fds(sock, [header], fds)
    else:
        sock.sendall(header)
    sock.sendall(data)


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise EOFError("connection closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def receive_message(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    """One framed JSON message and the file descriptors that came with it.

    Raises `EOFError` if the connection closes before a whole message arrived.
    """
    fds: list[int] = []
    if max_fds:
        header, fds, _, _ = socket.recv_fds(sock, _HEADER.size, max_fds)
        if not header:
            raise EOFError("connection closed")
        if len(header) < _HEADER.size:
            header += _receive_exactly(sock, _HEADER.size - len(header))
    else:
        header = _receive_exactly(sock, _HEADER.size)
    (size,) = _HEADER.unpack(header)
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes")
    return json.loads(_receive_exactly(sock, size)), fds


def _open_fds() -> list[int]:
    """Which of the standard streams 0, 1, 2 this process has open."""
    opened = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            continue
        opened.append(fd)
    return opened


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists and has not ended (this file runs with the standard
    library only). A zombie has ended: a task child killed with its server is reaped by
    whichever process adopted it, maybe never."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def run_through_server(path: str, argv: list[str]) -> int | None:
    """Run the task in a child of the server at ``path``; its exit status.

    The status is the exit code, or minus the number of the signal that ended the child. None
    when no child was started (the caller then runs the task itself).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        fds = _open_fds()
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "fds": fds}
        send_message(sock, request, fds)
        reply, _ = receive_message(sock)
    except (OSError, EOFError, ValueError):
        sock.close()
        return None
    pid = int(reply["pid"])

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        status, _ = receive_message(sock)
    except (OSError, EOFError, ValueError):
        # The server went away while the child runs: wait for the child, status unknown.
        while pid_alive(pid):
            time.sleep(0.2)
        return 1
    finally:
        sock.close()
    if "signal" in status:
        return -int(status["signal"])
    return int(status["exit"])


def stands_in_for(argv: list[str]) -> str | None:
    """The command that a process with the command line ``argv`` stands in for, if it runs this
    file as a stand-in script does (``python -I -S <this file> <the stand-in's path> ARGS``:
    [`shim_script`][pflower.runtime.forkserver.shim_script]); None for any other process.
    Whoever looks for a ``flwr-serverapp`` process by its command line finds the stand-in, which
    passes SIGTERM on to the ServerApp and whose end ends it."""
    if len(argv) < 5 or os.path.basename(argv[3]) != os.path.basename(__file__):
        return None
    return os.path.basename(argv[4])


def real_command(own: str) -> str:
    """The next command on ``PATH`` named as ``own`` (this stand-in: ``flwr-clientapp``, or
    ``pflower`` for tuning runs) that is not ``own``."""
    name = os.path.basename(own)
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if not os.access(candidate, os.X_OK) or os.path.isdir(candidate):
            continue
        try:
            if os.path.samefile(candidate, own):
                continue
        except OSError:
            pass
        return candidate
    raise FileNotFoundError(f"no {name} on PATH besides {own}")


def main(argv: list[str]) -> None:
    """``argv``: this stand-in's path (ending in the command's name), then its arguments."""
    path = os.environ.get(SOCKET_VARIABLE)
    status = run_through_server(path, argv) if path else None
    if status is None:
        real = real_command(argv[0])
        os.execv(real, [real, *argv[1:]])
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        sys.exit(128 - status)
    sys.exit(status)


if __name__ == "__main__":
    main(sys.argv[1:])
