"""A fork server for ClientApp (and ServerApp) processes: each task starts in milliseconds, not
seconds.

In Flower 1.39 a SuperNode hands every message to a new ``flwr-clientapp`` process, started by its
SuperExec by name (``subprocess.Popen(["flwr-clientapp", ...])``), which runs that one task and
exits. Such a process spends most of its life importing torch, Flower and the app's libraries
(6-8 s on a 2-core machine), twice a round per client (a ``train`` and an ``evaluate`` message).

The fork server imports those libraries once, then forks a child per task:

- [`ForkServerProcess`][pflower.runtime.forkserver.ForkServerProcess] (in the process that starts
  the SuperNode or SuperExec, see
  [`pflower.runtime.launcher`][pflower.runtime.launcher]) makes a directory holding the listening
  Unix socket and a
  ``bin/flwr-clientapp`` script, starts the server (``python -m pflower.runtime.forkserver``,
  the socket passed as an open file descriptor), and gives the SuperNode/SuperExec an
  environment with ``bin`` first on ``PATH`` and the socket in
  [`SOCKET_VARIABLE`][pflower.runtime.forkclient.SOCKET_VARIABLE];
- the script runs [`pflower.runtime.forkclient`][pflower.runtime.forkclient] (standard library
  only), which sends the
  server its command line, environment, working directory and standard streams and waits;
- the server ([`ForkServer`][pflower.runtime.forkserver.ForkServer]) forks; the child takes over the
  streams, environment, working
  directory and ``sys.argv`` of the stand-in and calls Flower's ``flwr-clientapp`` entry point
  ([`CLIENTAPP`][pflower.runtime.standins.CLIENTAPP]), which connects to the SuperNode,
  pulls the task, runs the app and
  exits; the server reports the child's exit status back to the stand-in, which exits likewise.

What the child runs is what ``flwr-clientapp`` runs: the same Flower function, the same arguments
(runtime address, token, TLS root certificates, ``--parent-pid``), the same environment. The server
imports the app's modules named by the process that starts it (the launcher's: pflower's ClientApp,
and with it torch, torchvision, Flower, Hydra, datasets, ...), ``torch._dynamo`` (which torch
imports when the first optimizer is built) and composes the default configuration once (Hydra's lazy
imports). Before it forks it also changes two things in Flower's ClientApp runtime that its children
inherit: a FAB installed by an earlier task of the node is not unpacked and checked again
([`install_fabs_once`][pflower.runtime.forkapp.install_fabs_once]:
``run_clientapp.install_from_fab``), and an array that the SuperNode has not pulled yet is asked for
again after 0.02 s instead of 1 s
([`pflower.runtime.polling.prompt_object_pulls`][pflower.runtime.polling.prompt_object_pulls]). The
app a child runs is still the run's FAB: Flower imports the ClientApp from the FAB's directory
unless it is imported already, so a child keeps the server's ``pflower`` modules only when the FAB's
``pflower/**/*.py`` and ``conf/**/*.yaml`` have the same digest as the imported ones (computed once
per installed FAB), and otherwise forgets them and imports the FAB's code
([`keep_app_if_unchanged`][pflower.runtime.forkapp.keep_app_if_unchanged]:
``clientapp.utils.load_app``). A child that ran the server's import tells the server which
configurations it composed, and the server prepares them too
([`warm_configs`][pflower.runtime.forkapp.warm_configs]: composed, with the experiment's federation
and model built): later children find them in their caches. The server runs torch only there, on one
thread (no thread pool exists when it forks), and is single-threaded itself; it parks its objects
outside the garbage collector (``gc.freeze``) and its children end with ``os._exit`` after flushing
their streams: a normal interpreter exit would tear down every inherited module and so copy every
page of the server's memory (seconds per task).

The server lives as long as the process that started it (``--watch-pid``: the kernel sends it
SIGTERM when that process ends, whatever ended it, and it also checks twice a second) and removes
its directory when it ends. Each child is killed when the server ends
([`pflower.runtime.processes.die_with_parent`][pflower.runtime.processes.die_with_parent]): a
SuperNode ended by ``kill -9`` leaves no ClientApp task behind. If the server is gone, the stand-in
runs the real ``flwr-clientapp`` instead.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from pflower.runtime import forkclient
from pflower.runtime.forkapp import (
    Task,
    loaded_app_digest,
    run_task,
    warm_configs,
)
from pflower.runtime.forkclient import SOCKET_VARIABLE, pid_alive, receive_message, send_message
from pflower.runtime.processes import die_with_parent
from pflower.runtime.standins import CLIENTAPP, stand_in

TERMINAL_SIGNALS = frozenset({signal.SIGINT, signal.SIGHUP})
"""Signals from a terminal, which a command started with ``&`` by a script (SIGINT: no job
control) or under ``nohup`` (SIGHUP) ignores: one ignored when the server starts stays ignored
in the server and its children, as in the process that started it and in a run
([`summary_on_signal`][pflower.results.failures.summary_on_signal]). A SIGINT to the group of
such a ``pflower tune`` used to end its fork server and runs while the driver went on. SIGTERM,
pflower's own stop, is always caught."""

SOCKET_NAME = "server.sock"
MAX_SOCKET_PATH = 107
"""The longest path a Unix socket may have on Linux (``sun_path`` holds 108 bytes, one a NUL)."""


def server_directory(prefix: str) -> Path:
    """A new folder for a fork server (its socket and stand-in): under the temporary folder
    (``TMPDIR``), or under ``/tmp`` where that folder is so deep that the socket's path would be
    longer than a Unix socket's may be (binding it would fail)."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    if len(str(directory / SOCKET_NAME)) <= MAX_SOCKET_PATH:
        return directory
    directory.rmdir()
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


TASK_LOG_PREFIX = "pflower fork server: task"
"""Start of the line the server prints (to the SuperNode's log) when a task's child ended:
``<prefix> <pid> ran <seconds> s <status>``."""


def preload(modules: Sequence[str]) -> None:
    """Import ``modules`` (``module`` or ``module:function``, a function to call once the
    modules before it are imported); one that fails is reported and skipped (the children
    import it themselves)."""
    for name in modules:
        try:
            module, _, function = name.partition(":")
            loaded = importlib.import_module(module)
            if function:
                getattr(loaded, function)()
        except Exception as error:  # any failure here only costs the children time
            print(f"pflower fork server: not preloaded: {name}: {error!r}", file=sys.stderr)


def wait_status(status: int) -> dict[str, int]:
    """A ``waitpid`` status as the stand-in expects it: ``exit`` code or ``signal`` number."""
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"exit": os.waitstatus_to_exitcode(status)}


class ForkServer:
    """Accepts tasks on ``listener`` and runs each in a forked child (see the module docstring).

    ``watch_pid``: serve only while this process lives.
    """

    def __init__(
        self,
        listener: socket.socket,
        watch_pid: int | None = None,
        ignored: frozenset[int] = frozenset(),
    ) -> None:
        self.listener, self.watch_pid, self.ignored = listener, watch_pid, ignored
        self.children: dict[int, socket.socket] = {}
        self.started: dict[int, float] = {}
        self.pid = os.getpid()
        self.selector = selectors.DefaultSelector()

    def serve(self) -> Task | None:
        """Serve until the watched process ends (returns None, in the server) or a task was
        forked (returns the task, in the child).

        Besides the listener it watches the connection of each running child's stand-in: the
        stand-in sends nothing more once its child started, so that connection turns readable
        only when the stand-in is gone (``kill -9``, or ended with its SuperExec). Its child is
        then killed too, as the program it stands in for would have been."""
        self.selector.register(self.listener, selectors.EVENT_READ)
        try:
            while self.watch_pid is None or pid_alive(self.watch_pid):
                for key, _ in self.selector.select(timeout=0.05 if self.children else 0.5):
                    if key.fileobj is not self.listener:
                        self._stand_in_gone(int(key.data))
                        continue
                    task = self._accept()
                    if task is not None:
                        return task
                self._reap()
        finally:
            self.selector.close()
        return None

    def _stand_in_gone(self, pid: int) -> None:
        """The stand-in of child ``pid`` closed its connection before the child ended: kill the
        child (reaped and reported by `_reap`)."""
        conn = self.children.get(pid)
        if conn is not None:
            self.selector.unregister(conn)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def _accept(self) -> Task | None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return None
        conn.settimeout(30)
        try:
            request, fds = receive_message(conn, max_fds=3)
            if request.get("kind") == "ping":
                send_message(conn, {"ready": True})
                conn.close()
                return None
            if request.get("kind") == "warm":
                conn.close()
                warm_configs(request["overrides"])
                return None
            task = Task(
                argv=[str(a) for a in request["argv"]],
                env={str(k): str(v) for k, v in request["env"].items()},
                cwd=str(request["cwd"]),
                fds=dict(zip((int(n) for n in request["fds"]), fds, strict=True)),
            )
        except (OSError, EOFError, ValueError, KeyError, TypeError):
            conn.close()
            return None
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            die_with_parent(self.pid)
            self._become_child(conn)
            return task
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self.started[pid] = time.monotonic()
        self.selector.register(conn, selectors.EVENT_READ, pid)
        with contextlib.suppress(OSError):
            send_message(conn, {"pid": pid})
        return None

    def _become_child(self, conn: socket.socket) -> None:
        """In a fresh child: drop the server's sockets and signal handlers."""
        conn.close()
        self.listener.close()
        self.selector.close()
        for other in self.children.values():
            other.close()
        self.children.clear()
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for kept in self.ignored:
            signal.signal(kept, signal.SIG_IGN)

    def _reap(self) -> None:
        """Collect finished children and tell their stand-ins how they ended."""
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if pid in self.started:
                ran = time.monotonic() - self.started.pop(pid)
                print(f"{TASK_LOG_PREFIX} {pid} ran {ran:.3f} s {wait_status(status)}", flush=True)
            if conn is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(conn)
                with contextlib.suppress(OSError):
                    send_message(conn, wait_status(status))
                conn.close()

    def close(self) -> None:
        """End serving (in the server): close the sockets; running children go on."""
        self.listener.close()
        for conn in self.children.values():
            conn.close()


# ---------------------------------------------------------------------- starting a server
def shim_script(python: str) -> str:
    """The ``flwr-clientapp`` script: [`pflower.runtime.forkclient`][pflower.runtime.forkclient] on
    ``python``."""
    client = shlex.quote(str(Path(forkclient.__file__).resolve()))
    return f'#!/bin/sh\nexec {shlex.quote(python)} -I -S {client} "$0" "$@"\n'


@dataclass
class ForkServerProcess:
    """A fork server started by this process, in ``directory`` (see the module docstring),
    whose stand-in is ``bin/<command>``."""

    directory: Path
    popen: subprocess.Popen[bytes]
    command: str = forkclient.COMMAND

    @property
    def socket_path(self) -> Path:
        return self.directory / SOCKET_NAME

    @property
    def bin(self) -> Path:
        return self.directory / "bin"

    @property
    def shim(self) -> Path:
        return self.bin / self.command

    @classmethod
    def start(
        cls,
        directory: Path,
        target: str | None = None,
        watch_pid: int | None = None,
        python: str = sys.executable,
        preload_modules: Sequence[str] | None = None,
        command: str = forkclient.COMMAND,
        app: Sequence[str] = (),
    ) -> ForkServerProcess:
        """Write the stand-in ``bin/<command>`` (without a server it runs the next ``command``
        on ``PATH``), bind the socket and start the server (it imports in the background; tasks
        that arrive meanwhile wait in the socket's backlog). The server imports (or calls) the
        ``app``'s modules (``module`` or ``module:function``), then ``preload_modules``; its
        children call ``target``. Both default to those of the program ``command`` stands in
        for ([`STAND_INS`][pflower.runtime.standins.STAND_INS]: ``flwr-clientapp``,
        ``flwr-serverapp``)."""
        known = stand_in(command)
        target = known.target if target is None else target
        preload_modules = known.preload if preload_modules is None else preload_modules
        bin_dir = directory / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        shim = bin_dir / command
        shim.write_text(shim_script(python))
        shim.chmod(0o755)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(directory / SOCKET_NAME))
            listener.listen(128)
            argv = [python, "-P", "-m", "pflower.runtime.forkserver", "--target", target]
            argv += ["--command", command]
            argv += ["--fd", str(listener.fileno()), "--remove", str(directory)]
            argv += ["--preload", ",".join([*app, *preload_modules])]
            if watch_pid is not None:
                argv += ["--watch-pid", str(watch_pid)]
            popen = subprocess.Popen(argv, pass_fds=[listener.fileno()], stdin=subprocess.DEVNULL)
        finally:
            listener.close()
        return cls(directory, popen, command)

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with the stand-in first on ``PATH``
        and the socket's path in [`SOCKET_VARIABLE`][pflower.runtime.forkclient.SOCKET_VARIABLE]."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = os.pathsep.join([str(self.bin), env.get("PATH", "")])
        env[SOCKET_VARIABLE] = str(self.socket_path)
        return env

    def wait_ready(self, timeout: float) -> None:
        """Block until the server has imported and answers."""
        deadline = time.monotonic() + timeout
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.socket_path))
            send_message(sock, {"kind": "ping"})
            while True:
                try:
                    reply, _ = receive_message(sock)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise
        if not reply.get("ready"):
            raise RuntimeError(f"unexpected reply from the fork server: {reply}")

    def stop(self, grace: float = 10.0) -> None:
        """End the server (and with it any running child:
        [`die_with_parent`][pflower.runtime.forkserver.die_with_parent]) and remove
        its directory."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


# ------------------------------------------------------------------------------ the server
def _stop(_signum: int, _frame: FrameType | None) -> None:
    """End the server once: a second signal (Ctrl-C in the terminal, then the driver's SIGTERM)
    would otherwise interrupt its exit handlers."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _already_stopping)  # not SIG_IGN: a pending one would raise
    raise SystemExit(0)


def _already_stopping(_signum: int, _frame: FrameType | None) -> None:
    """The server is ending: nothing more to do."""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="pflower's fork server for Flower's app processes")
    parser.add_argument("--fd", type=int, required=True, help="the listening Unix socket")
    parser.add_argument("--target", default=CLIENTAPP.target, help="module:function a child calls")
    parser.add_argument("--watch-pid", type=int, default=None, help="serve while this pid lives")
    parser.add_argument("--remove", type=Path, default=None, help="directory removed at the end")
    parser.add_argument(
        "--preload", default=",".join(CLIENTAPP.preload), help="modules to import first"
    )
    parser.add_argument(
        "--command", default=CLIENTAPP.command, help="the program the stand-ins stand in for"
    )
    args = parser.parse_args(argv)
    # Ctrl-C in a terminal reaches the whole foreground group, the server too: it ends quietly
    # (its children restore Python's own SIGINT handler), unless it ignores it (TERMINAL_SIGNALS).
    ignored = frozenset(s for s in TERMINAL_SIGNALS if signal.getsignal(s) == signal.SIG_IGN)
    for signum in {signal.SIGTERM, *TERMINAL_SIGNALS} - ignored:
        signal.signal(signum, _stop)
    if args.watch_pid is not None and args.watch_pid == os.getppid():
        # SIGTERM (not SIGKILL): the server still removes its directory when it ends
        die_with_parent(args.watch_pid, signal.SIGTERM)
    listener = socket.socket(fileno=args.fd)
    server = ForkServer(listener, args.watch_pid, ignored)
    task, loaded_app = None, None
    try:
        preload([m for m in args.preload.split(",") if m])
        loaded_app = loaded_app_digest()
        # Park everything imported so far outside the collector: the children's collections
        # then never touch (and copy) the server's objects.
        gc.collect()
        gc.freeze()
        gc.disable()
        task = server.serve()
    finally:
        if os.getpid() == server.pid:
            server.close()
            if args.remove is not None:
                shutil.rmtree(args.remove, ignore_errors=True)
    if task is not None:  # in a child
        run_task(task, args.target, loaded_app, stand_in(args.command).load_app)


if __name__ == "__main__":
    main()
