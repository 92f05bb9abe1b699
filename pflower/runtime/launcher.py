"""Start Flower's SuperNode, SuperExec or SuperLink with short polling and a fork server for
the app processes they start.

``python -m pflower.deploy.launcher supernode <flower-supernode arguments>`` runs Flower's
``flower-supernode`` in this process, ``... superexec <flower-superexec arguments>`` its
``flower-superexec`` and ``... superlink <flower-superlink arguments>`` its
``flower-superlink``, after changes that only touch timing, never what a task computes:

- a fork server ([`pflower.runtime.forkserver`][pflower.runtime.forkserver]) whose
  ``flwr-clientapp`` stand-in comes
  first on ``PATH``, so that the SuperExec (started by the SuperNode in ``subprocess``
  isolation, or the SuperExec itself in ``process`` isolation) starts each ClientApp task as a
  fork of a process that imported torch and Flower already, instead of a new interpreter that
  imports them (not started for a SuperNode in ``process`` isolation: it runs no ClientApps);
- for a SuperLink (in ``subprocess`` isolation, whose SuperExec starts a new ``flwr-serverapp``
  process for every run) a ServerApp fork server
  ([`SERVERAPP`][pflower.runtime.standins.SERVERAPP]) whose ``flwr-serverapp`` stand-in comes
  first on ``PATH``: a run's ServerApp starts with torch, Flower, pflower's ServerApp and the
  FAB's installation at hand, instead of 15-25 s of imports and installing on 2 cores before
  its first round;
- the SuperExec of a SuperNode asks for tasks every
  [`Polling.superexec_s`][pflower.runtime.launcher.Polling.superexec_s] instead of every second
  (Flower's own setting, the environment variable ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, which
  wins if set). A SuperLink's SuperExec keeps Flower's second: it starts one ServerApp per run,
  and its polls would cost the SuperLink a request each, all the time, for at most a second
  saved per run;
- the SuperNode waits [`Polling.supernode_s`][pflower.runtime.launcher.Polling.supernode_s] at most
  between its polls instead of 3 s
  between asking the SuperLink for a message while it has none, and 0.5 s between looking for
  its ClientApp's reply; after
  [`Polling.idle_after_s`][pflower.runtime.launcher.Polling.idle_after_s] without a message it
  asks every [`Polling.supernode_idle_s`][pflower.runtime.launcher.Polling.supernode_idle_s],
  so that an idle deployment costs its machines little (a run's first message then waits up to
  that long; the messages that follow come within a round's time). Flower 1.39 has no setting
  for these: its message loop
  (``flwr.supernode.start_client_internal``) calls ``time.sleep`` with constants, so this
  process gives that module a ``time`` whose ``sleep`` is capped
  ([`cap_supernode_sleeps`][pflower.runtime.launcher.cap_supernode_sleeps],
  `SUPERNODE_TIME`; ``PFLOWER_SUPERNODE_POLL_INTERVAL`` sets
  another cap);
- the SuperNode, and the ClientApps the fork server starts, retry an array of a message that is
  not there yet after 0.02 s instead of 1 s
  ([`pflower.runtime.polling.prompt_object_pulls`][pflower.runtime.polling.prompt_object_pulls]):
  the SuperNode announces a message to its ClientApp before it has pulled the message's arrays.

Each poll costs the SuperLink (SuperNode polls) or the SuperNode (SuperExec polls) a request:
with 0.1 s, about 10 requests per second and node while it waits, a few percent of a core per
node on a 2-core machine; raise the intervals for many nodes per SuperLink.

Without these, a message waits for the SuperNode's next poll (0-3 s), then for the SuperExec's
(0-1 s), then for a new ClientApp process to import its libraries (6-8 s on 2 cores), and its
reply for the SuperNode's next look (0-0.5 s): with a ``train`` and an ``evaluate`` message per
client and round, over 10 s per round. The ServerApp's own wait for replies (3 s steps in
Flower's ``HttpGrid``) is shortened in the ServerApp
([`pflower.runtime.polling`][pflower.runtime.polling]).

``python -m pflower.deploy.launcher`` is the public entry point of this module. The changes hold
for the life of the launcher's process, which exists for them.
"""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME

from pflower.runtime.fence import (
    FLOWER_SUPEREXEC,
    FLOWER_SUPERLINK,
    FLOWER_SUPERNODE,
    SUPERNODE_TIME,
)
from pflower.runtime.forkserver import ForkServerProcess, server_directory
from pflower.runtime.standins import CLIENTAPP, SERVERAPP

SUPERLINK_IN_MEMORY_DB = FLWR_IN_MEMORY_DB_NAME
"""The ``--database`` value that keeps a SuperLink's state in memory (Flower 1.39's
``flwr.supercore.constant``)."""

SUPEREXEC_POLL_VARIABLE = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
"""Flower's own setting of the SuperExec's task poll (seconds); a value already set is kept."""

SUPERNODE_POLL_VARIABLE = "PFLOWER_SUPERNODE_POLL_INTERVAL"
"""The cap on the SuperNode loop's sleeps (seconds), if not
[`Polling.supernode_s`][pflower.runtime.launcher.Polling.supernode_s]."""


@dataclass(frozen=True)
class Polling:
    """The polling intervals the launcher sets (seconds)."""

    supernode_s: float = 0.1
    """Longest sleep of the SuperNode's message loop (Flower: 3 s idle, 0.5 s reply wait)."""
    supernode_idle_s: float = 1.0
    """Longest idle sleep of the SuperNode's loop once it has had no message for
    [`idle_after_s`][pflower.runtime.launcher.Polling.idle_after_s] (Flower: 3 s)."""
    idle_after_s: float = 10.0
    """Seconds without a message after which the SuperNode polls every
    [`supernode_idle_s`][pflower.runtime.launcher.Polling.supernode_idle_s] instead of
    [`supernode_s`][pflower.runtime.launcher.Polling.supernode_s]: a run's messages follow each
    other within a round's time, and an idle deployment's polls cost its SuperLink and nodes
    CPU (3 idle SuperNodes and their SuperLink: 43% of a core at 0.1 s, on 2 cores)."""
    superexec_s: float = 0.1
    """The SuperExec's task poll (Flower: 1 s)."""

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


POLLING = Polling()


IDLE_SLEEP_S = 1.0
"""A sleep the SuperNode's loop asks for of at least this long is its idle wait (Flower 1.39:
3 s when the SuperLink had no message); its shorter ones (0.5 s) wait for a message's reply."""


class CappedSleepTime(types.ModuleType):
    """Stands in for the ``time`` module in one module: ``sleep`` waits ``cap`` seconds at most,
    everything else is the real ``time``. With an ``idle_cap``, idle sleeps
    ([`IDLE_SLEEP_S`][pflower.runtime.launcher.IDLE_SLEEP_S] or longer) that follow each other
    for ``idle_after`` seconds, with no shorter sleep between (a message handled), are capped at
    ``idle_cap`` instead."""

    def __init__(self, cap: float, idle_cap: float | None = None, idle_after: float = 0.0) -> None:
        super().__init__("time")
        self.cap = cap
        self.idle_cap = cap if idle_cap is None else max(cap, idle_cap)
        self.idle_after = idle_after
        self.idle_since: float | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        if seconds < IDLE_SLEEP_S:
            self.idle_since = None
            time.sleep(min(seconds, self.cap))
            return
        now = time.monotonic()
        if self.idle_since is None:
            self.idle_since = now
        idle = now - self.idle_since >= self.idle_after
        time.sleep(min(seconds, self.idle_cap if idle else self.cap))


def cap_supernode_sleeps(
    cap: float, idle_cap: float | None = None, idle_after: float = 0.0
) -> None:
    """Cap the sleeps of Flower's SuperNode message loop at ``cap`` seconds, its idle sleeps at
    ``idle_cap`` once it has been idle ``idle_after`` seconds (see the module docstring and
    [`CappedSleepTime`][pflower.runtime.launcher.CappedSleepTime]). Fails
    ([`FlowerChanged`][pflower.runtime.internal.FlowerChanged]) if Flower's module no longer has
    the ``time`` this replaces."""
    SUPERNODE_TIME.check()
    current = SUPERNODE_TIME.current()
    if not (current is time or isinstance(current, CappedSleepTime)):
        raise SUPERNODE_TIME._changed(f"is {current!r}, not the time module")
    SUPERNODE_TIME.replace_for_process(CappedSleepTime(cap, idle_cap, idle_after))


def isolation_of(arguments: Sequence[str]) -> str:
    """The ``--isolation`` value of a ``flower-supernode`` command line (default subprocess)."""
    for index, argument in enumerate(arguments):
        if argument == "--isolation" and index + 1 < len(arguments):
            return arguments[index + 1]
        if argument.startswith("--isolation="):
            return argument.split("=", 1)[1]
    return "subprocess"


def start_fork_server(
    app: Sequence[str] = (), command: str = CLIENTAPP.command
) -> ForkServerProcess:
    """A fork server for this process's ClientApp tasks (``command`` ``flwr-serverapp``: its
    ServerApps), which imports the ``app``'s modules first, its stand-in put on this process's
    ``PATH`` (inherited by the SuperExec it starts); it ends when this process does, whatever
    ends it."""
    server = ForkServerProcess.start(
        server_directory("pflower-fork-"), watch_pid=os.getpid(), app=app, command=command
    )
    os.environ.update(server.environment())
    return server


USAGE = """\
usage: python -m pflower.deploy.launcher [--no-fork-server]
         {supernode,superexec,superlink} [--] ARGS

Run flower-supernode or flower-superexec (with Flower's arguments ARGS) with a ClientApp fork
server and short polling intervals, or flower-superlink with a ServerApp fork server and a short
task poll of its SuperExec. --no-fork-server: start every ClientApp (ServerApp) as a new
flwr-clientapp (flwr-serverapp) process (Flower's way)."""

COMPONENTS = ("supernode", "superexec", "superlink")
"""The Flower programs the launcher runs."""


def parse(argv: Sequence[str]) -> tuple[str, bool, list[str]]:
    """``(component, fork_server, flower_arguments)`` of a launcher command line."""
    arguments = list(argv)
    fork_server = True
    while arguments and arguments[0].startswith("-"):
        option = arguments.pop(0)
        if option == "--no-fork-server":
            fork_server = False
        elif option in ("-h", "--help"):
            print(USAGE)
            raise SystemExit(0)
        else:
            raise SystemExit(f"unknown option {option}\n{USAGE}")
    if not arguments or arguments[0] not in COMPONENTS:
        raise SystemExit(USAGE)
    component = arguments.pop(0)
    if arguments[:1] == ["--"]:
        arguments.pop(0)
    return component, fork_server, arguments


def main(
    argv: Sequence[str] | None = None,
    app: Sequence[str] = (),
    server_app: Sequence[str] = (),
) -> None:
    """Run the SuperNode, SuperExec or SuperLink of ``argv`` (default: this process's
    arguments); a fork server, if one is started, imports the ClientApp's modules ``app`` first
    (the ServerApp's, ``server_app``, for a SuperLink)."""
    component, fork_server, arguments = parse(sys.argv[1:] if argv is None else argv)
    if component != "superlink":  # a SuperLink's SuperExec starts one process per run
        os.environ.setdefault(SUPEREXEC_POLL_VARIABLE, str(POLLING.superexec_s))
    asks_help = bool({"-h", "--help", "-V", "--version"} & set(arguments))
    # A SuperLink or SuperNode in subprocess isolation starts its own SuperExec, which starts
    # each app process by name: the stand-in on PATH. In process isolation it starts none.
    runs_apps = component == "superexec" or isolation_of(arguments) == "subprocess"
    if runs_apps and fork_server and not asks_help:
        if component == "superlink":
            start_fork_server(server_app, SERVERAPP.command)
        else:
            start_fork_server(app)
    if component == "supernode":
        cap_supernode_sleeps(
            float(os.environ.get(SUPERNODE_POLL_VARIABLE, POLLING.supernode_s)),
            POLLING.supernode_idle_s,
            POLLING.idle_after_s,
        )
        from pflower.runtime.polling import prompt_object_pulls  # after the fork server started

        prompt_object_pulls()
        sys.argv = ["flower-supernode", *arguments]
        FLOWER_SUPERNODE.current()()
    elif component == "superlink":
        sys.argv = ["flower-superlink", *arguments]
        FLOWER_SUPERLINK.current()()
    else:
        sys.argv = ["flower-superexec", *arguments]
        FLOWER_SUPEREXEC.current()()


if __name__ == "__main__":
    main()
