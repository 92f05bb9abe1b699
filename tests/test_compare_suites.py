"""``tools/compare_suites.py``: one setting of two folders of a tuning suite, side by side, on
the committed results: a folder against itself, against a copy with one search and one final
run changed, and every re-run in ``results/rerun`` against the stored suite it re-runs."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tools.compare_suites import QUOTE, compare, quoted, table

ROOT = Path(__file__).resolve().parent.parent
CPU = ROOT / "results" / "tuning" / "cpu"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
QUOTES = [(page, match) for page in PAGES for match in QUOTE.finditer(page.read_text())]
RERUNS = sorted(
    (folder, setting.name)
    for folder in (ROOT / "results" / "rerun").glob("*")
    for setting in folder.glob("*/final")
    if setting.is_dir()
)


def test_a_folder_against_itself_ranks_as_its_leaderboard() -> None:
    rows = compare(CPU, CPU, "fmnist_dir01")
    with (CPU / "leaderboard.csv").open() as file:
        board = {
            r["method"]: int(r["rank"])
            for r in csv.DictReader(file)
            if r["setting"] == "fmnist_dir01"
        }
    assert len(rows) == len(board) == 33
    text = table(rows, ("A", "B"))
    for row in rows:
        assert row.same_choice == [0, 1, 2] and row.identical == 15 and not row.differing
        assert row.means[0] == row.means[1]
        assert f"| {board[row.label]} | {board[row.label]} | 15 of 15 |" in text, row.label
    assert "rank correlation of the 33 methods' means: 1.000." in text


def test_another_choice_and_another_number_are_told_apart(tmp_path: Path) -> None:
    """A study that chose other values is not among the same choices (its finals are not
    compared); a final run of a study that chose alike with another value is named."""
    other = tmp_path / "fmnist_dir01"
    for part in ("chosen", "final"):
        shutil.copytree(CPU / "fmnist_dir01" / part / "fedavg", other / part / "fedavg")
    chosen = other / "chosen" / "fedavg" / "study_1.yaml"
    record = yaml.safe_load(chosen.read_text())
    record["params"]["train.lr"] *= 2
    chosen.write_text(yaml.safe_dump(record))
    summary_path = other / "final" / "fedavg" / "study_2" / "seed_4" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["last10"]["L1"]["acc_local"]["mean"] += 1e-12
    summary_path.write_text(json.dumps(summary))

    [row] = compare(CPU, tmp_path, "fmnist_dir01")
    assert row.label == "FedAvg" and row.same_choice == [0, 2]
    assert row.differing == ["study 2 seed 4"] and row.identical == 9
    assert row.means[0] == row.means[1]  # the final values are the same; last-10% is not
    assert "9 of 10 (differ: study 2 seed 4)" in table([row], ("A", "B"))


@pytest.mark.parametrize("rerun, setting", RERUNS, ids=[f"{f.name}/{s}" for f, s in RERUNS])
def test_a_rerun_that_chose_alike_made_the_same_final_runs(rerun: Path, setting: str) -> None:
    """A setting tuned again (``results/rerun``) whose study chose the values the stored study
    chose ran the same final runs: the same configuration, seed and kernels, under code verified
    to make the stored runs' numbers, give every final and last-10% value to the last digit."""
    suite = yaml.safe_load((rerun / "suite.yaml").read_text())["name"]
    for row in compare(ROOT / "results" / "tuning" / suite, rerun, setting):
        assert not row.differing, row


def test_the_tuning_guide_quotes_fedavg_s_rerun() -> None:
    """The tuning guide's figures for FedAvg's re-run on fmnist_dir01 are the comparison's."""
    guide = " ".join((ROOT / "docs" / "guide" / "tuning.md").read_text().split())
    rerun = ROOT / "results" / "rerun" / "cpu-fmnist2"
    [row] = [r for r in compare(CPU, rerun, "fmnist_dir01") if r.label == "FedAvg"]
    (a0, a1, a2), (b0, b1, b2) = row.configurations
    assert (
        f"tried {b0}, {b1} and {b2} configurations where the recorded ones tried {a0}, {a1}"
        in guide
    )
    assert f"and {a2}, chose the same learning rates, and made the same 15 final runs" in guide
    assert row.same_choice == [0, 1, 2] and row.identical == 15


def test_the_tuning_guide_quotes_a_comparison() -> None:
    """The guide quotes at least the re-run's table (the test below would pass on none)."""
    assert any(page.name == "tuning.md" for page, _ in QUOTES)


@pytest.mark.parametrize(
    "page, match",
    QUOTES,
    ids=[f"{p.relative_to(ROOT)}:{m[2]}:{m[3]}:{m[4]}" for p, m in QUOTES],
)
def test_a_quoted_table_is_the_one_its_folders_give(page: Path, match: re.Match[str]) -> None:
    """A table between ``<!-- compare_suites: A B setting -->`` and its end marker is the one
    ``compare_suites`` makes of the results now (``--update PAGE`` writes it)."""
    assert match[5] == quoted(match[2], match[3], match[4]) + "\n", (
        f"{page.relative_to(ROOT)}: run python tools/compare_suites.py --update "
        f"{page.relative_to(ROOT)}"
    )
