"""The runtime fence (pflower.runtime): every Flower/Ray internal pflower uses is the one it was
written against (one test per symbol, failing with one message naming it), every replacement is
undone at the end of its run, and import-linter fails an internal imported from outside
pflower.runtime."""

from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys
import textwrap
import tomllib
import types
from pathlib import Path

import pytest

from pflower.runtime import fence
from pflower.runtime.fence import INTERNALS
from pflower.runtime.internal import FlowerChanged, Internal, parameters_of

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("internal", [pytest.param(i, id=i.qualified) for i in INTERNALS])
def test_flower_internal_is_the_one_pflower_was_written_for(internal: Internal) -> None:
    internal.check()  # raises FlowerChanged: "<symbol> takes (...), not (...): ... because ..."


@pytest.mark.parametrize(
    "internal", [pytest.param(i, id=i.qualified) for i in INTERNALS if i.defaults]
)
def test_the_defaults_pflower_relies_on_are_flowers(internal: Internal) -> None:
    internal.check_defaults()  # raises FlowerChanged: "<symbol> has x=..., not ...: ..."


def test_a_changed_default_fails_naming_it() -> None:
    changed = Internal(
        "textwrap", "indent", "(text, prefix, predicate=...)", "why", defaults=(("predicate", 1),)
    )
    with pytest.raises(FlowerChanged, match=r"textwrap\.indent has predicate=None, not 1"):
        changed.check_defaults()


PATCH_TESTS = {
    fence.REGISTER_NODES: "test_register_nodes_maps_each_new_node_to_the_next_partition",
    fence.ADD_MESSAGES_TO_QUEUE: "test_delivery_hands_on_what_flowers_loop_hands_on_in_its_order",
    fence.RAY_BACKEND: "test_the_fork_backend_stands_in_for_the_module_the_engine_imports_from",
    fence.RAY_START_MONITOR: "test_a_lean_ray_head_keeps_sigterm",
    fence.RAY_START_API_SERVER: "test_a_lean_ray_head_keeps_sigterm",
    fence.RAY_INIT: "test_a_lean_ray_head_keeps_sigterm",
    fence.HTTP_GRID_SEND_AND_RECEIVE: "test_http_grid_pulls_as_prompt_grid_does",
    fence.GRID_CLIENT_PROXY: "test_a_grid_client_proxy_sends_through_the_grid_it_holds",
    fence.PULL_OBJECTS: (
        "test_deploy_fastpath.py::test_an_array_not_there_yet_is_pulled_again_promptly"
    ),
    fence.PULL_AND_INFLATE: "test_pull_and_inflate_passes_its_backoff_defaults_to_pull_objects",
    fence.INSTALL_FROM_FAB: "test_flower_installs_the_same_fab_into_the_same_directory",
    fence.SERVERAPP_INSTALL_FROM_FAB: "test_flower_installs_the_same_fab_into_the_same_directory",
    fence.LOAD_APP: "test_flower_loads_an_imported_app_module_as_it_is",
    fence.SERVERAPP_LOAD_APP: "test_flower_loads_an_imported_app_module_as_it_is",
    fence.SUPERNODE_TIME: "test_the_supernode_waits_for_a_reply_through_its_modules_time",
    fence.CONSOLE_HANDLER_CLASS: "test_console.py::test_flower_colours_only_a_terminal",
}
"""Each replaced symbol of the table (one with a measured saving) and the test of the behaviour
of Flower's (Ray's) symbol that the replacement relies on (in this file, or ``file::test``)."""


def test_every_replacement_has_a_measured_saving_and_a_behaviour_test() -> None:
    measured = {i.qualified for i in INTERNALS if i.measured}
    assert measured == {i.qualified for i in PATCH_TESTS}
    for test in PATCH_TESTS.values():
        file, _, name = test.rpartition("::")
        source = (ROOT / "tests" / (file or Path(__file__).name)).read_text()
        assert f"def {name}(" in source, test


def test_each_internal_is_listed_once_with_its_reason() -> None:
    assert len({i.qualified for i in INTERNALS}) == len(INTERNALS)
    assert all(i.why for i in INTERNALS)
    listed = {id(v) for v in vars(fence).values() if isinstance(v, Internal)}
    assert listed == {id(i) for i in INTERNALS}, "a constant of fence.py missing from INTERNALS"


def test_parameters_are_names_kinds_and_which_have_defaults() -> None:
    def function(a, b=1, *args, c, d=2, **kwargs):  # type: ignore[no-untyped-def]
        """A function with every kind of parameter."""

    def keyword_only(a: int, *, b: float = 0.5) -> None:
        """Annotations are left out."""

    assert parameters_of(function) == "(a, b=..., *args, c, d=..., **kwargs)"
    assert parameters_of(keyword_only) == "(a, *, b=...)"


def test_a_changed_symbol_fails_with_one_message_naming_it() -> None:
    changed = Internal("os.path", "join", "(a, b)", "it joins paths")
    with pytest.raises(FlowerChanged, match=r"os\.path\.join takes \(a, \*p\), not \(a, b\)"):
        changed.check()
    with pytest.raises(FlowerChanged, match=r"os\.path\.no_such cannot be found.*because"):
        Internal("os.path", "no_such", "()", "why").check()
    with pytest.raises(FlowerChanged, match=r"not a module"):
        Internal("os", "sep", None, "why").check()


class _Base:
    def method(self) -> str:
        return "base"


class _Owner(_Base):
    def own(self) -> str:
        return "own"


def test_a_replacement_is_undone_even_when_the_run_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fence_probe", type(sys)("fence_probe"))
    sys.modules["fence_probe"].Owner = _Owner  # type: ignore[attr-defined]
    own = Internal("fence_probe", "Owner.own", "(self)", "test")
    inherited = Internal("fence_probe", "Owner.method", "(self)", "test")
    with (
        pytest.raises(ValueError, match="the run failed"),
        own.replaced(lambda self: "patched"),
        inherited.replaced(lambda self: "patched"),
    ):
        assert _Owner().own() == _Owner().method() == "patched"
        raise ValueError("the run failed")
    assert _Owner().own() == "own" and _Owner().method() == "base"
    assert "method" not in vars(_Owner), "an inherited method is not copied onto the class"


def test_the_simulation_engine_is_flowers_again_after_the_run() -> None:
    from flwr.server.superlink.fleet.vce import vce_api

    from pflower.runtime.engine import deliver_pending_messages, scaled_to_many_clients

    register, deliver = vce_api._register_nodes, vce_api.add_messages_to_queue
    with scaled_to_many_clients():
        assert vce_api.add_messages_to_queue is deliver_pending_messages
        assert vce_api._register_nodes is not register
        assert vce_api._register_nodes.__wrapped__ is register  # type: ignore[attr-defined]
    assert (vce_api._register_nodes, vce_api.add_messages_to_queue) == (register, deliver)


def test_rays_head_node_is_rays_again_after_the_run() -> None:
    from ray._private.node import Node

    from pflower.runtime.engine import lean_ray_head

    before = (Node.start_monitor, Node.start_api_server)
    with lean_ray_head():
        assert Node.start_monitor(None) is None  # type: ignore[arg-type]
        assert Node.start_api_server(None, include_dashboard=False, raise_on_failure=True) is None  # type: ignore[arg-type]
    assert (Node.start_monitor, Node.start_api_server) == before


def test_object_pull_defaults_come_back() -> None:
    from flwr.supercore.inflatable import inflatable_utils

    from pflower.runtime.polling import prompt_object_pulls

    before = dict(inflatable_utils.pull_objects.__kwdefaults__ or {})
    restore = prompt_object_pulls(first_s=0.01, longest_s=0.05)
    assert inflatable_utils.pull_objects.__kwdefaults__["initial_backoff"] == 0.01  # type: ignore[index]
    restore()
    assert inflatable_utils.pull_objects.__kwdefaults__ == before


def test_fork_backend_is_a_backend_the_engine_builds_from_the_raybackend_module() -> None:
    """The engine imports ``RayBackend`` from the module that backend=fork stands in for, and
    calls only the members of Flower's ``Backend`` interface, which ForkBackend has."""
    from flwr.server.superlink.fleet.vce.backend.backend import Backend

    from pflower.runtime.forkbackend import RAY_BACKEND_MODULE, ForkBackend

    source = inspect.getsource(fence.START_VCE.current())
    assert "from .backend.raybackend import RayBackend" in source
    assert RAY_BACKEND_MODULE == "flwr.server.superlink.fleet.vce.backend.raybackend"
    interface = {n for n in vars(Backend) if not n.startswith("_")}
    assert interface <= set(dir(ForkBackend)), interface - set(dir(ForkBackend))


def test_message_delivery_reads_the_in_memory_link_states_store_and_lock() -> None:
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    source = inspect.getsource(InMemoryLinkState.__init__)
    assert "self.message_ins_store" in source and "self.lock" in source


def test_prompt_grid_swaps_the_grid_of_flowers_grid_client_proxy() -> None:
    source = inspect.getsource(fence.GRID_CLIENT_PROXY.current().__init__)
    assert "self.grid = grid" in source


# ----------------------------------------------------------------------------- import-linter
def _fence_contract() -> dict[str, object]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "fenced_externals"]
    return contract


def test_the_fence_contract_lets_only_the_runtime_import_the_internals_it_uses() -> None:
    contract = _fence_contract()
    assert contract["allowed_importers"] == ["pflower.runtime"]
    assert contract["private_modules_of"] == ["flwr", "optuna", "ray"]
    forbidden, private_of = contract["forbidden_modules"], contract["private_modules_of"]
    assert isinstance(forbidden, list) and isinstance(private_of, list)
    for internal in INTERNALS:
        assert _import_fence().fenced_by(internal.module, forbidden, private_of), (
            f"{internal.qualified} is not fenced"
        )


def _import_fence() -> types.ModuleType:
    """The contract type's module, ``tools/import_fence.py`` (lint-imports imports it from the
    repository root)."""
    spec = importlib.util.spec_from_file_location("import_fence", ROOT / "tools/import_fence.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("module", "fenced"),
    [
        ("flwr.supernode.cli", "flwr.supernode"),
        ("optuna.storages._rdb.storage", "optuna.storages._rdb"),
        ("ray._private.node", "ray._private"),
        ("optuna.storages", None),
        ("flwr.simulation", None),
        ("numpy._core", None),
    ],
)
def test_the_fence_covers_listed_modules_and_private_ones(module: str, fenced: str | None) -> None:
    forbidden, private_of = ["flwr.supernode", "ray._private"], ["flwr", "optuna", "ray"]
    assert _import_fence().fenced_by(module, forbidden, private_of) == fenced


@pytest.mark.slow
def test_lint_imports_fails_an_internal_imported_outside_the_runtime(tmp_path: Path) -> None:
    """A package with the fence contract: its runtime may import Flower's internals, any other
    module may not (also inside a function, in a multi-line import; nor Optuna's private
    modules), and Flower's public
    ``from flwr.simulation import run_simulation`` stays allowed."""
    package = tmp_path / "fenced"
    (package / "runtime").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "runtime" / "__init__.py").write_text(
        "from flwr.supernode import start_client_internal\n"
    )
    (package / "public.py").write_text("from flwr.simulation import run_simulation\n")
    (package / "other.py").write_text(
        textwrap.dedent(
            """
            def later():
                from flwr.server.superlink.fleet.vce import (
                    vce_api,
                )
                import ray._private.node
                from optuna.storages._rdb import storage
            """
        )
    )
    forbidden = _fence_contract()["forbidden_modules"]
    assert isinstance(forbidden, list)
    (tmp_path / ".importlinter").write_text(
        textwrap.dedent(
            """
            [importlinter]
            root_package = fenced
            include_external_packages = True
            contract_types =
                fenced_externals: tools.import_fence.FencedExternalsContract

            [importlinter:contract:fence]
            name = fence
            type = fenced_externals
            allowed_importers = fenced.runtime
            private_modules_of =
                optuna
            forbidden_modules =
            """
        )
        + "".join(f"    {module}\n" for module in forbidden)
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    result = subprocess.run(
        [Path(sys.executable).with_name("lint-imports"), "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = " ".join(result.stdout.split())
    assert result.returncode == 1, output
    assert "fenced.other (l. 3) imports flwr.server.superlink" in output, output
    assert "fenced.other (l. 6) imports ray._private" in output, output
    assert "fenced.other (l. 7) imports optuna.storages._rdb" in output, output
    assert "fenced.runtime (l." not in output, output
    assert "fenced.public" not in output, output


# ------------------------------------------------------- what each patch relies on, in behaviour
# One scenario per patch of the table: run with Flower's (or Ray's, or Optuna's) function, its
# result is what pflower's replacement assumes; it changes if that function's behaviour does.
class _Ended(Exception):
    """Stops a Flower function at the point a scenario looks at."""


def test_register_nodes_maps_each_new_node_to_the_next_partition() -> None:
    """Flower's node map is node id -> 0, 1, ... in registration order; pflower publishes it."""
    from pflower.runtime.engine import SIMULATED_PARTITIONS, _publishing

    class State:
        def __init__(self) -> None:
            self.created: list[int] = []

        def create_node(self, *args: object, **kwargs: object) -> int:
            self.created.append(100 + 7 * len(self.created))
            return self.created[-1]

        def acknowledge_node_heartbeat(self, node_id: int, heartbeat_interval: float) -> bool:
            return True

    state = State()
    factory = type("Factory", (), {"state": lambda self: state})()
    mapping = _publishing(fence.REGISTER_NODES.current())(3, factory)
    assert mapping == {100: 0, 107: 1, 114: 2} == getattr(state, SIMULATED_PARTITIONS)


def _link_state(destinations: dict[str, tuple[int, str]]) -> object:
    """Flower's in-memory link state holding messages ``id -> (node, delivered_at)`` (only its
    store and lock: what both delivery loops read)."""
    import threading
    from types import SimpleNamespace

    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    state = InMemoryLinkState.__new__(InMemoryLinkState)
    state.lock = threading.RLock()
    state.message_ins_store = {
        key: SimpleNamespace(
            metadata=SimpleNamespace(dst_node_id=node, run_id=1, delivered_at=delivered)
        )
        for key, (node, delivered) in destinations.items()
    }
    state._check_stored_messages = lambda ids: None  # type: ignore[method-assign]
    return state


def test_delivery_hands_on_what_flowers_loop_hands_on_in_its_order() -> None:
    import threading
    from queue import Queue

    from pflower.runtime.engine import deliver_pending_messages

    class OnePass(threading.Event):
        def __init__(self) -> None:
            super().__init__()
            self.asked = 0

        def is_set(self) -> bool:
            self.asked += 1
            return self.asked > 1

        def wait(self, timeout: float | None = None) -> bool:
            return True

    stored = {"a": (30, ""), "b": (10, ""), "c": (20, "earlier"), "d": (99, ""), "e": (10, "")}
    delivered = []
    for loop in (fence.ADD_MESSAGES_TO_QUEUE.current(), deliver_pending_messages):
        state, queue = _link_state(stored), Queue()  # type: ignore[var-annotated]
        loop(state, queue, {10: 0, 20: 1, 30: 2, 40: 3}, OnePass())
        delivered.append([id_of(state, queue.get()) for _ in range(queue.qsize())])
    assert delivered[0] == delivered[1] == ["b", "a"], "one per node and pass, in node order"


def id_of(state: object, message: object) -> str:
    return next(k for k, m in state.message_ins_store.items() if m is message)  # type: ignore[attr-defined]


def test_the_fork_backend_stands_in_for_the_module_the_engine_imports_from() -> None:
    from pflower.runtime.forkbackend import ForkBackend

    module = fence.RAY_BACKEND.module
    before = sys.modules.get(module)
    with fence.RAY_BACKEND.module_stands_in(ForkBackend, imported_by=fence.START_VCE):
        from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

        assert RayBackend is ForkBackend
    assert sys.modules.get(module) is before
    quiet = Internal("textwrap", "dedent", "(text)", "test")  # its source imports no RayBackend
    with (
        pytest.raises(FlowerChanged, match="no longer imports RayBackend"),
        fence.RAY_BACKEND.module_stands_in(ForkBackend, imported_by=quiet),
    ):
        pass
    assert sys.modules.get(module) is before


def _http_grid_pulling(ready_after: int) -> object:
    from types import SimpleNamespace

    from flwr.superlink.grid import HttpGrid

    class Grid(HttpGrid):
        def __init__(self) -> None:
            super().__init__(insecure=True, token="t")
            self.pulls = 0

        def push_messages(self, messages: object) -> list[str]:
            return ["m1", "m2"]

        def pull_messages(self, message_ids: object) -> list[object]:
            self.pulls += 1
            ids = sorted(message_ids) if self.pulls > ready_after else []  # type: ignore[call-overload]
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in ids]

    return Grid()


def test_http_grid_pulls_as_prompt_grid_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time
    import types

    from flwr.superlink.grid import http_grid

    from pflower.runtime.polling import PromptGrid

    slept: list[float] = []
    clock = types.SimpleNamespace(time=time.time, sleep=slept.append)
    monkeypatch.setattr(http_grid, "time", clock)
    flower = fence.HTTP_GRID_SEND_AND_RECEIVE.current()
    for ready_after in (0, 2):
        grid, prompt = _http_grid_pulling(ready_after), PromptGrid(_http_grid_pulling(ready_after))
        mine = [r.metadata.reply_to_message_id for r in flower(grid, ["x", "y"])]
        ours = [r.metadata.reply_to_message_id for r in prompt.send_and_receive(["x", "y"])]  # type: ignore[list-item]
        assert mine == ours == ["m1", "m2"]
        assert grid.pulls == prompt.grid.pulls == ready_after + 1  # type: ignore[attr-defined]
    assert slept == [3, 3], "Flower pauses 3 s between pulls"
    assert list(flower(_http_grid_pulling(0), ["x"], timeout=0)) == [], "no pull after timeout"


def test_a_grid_client_proxy_sends_through_the_grid_it_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flwr.common import GetPropertiesIns
    from flwr.supercore.task_identity import TaskIdentity

    from pflower.runtime.polling import PromptGrid

    class Recording(PromptGrid):
        def send_and_receive(self, messages: object, *, timeout: float | None = None) -> list:
            raise _Ended(list(messages))  # type: ignore[call-overload]

    for attribute, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, attribute, value)  # messages are made inside a run
    proxy = fence.GRID_CLIENT_PROXY.current()(node_id=5, grid=_http_grid_pulling(0), run_id=1)
    proxy.grid = Recording(proxy.grid)
    with pytest.raises(_Ended) as sent:
        proxy.get_properties(GetPropertiesIns(config={}), timeout=1.0, group_id=1)
    (message,) = sent.value.args[0]
    assert message.metadata.dst_node_id == 5


def test_pull_and_inflate_passes_its_backoff_defaults_to_pull_objects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flwr.supercore.inflatable import inflatable_utils

    from pflower.runtime.polling import prompt_object_pulls

    seen: dict[str, object] = {}

    def pull_objects(object_ids: object, pull_object_fn: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise _Ended

    restore = prompt_object_pulls(first_s=0.01, longest_s=0.05)
    try:
        monkeypatch.setattr(inflatable_utils, "pull_objects", pull_objects)
        tree = type("Tree", (), {"object_id": "o", "children": []})()
        with pytest.raises(_Ended):
            fence.PULL_AND_INFLATE.current()(tree, lambda i: b"", lambda i: None)
    finally:
        restore()
    assert (seen["initial_backoff"], seen["backoff_cap"]) == (0.01, 0.05)


@pytest.mark.parametrize(
    "internal",
    [fence.INSTALL_FROM_FAB, fence.SERVERAPP_INSTALL_FROM_FAB],
    ids=["clientapp", "serverapp"],
)
def test_flower_installs_the_same_fab_into_the_same_directory(
    internal: Internal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``install_fabs_once`` returns without asking Flower is what Flower would return, in
    its ClientApp runtime and in its ServerApp runtime."""
    from flwr.cli.build import build_fab_from_disk

    app = tmp_path / "app"
    (app / "probeapp").mkdir(parents=True)
    (app / "probeapp" / "__init__.py").write_text("app = None\n")
    (app / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [build-system]
            requires = ["hatchling"]
            build-backend = "hatchling.build"

            [project]
            name = "probeapp"
            version = "1.0.0"
            dependencies = []

            [tool.flwr.app]
            publisher = "pflower"

            [tool.flwr.app.components]
            serverapp = "probeapp:app"
            clientapp = "probeapp:app"

            [tool.flwr.app.config]
            """
        )
    )
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    fab = build_fab_from_disk(app)
    install = internal.current()
    first = install(fab, skip_prompt=True)
    assert install(fab, skip_prompt=True) == first and (first / "probeapp").is_dir()


@pytest.mark.parametrize(
    "internal", [fence.LOAD_APP, fence.SERVERAPP_LOAD_APP], ids=["clientapp", "serverapp"]
)
def test_flower_loads_an_imported_app_module_as_it_is(
    internal: Internal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flower's ``load_app`` (as its ClientApp and its ServerApp runtimes call it) takes a module
    imported already, whatever the FAB's directory holds: which is why a child forgets the
    server's import of a changed app."""
    for version in ("one", "two"):
        (tmp_path / version / "probe_fence_app").mkdir(parents=True)
        (tmp_path / version / "probe_fence_app" / "__init__.py").write_text(f"app = {version!r}\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "probe_fence_app", raising=False)
    load = internal.current()
    assert load("probe_fence_app:app", ValueError, tmp_path / "one") == "one"
    assert load("probe_fence_app:app", ValueError, tmp_path / "two") == "one"
    del sys.modules["probe_fence_app"]
    sys.path.remove(str(tmp_path / "one"))
    assert load("probe_fence_app:app", ValueError, tmp_path / "two") == "two"
    del sys.modules["probe_fence_app"]


def test_the_supernode_waits_for_a_reply_through_its_modules_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    from flwr.supernode import start_client_internal

    class Reply:
        @property
        def metadata(self) -> object:
            raise _Ended

    slept: list[float] = []
    monkeypatch.setattr(start_client_internal, "time", types.SimpleNamespace(sleep=slept.append))
    replies = iter([[], [], [Reply()]])
    state = types.SimpleNamespace(get_messages=lambda is_reply: next(replies))
    with pytest.raises(_Ended):
        start_client_internal._push_messages(state, None, None, None)  # type: ignore[arg-type]
    assert slept == [0.5, 0.5], "Flower looks for its ClientApp's reply every 0.5 s"


@pytest.mark.slow
def test_a_lean_ray_head_keeps_sigterm() -> None:
    probe = textwrap.dedent(
        """
        import signal
        from types import SimpleNamespace
        import ray
        from ray._private import ray_constants, worker
        from pflower.runtime import engine
        from pflower.runtime.fence import RAY_INIT

        def mine(signum, frame):
            pass

        signal.signal(signal.SIGTERM, mine)
        with engine.lean_ray_head(), engine.ray_keeps_signal_handlers():
            RAY_INIT.current()(SimpleNamespace(init_args_key="a"), {"a": {"num_cpus": 1}})
        started = worker._global_node.all_processes
        print(ray_constants.PROCESS_TYPE_MONITOR in started,
              ray_constants.PROCESS_TYPE_DASHBOARD in started,
              ray_constants.PROCESS_TYPE_RAYLET in started,
              signal.getsignal(signal.SIGTERM) is mine)
        ray.shutdown()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.stdout.split()[-4:] == ["False", "False", "True", "True"], result.stderr[-3000:]


# ---------------------------------------------------------------------------------- Optuna
def test_optuna_storage_sees_other_processes_trials_and_records_heartbeats(
    tmp_path: Path,
) -> None:
    import optuna
    from optuna.storages import RDBStorage, fail_stale_trials
    from optuna.trial import TrialState

    from pflower.runtime import optuna_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path / 'study.db'}"

    def study() -> optuna.Study:
        storage = RDBStorage(url, heartbeat_interval=60, grace_period=1)
        return optuna.create_study(study_name="s", storage=storage, load_if_exists=True)

    mine, theirs = study(), study()  # two processes' views of one study
    mine.get_trials(deepcopy=False)  # cached
    running = theirs.ask()
    optuna_storage.record_heartbeat(theirs, running)
    assert [t.number for t in optuna_storage.trials_of(mine)] == [running.number]
    assert optuna_storage.stored_trial(theirs, running).state == TrialState.RUNNING
    fail_stale_trials(mine)
    assert optuna_storage.stored_trial(mine, running).state == TrialState.RUNNING, "heartbeat"
    optuna_storage.heartbeat(theirs, running)()
    theirs.tell(running, 1.0)
    assert optuna_storage.trials_of(mine)[0].state == TrialState.COMPLETE
