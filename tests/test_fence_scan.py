"""The fence holds everything it should: outside ``pflower/runtime`` no module reaches a private
attribute of another object (``study._storage``) or reads an attribute by a name given as a string
(``getattr(proxy, "grid")``), the two ways code gets at Flower's, Ray's or Optuna's internals
without importing them (import-linter's fence contract sees only imports); and the runtime names
no module of the layers above it."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pflower"
RUNTIME = PACKAGE / "runtime"

REFLECTION = ("getattr", "hasattr", "setattr", "delattr")

ALLOWED: dict[tuple[str, str], str] = {
    ("pflower/results/tracking.py", "_guarded"): "the Tracker's own method, called on the "
    "instance its classmethod just built",
    ("pflower/config/__init__.py", "val_fraction"): "pflower's own split settings, older ones "
    "without the field",
    ("pflower/config/sections.py", "fork"): "os.fork exists only on POSIX",
    ("pflower/core/options.py", "value"): "an enum member's value, or the value itself",
    ("pflower/searchspace.py", "value"): "an enum member's value, or the value itself",
    ("pflower/datasets/hf.py", "num_classes"): "a Hugging Face datasets feature: ClassLabel",
    ("pflower/models/split.py", "head_module"): "pflower's own models that name their head",
    ("pflower/results/plots.py", "get"): "a YAML block that is a mapping",
}
"""(file, attribute) pairs outside the runtime that are not Flower's, Ray's or Optuna's, and why.
Dunder names (``__module__``) and attributes of ``self``/``cls`` are always allowed."""


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _own(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def reaches_in(source: str) -> list[tuple[int, str, str]]:
    """``(line, attribute, expression)`` for each private attribute read on an object other
    than ``self``/``cls`` and each attribute named by a string constant in
    ``getattr``/``hasattr``/``setattr``/``delattr``, in ``source``."""
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            name = node.attr
            if name.startswith("_") and not _is_dunder(name) and not _own(node.value):
                found.append((node.lineno, name, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in REFLECTION
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and not _is_dunder(node.args[1].value)
            and not _own(node.args[0])
        ):
            found.append((node.lineno, node.args[1].value, ast.unparse(node)))
    return sorted(found)


def _outside_runtime() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if RUNTIME not in p.parents]


def test_nothing_outside_the_runtime_reaches_into_other_objects() -> None:
    holes = [
        f"{path.relative_to(ROOT)}:{line}: {expression}"
        for path in _outside_runtime()
        for line, name, expression in reaches_in(path.read_text())
        if (str(path.relative_to(ROOT)), name) not in ALLOWED
    ]
    assert not holes, (
        "private attributes or string-named attributes outside pflower/runtime (move the access "
        "into pflower/runtime behind a typed function, or add it to ALLOWED with why it is not "
        "Flower's, Ray's or Optuna's):\n" + "\n".join(holes)
    )


def test_every_allowed_exception_is_still_used() -> None:
    used = {
        (str(path.relative_to(ROOT)), name)
        for path in _outside_runtime()
        for _, name, _ in reaches_in(path.read_text())
    }
    assert set(ALLOWED) <= used, set(ALLOWED) - used


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("study._storage.record_heartbeat(trial._trial_id)", ["_storage", "_trial_id"]),
        ('grid = getattr(proxy, "grid", None)', ["grid"]),
        ('hasattr(optuna.storages, "X")', ["X"]),
        ("self._cache = other.__dict__", []),
        ('getattr(self, "_weights", "")', []),
        ("getattr(module, name)", []),
    ],
)
def test_the_scan_finds_private_and_string_named_attributes(source: str, names: list[str]) -> None:
    assert [name for _, name, _ in reaches_in(source)] == names


def _upper_layers() -> list[str]:
    """The modules of the layers above ``pflower.runtime`` in the import-linter contract."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    above = layers[: next(i for i, layer in enumerate(layers) if "pflower.runtime" in layer)]
    return [module.strip() for layer in above for module in layer.split("|")]


def names_a_module_of(value: object, modules: list[str]) -> bool:
    """Whether ``value`` is a string naming one of ``modules`` (or a module or function inside
    one) the way an import by name does: ``"pflower.client.app"``, ``"pflower.client.app:f"``."""
    if not isinstance(value, str) or not re.fullmatch(r"[\w.]+(:\w+)?", value):
        return False
    return any(value == m or value.startswith((m + ".", m + ":")) for m in modules)


def test_the_runtime_names_no_module_of_a_layer_above_it() -> None:
    """A module named in a string (``importlib.import_module("pflower.client.app")``) is an
    import that import-linter does not see: the runtime is given such names by its callers."""
    upper = _upper_layers()
    assert "pflower.client" in upper and "pflower.tuning" in upper
    assert names_a_module_of("pflower.client.app:warm_up", upper)
    assert not names_a_module_of("pflower.clientele", upper)
    assert not names_a_module_of("usage: python -m pflower.deploy.launcher", upper)
    named = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
        for path in sorted(RUNTIME.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and names_a_module_of(node.value, upper)
    ]
    assert not named, "\n".join(named)


def test_the_launcher_gives_the_fork_server_pflowers_clientapp_to_preload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pflower.deploy import launcher
    from pflower.runtime import launcher as runtime_launcher
    from pflower.runtime.forkserver import ForkServerProcess
    from pflower.runtime.standins import PRELOAD, SERVERAPP_PRELOAD

    given: list[object] = []
    monkeypatch.setattr(
        runtime_launcher,
        "main",
        lambda argv, app, server_app: given.append((argv, app, server_app)),
    )
    launcher.main(["supernode"])
    assert given == [(["supernode"], launcher.CLIENTAPP_PRELOAD, launcher.SERVERAPP_PRELOAD)]
    assert "pflower.client.app" in launcher.CLIENTAPP_PRELOAD
    assert "pflower.server.app" in launcher.SERVERAPP_PRELOAD
    # the runtime, a lower layer, names no module of pflower's apps
    assert not any(m.startswith(("pflower.client", "pflower.server")) for m in PRELOAD)
    assert not any(m.startswith(("pflower.client", "pflower.server")) for m in SERVERAPP_PRELOAD)

    started: list[dict[str, object]] = []
    monkeypatch.setattr(ForkServerProcess, "start", lambda *a, **k: started.append(k) or _Env())
    runtime_launcher.start_fork_server(launcher.CLIENTAPP_PRELOAD)
    assert started[0]["app"] == launcher.CLIENTAPP_PRELOAD


class _Env:
    """A started fork server's environment changes: none."""

    def environment(self) -> dict[str, str]:
        return {}
