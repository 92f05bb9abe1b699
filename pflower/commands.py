"""The command line's table of subcommands, its help and its version, before any heavy import.

``pflower --help`` (also ``-h`` and ``help``), ``pflower help <command>``, ``pflower --version``
and a mistyped command are answered here (`answer`) with the standard library alone: no
torch, Flower, Hydra, OmegaConf or rich, which a run needs and a question about the command line
does not. Hydra's own help, every configuration group and key, is ``pflower --help-config``.

`SUBCOMMANDS` is the one table of subcommands: [`pflower.cli.main`][pflower.cli.main] dispatches
by it, ``pflower --help`` lists it, the CLI reference page (``docs/reference/cli.md``) is
rendered from it and its parsers, and the tests check that every entry has a summary and a
parser whose every option has a help text. A new subcommand is one more entry.

Every parser of the command line formats its help with `HelpFormatter`, so that every
help text wraps at the same `HELP_WIDTH` columns.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pflower.registry import did_you_mean

HELP_WIDTH = 80
"""The column that every help text of the command line wraps at."""


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help at `HELP_WIDTH` columns, whatever the terminal's width.

    A description or epilog is filled paragraph by paragraph (paragraphs are separated by a
    blank line); a paragraph whose lines all start with two spaces (examples) is kept as
    written.
    """

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30, width=HELP_WIDTH)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in textwrap.dedent(text).strip("\n").split("\n\n"):
            lines = paragraph.splitlines()
            if all(line.startswith("  ") for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(
                    textwrap.fill(
                        " ".join(paragraph.split()),
                        width,
                        initial_indent=indent,
                        subsequent_indent=indent,
                    )
                )
        return "\n\n".join(paragraphs)


class CommandParser(argparse.ArgumentParser):
    """An argparse parser that keeps its subcommands' parsers, by name, in ``subcommands``
    (argparse has no public accessor for them; [`subparsers`][pflower.commands.subparsers] reads
    them). The parsers of its subcommands are ``CommandParser``s too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.subcommands: dict[str, argparse.ArgumentParser] = {}

    def add_subparsers(self, **kwargs: Any) -> Any:
        """argparse's ``add_subparsers``; the parsers it adds are kept in ``subcommands``."""
        group = super().add_subparsers(**kwargs)
        self.subcommands = group.choices  # the name -> parser map that add_parser fills
        return group


@dataclass(frozen=True)
class Subcommand:
    """One ``pflower <name> ...`` command.

    Attributes:
        name: the word after ``pflower``.
        summary: its line in ``pflower --help``.
        parser: ``"module:function"``, the function that returns its argparse parser (its
            ``--help`` and its section of the CLI reference).
        main: ``"module:function"``: a function of the arguments after ``name`` that returns
            the exit code; with ``hydra_task``, a Hydra task function instead, which
            [`pflower.cli`][pflower.cli] runs with the arguments as overrides.
        hydra_task: ``main`` is a Hydra task (the arguments are Hydra overrides).
        runs_flower: the command runs Flower, whose console is set up first
            ([`pflower.runtime.logs.plain_flower_console_unless_tty`][pflower.runtime.logs.plain_flower_console_unless_tty]).
    """

    name: str
    summary: str
    parser: str
    main: str
    hydra_task: bool = False
    runs_flower: bool = True


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        "partition",
        "per-client sizes and class histograms, without training",
        "pflower.cli:partition_parser",
        "pflower.cli:_partition",
        hydra_task=True,
    ),
    Subcommand(
        "report",
        "compare methods over partitions and seeds: tables, plots",
        "pflower.reporting.report:_parser",
        "pflower.reporting.report:main",
        runs_flower=False,
    ),
    Subcommand(
        "tune",
        "tune methods on validation, then run them on test",
        "pflower.tuning.cli:_parser",
        "pflower.tuning.cli:main",
    ),
    Subcommand(
        "resume",
        "continue a run from its checkpoint, or extend it",
        "pflower.cli:resume_parser",
        "pflower.cli:resume",
    ),
    Subcommand(
        "deploy",
        "local SuperLink and SuperNodes, or docker-compose files",
        "pflower.deploy.cli:_parser",
        "pflower.deploy.cli:main",
    ),
    Subcommand(
        "reproduce",
        "run a recorded run again and compare every metric",
        "pflower.reproduce:_parser",
        "pflower.reproduce:main",
        runs_flower=False,
    ),
)

OVERRIDES: tuple[tuple[str, str], ...] = (
    ("strategy=NAME", "the algorithm: fliu (default), fedavg, fedprox, ditto ..."),
    ("strategy.KEY=VALUE", "its options, e.g. strategy=fedprox strategy.mu=0.1"),
    ("dataset=NAME", "digits (default), mnist, fmnist, cifar10 ..."),
    ("partition=NAME", "the clients' data: pathological (default), dirichlet ..."),
    ("num_clients=N", "the number of clients (default: 10)"),
    ("rounds=N", "the number of federated rounds (default: 10)"),
    ("seed=N", "partitioning, initialization, sampling, data order"),
    ("-m +experiment=NAME", "a paper's table as a sweep, e.g. fliu_table1_cpu"),
    ("output_dir=DIR", "where the run writes (default: runs/<date>/<time>)"),
    ("-m KEY=A,B ...", "a sweep (Hydra multirun): one run per combination"),
    ("--cfg job", "print the composed configuration and exit"),
)
"""The run's most used overrides and Hydra flags, one line each in ``pflower --help``."""

OPTIONS: tuple[tuple[str, str], ...] = (
    ("-h, --help, help", "this help; pflower help COMMAND: that command's"),
    ("--help-config", "every configuration group, option and key (Hydra's help)"),
    ("--version", "the versions of pflower, Flower, torch and Python"),
)
"""The options of ``pflower`` itself."""

HELP_FLAGS = ("-h", "--help")

HYDRA_OPTIONS = (
    "--cfg",
    "--config-dir",
    "--config-name",
    "--config-path",
    "--experimental-rerun",
    "--help",
    "--hydra-help",
    "--info",
    "--multirun",
    "--package",
    "--resolve",
    "--run",
    "--shell-completion",
    "--version",
)
"""The long options of Hydra's command line (Hydra 1.3), which a run passes on to Hydra."""


def resolve(reference: str) -> Any:
    """The object that a ``"module:function"`` reference of `SUBCOMMANDS` names."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def subcommand(name: str) -> Subcommand | None:
    """The entry of `SUBCOMMANDS` called ``name``, if there is one."""
    return next((command for command in SUBCOMMANDS if command.name == name), None)


def parser_of(command: Subcommand) -> argparse.ArgumentParser:
    """The argparse parser of ``command`` (imports its module)."""
    parser: argparse.ArgumentParser = resolve(command.parser)()
    return parser


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parsers of ``parser``'s own subcommands (``pflower deploy up`` ...), by name: a
    [`CommandParser`][pflower.commands.CommandParser]'s; none for another parser."""
    return dict(parser.subcommands) if isinstance(parser, CommandParser) else {}


def _rows(rows: Sequence[tuple[str, str]], width: int) -> list[str]:
    lines = []
    for name, text in rows:
        lines.extend(
            textwrap.wrap(
                text,
                HELP_WIDTH,
                initial_indent=f"  {name:<{width}}  ",
                subsequent_indent=" " * (width + 4),
            )
        )
    return lines


def top_help() -> str:
    """``pflower --help``: the usage, the subcommands, the most used overrides, the options."""
    width = max(len(name) for name, _ in (*OVERRIDES, *OPTIONS))
    commands = [(command.name, command.summary) for command in SUBCOMMANDS]
    return "\n".join(
        [
            "usage: pflower [KEY=VALUE ...]        run an experiment (a Flower simulation)",
            "       pflower -m KEY=A,B [...]       run a sweep",
            "       pflower COMMAND [ARGS ...]     see COMMAND --help",
            "",
            *textwrap.wrap(
                "Personalized federated learning on Flower: an experiment is composed from "
                "Hydra overrides (dataset, partition, model, strategy) and runs as a simulation; "
                "the commands tune, compare, resume and deploy it.",
                HELP_WIDTH,
            ),
            "",
            "commands:",
            *_rows(commands, width),
            "",
            "overrides of a run, the most used (pflower --help-config lists them all):",
            *_rows(OVERRIDES, width),
            "",
            "options:",
            *_rows(OPTIONS, width),
        ]
    )


def version() -> str:
    """pflower's, Flower's, torch's and Python's versions, read from the installed packages'
    metadata (importing Flower or torch would take seconds)."""
    from importlib import metadata

    def of(distribution: str) -> str:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return "not installed"

    python = ".".join(map(str, sys.version_info[:3]))
    return f"pflower {of('pflower')} (Flower {of('flwr')}, torch {of('torch')}, Python {python})"


def _is_override(argument: str) -> bool:
    """Whether ``argument`` is a Hydra override or flag rather than a command's name."""
    return "=" in argument or argument.startswith(("-", "+", "~"))


def answer(arguments: Sequence[str]) -> int | None:
    """Answer a question about the command line: print the help or the version, or refuse an
    unknown command or a run's unknown long option (one line naming the nearest, exit code 2);
    the exit code, or ``None`` when ``arguments`` are a run's or a command's, for
    [`pflower.cli.main`][pflower.cli.main] to dispatch. An abbreviated option (``--multi``) is
    Hydra's to expand, as argparse does.

    ``-h``/``--help`` among a run's overrides print this help too: ``pflower --help-config``
    shows the configuration that overrides compose."""
    if not arguments:
        return None
    first = arguments[0]
    command = subcommand(first)
    if command is None and "--version" in arguments:
        print(version())
        return 0
    if first == "help" or (command is None and any(a in HELP_FLAGS for a in arguments)):
        topic = arguments[1] if first == "help" and len(arguments) > 1 else "help"
        if topic == "help":
            print(top_help())
            return 0
        command = subcommand(topic)
        if command is None:
            return _unknown(topic)
        print(parser_of(command).format_help(), end="")
        return 0
    if command is not None:
        if command.hydra_task and any(a in HELP_FLAGS for a in arguments[1:]):
            print(parser_of(command).format_help(), end="")
            return 0
        return None
    options = [*HYDRA_OPTIONS, "--help-config"]
    for argument in arguments:
        option = argument.split("=", 1)[0]
        if option.startswith("--") and not any(known.startswith(option) for known in options):
            print(
                f"pflower: error: unknown option '{option}'{did_you_mean(option, options)}; "
                "a run takes KEY=VALUE overrides and Hydra's options (pflower --help)",
                file=sys.stderr,
            )
            return 2
    if _is_override(first):
        return None
    return _unknown(first)


def _unknown(word: str) -> int:
    """Refuse ``word``, neither a command nor an override, naming the nearest commands."""
    names = [command.name for command in SUBCOMMANDS]
    print(
        f"pflower: error: '{word}' is neither a command{did_you_mean(word, [*names, 'help'])} "
        f"nor an override KEY=VALUE; the commands: {', '.join(names)} (pflower --help)",
        file=sys.stderr,
    )
    return 2
