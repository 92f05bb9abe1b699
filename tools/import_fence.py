"""An import-linter contract type, ``fenced_externals``: submodules of external packages that only
some of the project's modules may import.

import-linter's own ``forbidden`` contract cannot name a subpackage of an external package
(``flwr.supernode``): its import graph keeps each external package as one module (``flwr``).
This contract reads the import statements behind each import of such a package (the graph keeps
the text of their first line) and fails every one, outside ``allowed_importers``, that names a
module in ``forbidden_modules`` or below it, or a private module (one whose dotted name has a part
starting with ``_``) of a package in ``private_modules_of`` (:func:`imported_modules`,
:func:`fenced_by`). Registered in
``pyproject.toml`` (``[tool.importlinter] contract_types``); ``lint-imports`` puts the working
directory on the path.
"""

from __future__ import annotations

import re

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output

_FROM_IMPORT = re.compile(r"^\s*from\s+([\w.]+)\s+import\b")
_IMPORT = re.compile(r"^\s*import\s+([\w.,\s]+)")


def imported_modules(line: str) -> list[str]:
    """The modules an import statement's first line names: ``from a.b import c`` gives ``a.b``;
    ``import a.b as x, c`` gives ``a.b`` and ``c``.

    The names after ``from a.b import`` are not counted: ``c`` may be a module or any attribute
    (``from flwr.simulation import run_simulation`` is Flower's public function, not the module
    of that name). So ``from flwr.server import superlink`` is not seen: name the module."""
    found = _FROM_IMPORT.match(line)
    if found:
        return [found.group(1)]
    found = _IMPORT.match(line)
    if found:
        return [part.split(" as ")[0].strip() for part in found.group(1).split(",")]
    return []


def _within(name: str, prefixes: list[str]) -> str | None:
    return next((p for p in prefixes if name == p or name.startswith(p + ".")), None)


def fenced_by(name: str, forbidden: list[str], private_of: list[str]) -> str | None:
    """What fences the module ``name``: the entry of ``forbidden`` it is or is below, or, for a
    private module of a package in ``private_of`` (``optuna.storages._rdb``), its name up to its
    first private part (``optuna.storages._rdb``); None if nothing does."""
    fenced = _within(name, forbidden)
    if fenced or not _within(name, private_of):
        return fenced
    parts = name.split(".")
    private = next((i for i, part in enumerate(parts) if part.startswith("_")), None)
    return None if private is None else ".".join(parts[: private + 1])


class FencedExternalsContract(Contract):
    """Modules of external packages (``forbidden_modules``, dotted, e.g. ``flwr.supernode``; the
    private modules of ``private_modules_of``, e.g. ``optuna``) that no module of the root package
    outside ``allowed_importers`` may import."""

    type_name = "fenced_externals"

    forbidden_modules = fields.ListField(subfield=fields.StringField())
    allowed_importers = fields.ListField(subfield=fields.StringField())
    private_modules_of = fields.ListField(subfield=fields.StringField(), required=False)

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        forbidden = [str(m) for m in self.forbidden_modules]  # type: ignore[attr-defined]
        allowed = [str(m) for m in self.allowed_importers]  # type: ignore[attr-defined]
        private_of = [str(m) for m in self.private_modules_of or []]  # type: ignore[attr-defined]
        roots = {name.split(".")[0] for name in [*forbidden, *private_of]}
        violations: list[dict[str, object]] = []
        for importer in sorted(graph.modules):
            if importer in roots or _within(importer, allowed):
                continue
            for root in sorted(roots & graph.find_modules_directly_imported_by(importer)):
                for detail in graph.get_import_details(importer=importer, imported=root):
                    for name in imported_modules(str(detail["line_contents"])):
                        fenced = fenced_by(name, forbidden, private_of)
                        if fenced:
                            violations.append(
                                {
                                    "importer": importer,
                                    "line_number": detail["line_number"],
                                    "line": str(detail["line_contents"]).strip(),
                                    "fenced": fenced,
                                }
                            )
                            break
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        allowed = ", ".join(str(m) for m in self.allowed_importers)  # type: ignore[attr-defined]
        for violation in check.metadata["violations"]:
            output.print_error(
                f"{violation['importer']} (l. {violation['line_number']}) imports "
                f"{violation['fenced']}, which only {allowed} may import: {violation['line']}",
                bold=False,
            )
            output.new_line()
