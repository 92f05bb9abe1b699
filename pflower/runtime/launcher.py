"""Start Flower's SuperNode or SuperExec with short polling and a ClientApp fork server.

``python -m pflower.deploy.launcher supernode <flower-supernode arguments>`` runs Flower's
``flower-supernode`` in this process and ``... superexec <flower-superexec arguments>`` its
``flower-superexec``, after three changes that only touch timing, never what a task computes:

- a fork server ([`pflower.runtime.forkserver`][pflower.runtime.forkserver]) whose
  ``flwr-clientapp`` stand-in comes
  first on ``PATH``, so that the SuperExec (started by the SuperNode in ``subprocess``
  isolation, or the SuperExec itself in ``process`` isolation) starts each ClientApp task as a
  fork of a process that imported torch and Flower already, instead of a new interpreter that
  imports them (not started for a SuperNode in ``process`` isolation: it runs no ClientApps);
- the SuperExec asks for tasks every
  [`Polling.superexec_s`][pflower.runtime.launcher.Polling.superexec_s] instead of every second
  (Flower's own setting, the environment variable ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, which
  wins if set);
- the SuperNode waits [`Polling.supernode_s`][pflower.runtime.launcher.Polling.supernode_s] at most
  between its polls instead of 3 s
  between asking the SuperLink for a message while it has none, and 0.5 s between looking for
  its ClientApp's reply. Flower 1.39 has no setting for these: its message loop
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

from pflower.runtime.fence import FLOWER_SUPEREXEC, FLOWER_SUPERNODE, SUPERNODE_TIME
from pflower.runtime.forkserver import ForkServerProcess, server_directory

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
    superexec_s: float = 0.1
    """The SuperExec's task poll (Flower: 1 s)."""

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


POLLING = Polling()


class CappedSleepTime(types.ModuleType):
    """Stands in for the ``time`` module in one module: ``sleep`` waits ``cap`` seconds at most,
    everything else is the real ``time``."""

    def __init__(self, cap: float) -> None:
        super().__init__("time")
        self.cap = cap

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.cap))


def cap_supernode_sleeps(cap: float) -> None:
    """Cap the sleeps of Flower's SuperNode message loop at ``cap`` seconds (see the module
    docstring). Fails ([`FlowerChanged`][pflower.runtime.internal.FlowerChanged]) if Flower's
    module no longer has the ``time`` this replaces."""
    SUPERNODE_TIME.check()
    current = SUPERNODE_TIME.current()
    if not (current is time or isinstance(current, CappedSleepTime)):
        raise SUPERNODE_TIME._changed(f"is {current!r}, not the time module")
    SUPERNODE_TIME.replace_for_process(CappedSleepTime(cap))


def isolation_of(arguments: Sequence[str]) -> str:
    """The ``--isolation`` value of a ``flower-supernode`` command line (default subprocess)."""
    for index, argument in enumerate(arguments):
        if argument == "--isolation" and index + 1 < len(arguments):
            return arguments[index + 1]
        if argument.startswith("--isolation="):
            return argument.split("=", 1)[1]
    return "subprocess"


def start_fork_server(app: Sequence[str] = ()) -> ForkServerProcess:
    """A fork server for this process's ClientApp tasks, which imports the ``app``'s modules
    first, its stand-in put on this process's ``PATH`` (inherited by the SuperExec it starts); it
    ends when this process does, whatever ends it."""
    server = ForkServerProcess.start(
        server_directory("pflower-fork-"), watch_pid=os.getpid(), app=app
    )
    os.environ.update(server.environment())
    return server


USAGE = """\
usage: python -m pflower.deploy.launcher [--no-fork-server] {supernode,superexec} [--] ARGS

Run flower-supernode or flower-superexec (with Flower's arguments ARGS) with a ClientApp fork
server and short polling intervals. --no-fork-server: start every ClientApp as a new
flwr-clientapp process (Flower's way)."""


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
    if not arguments or arguments[0] not in ("supernode", "superexec"):
        raise SystemExit(USAGE)
    component = arguments.pop(0)
    if arguments[:1] == ["--"]:
        arguments.pop(0)
    return component, fork_server, arguments


def main(argv: Sequence[str] | None = None, app: Sequence[str] = ()) -> None:
    """Run the SuperNode or SuperExec of ``argv`` (default: this process's arguments); a fork
    server, if one is started, imports the ClientApp's modules ``app`` first."""
    component, fork_server, arguments = parse(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault(SUPEREXEC_POLL_VARIABLE, str(POLLING.superexec_s))
    runs_clientapps = component == "superexec" or isolation_of(arguments) == "subprocess"
    asks_help = bool({"-h", "--help", "-V", "--version"} & set(arguments))
    if runs_clientapps and fork_server and not asks_help:
        start_fork_server(app)
    if component == "supernode":
        cap_supernode_sleeps(float(os.environ.get(SUPERNODE_POLL_VARIABLE, POLLING.supernode_s)))
        from pflower.runtime.polling import prompt_object_pulls  # after the fork server started

        prompt_object_pulls()
        sys.argv = ["flower-supernode", *arguments]
        FLOWER_SUPERNODE.current()()
    else:
        sys.argv = ["flower-superexec", *arguments]
        FLOWER_SUPEREXEC.current()()


if __name__ == "__main__":
    main()
