"""A deployment's round overhead removed: the ClientApp fork server, the launcher's polling
intervals and the ServerApp's prompt reply polls (no deployment is started here; the deployment
tests run SuperNodes through the launcher).

- the fork server runs a task as ``flwr-clientapp`` would: the stand-in's command line, working
  directory, environment and standard streams reach the child, its exit code or signal comes
  back; a child uses the server's import of the app only for a FAB with the same code;
- without a server the stand-in runs the real ``flwr-clientapp``; the server ends with the
  process it watches and removes its directory;
- the launcher's command line, and the cap on the SuperNode loop's sleeps (its patch point exists
  in this Flower version);
- a FAB that a task of the node installed completely is not installed again, anything else is;
  an array that is not there yet is pulled again after a short pause, not Flower's 1 s;
- :class:`PromptGrid` keeps ``send_and_receive``'s contract (all replies; timeout) with short,
  growing pauses, and only proxies over an ``HttpGrid`` get one;
- a deployment round's messages go out in one push, and each reply, error or silence is
  attributed to its own client.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Error, Message
from flwr.app.message_type import MessageType
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    GetPropertiesRes,
    MessageTypeLegacy,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.supercore.inflatable.inflatable_utils import ObjectPushError
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.grid import HttpGrid, InMemoryGrid

from pflower.config.base import stage_app
from pflower.core.nodes import NodeQuestions
from pflower.deploy import launcher
from pflower.deploy.processes import runs_program
from pflower.deploy.topology import launcher_command
from pflower.plugins import PLUGINS_ENV
from pflower.runtime import fence
from pflower.runtime import launcher as runtime_launcher
from pflower.runtime.forkapp import (
    APP_DIGEST_FILE,
    INSTALLED_FAB_MARK,
    app_digest,
    install_fabs_once,
    installed_app_digest,
)
from pflower.runtime.forkclient import SOCKET_VARIABLE, pid_alive, stands_in_for
from pflower.runtime.forkserver import ForkServerProcess, shim_script, wait_status
from pflower.runtime.packing import is_packed, packed_arrays_mod
from pflower.runtime.polling import (
    PUSH_ATTEMPTS,
    SIMULATION_POLL_S,
    PromptClientManager,
    PromptGrid,
    SimulationGrid,
    fit_at_once,
    prompt_object_pulls,
    round_grid,
)
from pflower.runtime.standins import SERVERAPP, STAND_INS
from tests.deploy_helpers import wait_until

PROBE = """
import json, os, signal, sys

def main():
    report = {}
    if "PROBE_FAB" in os.environ:  # load a module as Flower loads the ClientApp from a FAB
        from flwr.clientapp import utils

        utils.load_app("pflower.deploy.topology:Endpoints", ValueError, os.environ["PROBE_FAB"])
        report["app_file"] = sys.modules["pflower.deploy.topology"].__file__
    if "PROBE_COMPOSE" in os.environ:  # compose a run's configuration as the ClientApp does
        from pflower.compose import config_from_run_config
        from pflower.config import RUN_CONFIG_KEY

        config_from_run_config({RUN_CONFIG_KEY: os.environ["PROBE_COMPOSE"]})
    compose = sys.modules.get("pflower.compose")
    experiment = sys.modules.get("pflower.core.experiment")
    report.update(
        prepared=[
            {"federation", "_shared_model"} <= vars(e).keys()
            for e in (experiment._EXPERIMENTS.values() if experiment else ())
        ],
        argv=sys.argv,
        cwd=os.getcwd(),
        value=os.environ.get("PROBE_VALUE"),
        app_modules=sorted(m for m in sys.modules if m.split(".")[0] == "pflower"),
        preloaded="tomli_w" in sys.modules,
        composed=[list(o) for o in compose.composed_overrides()] if compose else None,
    )
    print(json.dumps(report), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if "PROBE_SLEEP" in os.environ:  # a long task: its pid in that file, then sleep
        with open(os.environ["PROBE_SLEEP"] + ".part", "w") as pid_file:
            pid_file.write(str(os.getpid()))
        os.replace(os.environ["PROBE_SLEEP"] + ".part", os.environ["PROBE_SLEEP"])
        import time

        time.sleep(600)
    outcome = os.environ.get("PROBE_EXIT", "0")
    if outcome.startswith("signal"):
        os.kill(os.getpid(), int(outcome[len("signal"):]))
    sys.exit(int(outcome))
"""


PROBE_PLUGIN = """
from dataclasses import dataclass
from typing import ClassVar

from pflower.api import register_algorithm
from pflower.strategies.fedavg import FedAvgClient, FedAvgOptions, FedAvgStrategy


@register_algorithm("probe_avg", strategy=FedAvgStrategy, client=FedAvgClient)
@dataclass
class ProbeOptions(FedAvgOptions):
    display_name: ClassVar[str] = "Probe-Avg"
"""
"""A plugin the fork server loads (``PFLOWER_PLUGINS``): FedAvg under another name."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServerProcess]:
    """A fork server whose children call ``probe:main``; it pre-imports pflower.deploy.local
    (which imports tomli_w) and pflower.client.app (with pflower.compose and the plugin
    ``probe_plugin``)."""
    root = tmp_path_factory.mktemp("fork")
    modules = root / "modules"
    modules.mkdir()
    (modules / "probe.py").write_text(textwrap.dedent(PROBE))
    (modules / "probe_plugin.py").write_text(textwrap.dedent(PROBE_PLUGIN))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(
            "PYTHONPATH", os.pathsep.join([str(modules), os.environ.get("PYTHONPATH", "")])
        )
        patch.setenv(PLUGINS_ENV, "probe_plugin")
        started = ForkServerProcess.start(
            root / "server",
            target="probe:main",
            preload_modules=("pflower.deploy.local", "pflower.client.app"),
        )
    try:
        started.wait_ready(timeout=300)
        yield started
    finally:
        started.stop()


def _run(server: ForkServerProcess, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = server.environment({**os.environ, **env})
    return subprocess.run(
        [str(server.shim), "--token", "secret", "--insecure"],
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_child_runs_the_task_as_flwr_clientapp(server: ForkServerProcess, tmp_path: Path) -> None:
    result = _run(server, tmp_path, PROBE_VALUE="from the stand-in", PROBE_EXIT="3")
    assert result.returncode == 3, result.stderr
    report = json.loads(result.stdout.splitlines()[0])
    assert report["argv"] == [str(server.shim), "--token", "secret", "--insecure"]
    assert report["cwd"] == str(tmp_path)
    assert report["value"] == "from the stand-in"
    assert "pflower.deploy.local" in report["app_modules"] and report["preloaded"]
    assert "to stderr" in result.stderr


def _fab(root: Path, changed: bool) -> Path:
    """A FAB directory holding this checkout's app, one file changed or not."""
    stage_app(root)
    if changed:
        with (root / "pflower" / "deploy" / "topology.py").open("a") as file:
            file.write("\n# a change\n")
    return root


@pytest.mark.parametrize("changed", [False, True])
def test_child_keeps_the_imported_app_only_for_the_same_code(
    server: ForkServerProcess, tmp_path: Path, changed: bool
) -> None:
    """Flower imports the ClientApp from the FAB unless it is imported: the server's import may
    stand in for it only when the FAB holds the same code and configuration."""
    fab = _fab(tmp_path / "fab", changed)
    result = _run(server, tmp_path, PROBE_FAB=str(fab))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[0])
    imported_from_fab = Path(report["app_file"]).is_relative_to(fab)
    assert imported_from_fab == changed


def test_a_child_composes_with_the_changed_fabs_own_schema(
    server: ForkServerProcess, tmp_path: Path
) -> None:
    """A child that forgot the server's import for a FAB with other code stores that code's
    schema in Hydra's ConfigStore (a process-wide store the forgotten import had filled) and
    composes with it, the plugins registered again with the FAB's registry: the
    configuration's dataclasses are the FAB's."""
    fab = _fab(tmp_path / "fab", changed=True)
    overrides = "dataset=digits rounds=1 strategy=probe_avg"
    env = {PLUGINS_ENV: "probe_plugin"}
    result = _run(server, tmp_path, PROBE_FAB=str(fab), PROBE_COMPOSE=overrides, **env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[0])["composed"] == [overrides.split()]


def test_server_prepares_ahead_what_a_child_composed(
    server: ForkServerProcess, tmp_path: Path
) -> None:
    """A child that composed a run's configuration tells the server, which prepares it too
    (composed, with the federation and the model built): the children forked afterwards find
    them in their caches instead of building them again."""
    overrides = "dataset=digits num_clients=3 rounds=2"
    first = _run(server, tmp_path, PROBE_COMPOSE=overrides)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["composed"] == [overrides.split()]
    assert json.loads(first.stdout)["prepared"] == []
    deadline = time.monotonic() + 30
    while True:  # the server composes after the first child ended
        later = json.loads(_run(server, tmp_path).stdout)
        if later["composed"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert later["composed"] == [overrides.split()]
    assert later["prepared"] == [True]


def test_child_killed_by_a_signal_is_reported(server: ForkServerProcess, tmp_path: Path) -> None:
    result = _run(server, tmp_path, PROBE_EXIT=f"signal{int(signal.SIGTERM)}")
    assert result.returncode == -signal.SIGTERM


def _long_task(server: ForkServerProcess, tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A stand-in whose child sleeps; the stand-in and the child's pid."""
    pid_file = tmp_path / "child.pid"
    stand_in = subprocess.Popen(
        [str(server.shim), "--token", "secret"],
        env=server.environment({**os.environ, "PROBE_SLEEP": str(pid_file)}),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(pid_file.exists, 60, "the child's pid")
    return stand_in, int(pid_file.read_text())


def test_a_child_ends_with_its_stand_in(server: ForkServerProcess, tmp_path: Path) -> None:
    """``kill -9`` of the stand-in (what looks like the ClientApp or ServerApp process) ends the
    task, as it ends Flower's own process; SIGTERM reaches the child through the stand-in."""
    stand_in, child = _long_task(server, tmp_path)
    assert pid_alive(child) and child != stand_in.pid
    stand_in.kill()
    stand_in.wait(timeout=10)
    wait_until(lambda: not pid_alive(child), 30, "the child to end with its stand-in")
    stand_in, child = _long_task(server, tmp_path)
    stand_in.terminate()
    assert stand_in.wait(timeout=30) == -signal.SIGTERM
    assert not pid_alive(child)


def test_a_stand_in_is_found_as_the_program_it_stands_in_for(
    server: ForkServerProcess, tmp_path: Path
) -> None:
    stand_in, child = _long_task(server, tmp_path)
    try:
        assert runs_program(stand_in.pid, "flwr-clientapp")
        assert not runs_program(stand_in.pid, "flwr-serverapp")
        assert not runs_program(child, "flwr-clientapp")  # the fork server's command line
    finally:
        stand_in.terminate()
        stand_in.wait(timeout=30)
    assert stands_in_for(["python", "-I", "-S", "/x/forkclient.py", "/d/bin/flwr-serverapp"]) == (
        "flwr-serverapp"
    )
    assert stands_in_for(["python", "-m", "pflower", "flwr-serverapp", "x"]) is None


def test_a_serverapp_fork_server_serves_flowers_serverapp(tmp_path: Path) -> None:
    """A fork server started for ``flwr-serverapp`` has that stand-in, and its children call
    Flower's ``flwr-serverapp`` entry point and load the app through the ServerApp runtime's
    ``load_app``."""
    server = ForkServerProcess.start(tmp_path / "server", command="flwr-serverapp")
    try:
        assert server.shim.name == "flwr-serverapp"
        argv = [str(a) for a in server.popen.args]  # type: ignore[union-attr]
        assert argv[argv.index("--target") + 1] == SERVERAPP.target
        assert argv[argv.index("--command") + 1] == "flwr-serverapp"
        assert argv[argv.index("--preload") + 1] == ",".join(SERVERAPP.preload)
    finally:
        server.stop()
    assert STAND_INS["flwr-serverapp"].load_app is fence.SERVERAPP_LOAD_APP
    assert SERVERAPP.target == f"{fence.FLWR_SERVERAPP.module}:{fence.FLWR_SERVERAPP.name}"


def test_stand_in_runs_the_real_command_without_a_server(tmp_path: Path) -> None:
    real, stand_in = tmp_path / "real", tmp_path / "stand-in"
    for directory, text in [
        (real, '#!/bin/sh\necho "real $*"\nexit 5\n'),
        (stand_in, shim_script(sys.executable)),
    ]:
        directory.mkdir()
        (directory / "flwr-clientapp").write_text(text)
        (directory / "flwr-clientapp").chmod(0o755)
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(stand_in), str(real), os.environ["PATH"]]),
        SOCKET_VARIABLE: str(tmp_path / "no-server.sock"),
    }
    result = subprocess.run(
        ["flwr-clientapp", "--token", "x"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 5, result.stderr
    assert result.stdout.strip() == "real --token x"


def test_server_ends_with_the_watched_process(tmp_path: Path) -> None:
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server = ForkServerProcess.start(tmp_path / "server", watch_pid=watched.pid, preload_modules=())
    try:
        server.wait_ready(timeout=60)
        watched.kill()
        watched.wait()
        server.popen.wait(timeout=10)
        assert not server.directory.exists()
    finally:
        watched.kill()
        server.stop()


def test_wait_status() -> None:
    assert wait_status(3 << 8) == {"exit": 3}
    assert wait_status(int(signal.SIGKILL)) == {"signal": int(signal.SIGKILL)}


# ------------------------------------------------------------------------------ launcher
def test_launcher_command_line() -> None:
    flower = ["--insecure", "--superlink", "127.0.0.1:9092", "--isolation", "process"]
    command = launcher_command("supernode", flower, python="python")
    assert command == ["python", "-m", "pflower.deploy.launcher", "supernode", "--", *flower]
    assert launcher.parse(command[3:]) == ("supernode", True, flower)
    assert launcher.parse(["--no-fork-server", "superexec", "--insecure"]) == (
        "superexec",
        False,
        ["--insecure"],
    )
    superlink = ["--insecure", "--isolation", "subprocess", "--database", ":flwr-in-memory:"]
    command = launcher_command("superlink", superlink, python="python")
    assert launcher.parse(command[3:]) == ("superlink", True, superlink)
    assert launcher.isolation_of(flower) == "process"
    assert launcher.isolation_of(["--isolation=subprocess"]) == "subprocess"
    assert launcher.isolation_of(["--insecure"]) == "subprocess"
    with pytest.raises(SystemExit):
        launcher.parse(["serverapp"])


def test_supernode_sleeps_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.supernode import start_client_internal

    assert start_client_internal.time is time, "Flower's SuperNode loop no longer uses time.sleep"
    monkeypatch.setattr(start_client_internal, "time", time)
    runtime_launcher.cap_supernode_sleeps(0.05)
    capped = start_client_internal.time
    began = time.monotonic()
    capped.sleep(3)  # Flower's idle poll
    assert time.monotonic() - began < 1.0
    assert capped.time is time.time and capped.monotonic is time.monotonic


def test_an_idle_supernode_polls_less_often_until_a_message_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Idle sleeps are capped at the short cap for ``idle_after`` seconds, then at the idle cap;
    a reply wait (a message being handled) starts the count again."""
    slept: list[float] = []
    clock = [100.0]
    monkeypatch.setattr(runtime_launcher.time, "sleep", slept.append)
    monkeypatch.setattr(runtime_launcher.time, "monotonic", lambda: clock[0])
    capped = runtime_launcher.CappedSleepTime(0.1, idle_cap=1.0, idle_after=10.0)
    for at in (100.0, 105.0, 109.9, 110.0, 200.0):
        clock[0] = at
        capped.sleep(3)
    clock[0] = 201.0
    capped.sleep(0.5)  # waiting for a ClientApp's reply: a message came
    capped.sleep(3)
    assert slept == [0.1, 0.1, 0.1, 1.0, 1.0, 0.1, 0.1]
    assert runtime_launcher.CappedSleepTime(0.1).idle_cap == 0.1  # no idle cap: one cap


class FakeInstaller:
    """Stands in for Flower's ``install_from_fab``: installs ``fab`` bytes as a directory named
    like Flower's (``<publisher>.<name>.<version>.<sha256[:8]>``) and counts its calls."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.calls = 0

    def __call__(
        self, fab_file: bytes, install_dir: Path | None = None, skip_prompt: bool = False
    ) -> Path:
        self.calls += 1
        digest = hashlib.sha256(fab_file).hexdigest()[:8]
        path = self.home / "apps" / f"pflower.pflower.1.0.{digest}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "content").write_bytes(fab_file)
        return path


def test_a_fab_installed_by_an_earlier_task_is_not_installed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flwr.supernode.runtime import run_clientapp

    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    flower = FakeInstaller(tmp_path)
    monkeypatch.setattr(run_clientapp, "install_from_fab", flower)
    install_fabs_once()
    first = run_clientapp.install_from_fab(b"fab one", skip_prompt=True)
    again = run_clientapp.install_from_fab(b"fab one", skip_prompt=True)
    assert (first, flower.calls) == (again, 1)
    assert (first / INSTALLED_FAB_MARK).read_text() == hashlib.sha256(b"fab one").hexdigest()
    other = run_clientapp.install_from_fab(b"fab two", skip_prompt=True)
    assert other != first and flower.calls == 2
    # A directory of the same name without the mark (left incomplete, or installed by Flower's
    # own command) is installed again; so is one whose mark holds another FAB's digest.
    (first / INSTALLED_FAB_MARK).unlink()
    assert run_clientapp.install_from_fab(b"fab one", skip_prompt=True) == first
    assert flower.calls == 3
    (first / INSTALLED_FAB_MARK).write_text("0" * 64)
    run_clientapp.install_from_fab(b"fab one", skip_prompt=True)
    assert flower.calls == 4


def test_an_installed_apps_digest_is_computed_once(tmp_path: Path) -> None:
    """A directory that ``install_fabs_once`` marked keeps its digest; any other is hashed anew."""
    app = _fab(tmp_path / "app", changed=False)
    digest = app_digest(app / "pflower", app / "conf")
    assert installed_app_digest(app) == digest and not (app / APP_DIGEST_FILE).exists()
    (app / INSTALLED_FAB_MARK).write_text("sha")
    assert installed_app_digest(app) == digest
    assert (app / APP_DIGEST_FILE).read_text() == digest
    (app / APP_DIGEST_FILE).write_text("kept")
    assert installed_app_digest(app) == "kept"


@pytest.fixture(autouse=True)
def flower_pull_defaults() -> Iterator[None]:
    """Restore the defaults of Flower's object pulls after each test: a ``PromptGrid`` changes
    them for the process's life (what a ServerApp wants), and tests/test_runtime_fence.py, which
    may run next in this process, checks Flower's own."""
    from flwr.supercore.inflatable import inflatable_utils

    functions = (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree)
    saved = [dict(function.__kwdefaults__ or {}) for function in functions]
    yield
    for function, defaults in zip(functions, saved, strict=True):
        function.__kwdefaults__ = defaults


def test_an_array_not_there_yet_is_pulled_again_promptly() -> None:
    """Flower waits 1 s (+-20%) before it asks for such an array again, then 2 s, 4 s, ..."""
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

    prompt_object_pulls(first_s=0.01, longest_s=0.05)
    attempts: dict[str, int] = {}

    def pull(object_id: str) -> bytes:
        attempts[object_id] = attempts.get(object_id, 0) + 1
        if attempts[object_id] <= 3:
            raise ObjectUnavailableError(object_id)
        return object_id.encode()

    began = time.monotonic()
    pulled = inflatable_utils.pull_objects(["a", "b"], pull)
    assert pulled == {"a": b"a", "b": b"b"} and attempts == {"a": 4, "b": 4}
    assert time.monotonic() - began < 0.8, "pauses of 0.01, 0.02, 0.04 s"
    defaults = inflatable_utils.pull_and_inflate_object_from_tree.__kwdefaults__ or {}
    assert (defaults["initial_backoff"], defaults["backoff_cap"]) == (0.01, 0.05)


# ------------------------------------------------------------------------- ServerApp side
class FakeGrid(HttpGrid):
    """An HttpGrid without a SuperLink: replies become available after ``delay_pulls`` pulls."""

    def __init__(self, delay_pulls: int) -> None:
        super().__init__(insecure=True, token="t")
        self.delay_pulls = delay_pulls
        self.pulls = 0
        self.pushed: list[Message] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        self.pushed = list(messages)
        return [f"id-{i}" for i in range(len(self.pushed))]

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.pulls += 1
        if self.pulls <= self.delay_pulls:
            return []
        return [_reply(i) for i in sorted(message_ids)]


def _reply(message_id: str) -> Any:
    class Metadata:
        reply_to_message_id = message_id

    class Reply:
        metadata = Metadata()

    return Reply()


def test_prompt_grid_waits_for_every_reply_with_short_pauses() -> None:
    grid = PromptGrid(FakeGrid(delay_pulls=4))
    began = time.monotonic()
    replies = list(grid.send_and_receive(["a", "b"]))  # type: ignore[list-item]
    elapsed = time.monotonic() - began
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["id-0", "id-1"]
    assert grid.grid.pulls == 5
    assert elapsed < 1.0, "pauses of 0.02, 0.03, 0.045, 0.0675 s, not Flower's 3 s"


def test_prompt_grid_respects_the_timeout() -> None:
    grid = PromptGrid(FakeGrid(delay_pulls=10**9))
    began = time.monotonic()
    assert list(grid.send_and_receive(["a"], timeout=0.5)) == []  # type: ignore[list-item]
    assert 0.5 <= time.monotonic() - began < 1.5


def test_only_proxies_over_an_http_grid_get_prompt_polls() -> None:
    manager = PromptClientManager()
    http = GridClientProxy(node_id=1, grid=FakeGrid(0), run_id=1)
    memory = GridClientProxy(node_id=2, grid=InMemoryGrid.__new__(InMemoryGrid), run_id=1)
    assert manager.register(http) and manager.register(memory)
    assert isinstance(http.grid, PromptGrid)
    assert isinstance(memory.grid, InMemoryGrid)


class RoundGrid(HttpGrid):
    """An HttpGrid without a SuperLink that records its pushes and answers each train message
    as its node is told to: ``reply`` (its parameters plus one), ``error``, ``silent``, or
    ``unavailable`` (the SuperLink's error reply for a node whose heartbeats stopped: from the
    SuperLink, node 1); a question for its properties it answers with partition ``node id - 10``.
    Its first ``refused`` pushes fail as Flower 1.39's did when its object store refused an
    object."""

    def __init__(self, behaviour: dict[int, str], refused: int = 0) -> None:
        super().__init__(insecure=True, token="t")
        self.behaviour = behaviour
        self.refused = refused
        self.pushes: list[list[Message]] = []
        self.pushed_packed: list[bool] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        pushed = list(messages)
        self.pushes.append(pushed)
        if len(self.pushes) <= self.refused:
            raise ObjectPushError("92e56e10", 1, "session")
        self.pushed_packed = [is_packed(m.content) for m in pushed]
        for message in pushed:
            message.metadata.__dict__["_message_id"] = message.object_id
        return [m.metadata.message_id for m in pushed]

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        wanted = set(message_ids)
        return [
            self._reply(m)
            for m in self.pushes[-1]
            if m.metadata.message_id in wanted
            and self.behaviour[m.metadata.dst_node_id] != "silent"
        ]

    def _reply(self, message: Message) -> Message:
        """The reply of a node whose ClientApp has pflower's mod (it unpacks and packs)."""
        if self.behaviour[message.metadata.dst_node_id] == "unavailable":
            reply = Message(Error(code=4, reason="Error: Node Unavailable"), reply_to=message)
            reply.metadata.__dict__["_src_node_id"] = 1  # Flower's SUPERLINK_NODE_ID
            return reply
        return packed_arrays_mod(message, None, self._client_app)  # type: ignore[arg-type]

    def _client_app(self, message: Message, _context: object) -> Message:
        if self.behaviour[message.metadata.dst_node_id] == "error":
            return Message(Error(code=0, reason="client crashed"), reply_to=message)
        if message.metadata.message_type == MessageTypeLegacy.GET_PROPERTIES:
            partition = {"partition_id": message.metadata.dst_node_id - 10, "num_train": 7}
            properties = GetPropertiesRes(Status(Code.OK, ""), partition)  # type: ignore[arg-type]
            return Message(compat.getpropertiesres_to_recorddict(properties), reply_to=message)
        ins = compat.recorddict_to_fitins(message.content, keep_input=True)
        weights = [w + 1 for w in parameters_to_ndarrays(ins.parameters)]
        res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(weights), 7, {})
        return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=message)


def _grid_proxies(monkeypatch: pytest.MonkeyPatch, grid: RoundGrid) -> list[GridClientProxy]:
    """A proxy over ``grid`` (made prompt) for each of its nodes."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)  # messages are made inside a run
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    manager = PromptClientManager()
    proxies = [GridClientProxy(node_id=n, grid=grid, run_id=1) for n in grid.behaviour]
    for proxy in proxies:
        manager.register(proxy)
    return proxies


def test_a_deployment_round_is_one_push_and_each_reply_finds_its_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grid = RoundGrid({11: "reply", 12: "error", 13: "silent", 14: "unavailable"})
    proxies = _grid_proxies(monkeypatch, grid)
    shared = round_grid(proxies)
    assert isinstance(shared, PromptGrid) and shared.grid is grid
    model = [np.arange(3.0), np.ones((2, 2), dtype=np.float32)]
    ins = FitIns(ndarrays_to_parameters(model), {"lr": 0.1})
    results, failures = fit_at_once(shared, [(p, ins) for p in proxies], timeout=0.3, group_id=4)
    assert len(grid.pushes) == 1, "one push for the whole round"
    pushed = grid.pushes[0]
    assert [m.metadata.dst_node_id for m in pushed] == [11, 12, 13, 14]
    assert {m.metadata.message_type for m in pushed} == {MessageType.TRAIN}
    assert {m.metadata.group_id for m in pushed} == {"4"}
    assert grid.pushed_packed == [True] * 4, "the model travels as one array"
    assert [(proxy.cid, res.num_examples) for proxy, res in results] == [("11", 7)]
    returned = parameters_to_ndarrays(results[0][1].parameters)
    np.testing.assert_array_equal(returned[0], [1, 2, 3])
    np.testing.assert_array_equal(returned[1], np.full((2, 2), 2, dtype=np.float32))
    assert returned[1].dtype == np.float32
    assert [type(f).__name__ for f in failures] == ["ValueError", "TimeoutError", "ValueError"]
    assert "client crashed" in str(failures[0]) and "node 13" in str(failures[1])
    assert str(failures[2]) == "the SuperLink replied for the node: Error: Node Unavailable"


def test_the_nodes_are_asked_for_their_partitions_in_one_push_pushed_again_if_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The roster's questions go in one push (with one push per node, Flower 1.39's SuperLink
    sometimes refused one node's, which left it out of round 1), and a refused push is pushed
    again."""
    grid = RoundGrid({11: "reply", 12: "error", 13: "silent"}, refused=PUSH_ATTEMPTS - 1)
    questions = NodeQuestions(_grid_proxies(monkeypatch, grid), timeout=0.3)
    questions.wait()
    assert len(grid.pushes) == PUSH_ATTEMPTS and all(len(push) == 3 for push in grid.pushes)
    assert {m.metadata.message_type for m in grid.pushes[-1]} == {MessageTypeLegacy.GET_PROPERTIES}
    answers = questions.answers
    assert list(answers) == ["11", "12", "13"]
    assert answers["11"] == {"partition_id": 1, "num_train": 7}
    assert isinstance(answers["12"], ValueError) and "client crashed" in str(answers["12"])
    assert isinstance(answers["13"], TimeoutError)


def test_a_push_of_the_questions_refused_every_time_is_every_node_s_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grid = RoundGrid({11: "reply", 12: "reply"}, refused=PUSH_ATTEMPTS)
    questions = NodeQuestions(_grid_proxies(monkeypatch, grid), timeout=0.3)
    questions.wait()
    assert len(grid.pushes) == PUSH_ATTEMPTS
    assert list(questions.answers) == ["11", "12"]
    assert all(isinstance(a, ObjectPushError) for a in questions.answers.values())


def test_rounds_over_a_prompt_grid_or_one_in_memory_grid_are_sent_at_once() -> None:
    http = GridClientProxy(node_id=1, grid=PromptGrid(FakeGrid(0)), run_id=1)
    in_memory = InMemoryGrid.__new__(InMemoryGrid)
    memory = GridClientProxy(node_id=2, grid=in_memory, run_id=1)
    other_memory = GridClientProxy(node_id=3, grid=InMemoryGrid.__new__(InMemoryGrid), run_id=1)
    assert round_grid([http]) is http.grid
    simulation = round_grid([memory, GridClientProxy(node_id=4, grid=in_memory, run_id=1)])
    assert isinstance(simulation, SimulationGrid) and simulation.grid is in_memory
    assert (
        simulation.first_s == simulation.longest_s == SIMULATION_POLL_S < in_memory_pull_interval()
    )
    assert round_grid([http, memory]) is None
    assert round_grid([memory, other_memory]) is None
    assert round_grid([]) is None


def in_memory_pull_interval() -> float:
    """How often Flower's proxies look for their reply in a simulation (its default)."""
    default: float = inspect.signature(InMemoryGrid).parameters["pull_interval"].default
    return default
