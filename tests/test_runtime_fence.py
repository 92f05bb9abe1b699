"""The runtime fence (pflower.runtime): every Flower/Ray internal pflower uses is the one it was
written against (one test per symbol, failing with one message naming it), every replacement is
undone at the end of its run, and import-linter fails an internal imported from outside
pflower.runtime."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from pflower.runtime import fence
from pflower.runtime.fence import INTERNALS, FlowerChanged, Internal, parameters_of

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("internal", [pytest.param(i, id=i.qualified) for i in INTERNALS])
def test_flower_internal_is_the_one_pflower_was_written_for(internal: Internal) -> None:
    internal.check()  # raises FlowerChanged: "<symbol> takes (...), not (...): ... because ..."


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
    forbidden = contract["forbidden_modules"]
    assert isinstance(forbidden, list)
    for internal in INTERNALS:
        assert any(
            internal.module == f or internal.module.startswith(f + ".") for f in forbidden
        ), f"{internal.qualified} is not fenced"


@pytest.mark.slow
def test_lint_imports_fails_an_internal_imported_outside_the_runtime(tmp_path: Path) -> None:
    """A package with the fence contract: its runtime may import Flower's internals, any other
    module may not (also inside a function, in a multi-line import), and Flower's public
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
    assert "fenced.runtime (l." not in output, output
    assert "fenced.public" not in output, output
