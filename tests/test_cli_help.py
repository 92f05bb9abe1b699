"""The command line introduces itself (:mod:`pflower.commands`).

``pflower --help`` lists every subcommand of the dispatcher's table and the most used overrides
without importing torch, Flower, Hydra, OmegaConf, Ray or rich; every subcommand's parser has a
help text for every option, all wrapped at the same width; ``pflower --version`` names
pflower's, Flower's and torch's versions; a mistyped command is refused in one line naming the
nearest; Hydra's help is ``pflower --help-config``. (Timings: ``benchmarks/error_latency.py``.)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from pflower import cli
from pflower.commands import (
    HELP_WIDTH,
    HYDRA_OPTIONS,
    OPTIONS,
    OVERRIDES,
    SUBCOMMANDS,
    Subcommand,
    answer,
    parser_of,
    resolve,
    subparsers,
    top_help,
    version,
)

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "flwr", "hydra", "omegaconf", "ray", "rich")

PROBE = """
import sys
from pflower.cli import main
sys.argv = ["pflower", *sys.argv[1:]]
try:
    main()
except SystemExit as exit:
    heavy = [m for m in {heavy!r} if m in sys.modules]
    print("EXIT", exit.code, "HEAVY", ",".join(heavy) or "none", file=sys.stderr)
"""


def _pflower(*arguments: str) -> subprocess.CompletedProcess[str]:
    """``pflower ARGUMENTS`` in a fresh interpreter; its stderr ends with the exit code and the
    heavy modules it imported."""
    return subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *arguments],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )


def _every_parser(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [parser, *(p for sub in subparsers(parser).values() for p in _every_parser(sub))]


@pytest.mark.parametrize("arguments", [["--help"], ["-h"], ["help"], ["--version"], ["tunee"]])
def test_help_version_and_a_mistyped_command_import_nothing_heavy(arguments: list[str]) -> None:
    result = _pflower(*arguments)
    code = 2 if arguments == ["tunee"] else 0
    assert f"EXIT {code} HEAVY none" in result.stderr, result.stderr


def test_help_is_the_same_however_asked() -> None:
    outputs = {flag: _pflower(flag).stdout for flag in ("--help", "-h", "help")}
    assert outputs["--help"] == outputs["-h"] == outputs["help"] == top_help() + "\n"


@pytest.mark.parametrize("command", SUBCOMMANDS, ids=lambda command: command.name)
def test_help_lists_every_subcommand_of_the_dispatchers_table(command: Subcommand) -> None:
    assert re.search(rf"^  {command.name} +{re.escape(command.summary[:30])}", top_help(), re.M)


@pytest.mark.parametrize("command", SUBCOMMANDS, ids=lambda command: command.name)
def test_every_subcommand_has_a_parser_whose_every_option_has_help(command: Subcommand) -> None:
    assert callable(resolve(command.main))
    parser = parser_of(command)
    assert parser.prog == f"pflower {command.name}"
    for each in _every_parser(parser):
        assert each.description, each.prog
        for action in each._actions:
            if isinstance(action, argparse._SubParsersAction):  # its choices are listed
                assert all(choice.help for choice in action._choices_actions), each.prog
                continue
            assert action.help, f"{each.prog} {action.option_strings or action.dest}: no help"
        text = each.format_help()
        too_wide = [line for line in text.splitlines() if len(line) > HELP_WIDTH]
        assert not too_wide, f"{each.prog}: wider than {HELP_WIDTH} columns: {too_wide}"


def test_the_top_level_help_has_one_line_per_entry_at_the_same_width() -> None:
    lines = top_help().splitlines()
    assert max(len(line) for line in lines) <= HELP_WIDTH
    sections = lines[lines.index("commands:") :]
    entries = [line for line in sections if line.startswith("  ")]
    assert len(entries) == len(SUBCOMMANDS) + len(OVERRIDES) + len(OPTIONS)
    assert all(re.match(r"  \S", line) for line in entries)  # none wraps onto a second line


def test_pflower_help_command_prints_that_commands_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in SUBCOMMANDS:
        assert answer(["help", command.name]) == 0
        assert capsys.readouterr().out == parser_of(command).format_help()
    assert answer(["partition", "dataset=mnist", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: pflower partition")


NAMED = {
    "strategy": ["fliu", "fedavg", "fedprox", "ditto"],
    "dataset": ["digits", "mnist", "fmnist", "cifar10"],
    "partition": ["pathological", "dirichlet"],
}
"""The group options that ``pflower --help`` names, the first of each its default."""


def test_the_help_names_only_options_and_keys_that_exist() -> None:
    from pflower.compose import compose_config

    helped = top_help()
    default = compose_config([])
    for group, names in NAMED.items():
        assert f"{group}=NAME" in helped
        assert re.search(rf"\b{names[0]} \(default\)", helped), names[0]
        assert default[group].name == names[0]
        for name in names:
            assert re.search(rf"\b{name}\b", helped), name
            assert compose_config([f"{group}={name}"])[group].name == name
    examples = ["strategy=fedprox", "strategy.mu=0.1", "+experiment=fliu_table1_cpu"]
    assert all(example in helped for example in examples[:2])
    assert "+experiment=NAME" in helped and "fliu_table1_cpu" in helped
    assert compose_config(examples[:2]).strategy.mu == 0.1
    assert compose_config(examples[2:]).dataset.name == "mnist"
    for key in ("num_clients", "rounds", "seed", "output_dir"):
        assert f"{key}=" in helped and key in default
    for key in ("num_clients", "rounds"):
        assert re.search(rf"{key}=N +.*\(default: {default[key]}\)", helped), key


def test_version_names_pflower_flower_torch_and_python() -> None:
    line = version()
    assert line.startswith(f"pflower {metadata.version('pflower')} (")
    assert f"Flower {metadata.version('flwr')}" in line
    assert f"torch {metadata.version('torch')}" in line
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}." in line
    assert _pflower("--version").stdout.strip() == line


@pytest.mark.parametrize(("word", "near"), [("tunee", "'tune'"), ("reprot", "'report'")])
def test_a_mistyped_command_is_refused_in_one_line_naming_the_nearest(word: str, near: str) -> None:
    result = _pflower(word)
    message = result.stderr.splitlines()[0]
    assert message.startswith(f"pflower: error: '{word}' is neither a command (did you mean {near}")
    assert result.stderr.splitlines()[1].startswith("EXIT 2 ")
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("option", "near"), [("--hlep-config", "'--help-config'"), ("--multirn", "'--multirun'")]
)
def test_a_mistyped_option_of_a_run_is_refused_in_one_line_naming_the_nearest(
    option: str, near: str
) -> None:
    result = _pflower("rounds=2", option)
    message, verdict = result.stderr.splitlines()
    assert message.startswith(f"pflower: error: unknown option '{option}' (did you mean {near}")
    assert verdict == "EXIT 2 HEAVY none"


def test_the_options_passed_on_to_hydra_are_hydras_own() -> None:
    from hydra._internal.utils import get_args_parser

    hydras = {s for a in get_args_parser()._actions for s in a.option_strings if s[:2] == "--"}
    assert set(HYDRA_OPTIONS) == hydras
    assert answer(["--multi", "rounds=2"]) is None  # an abbreviation is Hydra's to expand


def test_help_config_is_hydras_help_with_every_group_and_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["pflower", "--help-config"])
    with pytest.raises(SystemExit) as exit:
        cli.main()
    out = capsys.readouterr().out
    assert exit.value.code in (0, None)
    assert out.startswith("pflower's configuration")
    assert "== Configuration groups ==" in out
    assert "\nstrategy: " in out and "fedavg" in out
    assert "\nnum_clients: " in out
