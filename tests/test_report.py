"""``pflower report``: grouping by configuration, method names, and statistics checked against
values computed by hand from small hand-written run directories."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from pflower.reporting.groups import group_runs
from pflower.reporting.report import main, write_report
from pflower.reporting.stats import experiment_cells
from pflower.results.runs import load_runs


def _client(client: int, acc_local: float, acc_global: float, loss_local: float) -> dict[str, Any]:
    return {
        "client": client,
        "acc_local": acc_local,
        "acc_global": acc_global,
        "loss_local": loss_local,
        "loss_global": 1.0,
        "num_test": 10 * (client + 1),
    }


def write_run(
    path: Path,
    seed: int,
    strategy: dict[str, Any],
    l1: Sequence[tuple[float, float, float]],
    l2: Sequence[tuple[float, float, float]] = (),
    g: float | None = None,
    lr: float = 0.05,
    status: str = "completed",
    code: dict[str, Any] | None = None,
) -> Path:
    """A two-round run directory whose final round (2) has the given L1/L2 clients and G (and,
    with ``code``, the pflower code its summary records)."""
    config = {
        "seed": seed,
        "output_dir": str(path),
        "rounds": 2,
        "strategy": strategy,
        "partition": {"name": "pathological", "classes_per_client": 2},
        "train": {"lr": lr},
    }
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows: list[dict[str, Any]] = [{"round": 0, "stage": "G", "acc": 0.1, "loss": 2.3}]
    # Round 1 is better than round 2 everywhere: only the final round may be reported.
    rows += [{"round": 1, "stage": "L1", **_client(c, 0.99, 0.99, 0.01)} for c in range(len(l1))]
    rows.append({"round": 2, "stage": "time", "fit_done_unix_s": 1.0})
    rows += [{"round": 2, "stage": "L1", **_client(c, *v)} for c, v in enumerate(l1)]
    rows += [{"round": 2, "stage": "L2", **_client(c, *v)} for c, v in enumerate(l2)]
    rows.append({"round": 2, "stage": "failure", "phase": "fit", "client": 9, "error": "boom"})
    if g is not None:
        rows += [{"round": 1, "stage": "G", "acc": 0.99}, {"round": 2, "stage": "G", "acc": g}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recorded = {} if code is None else {"code": code}
    if status == "completed":
        summary = {"status": "completed", "final_round": 2, **recorded}
        (path / "summary.json").write_text(json.dumps(summary))
    elif status == "failed":
        summary = {"status": "failed", "error": "E: bad", **recorded}
        (path / "summary.json").write_text(json.dumps(summary))
    elif status == "interrupted":
        summary = {"status": "failed", "error": "interrupted by SIGTERM", **recorded}
        (path / "summary.json").write_text(json.dumps(summary))
    return path


FEDAVG = {"name": "fedavg", "aggregation": "uniform"}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """FedAvg over two seeds (hand-computed below), plus runs that must not be averaged in."""
    root = tmp_path / "sweep"
    # seed 0: L1 Acc(L) (0.8 + 0.6)/2 = 0.7, Acc(G) 0.6, losses 0.2/0.6 (var 0.04); L2 present.
    write_run(
        root / "0",
        0,
        FEDAVG,
        [(0.8, 0.5, 0.2), (0.6, 0.7, 0.6)],
        [(1.0, 0.3, 0.1), (0.9, 0.2, 0.3)],
        0.65,
    )
    # seed 1: L1 Acc(L) 0.8, Acc(G) 0.6, losses 0.4/0.4 (var 0); no L2 rows.
    write_run(root / "1", 1, FEDAVG, [(0.9, 0.6, 0.4), (0.7, 0.6, 0.4)], g=0.55)
    write_run(root / "2", 2, FEDAVG, [(0.1, 0.1, 9.0)], g=0.1, status="failed")
    write_run(root / "3", 3, FEDAVG, [(0.1, 0.1, 9.0)], g=0.1, status="incomplete")
    write_run(root / "5", 4, FEDAVG, [(0.1, 0.1, 9.0)], g=0.1, status="interrupted")
    # Differs in train.lr only: its own experiment, in its own section.
    write_run(root / "4", 0, FEDAVG, [(0.2, 0.2, 1.0), (0.2, 0.2, 1.0)], g=0.2, lr=0.1)
    return root


def test_statistics_match_hand_computed_values(sweep: Path) -> None:
    experiments = group_runs(load_runs([sweep]))
    fedavg = next(e for e in experiments if e.config["train.lr"] == 0.05)
    cells = experiment_cells(fedavg, eps=0.65)
    expected = {
        "L1 Acc(L)": (0.75, 0.05, 2),  # mean of 0.7, 0.8; population std 0.05 (ddof 1: 0.0707)
        "L1 Acc(G)": (0.6, 0.0, 2),
        "L1 Acc": (1.35, 0.05, 2),
        "L1 rho": (1.5, 0.5, 2),  # clients with Acc(L) > 0.65: 1 (seed 0) and 2 (seed 1)
        "L1 loss var": (0.02, 0.02, 2),  # variances 0.04 and 0.0
        "L1 bottom-10%": (0.65, 0.05, 2),  # worst client of 2 (ceil(0.1 * 2) = 1): 0.6, 0.7
        "L2 Acc(L)": (0.95, 0.0, 1),  # seed 0 only
        "L2 Acc(G)": (0.25, 0.0, 1),
        "L2 Acc": (1.2, 0.0, 1),
        "G Acc(G)": (0.6, 0.05, 2),  # 0.65, 0.55
    }
    for key, (mean, std, n) in expected.items():
        cell = cells[key]
        assert (cell.mean, cell.std, cell.n) == (pytest.approx(mean), pytest.approx(std), n), key


def test_runs_kept_without_their_rows_report_their_summarys_numbers(
    sweep: Path, tmp_path: Path
) -> None:
    """The final runs stored under ``results/tuning`` keep ``summary.json`` and no
    ``metrics.jsonl``: the report reads their values from the summary's ``final`` and
    ``last10`` aggregates, the same numbers the rows give, says so, and draws no empty figure."""
    import shutil

    from pflower.results.rows import read_rows
    from pflower.results.summary import headline

    for summary_path in sweep.rglob("summary.json"):
        summary = json.loads(summary_path.read_text())
        if summary["status"] == "completed":  # the summary a run writes records its aggregates
            rows = read_rows(summary_path.parent)
            summary.update(headline(rows, 2, [0.65]))
            summary_path.write_text(json.dumps(summary))
    bare = tmp_path / "bare"
    shutil.copytree(sweep, bare)
    for rows_file in bare.rglob("metrics.jsonl"):
        rows_file.unlink()

    def cells(root: Path) -> list[dict[str, Any]]:
        return [experiment_cells(e, 0.65) for e in group_runs(load_runs([root]))]

    with_rows, without = cells(sweep), cells(bare)
    assert [sorted(c) for c in with_rows] == [sorted(c) for c in without]
    assert any("L1 Acc(L) last10" in c and "L2 rho" in c for c in without)
    for kept, read in zip(with_rows, without, strict=True):
        for key, cell in kept.items():
            assert (read[key].mean, read[key].std, read[key].n) == (
                pytest.approx(cell.mean),
                pytest.approx(cell.std, abs=1e-12),
                cell.n,
            ), key
    out = tmp_path / "out"
    assert main([str(bare), "--out", str(out), "--eps", "0.65"]) == 0
    text = (out / "report.md").read_text()
    assert "3 of the 3 completed runs keep no `metrics.jsonl`" in text
    assert "| FedAvg | 75.00 ± 5.00 (2) | 75.00 ± 5.00 (2) |" in text
    assert not (out / "plots").exists() and "![" not in text


def test_a_multi_line_error_stays_in_its_row(tmp_path: Path) -> None:
    """A failed run's error holds one line per client (and may hold a ``|``): its cell keeps
    them on the row, as ``<br>`` and ``\\|``, where raw they broke the table."""
    run = write_run(tmp_path / "runs" / "5", 5, FEDAVG, [(0.1, 0.1, 9.0)], status="failed")
    error = "Round 15: all 2 clients failed.\n  client 0: NaN | Inf\n  client 1: NaN | Inf"
    (run / "summary.json").write_text(json.dumps({"status": "failed", "error": error}))
    out = tmp_path / "out"
    assert main([str(run.parent), "--out", str(out)]) == 0
    lines = (out / "report.md").read_text().splitlines()
    (row,) = [line for line in lines if "| failed |" in line]
    assert row.endswith(
        "| failed | Round 15: all 2 clients failed.<br>  client 0: NaN \\| Inf<br>"
        "  client 1: NaN \\| Inf |"
    )
    assert "Seed: 5." in lines  # one seed: not "Seeds: 5."


def test_report_tables_csv_and_listing_of_what_varies(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main([str(sweep), "--out", str(out), "--eps", "0.65"]) == 0
    text = (out / "report.md").read_text()
    assert "6 runs (3 completed, 1 failed, 1 interrupted, 1 incomplete) in 2 experiments" in text
    assert "| `train.lr` | 0.05, 0.1 |" in text
    assert "## train.lr=0.05" in text and "## train.lr=0.1" in text
    # Two rounds: the last 10% of rounds is the final round, so both columns agree.
    twice = lambda *cells: " | ".join(c for cell in cells for c in (cell, cell))  # noqa: E731
    assert (
        f"| FedAvg | {twice('75.00 ± 5.00 (2)', '60.00 ± 0.00 (2)', '135.00 ± 5.00 (2)')} |" in text
    )
    assert (
        f"| FedAvg | {twice('95.00 ± 0.00 (1)', '25.00 ± 0.00 (1)', '120.00 ± 0.00 (1)')} |" in text
    )
    assert f"| FedAvg | {twice('60.00 ± 5.00 (2)')} |" in text
    assert "| FedAvg | 1.5 ± 0.5 (2) | 0.02 ± 0.02 (2) | 65.00 ± 5.00 (2) |" in text
    # The lr=0.1 run is reported on its own, never averaged with the others.
    assert (
        f"| FedAvg | {twice('20.00 ± 0.00 (1)', '20.00 ± 0.00 (1)', '40.00 ± 0.00 (1)')} |" in text
    )
    assert "| failed | E: bad |" in text and "| incomplete |" in text
    assert "| interrupted | interrupted by SIGTERM |" in text

    with (out / "report.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["section"], r["method"]) for r in rows] == [
        ("train.lr=0.05", "FedAvg"),
        ("train.lr=0.1", "FedAvg"),
    ]
    assert rows[0]["PATH L1 Acc(L)"] == "75.00 ± 5.00 (2)"
    assert rows[0]["PATH G Acc(G)"] == "60.00 ± 5.00 (2)"
    with (out / "report_values.csv").open() as handle:
        values = list(csv.DictReader(handle))
    l1 = next(v for v in values if v["section"] == "train.lr=0.05" and v["metric"] == "L1 Acc(L)")
    assert (float(l1["mean"]), float(l1["std"]), int(l1["n"])) == (
        pytest.approx(0.75),
        pytest.approx(0.05),
        2,
    )
    for name in ("accuracy_rounds_1.png", "client_accuracy_1.png", "accuracy_rounds_2.png"):
        assert (out / "plots" / name).stat().st_size > 0


def test_methods_are_named_by_their_distinguishing_options(tmp_path: Path) -> None:
    clients = [(0.5, 0.5, 1.0)]
    strategies = {
        "fliu": {"name": "fliu", "gamma_mode": "adaptive", "gamma": 0.5, "aggregation": "uniform"},
        "fliu10": {"name": "fliu", "gamma_mode": "fixed", "gamma": 0.1, "aggregation": "uniform"},
        "fliu25": {"name": "fliu", "gamma_mode": "fixed", "gamma": 0.25, "aggregation": "uniform"},
        "clt": {"name": "local", "aggregation": "uniform"},
        "fedavg_u": FEDAVG,
        "fedavg_w": {"name": "fedavg", "aggregation": "weighted"},
        "fedmpr": {"name": "fedmpr", "reg_stages": [1, 2, 3, 4]},  # a list-valued option
    }
    for name, strategy in strategies.items():
        write_run(tmp_path / name, 0, strategy, clients, g=None if name == "clt" else 0.5)
    experiments = group_runs(load_runs([tmp_path]))
    assert {e.section for e in experiments} == {""}
    assert [e.method for e in experiments] == [
        "FedAvg (aggregation=uniform)",
        "FedAvg (aggregation=weighted)",
        "FLIU",
        "FLIU10",
        "FLIU25",
        "FedMPR",
        "Local",
    ]
    report = write_report([tmp_path], tmp_path / "out").read_text()
    assert "| Local | - | - |" in report  # no stage G for local training


def test_last10_averages_the_evaluated_rounds_among_the_last_tenth(tmp_path: Path) -> None:
    """20 rounds: the window is rounds 19 and 20; round 18 (better) is outside it."""
    path = tmp_path / "run"
    path.mkdir()
    config = {"seed": 0, "rounds": 20, "strategy": FEDAVG, "partition": {"name": "iid"}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = []
    for round_, acc in ((18, 0.99), (19, 0.6), (20, 0.8)):
        rows += [{"round": round_, "stage": "L1", **_client(c, acc, acc / 2, 1.0)} for c in (0, 1)]
        rows.append({"round": round_, "stage": "G", "acc": acc, "loss": 1.0})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps({"status": "completed", "final_round": 20}))
    (experiment,) = group_runs(load_runs([tmp_path]))
    cells = experiment_cells(experiment, eps=0.5)
    assert cells["L1 Acc(L)"].mean == pytest.approx(0.8)
    assert cells["L1 Acc(L) last10"].mean == pytest.approx(0.7)
    assert cells["L1 Acc(G) last10"].mean == pytest.approx(0.35)
    assert cells["G Acc(G) last10"].mean == pytest.approx(0.7)


def _with_models(client: dict[str, Any], pm: float, gm: float, loss_pm: float, loss_gm: float):
    """A stage-L1 row of a client holding a personalized and a global model (HM: the better)."""
    choose_pm = pm >= gm
    return {
        **client,
        "acc_pm": pm,
        "acc_gm": gm,
        "acc_hm": pm if choose_pm else gm,
        "loss_pm": loss_pm,
        "loss_gm": loss_gm,
        "loss_hm": loss_pm if choose_pm else loss_gm,
        "hm_choice_pm": float(choose_pm),
    }


def test_pm_gm_hm_accuracy_and_fairness_per_model_type(tmp_path: Path) -> None:
    """Clients with both models: PM/GM/HM Acc(L) and loss variance each get a column (by hand:
    client 0 PM 0.9 GM 0.5 -> HM PM; client 1 PM 0.4 GM 0.8 -> HM GM), and the fairness plot has
    one point per model type; a method with one model gets its single point."""
    flame = write_run(tmp_path / "flame", 0, {"name": "flame"}, [(0.9, 0.5, 0.1), (0.4, 0.3, 0.9)])
    rows = [json.loads(line) for line in (flame / "metrics.jsonl").read_text().splitlines()]
    hybrid = {0: (0.9, 0.5, 0.1, 0.7), 1: (0.4, 0.8, 0.9, 0.3)}
    rows = [
        _with_models(r, *hybrid[r["client"]]) if r["stage"] == "L1" and r["round"] == 2 else r
        for r in rows
    ]
    (flame / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_run(tmp_path / "fedavg", 0, FEDAVG, [(0.7, 0.5, 0.2), (0.5, 0.5, 0.4)], g=0.5)
    experiments = group_runs(load_runs([tmp_path]))
    cells = experiment_cells(next(e for e in experiments if e.method == "FLAME"), eps=0.5)
    expected = {
        "L1 PM Acc(L)": 0.65,
        "L1 GM Acc(L)": 0.65,
        "L1 HM Acc(L)": 0.85,  # 0.9 (PM) and 0.8 (GM)
        "L1 PM loss var": 0.16,  # 0.1, 0.9
        "L1 GM loss var": 0.04,  # 0.7, 0.3
        "L1 HM loss var": 0.01,  # 0.1, 0.3
    }
    for key, value in expected.items():
        assert cells[key].mean == pytest.approx(value), key
    fedavg = experiment_cells(next(e for e in experiments if e.method != "FLAME"), eps=0.5)
    assert not any(" PM " in key for key in fedavg)

    from pflower.reporting.stats import model_points

    assert [m for m, _, _ in model_points(cells, "L1")] == ["PM", "GM", "HM"]
    assert [m for m, _, _ in model_points(fedavg, "L1")] == [""]
    report = write_report([tmp_path], tmp_path / "out").read_text()
    assert "### Stage L1 by model" in report and "### Stage L2 by model" not in report
    assert "| FedAvg | - | - |" in report  # FedAvg has no PM/GM/HM columns to fill
    assert (tmp_path / "out" / "plots" / "fairness.png").stat().st_size > 0


def _attacked_run(path: Path, seed: int, attack: str, fraction: float, robust: str, acc: float):
    run = write_run(path, seed, FEDAVG, [(acc, 0.5, 0.2)], g=0.5)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["attack"] = {"name": attack, "fraction": fraction}
    config["robust"] = {"name": robust}
    (run / "config.yaml").write_text(yaml.safe_dump(config))


def test_robustness_study_shares_the_attack_free_run_across_attacks(
    sweep: Path, tmp_path: Path
) -> None:
    """One attack-free run per seed (``attack=none``) gives every attack's line its point at
    fraction 0; each line's points are the seed means of its own runs, per aggregator. The report
    draws the figure and tabulates the same points; a report without attacks has neither."""
    from pflower.reporting.robustness import Line, robustness_panels
    from pflower.reporting.tables import sections

    root = tmp_path / "attacked"
    runs = [  # (attack, fraction, robust, Acc(L) of seeds 0 and 1)
        ("none", 0.2, "none", (0.9, 0.7)),  # the fraction of attack=none is ignored
        ("label_flip", 0.2, "none", (0.6, 0.6)),
        ("label_flip", 0.4, "none", (0.4, 0.2)),
        ("gaussian", 0.2, "none", (0.1, 0.1)),
        ("gaussian", 0.2, "multi_krum", (0.8, 0.8)),
        ("gaussian", 0.0, "multi_krum", (0.85, 0.85)),  # fraction 0: attack-free, any attack
    ]
    for index, (attack, fraction, robust, accuracies) in enumerate(runs):
        for seed, acc in enumerate(accuracies):
            _attacked_run(root / f"{index}_{seed}", seed, attack, fraction, robust, acc)
    panels = robustness_panels(sections(group_runs(load_runs([root])), eps=0.5), "L1")
    plain, krum = Line("FedAvg", "none", ""), Line("FedAvg", "multi_krum", "")
    means = {
        key: {line: {f: round(p.final.mean, 6) for f, p in points.items()}}
        for key, lines in panels.items()
        for line, points in lines.items()
        if line == plain
    }
    assert means == {
        ("gaussian", "PATH"): {plain: {0.0: 0.8, 0.2: 0.1}},
        ("label_flip", "PATH"): {plain: {0.0: 0.8, 0.2: 0.6, 0.4: 0.3}},
    }
    assert panels["gaussian", "PATH"][krum][0.0].final.mean == pytest.approx(0.85)
    assert krum not in panels["label_flip", "PATH"]  # no Multi-Krum run under label flipping
    free = panels["label_flip", "PATH"][plain][0.0]
    assert (free.final.std, free.final.n) == (pytest.approx(0.1), 2)
    assert free.last10 is not None and free.last10.mean == pytest.approx(0.8)  # round 2 of 2

    report = write_report([root], tmp_path / "out").read_text()
    assert "## Across sections\n\n![robustness](plots/robustness.png)" in report
    assert (tmp_path / "out" / "plots" / "robustness.png").stat().st_size > 0
    assert (
        "| label_flip | PATH | FedAvg | 80.00 ± 10.00 (2) / 80.00 ± 10.00 (2) "
        "| 60.00 ± 0.00 (2) / 60.00 ± 0.00 (2) | 30.00 ± 10.00 (2) / 30.00 ± 10.00 (2) |"
    ) in report
    assert (
        "| gaussian | PATH | FedAvg + multi_krum | 85.00 ± 0.00 (2) / 85.00 ± 0.00 (2) " in report
    )
    plain_report = write_report([sweep], tmp_path / "plain").read_text()
    assert "Across sections" not in plain_report
    assert not (tmp_path / "plain" / "plots" / "robustness.png").exists()


def test_cost_columns_seconds_per_round_and_megabytes(tmp_path: Path) -> None:
    """s/round is the median gap between rounds' aggregations (start-up left out); MB down/up the
    mean array bytes per client and round of the L2 rows."""
    path = write_run(tmp_path / "run", 0, FEDAVG, [(0.5, 0.5, 1.0)], [(0.9, 0.1, 0.3)] * 2, g=0.5)
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["stage"] != "time"]
    rows += [{"round": r, "stage": "time", "fit_done_unix_s": t} for r, t in ((1, 10.0), (2, 12.0))]
    rows += [{"round": 3, "stage": "time", "fit_done_unix_s": 15.0}]
    for r in rows:
        if r["stage"] == "L2":
            r.update(bytes_down=2_000_000 * (r["client"] + 1), bytes_up=1_000_000)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (experiment,) = group_runs(load_runs([tmp_path]))
    cells = experiment_cells(experiment, eps=0.5)
    assert cells["seconds per round"].mean == pytest.approx(2.5)  # median of 2.0 and 3.0
    assert cells["MB down"].mean == pytest.approx(3.0)  # clients 0 and 1: 2 and 4 MB
    assert cells["MB up"].mean == pytest.approx(1.0)
    report = write_report([tmp_path], tmp_path / "out").read_text()
    assert (
        "### Cost: seconds per round" in report and "| FedAvg | 2.5 ± 0 (1) | 3 ± 0 (1) |" in report
    )


def test_a_key_added_later_counts_as_its_default(tmp_path: Path) -> None:
    """A run recorded before ``eval.unseen_fraction`` existed and one with its default (0.0) are
    seeds of one experiment; a run with another value is not."""
    write_run(tmp_path / "old", 0, FEDAVG, [(0.6, 0.5, 0.2)], g=0.5)
    for name, seed, fraction in (("new", 1, 0.0), ("held_out", 1, 0.2)):
        run = write_run(tmp_path / name, seed, FEDAVG, [(0.8, 0.5, 0.2)], g=0.5)
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["eval"] = {"unseen_fraction": fraction}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    experiments = group_runs(load_runs([tmp_path]))
    assert sorted(len(e.runs) for e in experiments) == [1, 2]
    (pair,) = [e for e in experiments if len(e.runs) == 2]
    assert pair.section == "eval.unseen_fraction=0"


def test_block_keys_added_later_count_as_their_defaults(tmp_path: Path) -> None:
    """``split.evaluate_on`` and FedDyn's ``report`` were added after runs were recorded: a run
    without them and one with their defaults are seeds of one experiment, other values not."""
    feddyn = {"name": "feddyn", "aggregation": "uniform", "alpha": 0.01}
    write_run(tmp_path / "old", 0, feddyn, [(0.6, 0.5, 0.2)], g=0.5)
    cases = [("new", {"report": "average"}, "test"), ("server", {"report": "server"}, "test")]
    cases.append(("tuning", {"report": "average"}, "val"))
    for name, extra, evaluate_on in cases:
        run = write_run(tmp_path / name, 1, {**feddyn, **extra}, [(0.8, 0.5, 0.2)], g=0.5)
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["split"] = {**config.get("split", {}), "evaluate_on": evaluate_on}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    experiments = group_runs(load_runs([tmp_path]))
    assert sorted(len(e.runs) for e in experiments) == [1, 1, 2]
    (pair,) = [e for e in experiments if len(e.runs) == 2]
    assert sorted(run.seed for run in pair.runs) == [0, 1]


def test_the_report_names_the_code_that_made_its_runs(tmp_path: Path) -> None:
    old = {"fingerprint": "aaaa", "commit": "1" * 40, "dirty": False}
    new = {"fingerprint": "bbbb", "commit": "2" * 40, "dirty": True}
    clients = [(0.5, 0.5, 1.0)]
    write_run(tmp_path / "one" / "0", 0, FEDAVG, clients, code=old)
    write_run(tmp_path / "one" / "1", 1, FEDAVG, clients, code=old, status="failed")
    text = write_report([tmp_path / "one"], tmp_path / "out1").read_text()
    assert "Code: every run was made with pflower `aaaa`, commit 111111111111." in text

    write_run(tmp_path / "mixed" / "0", 0, FEDAVG, clients, code=old)
    write_run(tmp_path / "mixed" / "1", 1, FEDAVG, clients, code=new)
    write_run(tmp_path / "mixed" / "2", 2, FEDAVG, clients)  # made before pflower recorded it
    text = write_report([tmp_path / "mixed"], tmp_path / "out2").read_text()
    assert (
        "Code: the runs were made with 2 version(s) of pflower: `aaaa`, commit 111111111111 "
        "(1 runs); `bbbb`, commit 222222222222 with uncommitted changes (1 runs); not recorded "
        "(1 runs: incomplete, or made before pflower did)."
    ) in text


def test_the_report_warns_when_runs_scored_validation_shares(tmp_path: Path) -> None:
    clients = [(0.5, 0.5, 1.0)]
    write_run(tmp_path / "test" / "0", 0, FEDAVG, clients)
    assert "validation shares" not in write_report([tmp_path / "test"], tmp_path / "o1").read_text()
    tuning = write_run(tmp_path / "tuning" / "0", 0, FEDAVG, clients)
    config = yaml.safe_load((tuning / "config.yaml").read_text())
    config["split"] = {**config.get("split", {}), "val_fraction": 0.2, "evaluate_on": "val"}
    (tuning / "config.yaml").write_text(yaml.safe_dump(config))
    text = write_report([tmp_path / "test", tmp_path / "tuning"], tmp_path / "o2").read_text()
    assert "**1 of 2 runs scored the clients' validation shares, not their test shares**" in text


def test_a_run_that_went_on_without_a_client_is_listed(tmp_path: Path) -> None:
    """A completed run that rejected a diverged client's replies stays in the tables, and a
    section under them names it, the replies and the client its final mean left out."""
    write_run(tmp_path / "0", 0, FEDAVG, [(0.8, 0.5, 0.2), (0.6, 0.7, 0.6)], g=0.6)
    run = write_run(tmp_path / "1", 1, FEDAVG, [(0.9, 0.6, 0.4)], g=0.55)
    nan = "metric loss_local=nan is not finite"
    failures = [
        {"round": 2, "stage": "failure", "phase": "fit", "client": 1, "error": "array 0 is NaN"},
        {"round": 2, "stage": "failure", "phase": "evaluate", "client": 1, "error": nan},
    ]
    summary = {"status": "completed", "final_round": 2, "failures": failures}
    summary["final"] = {"L1": {"num_clients": 1}}
    (run / "summary.json").write_text(json.dumps(summary))
    text = write_report([tmp_path], tmp_path / "out").read_text()
    assert "2 runs (2 completed" in text and "80.00 ± 10.00 (2)" in text  # both in the tables
    assert "## Completed runs without some clients' replies (in the tables)" in text
    assert (
        f"| `{run}` | FedAvg | PATH | 1 | 2 client replies rejected or lost in round 2 (1 fit, "
        "1 evaluate; first: client 1, array 0 is NaN); its final accuracy is the mean of the 1 "
        "clients that replied, 1 left out |"
    ) in text
    assert f"`{tmp_path / '0'}`" not in text.split("without some clients' replies")[1]
