"""A signal's Python handler runs when the signal arrives, not when the main thread next wakes.

Python runs a signal handler on the main thread, the next time that thread executes Python code.
The kernel delivers a process-directed signal (``kill``, ``timeout``) to any thread that does not
block it. When it picks another thread, Python's C-level handler runs there and marks the signal
pending, but a main thread asleep in a lock's wait is not woken. A simulation's main thread
waits in Flower's simulation engine for the whole run (``run_api`` joins its worker threads),
so a ``kill`` caught by a worker thread ran pflower's handler only after the last round: the run
completed and its summary said so, and only then did the process end by the signal.

[`handlers_run_promptly`][pflower.runtime.signals.handlers_run_promptly] closes that gap. Python's
C-level handler also writes the signal's
number to the wakeup file descriptor (`signal.set_wakeup_fd`), from whichever thread
caught it. A watcher thread reads it and, unless the handler has started within
[`GRACE_S`][pflower.runtime.signals.GRACE_S], sends the signal again to the main thread alone
(`signal.pthread_kill`),
which interrupts its wait (``EINTR``); Python then runs the handler there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any]

GRACE_S = 0.25
"""Seconds the main thread has to start a signal's handler before the signal is sent to it
again: a main thread that caught the signal itself starts the handler well within it."""

STOP_S = 1.0
"""Most seconds the end of [`handlers_run_promptly`][pflower.runtime.signals.handlers_run_promptly]
waits for its thread."""

SUPPORTED = hasattr(signal, "pthread_kill") and hasattr(os, "register_at_fork")
"""POSIX only: Windows has neither thread-directed signals nor ``fork`` (and there the
watcher is not needed: Python's handlers wake a waiting main thread by other means)."""

log = logging.getLogger(__name__)


class _Watcher:
    """The wakeup pipe and the thread that reads it (see the module docstring)."""

    def __init__(self, handler: Handler, signums: frozenset[int], started: threading.Event) -> None:
        self.handler = handler
        self.signums = signums
        self.started = started
        self.read_fd, self.write_fd = os.pipe()
        self.previous_fd = -1
        self.stopping = False
        self.thread = threading.Thread(target=self._watch, name="pflower-signals", daemon=True)

    def start(self) -> None:
        """Become the wakeup descriptor and start the thread."""
        os.set_blocking(self.write_fd, False)  # set_wakeup_fd requires it
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self.thread.start()

    def _watch(self) -> None:
        """Send each signal the main thread has not started handling to it, while ``handler``
        is the one installed for it (another one, installed meanwhile, is left to its own
        ways); pass every byte on to the wakeup descriptor set before this one (asyncio's,
        say)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, self.signums)  # never caught by this thread
        main = threading.main_thread().ident
        while (data := os.read(self.read_fd, 64)) and not self.stopping:
            if self.previous_fd != -1:
                with contextlib.suppress(OSError):
                    os.write(self.previous_fd, data)
            for signum in self.signums.intersection(data):
                if (
                    not self.started.wait(GRACE_S)
                    and signal.getsignal(signum) is self.handler
                    and main is not None
                ):
                    signal.pthread_kill(main, signum)

    def stop(self) -> None:
        """Put the previous wakeup descriptor back, end the thread (a byte wakes it: a child
        forked meanwhile may hold the pipe open) and close the pipe."""
        self.stopping = True
        self.forget()
        if self.thread.is_alive():
            with contextlib.suppress(OSError):
                os.write(self.write_fd, b"\0")
            self.thread.join(timeout=STOP_S)
        self.close_pipe()

    def close_pipe(self) -> None:
        """Close both ends of the pipe (what is closed already stays closed)."""
        for fd in (self.write_fd, self.read_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def forget(self) -> None:
        """Stop being the wakeup descriptor: the previous one is set again, unless another was
        set after this one (that one stays), or was closed meanwhile (then none is)."""
        try:
            current = signal.set_wakeup_fd(self.previous_fd)
        except (OSError, ValueError):
            current = signal.set_wakeup_fd(-1)
        if current not in (self.write_fd, -1):
            signal.set_wakeup_fd(current)


_active: _Watcher | None = None
"""The watcher of this process, while
[`handlers_run_promptly`][pflower.runtime.signals.handlers_run_promptly] is active."""


def _forget_in_forked_child() -> None:
    """A forked child (a simulation's worker) must not write its signals to its parent's
    watcher, which would send them on to the parent's main thread. The child has no watcher
    thread (only the forking thread survives a fork): it closes its copies of the pipe."""
    global _active
    if _active is not None:
        _active.forget()
        _active.close_pipe()
        _active = None


if SUPPORTED:
    os.register_at_fork(after_in_child=_forget_in_forked_child)


@contextlib.contextmanager
def handlers_run_promptly(
    handler: Handler, signums: frozenset[int], started: threading.Event
) -> Iterator[None]:
    """While active, a signal in ``signums`` caught by a thread other than the main one is sent
    to the main thread again, unless ``started`` is set within
    [`GRACE_S`][pflower.runtime.signals.GRACE_S]: ``handler``,
    installed for those signals, sets it first thing. Call it on the main thread, after
    installing ``handler``.

    Limits: once ``started`` is set, later signals get no help (the handler is expected to end
    the process, as pflower's does); nested, only the outermost one watches, for its own
    handler; off the main thread, or where it is not
    [`SUPPORTED`][pflower.runtime.signals.SUPPORTED], it does nothing, and a
    watcher that cannot start (no file descriptor left) is logged and done without."""
    global _active
    if (
        not SUPPORTED
        or _active is not None
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return
    watcher = None
    try:
        # known (_active) before it is the wakeup descriptor: a child forked from now forgets it
        watcher = _active = _Watcher(handler, signums, started)
        watcher.start()
    except (OSError, RuntimeError, ValueError) as error:
        log.warning("signals caught by other threads may wait for the main thread: %s", error)
        if watcher is not None:
            watcher.stop()
        watcher = _active = None
    try:
        yield
    finally:
        if watcher is not None:
            watcher.stop()
            _active = None
