"""The Flower programs a fork server ([`pflower.runtime.forkserver`][pflower.runtime.forkserver])
stands in for: for each, the command its SuperExec starts it by, the function a forked child calls
instead, what the server imports first and how the program loads the app.

A SuperNode's SuperExec starts each ClientApp task as a new ``flwr-clientapp`` process
([`CLIENTAPP`][pflower.runtime.standins.CLIENTAPP]); a SuperLink's SuperExec starts each run's
ServerApp as a new ``flwr-serverapp`` process ([`SERVERAPP`][pflower.runtime.standins.SERVERAPP]).

A SuperLink's ServerApps are served the same way
(a ``flwr-serverapp`` stand-in, children that
call Flower's ``flwr-serverapp`` entry point, a server that imported pflower's ServerApp; started by
the launcher for a SuperLink): Flower starts one ``flwr-serverapp`` process per run, which spent
15-25 s importing and installing the FAB on 2 cores before the run's first round. A child ends
with its stand-in: when a stand-in's connection closes before its child ended (the stand-in was
killed), the server kills the child, so ``kill -9`` of what looks like the ClientApp or ServerApp
process ends the task as it ends Flower's own process.
"""

from __future__ import annotations

from dataclasses import dataclass

from pflower.runtime import forkclient
from pflower.runtime.fence import FLWR_CLIENTAPP, FLWR_SERVERAPP, LOAD_APP, SERVERAPP_LOAD_APP
from pflower.runtime.internal import Internal

PRELOAD = (
    FLWR_CLIENTAPP.module,
    "pflower.runtime.polling:prompt_object_pulls",
    "pflower.runtime.forkapp:install_fabs_once",
    "sklearn.datasets",
    "torch._dynamo",
)
"""Imported (``module``) or called (``module:function``) by the server before it serves, after
the application's own modules, which the process that starts the server names
([`ForkServerProcess.start`][pflower.runtime.forkserver.ForkServerProcess.start]'s ``app``:
pflower's launcher, [`pflower.deploy.launcher`][pflower.deploy.launcher], gives its ClientApp's;
the runtime names no module of the layers above it).

``torch._dynamo``: torch imports it the first time an optimizer is built (``Optimizer.__init__``
is wrapped in ``torch._disable_dynamo``), 2-4 s that every ``train`` task would spend again."""

SERVERAPP_PRELOAD = (
    FLWR_SERVERAPP.module,
    "pflower.runtime.forkapp:install_serverapp_fabs_once",
    "sklearn.datasets",
)
"""What a ServerApp fork server imports or calls after the app's modules: Flower's ServerApp
runtime, the FAB installed once per SuperLink
([`install_serverapp_fabs_once`][pflower.runtime.forkapp.install_serverapp_fabs_once]), and the
digits loader's ``sklearn``, which a run's ServerApp imports when it builds its experiment.
Unlike [`PRELOAD`][pflower.runtime.standins.PRELOAD] it leaves Flower's object pulls as they
are (a ServerApp's replies are stored before they are announced) and ``torch._dynamo`` out (torch
imports it at a process's first optimizer step, which the clients take, not pflower's
ServerApps), so that the server imports no more than a new ``flwr-serverapp`` process would."""


@dataclass(frozen=True)
class StandIn:
    """A Flower program that a fork server stands in for: the name its SuperExec starts it by,
    its entry point (what a child calls), what the server imports first, and how the program
    loads the app ([`keep_app_if_unchanged`][pflower.runtime.forkapp.keep_app_if_unchanged])."""

    command: str
    entry: Internal
    preload: tuple[str, ...]
    load_app: Internal

    @property
    def target(self) -> str:
        """The entry point as ``module:function``, what a child calls."""
        return f"{self.entry.module}:{self.entry.name}"


CLIENTAPP = StandIn(forkclient.COMMAND, FLWR_CLIENTAPP, PRELOAD, LOAD_APP)
"""A SuperNode's (or its SuperExec's) ClientApp tasks."""

SERVERAPP = StandIn("flwr-serverapp", FLWR_SERVERAPP, SERVERAPP_PRELOAD, SERVERAPP_LOAD_APP)
"""A SuperLink's ServerApps: one per run, started by the SuperLink's SuperExec."""

STAND_INS = {stand_in.command: stand_in for stand_in in (CLIENTAPP, SERVERAPP)}
"""The Flower programs a fork server stands in for, by command."""


def stand_in(command: str) -> StandIn:
    """The program ``command`` stands in for; another command (``pflower``, for
    `pflower tune`'s runs) is served like a ClientApp, with the target it is given."""
    return STAND_INS.get(command, CLIENTAPP)
