"""The package stays in small parts (issue 63): no module of ``pflower/`` over
`MAX_MODULE_LINES` lines and no class over `MAX_CLASS_LINES`. A part that grows past them is
split along its duties (as ``pflower.results.rundir`` was into rows, summary, failures and disk),
not let grow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pflower"
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 250


def oversized(source: str, name: str) -> list[str]:
    """What in the module ``source`` (called ``name``) is over the limits, one line each."""
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{name}: {lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            if length > MAX_CLASS_LINES:
                found.append(
                    f"{name}: class {node.name} {length} lines (at most {MAX_CLASS_LINES})"
                )
    return found


def test_no_module_or_class_of_the_package_is_over_the_limits() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 100  # the package was found
    found = [
        problem
        for path in modules
        for problem in oversized(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    ]
    assert not found, "split these along their duties:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("x = 1\n" * MAX_MODULE_LINES, []),
        ("x = 1\n" * (MAX_MODULE_LINES + 1), [f"m.py: {MAX_MODULE_LINES + 1} lines"]),
        ("class A:\n" + "    x = 1\n" * (MAX_CLASS_LINES - 1), []),
        (
            "class A:\n    class B:\n" + "        x = 1\n" * MAX_CLASS_LINES,
            [f"class A {MAX_CLASS_LINES + 2} lines", f"class B {MAX_CLASS_LINES + 1} lines"],
        ),
    ],
)
def test_the_limits_count_lines_and_nested_classes(source: str, expected: list[str]) -> None:
    found = oversized(source, "m.py")
    assert len(found) == len(expected)
    for line, start in zip(found, expected, strict=True):
        assert line.startswith(start if start.startswith("m.py") else f"m.py: {start}")
