"""The numbers quoted in the tuned sections of the results pages are the leaderboard's.

A tuned section is a ``## Tuned with the same budget ...`` section of a page under
``docs/results``; a comment in it, ``<!-- leaderboard: <suite>/<setting> ... -->``, names the
settings of ``results/tuning/<suite>/leaderboard.csv`` it quotes (a guide's section that quotes
the leaderboard carries the same comment and is checked too). In such a section, sentences that
quote the paper ("Paper ...") aside:

- a table row ``| <rank> | <method> | <final> | <last-10%> | ...`` has the leaderboard's rank,
  final and last-10% accuracy of that method;
- ``<method> <mean> ± <std>`` (a method's label, as the leaderboard writes it) is its final or
  last-10% accuracy;
- ``<method> <mean> at rank <n>`` and ``<method> (<mean>) ranks <n>`` give its rank;
- ``<n> methods share rank 1`` (or ``<n> share rank 1``) counts the setting's rank-1 methods;
- ``<A> - <B> = <+d> points, 95% interval <lo> to <hi>, p = <p>`` is what ``pflower report
  <suite> --compare a,b`` prints for one of the section's settings.

A table row that holds the comment (the README's reproduction table) is checked alone.

A value of another time belongs in the page's history (``tuning-passes.md``, the changelog),
not in a tuned section, or this test fails: the sections say what the leaderboard says now.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import pflower.strategies  # noqa: F401  (registers the algorithms, whose labels the pages use)
from pflower.core.algorithm import ALGORITHMS
from pflower.reporting.leaderboard import compare

ROOT = Path(__file__).resolve().parents[1]
TUNING = ROOT / "results" / "tuning"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"<!-- leaderboard: ([\w/ -]+) -->")
WORDS = {
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
}


@dataclass(frozen=True)
class Row:
    rank: int
    final: str
    last10: str


def board() -> dict[str, dict[str, Row]]:
    """``<suite>/<setting>`` -> method label -> its row (the numbers as the leaderboard prints
    them), for every suite under ``results/tuning``."""
    table: dict[str, dict[str, Row]] = {}
    for path in sorted(TUNING.glob("*/leaderboard.csv")):
        with path.open() as handle:
            for row in csv.DictReader(handle):
                if row["setting"] == "setting" or not row["rank"].isdigit():  # a header
                    continue
                key = f"{path.parent.name}/{row['setting']}"
                table.setdefault(key, {})[row["method"]] = Row(
                    int(row["rank"]), row["final Acc(L) %"], row["last-10% Acc(L) %"]
                )
    return table


def sections() -> Iterator[tuple[str, list[str], str]]:
    """(page, settings, text) of every tuned section, and of every other section that names the
    settings it quotes."""
    for page in PAGES:
        for part in re.split(r"\n(?=## )", page.read_text()):
            lines = part.splitlines()
            own = [line for line in lines if not line.startswith("|")]
            marker = MARKER.search("\n".join(own))
            if part.startswith("## Tuned with the same budget") and "results" in page.parts:
                assert marker, f"{page.name}: a tuned section names its settings ({MARKER.pattern})"
            if marker:
                yield page.name, marker.group(1).split(), part
                continue
            for line in lines:  # a table row that names its settings is checked alone
                row_marker = MARKER.search(line) if line.startswith("|") else None
                if row_marker:
                    yield page.name, row_marker.group(1).split(), line


DIFFERENCE = re.compile(
    r"(?P<a>[\w+-]+) - (?P<b>[\w+-]+) = [+-]\d+\.\d\d points, 95% interval "
    r"[+-]\d+\.\d\d to [+-]\d+\.\d\d, p = (?:[\d.e-]*\d)"
)
"""A difference as ``pflower report --compare`` prints it, the methods by their labels."""


def differences(settings: list[str], first: str, second: str) -> set[str]:
    """What ``pflower report --compare`` prints for two methods (by label) on ``settings``,
    each line's ``A - B = ..., p = ...``."""
    names = {a.options.display_name: name for name, a in ALGORITHMS.items()}
    quoted = set()
    for suite in sorted({s.split("/")[0] for s in settings}):
        for line in compare(TUNING / suite, names.get(first, first), names.get(second, second)):
            setting, _, said = line.partition(": ")
            if f"{suite}/{setting}" in settings:
                quoted.add(said.split(" (")[0])
    return quoted


def _label(name: str) -> str:
    return re.escape(name)


def problems(settings: list[str], text: str) -> list[str]:
    rows = board()
    found: list[str] = []
    labels = sorted({m for s in settings for m in rows[s]}, key=len, reverse=True)

    def values(method: str) -> list[Row]:
        return [rows[s][method] for s in settings if method in rows[s]]

    for line in text.splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 4 and cells[0].isdigit():
            method = next((m for m in labels if cells[1].startswith(m)), None)
            if method is None:
                continue
            candidates = values(method)
            if not any(
                int(cells[0]) == r.rank and cells[2] == r.final and cells[3] == r.last10
                for r in candidates
            ):
                found.append(f"table row {cells[:4]} != leaderboard {candidates}")
    flat = " ".join(text.split())
    flat = re.sub(r"(?<!\w)Paper \([^.]*(?:\.\d[^.]*)*\.", " ", flat)  # the paper's numbers
    for method in labels:
        name = _label(method)
        for m in re.finditer(rf"(?<![\w+-]){name}\*{{0,2}} \*{{0,2}}(\d+\.\d\d ± \d+\.\d\d)", flat):
            if not any(m.group(1) in (r.final, r.last10) for r in values(method)):
                found.append(f"{method} {m.group(1)} is not its final or last-10% accuracy")
        for m in re.finditer(rf"(?<![\w+-]){name} \(?\d+\.\d\d\)? (?:at rank|ranks) (\d+)", flat):
            if not any(int(m.group(1)) == r.rank for r in values(method)):
                found.append(f"{method} at rank {m.group(1)}: leaderboard {values(method)}")
    for m in DIFFERENCE.finditer(flat):
        if m.group(0) not in differences(settings, m.group("a"), m.group("b")):
            found.append(f"{m.group(0)}: pflower report --compare prints otherwise")
    for m in re.finditer(r"(\w+) (?:methods )?share rank 1", flat):
        count = WORDS.get(m.group(1).lower()) or (int(m.group(1)) if m.group(1).isdigit() else None)
        if count is None:
            continue
        ones = [sum(r.rank == 1 for r in rows[s].values()) for s in settings]
        if count not in ones:
            found.append(f"{count} methods share rank 1: the leaderboard has {ones}")
    return found


@pytest.mark.parametrize("page,settings,text", list(sections()), ids=lambda v: str(v)[:30])
def test_a_tuned_section_quotes_the_leaderboard(page: str, settings: list[str], text: str) -> None:
    assert not problems(settings, text), page


def test_every_leaderboard_comment_names_stored_settings() -> None:
    """A comment that the marker's pattern misses (a suite name it cannot read) or that names a
    setting no leaderboard holds would leave its section unchecked."""
    stored = board()
    for page in PAGES:
        for comment in re.findall(r"<!-- leaderboard:[^>]*-->", page.read_text()):
            marker = MARKER.fullmatch(comment)
            assert marker, f"{page.name}: {comment} does not match {MARKER.pattern}"
            for setting in marker.group(1).split():
                assert setting in stored, f"{page.name}: no leaderboard holds {setting}"


def test_every_results_page_with_a_tuned_section_is_checked() -> None:
    checked = {page for page, _, _ in sections()}
    assert checked >= {"fedala.md", "diversifed.md", "fedmpr.md", "fliu.md"}


def test_the_check_catches_a_drifted_number() -> None:
    rows = board()
    setting = "cpu-v1/mnist_path"
    method, row = next(iter(rows[setting].items()))
    good = f"{method} {row.final} and {method} {row.final.split(' ')[0]} at rank {row.rank}"
    assert not problems([setting], good)
    drifted = good.replace(f"at rank {row.rank}", f"at rank {row.rank + 1}")
    assert problems([setting], drifted)
    assert problems([setting], f"{method} 12.34 ± 0.56")


def test_the_check_catches_a_drifted_difference() -> None:
    setting = "cpu-v1/fmnist_dir01"
    line = compare(TUNING / "cpu-v1", "ditto", "diversifed")[0]
    quoted = line.split(": ", 1)[1].split(" (")[0]  # "Ditto - DiversiFed = ..., p = ..."
    assert quoted.startswith("Ditto - DiversiFed = ")
    assert not problems([setting], f"On this setting {quoted} (not separated).")
    for drifted in (
        quoted[:-1] + ("8" if quoted[-1] == "9" else "9"),  # the p-value's last digit
        quoted[:-1],  # a p-value cut short
        quoted.replace("DiversiFed = +", "DiversiFed = -"),  # the sign of the difference
    ):
        assert problems([setting], drifted), drifted


def test_the_section_tool_drafts_what_the_pages_quote() -> None:
    """``tools/tuned_section.py`` writes a tuned section's table from ``leaderboard.csv``: its
    rows for FLIU's fmnist_dir01 section are the page's, and it reads each study's chosen
    values by key."""
    from tools.tuned_section import chosen_by_key, table

    with (TUNING / "cpu" / "leaderboard.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["setting"] == "fmnist_dir01"]
    page = (ROOT / "docs" / "results" / "fliu.md").read_text()
    drafted = table(rows, ["local", "fliu", "fedavg"])
    assert drafted[0].startswith(f"| rank (of {len(rows)}) | method |")
    for line in drafted:
        assert line in page
    assert chosen_by_key("0: lr=0.1, mu=0.5; 1: lr=0.2; 2: lr=0.3, mu=0.4") == (
        "lr 0.1, 0.2, 0.3; mu 0.5, -, 0.4"
    )
    assert chosen_by_key("0: lr=0.1, dims=[8, 4]; 1: lr=0.2") == "lr 0.1, 0.2; dims [8, 4], -"
    assert chosen_by_key("-") == "-"
    with pytest.raises(SystemExit, match="not ranked on this setting: FLIU"):
        table([r for r in rows if r["method"] != "FLIU"], ["fedavg", "fliu"])
