"""A signal caught by a thread other than the main one runs its handler at once, even while the
main thread waits in a join (:mod:`pflower.runtime.signals`), and a forked child's signals stay
the child's."""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from pflower.runtime.signals import GRACE_S, Handler, handlers_run_promptly

WAIT_S = 60.0
"""How long a test waits for a handler that must run within a fraction of a second."""

JOIN_WAITS = ("_wait_for_tstate_lock", "join")
"""The function a main thread is in while :meth:`threading.Thread.join` waits (Python 3.11;
3.13 waits in ``join`` itself)."""


Handled = tuple[list[int], threading.Event, Handler]
"""The pids SIGUSR1 was handled in, an event its handler sets first thing, and that handler."""


@pytest.fixture
def sigusr1_calls() -> Iterator[Handled]:
    """SIGUSR1 handled for the test (see :data:`Handled`)."""
    calls: list[int] = []
    started = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        started.set()
        calls.append(os.getpid())

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        yield calls, started, handler
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _asleep_in_join(main: int) -> bool:
    """Is the main thread (``main``: its ident) in a join, asleep (Linux's thread state ``S``)?"""
    if sys._current_frames()[main].f_code.co_name not in JOIN_WAITS:
        return False
    native = threading.main_thread().native_id
    stat = Path(f"/proc/self/task/{native}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] == "S"


def _signal_caught_by_a_worker_while_main_joins(started: threading.Event) -> bool:
    """A worker thread sends SIGUSR1 to itself (so it, not the main thread, catches it), then
    waits for the handler while the main thread joins it; whether the handler ran meanwhile."""
    seen = []
    main = threading.main_thread().ident

    def worker() -> None:
        # A signal sent before the main thread sleeps in the join is handled on its way there.
        while not _asleep_in_join(main):
            time.sleep(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        seen.append(started.wait(WAIT_S))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    return seen[0]


def test_a_signal_caught_by_another_thread_is_handled_while_the_main_thread_joins(
    sigusr1_calls: Handled,
) -> None:
    calls, started, handler = sigusr1_calls
    with handlers_run_promptly(handler, frozenset({signal.SIGUSR1}), started):
        assert _signal_caught_by_a_worker_while_main_joins(started)
    assert calls == [os.getpid()]  # handled once: the signal sent again was not handled twice


def test_without_the_watcher_the_handler_waits_for_the_join(
    sigusr1_calls: Handled, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The defect the watcher mends, shown with a short wait: Python's handler runs only once
    the main thread's join returns."""
    monkeypatch.setattr(f"{__name__}.WAIT_S", 1.0)
    calls, started, _ = sigusr1_calls
    assert not _signal_caught_by_a_worker_while_main_joins(started)
    assert calls == [os.getpid()]  # at the join's end


def test_a_forked_childs_signal_is_not_sent_on_to_its_parent(
    sigusr1_calls: Handled,
) -> None:
    """A child forked while the watcher is active inherits the handler and, without the
    after-fork reset, the parent's wakeup pipe: its own SIGUSR1 would be sent on to the
    parent's main thread."""
    calls, started, handler = sigusr1_calls
    with handlers_run_promptly(handler, frozenset({signal.SIGUSR1}), started):
        pid = os.fork()
        if pid == 0:  # the child: handle its own signal, then leave without pytest's cleanup
            code = 1
            try:
                os.kill(os.getpid(), signal.SIGUSR1)
                code = 0 if calls == [os.getpid()] else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert not started.wait(1.0)  # more than the watcher's grace: nothing came
    assert calls == []


def test_the_previous_wakeup_descriptor_is_restored_and_still_fed(
    sigusr1_calls: Handled,
) -> None:
    """A wakeup descriptor set before (asyncio's, say) still gets every signal's byte while the
    watcher owns the slot, and has it back afterwards."""
    _, started, handler = sigusr1_calls
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    before = signal.set_wakeup_fd(write_fd)
    try:
        with handlers_run_promptly(handler, frozenset({signal.SIGUSR1}), started):
            watchers = signal.set_wakeup_fd(-1)
            signal.set_wakeup_fd(watchers)  # put back at once
            assert watchers not in (-1, write_fd)
            os.kill(os.getpid(), signal.SIGUSR1)
            assert started.wait(WAIT_S)
            assert select.select([read_fd], [], [], WAIT_S)[0], "no byte passed on"
            assert os.read(read_fd, 1) == bytes([signal.SIGUSR1])
        assert signal.set_wakeup_fd(before) == write_fd
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_handler_installed_meanwhile_is_left_to_its_own_ways(sigusr1_calls: Handled) -> None:
    """Only the handler the watcher was started for is helped along: another one, installed
    while it watches (Ray defers Ctrl-C that way), is called once per signal, not once more
    by a resend."""
    _, started, handler = sigusr1_calls
    other: list[int] = []
    with handlers_run_promptly(handler, frozenset({signal.SIGUSR1}), started):
        signal.signal(signal.SIGUSR1, lambda signum, frame: other.append(signum))
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(4 * GRACE_S)  # a resend would have come by now
    assert other == [signal.SIGUSR1]
