"""Processes that pflower forks die with the process they were forked from.

A forked worker (``backend=fork``), the run process of a GPU run, a ClientApp fork server and
each of its task children call [`die_with_parent`][pflower.runtime.processes.die_with_parent] first
thing: on Linux the kernel then
sends them SIGKILL when their parent ends, whatever ended it (SIGKILL included, which no handler
and no ``atexit`` can see). Without it a driver killed with ``kill -9`` left its workers
running, adopted by init, holding their memory until killed by hand.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal this process gets when its parent thread ends
(``<linux/prctl.h>``)."""


def _prctl_death_signal(signum: int) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent ends; False where that
    cannot be asked (not Linux, no C library)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return False
    return bool(libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0)


def die_with_parent(parent_pid: int, signum: int = signal.SIGKILL) -> bool:
    """Make this freshly forked process get ``signum`` (default SIGKILL: it dies) when its
    parent ``parent_pid`` ends; if
    the parent has ended already (between the fork and this call, the race the kernel's
    setting cannot see), exit now. Returns whether the kernel took the setting (Linux);
    elsewhere the caller's own checks (a closed pipe, a watched pid) are all there is.

    Linux sends the signal when the *thread* that forked this process ends: call it only in
    processes forked from a thread that lives as long as its process (a main thread)."""
    armed = _prctl_death_signal(signum)
    if os.getppid() != parent_pid:
        os._exit(1)
    return armed
