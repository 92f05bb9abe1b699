"""MkDocs hook: the pages that are generated from the code, so that they cannot drift from it.

- ``algorithms/<module>.md``: one page per algorithm module of :mod:`pflower.strategies` (every
  module that registers an algorithm), made of the module's docstring and, per registered
  algorithm, a table of its options generated from its options dataclass: key, type, default,
  allowed values (enum members and the conditions its ``__post_init__`` checks with
  ``require``), the tuning range declared in the field's metadata where there is one, and the
  help text from the class's ``Attributes:`` docstring section.
- ``datasets/gallery.md``: every partition scheme (its docstring, an options table generated
  from its ``partition`` block and its heatmap from ``docs/images/partitions``).
- ``reference/api/<package>.md``: one mkdocstrings page per subpackage of :mod:`pflower`.
- ``benchmarks/recorded/*.md``, ``deployment/docker.md`` and ``changelog.md``: the recorded
  benchmark notes (``benchmarks/results/*.md``), ``docker/README.md`` and ``CHANGELOG.md``, which
  live beside their code.
- ``leaderboard/<suite>.md``: each suite's recorded leaderboard (``results/tuning/<suite>/``).
- ``reference/cli.md``: ``pflower --help`` and every subcommand's help
  (:data:`pflower.commands.SUBCOMMANDS`).

The navigation in ``mkdocs.yml`` names these with placeholders that this hook expands:
``algorithms/*`` (every generated algorithm page), ``reference/api/*``, ``benchmarks/recorded/*``,
``leaderboard/*`` and ``reference/*`` (every page directly under ``docs/reference/``), so a new
algorithm module, a new suite's leaderboard or a new reference page (the CLI's) appears without
editing the navigation.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import pkgutil
import re
import sys
import textwrap
import tomllib
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_GENERATED: dict[str, str] = {}
IMAGES: dict[str, Path] = {}
"""Images outside ``docs/`` that the README shows, copied into the site at the same path."""
ALGORITHM_MODULES: set[str] = set()


# --------------------------------------------------------------------------------------------
# docstrings -> Markdown


def rst_to_markdown(text: str) -> str:
    """The reStructuredText of pflower's docstrings as Markdown (roles, literals, ``::`` blocks,
    lists that follow a paragraph)."""
    text = inspect.cleandoc(text)
    text = re.sub(r":(?:class|func|meth|mod|attr|data|obj|exc):`~?([^`]+)`", _role, text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::"):
            head = line.rstrip()[:-2].rstrip()
            if head:
                out.append(head + ":")
            out.append("")
            i += 1
            block: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            out.append("```text")
            out.extend(textwrap.dedent("\n".join(block)).strip("\n").splitlines())
            out.append("```")
            out.append("")
            continue
        is_item = bool(re.match(r"\s*([-*]|\d+\.) ", line))
        previous = out[-1] if out else ""
        if (
            is_item
            and previous.strip()
            and not re.match(r"\s*([-*]|\d+\.) ", previous)
            and not previous.startswith((" ", "\t"))
        ):
            out.append("")
        out.append(line)
        i += 1
    return "\n".join(out).strip() + "\n"


def _role(match: re.Match[str]) -> str:
    target = match.group(1)
    shown = target.rsplit(".", 1)[-1] if match.group(0).split("`")[1].startswith("~") else target
    return f"``{shown}``"


def attribute_help(cls: type) -> dict[str, str]:
    """Field name -> help text, from the ``Attributes:`` sections of ``cls`` and its bases."""
    helps: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = klass.__dict__.get("__doc__") or ""
        helps.update(_parse_attributes(doc))
    return helps


def _parse_attributes(doc: str) -> dict[str, str]:
    doc = inspect.cleandoc(doc)
    match = re.search(r"Attributes:[ \t]*\n(.*)", doc, flags=re.S)
    if not match:
        return {}
    helps: dict[str, str] = {}
    current: str | None = None
    lines = match.group(1).splitlines()
    base_indent: int | None = None
    for line in lines:
        if not line.strip():
            current = None
            continue
        indent = len(line) - len(line.lstrip())
        entry = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\([^)]*\))?:\s*(.*)", line)
        if entry and (base_indent is None or indent <= base_indent):
            base_indent = indent
            current = entry.group(1)
            helps[current] = entry.group(2).strip()
        elif (
            current is not None and base_indent is not None and (indent > base_indent or not entry)
        ):
            helps[current] += " " + line.strip()
        else:
            current = None
    return {k: v.strip() for k, v in helps.items()}


# --------------------------------------------------------------------------------------------
# options dataclass -> table


def post_init_conditions(cls: type) -> dict[str, list[str]]:
    """Field name -> the conditions ``__post_init__`` checks with ``require(...)`` on it (of
    ``cls`` and its bases), as source text without ``self.``."""
    found: dict[str, list[str]] = {}
    for klass in cls.__mro__:
        method = klass.__dict__.get("__post_init__")
        if method is None:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(method))
        except (OSError, TypeError):
            continue
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "require"):
                continue
            if not node.args:
                continue
            condition = node.args[0]
            names = {
                n.attr
                for n in ast.walk(condition)
                if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id == "self"
            }
            text = ast.unparse(condition).replace("self.", "")
            for name in names:
                if text not in found.setdefault(name, []):
                    found[name].append(text)
    return found


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    text = str(annotation).replace("typing.", "")
    return re.sub(r"\b(?:[a-z_]+\.)+([A-Za-z_]+)", r"\1", text).replace("NoneType", "None")


def _default(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "(required)"
    if isinstance(value, enum.Enum):
        value = value.value
    return repr(value) if isinstance(value, str) else str(value)


def _tunable(metadata: Any) -> str:
    """The tuning range a field's metadata declares (:func:`pflower.searchspace.tunable` stores
    a ``Param`` with ``describe()`` and ``source``); other metadata is shown as it is."""
    if not metadata:
        return ""
    parts = []
    for key, value in metadata.items():
        if hasattr(value, "describe"):
            text = value.describe()
            source = getattr(value, "source", "")
            parts.append(f"{text} ({source})" if source else text)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            items = dataclasses.asdict(value).items()
            parts.append(f"{key}: " + ", ".join(f"{k}={v!r}" for k, v in items))
        else:
            parts.append(f"{key}: {value}")
    return "; ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def options_rows(cls: type, prefix: str = "strategy") -> list[dict[str, str]]:
    """One row per option of the options dataclass ``cls`` (the ``name`` key excluded), its key
    under ``prefix`` (the config section)."""
    hints = typing.get_type_hints(cls)
    helps = attribute_help(cls)
    conditions = post_init_conditions(cls)
    rows = []
    for field in dataclasses.fields(cls):
        if field.name == "name":
            continue
        annotation = hints.get(field.name, field.type)
        allowed: list[str] = []
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            allowed.append(" \\| ".join(f"`{m.value}`" for m in annotation))
        allowed.extend(f"`{c}`" for c in conditions.get(field.name, []))
        rows.append(
            {
                "key": f"`{prefix}.{field.name}`",
                "type": f"`{_type_name(annotation)}`",
                "default": f"`{_default(field)}`",
                "allowed": "; ".join(allowed) or "-",
                "tunable": _cell(_tunable(field.metadata)) or "-",
                "help": _cell(rst_to_markdown(helps.get(field.name, "")).strip()) or "-",
            }
        )
    return rows


def options_table(cls: type, prefix: str = "strategy") -> str:
    """The Markdown table of :func:`options_rows` (without the tunable column where no option
    declares a range)."""
    rows = options_rows(cls, prefix)
    columns = ["key", "type", "default", "allowed", "tunable", "help"]
    if all(row["tunable"] == "-" for row in rows) and prefix != "strategy":
        columns.remove("tunable")
    titles = {"tunable": "tunable range"}
    head = "| " + " | ".join(titles.get(c, c) for c in columns) + " |\n"
    head += "|" + "---|" * len(columns) + "\n"
    return head + "".join("| " + " | ".join(row[c] for c in columns) + " |\n" for row in rows)


# --------------------------------------------------------------------------------------------
# pages


def algorithm_pages() -> dict[str, tuple[str, str]]:
    """``algorithms/<module>.md`` -> (title, Markdown) for every algorithm module."""
    import pflower.strategies  # noqa: F401  (registers every algorithm)
    from pflower.core.algorithm import ALGORITHMS

    by_module: dict[str, list[Any]] = {}
    for algorithm in ALGORITHMS.values():
        by_module.setdefault(algorithm.options.__module__, []).append(algorithm)
    pages = {}
    for module_name in sorted(by_module):
        module = importlib.import_module(module_name)
        short = module_name.rsplit(".", 1)[-1]
        algorithms = by_module[module_name]
        first = algorithms[0].options
        title = getattr(first, "display_name", short)
        parts = [f"# {title}\n"]
        names = ", ".join(f"`strategy={a.name}`" for a in algorithms)
        parts.append(
            f"*Generated from `{module_name}` (its docstring and options dataclasses). "
            f"Select with {names}.*\n"
        )
        parts.append(rst_to_markdown(module.__doc__ or "(no module docstring)"))
        for algorithm in algorithms:
            options = algorithm.options
            parts.append(f"\n## Options of `strategy={algorithm.name}`\n")
            parts.append(
                f"`{options.__name__}` ({getattr(options, 'display_name', algorithm.name)}); "
                f"server half `{algorithm.strategy.__name__}`, client half "
                f"`{algorithm.client.__name__}`.\n"
            )
            parts.append(options_table(options))
            parts += [
                f"\nAt `{c.describe()}` it computes what `strategy={c.base}` computes (a "
                "neutral point: the leaderboard names a tuned configuration at or next to "
                "it).\n"
                for c in options.collapses
            ]
        presets = sorted(
            p.stem
            for p in (ROOT / "conf" / "strategy").glob("*.yaml")
            if any(
                re.search(rf"\b{re.escape(a.name)}\b", line)
                for line in p.read_text().splitlines()
                if "strategy" in line or line.lstrip().startswith("-")
                for a in algorithms
            )
        )
        if presets:
            parts.append(
                "\n## Presets\n\n"
                + "".join(f"- `strategy={p}` (`conf/strategy/{p}.yaml`)\n" for p in presets)
            )
        parts.append(
            f"\n## API\n\n::: {module_name}\n    options:\n      show_root_heading: false\n"
            "      show_docstring_description: false\n      heading_level: 3\n"
        )
        pages[f"algorithms/{short}.md"] = (title, "\n".join(parts))
        ALGORITHM_MODULES.add(module_name)
    return pages


GALLERY = Path("images") / "partitions"
"""The partition heatmaps under ``docs/`` (drawn by ``tools/partition_gallery.py``)."""
NO_HEATMAP = {
    "from_file": "it replays client index lists written by `pflower partition`.",
    "natural": "its clients are the ids the data names (LEAF users, a table's client column, "
    "one image folder per client); MNIST names none.",
}


def partition_gallery() -> dict[str, tuple[str, str]]:
    """``datasets/gallery.md``: every registered partition scheme with its docstring, its options
    and its heatmap. A scheme without a heatmap (and not in :data:`NO_HEATMAP`) fails the build:
    run ``python tools/partition_gallery.py`` after adding one."""
    from pflower.blocks import blocks

    schemes = blocks("partition")
    missing = [
        name
        for name in sorted(schemes)
        if name not in NO_HEATMAP and not (ROOT / "docs" / GALLERY / f"{name}.png").is_file()
    ]
    if missing:
        raise RuntimeError(
            f"partition schemes without a heatmap in docs/{GALLERY}: {', '.join(missing)}; "
            "run `python tools/partition_gallery.py`"
        )
    parts = [
        "# Partition gallery\n",
        "*Generated from `pflower.blocks.partitions` (each scheme's docstring and options) when "
        "the site is built; the heatmaps are drawn by `python tools/partition_gallery.py`: every "
        "scheme with its default options, 10 clients (3 for `attribute_groups`) and seed 0 on "
        "MNIST's training labels (the "
        "same call as a run's partition step). Rows are clients, columns classes (made-up group "
        "ids for `feature_skew` and `attribute_groups`, whose datasets are not here), colour "
        "and numbers each client's training samples. [Partitions](partitions.md) explains the "
        "splits and the command that draws the same figure for any configuration: "
        "`pflower partition dataset=mnist partition=<scheme> num_clients=10`.*\n",
    ]
    for name in sorted(schemes):
        block = schemes[name]
        parts.append(f"\n## `partition={name}`\n")
        summary = (inspect.getdoc(block) or "").split("\nAttributes:")[0]
        parts.append(rst_to_markdown(summary))
        if options_rows(block, "partition"):
            parts.append("\n" + options_table(block, "partition"))
        if name in NO_HEATMAP:
            parts.append(f"\nNo heatmap: {NO_HEATMAP[name]}\n")
        else:
            parts.append(f"\n![partition={name} of MNIST](../{GALLERY.as_posix()}/{name}.png)\n")
    return {"datasets/gallery.md": ("Partition gallery", "\n".join(parts))}


REEXPORTING = {"pflower.api"}
"""Modules whose public names are re-exports, documented where they are defined."""


def api_packages() -> list[str]:
    """Every public package and module directly under :mod:`pflower` (``__main__`` aside): each
    gets an API page, so a new package is documented without editing this hook."""
    found = pkgutil.iter_modules([str(ROOT / "pflower")])
    return sorted(f"pflower.{m.name}" for m in found if not m.name.startswith("_"))


def api_pages(skip: set[str]) -> dict[str, tuple[str, str]]:
    """``reference/api/<package>.md`` -> (title, Markdown) for every documented package, leaving
    out the modules in ``skip`` (the algorithm modules, documented on their own pages)."""
    pages = {}
    for package in api_packages():
        path = ROOT / Path(*package.split("."))
        if path.is_dir():
            modules = [package] + [
                m.name
                for m in pkgutil.walk_packages([str(path)], f"{package}.")
                if not any(part.startswith("_") for part in m.name.split("."))
                and m.name not in skip
            ]
        elif path.with_suffix(".py").is_file():
            modules = [package]
        else:
            continue
        body = [f"# `{package}`\n"]
        for module in modules:
            # pflower.api re-exports what lives elsewhere: its page is its docstring, the names
            # keep one page each (rendered twice, their anchors would be ambiguous)
            members = "      members: false\n" if module in REEXPORTING else ""
            body.append(
                f"::: {module}\n    options:\n      show_submodules: false\n"
                f"      heading_level: 2\n{members}"
            )
        pages[f"reference/api/{package.removeprefix('pflower.')}.md"] = (package, "\n".join(body))
    return pages


def cli_page() -> tuple[str, str]:
    """``reference/cli.md``: ``pflower --help`` and the help of every subcommand (and of their
    own subcommands), rendered from :data:`pflower.commands.SUBCOMMANDS` and their parsers."""
    from pflower.commands import SUBCOMMANDS, parser_of, subparsers, top_help

    def block(command: str, text: str) -> str:
        return f"```text\n$ {command} --help\n{text.rstrip()}\n```\n"

    body = [
        "# Command line\n",
        "*Generated from the command line's table of subcommands (`pflower/commands.py`) and "
        "their parsers when the site is built.* Every configuration group and key: "
        "`pflower --help-config`.\n",
        block("pflower", top_help()),
    ]
    for command in SUBCOMMANDS:
        parser = parser_of(command)
        body += [
            f"## `pflower {command.name}`\n",
            f"{command.summary}.\n",
            block(parser.prog, parser.format_help()),
        ]
        for sub in subparsers(parser).values():
            body += [f"### `{sub.prog}`\n", block(sub.prog, sub.format_help())]
    return "Command line", "\n".join(body)


def _unlink(text: str) -> str:
    """Relative links of a page copied from outside docs/ become code spans (their targets are
    repository files, not site pages)."""

    def rep(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        if target.startswith(("http://", "https://", "#", "mailto:")):
            return match.group(0)
        return f"{label} (`{target}`)" if label.strip("`") != target else f"`{target}`"

    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)]+)\)", rep, text)


LEADERBOARD = re.compile(r"results/tuning/([\w-]+)/leaderboard\.md")
"""A suite's leaderboard in the repository; the site shows it as ``leaderboard/<suite>.md``."""


def home_page() -> tuple[str, str]:
    """The site's home page: the README, its links turned into site links (``docs/X`` -> ``X``,
    an algorithm module -> its generated page, a suite's leaderboard -> its page, the changelog
    -> its page, an image
    elsewhere in the repository -> the same image copied into the site (:data:`IMAGES`), other
    repository files -> code spans)."""
    text = (ROOT / "README.md").read_text()

    def rep(match: re.Match[str]) -> str:
        bang, label, target = match.group(1), match.group(2), match.group(3)
        if target.startswith(("http://", "https://", "#", "mailto:")):
            return match.group(0)
        if target.startswith("docs/"):
            return f"{bang}[{label}]({target[len('docs/') :]})"
        board = LEADERBOARD.fullmatch(target)
        if board and (ROOT / target).is_file():
            return f"[{label}](leaderboard/{board.group(1)}.md)"
        if bang and (ROOT / target).is_file():
            IMAGES[target] = ROOT / target
            return match.group(0)
        if target == "CHANGELOG.md":
            return f"[{label}](changelog.md)"
        module = re.fullmatch(r"pflower/strategies/(\w+)\.py", target)
        if module and (ROOT / target).is_file():
            return f"[{label}](algorithms/{module.group(1)}.md)"
        return f"{label} (`{target}`)"

    return "pflower", re.sub(r"(!?)\[([^\]]+)\]\(([^)]+)\)", rep, text)


def leaderboard_pages() -> dict[str, tuple[str, str]]:
    """Every recorded leaderboard (``results/tuning/<suite>/leaderboard.md``, written by
    ``pflower report --leaderboard``) as ``leaderboard/<suite>.md``, its figures copied into the
    site at their repository paths (:data:`IMAGES`) and its other links turned into code spans."""
    pages = {}
    for source in sorted((ROOT / "results" / "tuning").glob("*/leaderboard.md")):
        folder = source.parent.relative_to(ROOT).as_posix()
        suite = source.parent.name

        def figure(match: re.Match[str], folder: str = folder) -> str:
            alt, target = match.group(1), match.group(2)
            IMAGES[f"{folder}/{target}"] = ROOT / folder / target
            return f"![{alt}](../{folder}/{target})"

        text = re.sub(r"!\[([^\]]*)\]\(([^)/:]+\.png)\)", figure, source.read_text())
        note = f"*Copied from `{folder}/leaderboard.md` when the site is built.*\n\n"
        pages[f"leaderboard/{suite}.md"] = (f"Suite {suite}", note + _unlink(text))
    return pages


BENCHMARK_NOTES = {
    "README.md": "Notes and history",
    "refactor_ab.md": "Platform refactor before and after",
    "gpu.md": "GPU results (not measured yet)",
}
"""Recorded benchmark notes that are working records (a refactor's A/B, the notes' history, a
benchmark still waiting for its machine): built and linked from ``benchmarks.md``, but not listed
in the navigation."""
NOT_IN_NAV: set[str] = set()


def copied_pages() -> dict[str, tuple[str, str]]:
    """Markdown files kept beside their code, shown in the site."""
    pages = {"index.md": home_page(), **leaderboard_pages()}
    for source in sorted((ROOT / "benchmarks" / "results").glob("*.md")):
        text = source.read_text()
        heading = re.match(r"# ([^:(\n]+)", text)
        title = heading.group(1).strip() if heading else source.stem.replace("_", " ")
        title = title[0].upper() + title[1:]
        if source.name in BENCHMARK_NOTES:
            title = BENCHMARK_NOTES[source.name]
            NOT_IN_NAV.add(f"benchmarks/recorded/{source.name}")
        note = f"*Copied from `benchmarks/results/{source.name}` when the site is built.*\n\n"
        pages[f"benchmarks/recorded/{source.name}"] = (title, note + _unlink(text))
    changelog = ROOT / "CHANGELOG.md"
    if changelog.is_file():
        note = "*Copied from `CHANGELOG.md` when the site is built.*\n\n"
        pages["changelog.md"] = ("Changelog", note + _unlink(changelog.read_text()))
    docker = ROOT / "docker" / "README.md"
    if docker.is_file():
        note = "*Copied from `docker/README.md` when the site is built.*\n\n"
        pages["deployment/docker.md"] = ("Docker", note + _unlink(docker.read_text()))
    return pages


# --------------------------------------------------------------------------------------------
# mkdocs events


def _expand(nav: Any, docs_dir: Path) -> Any:
    if isinstance(nav, list):
        out = []
        for item in nav:
            if isinstance(item, str) and item.endswith("/*"):
                out.extend(_glob(item[:-2], docs_dir))
            else:
                expanded = _expand(item, docs_dir)
                if expanded not in ([], {}):
                    out.append(expanded)
        return out
    if isinstance(nav, dict):
        result = {k: _expand(v, docs_dir) for k, v in nav.items()}
        return {k: v for k, v in result.items() if v != []}
    return nav


def _glob(prefix: str, docs_dir: Path) -> list[Any]:
    entries: dict[str, str] = {}
    for uri, (title, _) in _GENERATED.items():
        if uri in NOT_IN_NAV:
            continue
        if uri.startswith(prefix + "/") and "/" not in uri[len(prefix) + 1 :]:
            entries[uri] = title
    for path in sorted((docs_dir / prefix).glob("*.md")):
        uri = f"{prefix}/{path.name}"
        if uri.endswith("/index.md"):
            continue
        match = re.search(r"^# (.+)$", path.read_text(), flags=re.M)
        entries[uri] = match.group(1).strip().replace("`", "") if match else path.stem
    return [{title: uri} for uri, title in sorted(entries.items(), key=lambda kv: kv[1].lower())]


def version() -> str:
    """The package version, from ``pyproject.toml`` (the one place it is written)."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        return str(tomllib.load(file)["project"]["version"])


def on_config(config: Any) -> Any:
    config["extra"]["version"] = version()
    config["copyright"] = f"pflower {version()}" + (
        f" · {config['copyright']}" if config.get("copyright") else ""
    )
    _GENERATED.clear()
    IMAGES.clear()
    NOT_IN_NAV.clear()
    _GENERATED.update(algorithm_pages())
    _GENERATED.update(api_pages(ALGORITHM_MODULES))
    _GENERATED.update(partition_gallery())
    _GENERATED.update(copied_pages())
    _GENERATED["reference/cli.md"] = cli_page()
    config["nav"] = _expand(config["nav"], Path(config["docs_dir"]))
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for uri, (_, content) in _GENERATED.items():
        existing = files.get_file_from_path(uri)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, uri, content=content))
    for uri, path in IMAGES.items():
        files.append(File.generated(config, uri, content=path.read_bytes()))
    return files
