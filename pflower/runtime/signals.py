"""A signal's Python handler runs when the signal arrives, not when the main thread next wakes.

Python runs a signal handler on the main thread, the next time that thread executes Python code.
The kernel delivers a process-directed signal (``kill``, ``timeout``) to any thread that does not
block it. When it picks another thread, Python's C-level handler runs there and marks the signal
pending, but a main thread asleep in a lock's wait is not woken. A simulation's main thread
waits in Flower's simulation engine for the whole run (``run_api`` joins its worker threads),
so a ``kill`` caught by a worker thread ran pflower's handler only after the last round: the run
completed and its summary said so, and only then did the process end by the signal.

:func:`handlers_run_promptly` closes that gap. Python's C-level handler also writes the signal's
number to the wakeup file descriptor (:func:`signal.set_wakeup_fd`), from whichever thread
caught it. A watcher thread reads it and, unless the handler has started within
:data:`GRACE_S`, sends the signal again to the main thread alone (:func:`signal.pthread_kill`),
which interrupts its wait (``EINTR``); Python then runs the handler there.
"""

from __future__ import annotations

import contextlib
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


class _Watcher:
    """The wakeup pipe and the thread that reads it (see the module docstring)."""

    def __init__(self, handler: Handler, signums: frozenset[int], started: threading.Event) -> None:
        self.handler = handler
        self.signums = signums
        self.started = started
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)  # set_wakeup_fd requires it
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self.main_ident = threading.main_thread().ident
        self.thread = threading.Thread(target=self._watch, name="pflower-signals", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        """Send each signal the main thread has not started handling to it, while ``handler``
        is the one installed for it (another one, installed meanwhile, is left to its own
        ways); pass every byte on to the wakeup descriptor set before this one (asyncio's,
        say)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, self.signums)  # never caught by this thread
        while data := os.read(self.read_fd, 64):
            if self.previous_fd != -1:
                with contextlib.suppress(OSError):
                    os.write(self.previous_fd, data)
            for signum in self.signums.intersection(data):
                if (
                    not self.started.wait(GRACE_S)
                    and signal.getsignal(signum) is self.handler
                    and self.main_ident is not None
                ):
                    signal.pthread_kill(self.main_ident, signum)

    def close(self, *, in_forked_child: bool = False) -> None:
        """Put the previous wakeup descriptor back and end the thread (a forked child has no
        thread to end: only the one that forked survives a fork)."""
        signal.set_wakeup_fd(self.previous_fd)
        os.close(self.write_fd)  # the thread's read returns b"": it ends
        if not in_forked_child:
            self.thread.join()
        os.close(self.read_fd)


_active: _Watcher | None = None
"""The watcher of this process, while :func:`handlers_run_promptly` is active."""


def _forget_in_forked_child() -> None:
    """A forked child (a simulation's worker) must not write its signals to its parent's
    watcher, which would send them on to the parent's main thread."""
    global _active
    if _active is not None:
        _active.close(in_forked_child=True)
        _active = None


os.register_at_fork(after_in_child=_forget_in_forked_child)


@contextlib.contextmanager
def handlers_run_promptly(
    handler: Handler, signums: frozenset[int], started: threading.Event
) -> Iterator[None]:
    """While active, a signal in ``signums`` caught by a thread other than the main one is sent
    to the main thread again, unless ``started`` is set within :data:`GRACE_S`: ``handler``,
    installed for those signals, sets it first thing (once set, nothing is sent again). Call it
    on the main thread, after installing ``handler``; nested, only the outermost one watches (a
    handler that calls the one it replaced sets the outer ``started`` too)."""
    global _active
    if _active is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    _active = _Watcher(handler, signums, started)
    try:
        yield
    finally:
        watcher, _active = _active, None
        if watcher is not None:
            watcher.close()
