"""The documentation: pages generated from the code, the README as a front page, and the commands
the docs show.

- every registered algorithm has a generated page whose options table is its options dataclass
  (key, type, default, allowed values from enums and ``__post_init__``, tuning metadata, help);
- the README stays a front page (at most 250 lines), lists every algorithm module, and every
  bash block in it is either run here (``<!-- tested: OVERRIDES -->``) or names the test or CI
  script that runs it (``<!-- covered: FILES -->``);
- the fenced bash blocks marked ``<!-- tested: OVERRIDES -->`` in the README and in ``docs/`` run,
  in a temporary folder, with ``OVERRIDES`` put into each ``pflower`` command (replacing a key the
  command sets, appended otherwise; ``pflower report`` is run as written, and ``pflower resume``
  gets only ``rounds`` = the tested rounds + 1).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- (tested|covered): ([^>]*) -->\n```bash\n(.*?)```", re.S)


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "pflower_docs", ROOT / "docs/hooks/pflower_docs.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_algorithm_has_a_generated_page_with_its_options_table() -> None:
    from pflower.core.algorithm import ALGORITHMS

    pages = _hook().algorithm_pages()
    for name, algorithm in ALGORITHMS.items():
        module = algorithm.options.__module__.rsplit(".", 1)[-1]
        page = pages[f"algorithms/{module}.md"][1]
        assert f"## Options of `strategy={name}`" in page
        for field in dataclasses.fields(algorithm.options):
            if field.name != "name":
                assert f"| `strategy.{field.name}` |" in page, (name, field.name)
    fliu = pages["algorithms/fliu.md"][1]
    assert "Hussaini, Theiß and Stein" in fliu  # the module docstring
    row = next(line for line in fliu.splitlines() if line.startswith("| `strategy.gamma` |"))
    assert "`float`" in row and "`0.5`" in row and "`0.0 <= gamma <= 1.0`" in row
    assert "personalization factor" in row  # help, from the Attributes: section
    mode = next(line for line in fliu.splitlines() if line.startswith("| `strategy.gamma_mode` |"))
    assert "`adaptive` \\| `fixed`" in mode


def test_every_partition_scheme_has_a_gallery_entry_with_options_and_heatmap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pflower.blocks import blocks

    hook = _hook()
    page = hook.partition_gallery()["datasets/gallery.md"][1]
    for name, block in blocks("partition").items():
        assert f"## `partition={name}`" in page
        for field in dataclasses.fields(block):
            if field.name != "name":
                assert f"| `partition.{field.name}` |" in page, (name, field.name)
        if name not in hook.NO_HEATMAP:
            assert f"images/partitions/{name}.png)" in page
    assert "tunable range" not in page  # no partition option declares one
    # a scheme without its heatmap stops the build, naming the scheme and the command
    (tmp_path / "docs" / "images" / "partitions").mkdir(parents=True)
    monkeypatch.setattr(hook, "ROOT", tmp_path)
    with pytest.raises(RuntimeError, match=r"without a heatmap .*iid.*tools/partition_gallery"):
        hook.partition_gallery()


def test_the_options_table_shows_tuning_metadata_where_a_field_declares_it() -> None:
    @dataclasses.dataclass
    class Options:
        """Attributes:
        lr: the step size,
            over two lines.
        """

        lr: float = dataclasses.field(default=0.1, metadata={"tune": "log-uniform 1e-3..1"})

    rows = _hook().options_rows(Options)
    assert rows[0]["tunable"] == "tune: log-uniform 1e-3..1"
    assert rows[0]["help"] == "the step size, over two lines."


def test_the_cli_reference_shows_the_help_of_every_subcommand() -> None:
    from pflower.commands import SUBCOMMANDS, parser_of, subparsers, top_help

    title, page = _hook().cli_page()
    assert title == "Command line" and top_help() in page
    for command in SUBCOMMANDS:
        parser = parser_of(command)
        assert f"## `pflower {command.name}`" in page and parser.format_help() in page
        for sub in subparsers(parser).values():
            assert f"### `{sub.prog}`" in page and sub.format_help() in page


def test_the_readme_is_a_front_page_listing_every_algorithm_module() -> None:
    from pflower.core.algorithm import ALGORITHMS

    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for algorithm in ALGORITHMS.values():
        module = algorithm.options.__module__.replace(".", "/")
        assert f"]({module}.py)" in readme, module
    for match in re.finditer(r"\]\(((?:docs|pflower|results)/[^)#]+)", readme):
        assert (ROOT / match.group(1)).exists(), match.group(1)
    # the README's figures reach the site's home page, those outside docs/ copied into it
    hook = _hook()
    _, home = hook.home_page()
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", home):
        assert (image.startswith("results/") and image in hook.IMAGES) or (
            ROOT / "docs" / image
        ).is_file()


def test_every_recorded_leaderboard_is_a_site_page_with_its_figures() -> None:
    hook = _hook()
    hook.IMAGES.clear()
    pages = hook.leaderboard_pages()
    recorded = sorted((ROOT / "results" / "tuning").glob("*/leaderboard.md"))
    assert recorded and sorted(pages) == sorted(f"leaderboard/{p.parent.name}.md" for p in recorded)
    for uri, (_, text) in pages.items():
        suite = uri.removeprefix("leaderboard/").removesuffix(".md")
        figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
        assert figures, uri
        for figure in figures:  # relative to the page, copied into the site at that path
            assert figure.startswith(f"../results/tuning/{suite}/"), figure
            assert hook.IMAGES[figure.removeprefix("../")].is_file()
        assert not re.search(r"(?<!!)\[[^\]]+\]\((?!https?:|#)", text), "a repository link"
    # the README's links to a leaderboard become links to its page on the home page
    _, home = hook.home_page()
    assert "](leaderboard/cpu.md)" in home and "results/tuning/cpu/leaderboard.md" not in home


def test_every_readme_command_block_is_run_by_a_test_or_by_ci() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n", readme)
    marked = MARKER.findall(readme)
    assert len(marked) == len(blocks), "a README bash block without a tested/covered marker"
    for kind, argument, _ in marked:
        if kind == "covered":
            for path in argument.split():
                assert (ROOT / path).exists(), path


def _pytest_commands(lines: list[str]) -> set[tuple[str, ...]]:
    """The ``pytest`` command lines among ``lines``, comments and ``-q`` left out."""
    commands = [shlex.split(line, comments=True) for line in lines if line.startswith("pytest")]
    return {tuple(a for a in command if a != "-q") for command in commands}


def test_ci_runs_the_test_commands_of_the_readme() -> None:
    """The README's test commands (the quick tier and the slow one) are what ``.ci/run`` runs."""
    blocks = [body for _, _, body in MARKER.findall((ROOT / "README.md").read_text())]
    readme = _pytest_commands([line for body in blocks for line in body.splitlines()])
    ci = _pytest_commands((ROOT / ".ci/run").read_text().splitlines())
    assert readme == ci, f"README: {sorted(readme)}, .ci/run: {sorted(ci)}"
    assert {("pytest",), ("pytest", "-m", "slow")} <= ci


def _tested_blocks() -> list[tuple[str, str, str]]:
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = []
    for source in sources:
        for kind, overrides, body in MARKER.findall(source.read_text()):
            if kind == "tested":
                found.append((str(source.relative_to(ROOT)), overrides, body))
    return found


def tiny(command: list[str], overrides: list[str]) -> list[str]:
    """``command`` (a ``pflower`` call) with ``overrides`` put in (see the module docstring)."""
    if len(command) < 2 or command[0] != "pflower" or command[1] == "report":
        return command
    settings = dict(o.split("=", 1) for o in overrides)
    if command[1] == "resume":
        rounds = int(settings.get("rounds", "1")) + 1
        return [f"rounds={rounds}" if a.startswith("rounds=") else a for a in command]
    out, seen = [], set()
    for argument in command:
        key = argument.split("=", 1)[0] if "=" in argument else None
        if key in settings:
            out.append(f"{key}={settings[key]}")
            seen.add(key)
        else:
            out.append(argument)
    return out + [f"{k}={v}" for k, v in settings.items() if k not in seen]


def test_tiny_puts_overrides_into_pflower_commands() -> None:
    assert tiny(["pflower", "rounds=20", "seed=0,1"], ["rounds=2", "seed=0"]) == [
        "pflower",
        "rounds=2",
        "seed=0",
    ]
    assert tiny(["pflower", "-m", "x=1"], ["rounds=2"]) == ["pflower", "-m", "x=1", "rounds=2"]
    assert tiny(["pflower", "report", "multirun/a"], ["rounds=2"]) == [
        "pflower",
        "report",
        "multirun/a",
    ]
    assert tiny(["pflower", "resume", "runs/a", "rounds=30"], ["rounds=2"])[-1] == "rounds=3"
    assert tiny(["head", "-n", "3", "f"], ["rounds=2"]) == ["head", "-n", "3", "f"]


def _commands(body: str) -> list[str]:
    lines, current = [], ""
    for raw in body.splitlines():
        line = raw.split("  #", 1)[0].rstrip() if "  #" in raw else raw.rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            lines.append(current.strip())
        current = ""
    return lines


@pytest.mark.slow
@pytest.mark.parametrize(
    "source,overrides,body",
    [pytest.param(*block, id=f"{block[0]}:{i}") for i, block in enumerate(_tested_blocks())],
)
def test_documented_commands_run(source: str, overrides: str, body: str, tmp_path: Path) -> None:
    data = os.environ.get("PFLOWER_DATA", "")
    if "mnist" in body and not (Path(data) / "mnist").is_dir():
        pytest.skip("needs the MNIST files under $PFLOWER_DATA")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    for command in _commands(body):
        pipeline = [
            shlex.join(tiny(shlex.split(part), overrides.split())) for part in command.split(" | ")
        ]
        result = subprocess.run(
            " | ".join(pipeline),
            shell=True,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, (
            f"{source}: {pipeline}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )


def test_docstrings_cross_reference_without_sphinx_roles() -> None:
    """mkdocstrings shows a Sphinx role (``:func:`x```) as text: docstrings link with
    ``[x][pflower.a.b.x]`` (the strict build resolves it) or write a code span."""
    role = re.compile(r":(?:mod|class|func|meth|data|attr|obj|exc):`")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "pflower").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if role.search(line)
    ]
    assert not found, found
