"""Ranks over several studies and paired seeds (``pflower.reporting.studies``), on hand-built
tables of final accuracies: the rank rule does not reward variance, paired seeds separate a
method that is better on every seed, the studies' luck is shown, and the figures that qualify a
ranking (detectable difference, false separation rate) are what their formulas say."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from pflower.compose import compose_config, validate
from pflower.reporting.leaderboard import compare, render
from pflower.reporting.report import main as report_main
from pflower.reporting.studies import (
    FAILED,
    Spreads,
    detectable_difference,
    difference,
    false_separation_rate,
    rank_intervals,
    scored,
    spreads,
)
from pflower.results.failures import every_client_acc, rejected_replies
from pflower.results.summary import resolved_config
from tests.helpers import fake_final_run

SEED_EFFECT = {1: -4.0, 2: 3.0, 3: -1.0, 4: 5.0, 5: -2.0}
"""How hard each final seed's partition is, for every method alike (large: seeds are paired)."""


def _method(level: float, studies: int = 3, jitter: float = 0.0, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        k: {s: level + effect + rng.normal(0, jitter) for s, effect in SEED_EFFECT.items()}
        for k in range(studies)
    }


def test_a_method_with_one_diverged_run_is_ranked_by_its_mean_not_rewarded() -> None:
    """The paired t-test rank gives a widely spread method rank 1 (nothing separates from it);
    ranked by the mean, one diverged run costs what it costs, and the interval shows the
    spread."""
    results = {"steady": _method(90.0), "close": _method(89.5), "wild": _method(91.0)}
    results["wild"][0][1] = 10.0  # one diverged final run
    ranked = {r.method: r for r in rank_intervals(results, resamples=500)}
    assert ranked["wild"].rank == 3 and ranked["steady"].rank == 1
    assert ranked["wild"].interval == (1, 3)  # but it might well be the best
    assert ranked["steady"].interval[1] <= 2


def test_paired_seeds_separate_a_method_that_is_better_on_every_seed() -> None:
    """Seed effects of +-5 points swamp a 0.5-point gap between the means, but every seed shows
    it: resampling the seeds jointly for all methods keeps the pairing, and the intervals are
    disjoint."""
    results = {"better": _method(90.5, jitter=0.05, seed=1), "worse": _method(90.0, seed=2)}
    ranked = {r.method: r for r in rank_intervals(results, resamples=500)}
    assert ranked["better"].interval == (1, 1) and ranked["worse"].interval == (2, 2)


def test_the_studies_luck_is_shown_and_a_rank_that_moves_is_marked() -> None:
    results = {"a": _method(90.0), "b": _method(90.0), "c": _method(80.0)}
    results["a"][2] = {s: v - 2.0 for s, v in results["a"][2].items()}  # an unlucky search
    ranked = {r.method: r for r in rank_intervals(results, resamples=500)}
    assert ranked["a"].study_ranks == {0: 1, 1: 1, 2: 2}
    assert ranked["a"].rank_moves_with_the_study and not ranked["c"].rank_moves_with_the_study
    assert ranked["a"].between_studies == pytest.approx(2.0)
    assert ranked["a"].study_means[2] == pytest.approx(
        90.0 + np.mean(list(SEED_EFFECT.values())) - 2
    )


def test_too_few_seeds_are_flagged() -> None:
    results = {"a": _method(90.0), "b": {0: {1: 80.0, 2: 81.0}}}
    ranked = {r.method: r for r in rank_intervals(results, resamples=200)}
    assert ranked["b"].too_few_seeds and ranked["b"].seeds == 2
    assert not ranked["a"].too_few_seeds


def test_the_detectable_difference_follows_the_paired_sample_size_formula() -> None:
    rng = np.random.default_rng(3)
    results = {m: _method(90.0, studies=1, jitter=1.0, seed=int(rng.integers(99))) for m in "ab"}
    diffs = [results["a"][0][s] - results["b"][0][s] for s in SEED_EFFECT]
    n = len(diffs)
    # the sample variance scaled to its chi-square median: a typical variance over pairs
    spread = math.sqrt(statistics.variance(diffs) * (n - 1) / stats.chi2.median(n - 1))
    expected = (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * spread
    assert detectable_difference(results) == pytest.approx(expected / math.sqrt(n))
    assert detectable_difference({"a": {0: {1: 1.0}}}) is None


def _studies(level: float, rng: np.random.Generator, between: float = 1.0) -> dict:
    """Three studies of the five paired seeds: a study effect and each run's own noise."""
    return {
        k: {s: level + shift + e + rng.normal(0, 0.5) for s, e in SEED_EFFECT.items()}
        for k, shift in enumerate(rng.normal(0, between, 3))
    }


def test_the_detectable_difference_of_several_studies_is_that_of_the_compare_test() -> None:
    """With several studies, the smallest difference that `difference` separates at 80% power
    by the sample-size formula: its variance (the per-seed differences over the seeds, each
    method's study means over its studies, each a sample variance scaled to its chi-square
    median) and its Welch-Satterthwaite degrees of freedom, for two methods alike."""
    rng = np.random.default_rng(5)
    results = {name: _studies(90.0, rng) for name in "ab"}
    per_seed = [
        statistics.fmean(results["a"][k][s] for k in range(3))
        - statistics.fmean(results["b"][k][s] for k in range(3))
        for s in SEED_EFFECT
    ]
    studies = [
        statistics.variance([statistics.fmean(results[m][k].values()) for k in range(3)])
        * 2
        / stats.chi2.median(2)
        for m in "ab"
    ]
    seeds = statistics.variance(per_seed) * 4 / stats.chi2.median(4)
    terms = [(seeds / 5, 4), (statistics.median(studies) / 3, 2)]
    terms.append(terms[1])
    variance = sum(v for v, _ in terms)
    df = variance**2 / sum(v**2 / d for v, d in terms)
    expected = (stats.t.ppf(0.975, df) + stats.t.ppf(0.8, df)) * math.sqrt(variance)
    assert detectable_difference(results) == pytest.approx(expected)


def test_a_detectable_difference_is_separated_about_as_often_as_it_says() -> None:
    """Estimated from a setting of 30 methods alike, a difference that large between two more
    is separated by `difference` in most simulated pairs: near the nominal 80% (the formula
    takes the variance as known, and three studies estimate it loosely)."""
    rng = np.random.default_rng(5)
    smallest = detectable_difference({f"m{i}": _studies(0.0, rng) for i in range(30)})
    assert smallest is not None
    separated = [
        difference(_studies(smallest, rng), _studies(0.0, rng)).separated for _ in range(500)
    ]
    assert 0.6 <= statistics.fmean(separated) <= 0.9


def test_a_settings_spreads_recover_the_parts_of_a_runs_accuracy() -> None:
    """Study effects, the seed's effect shared by every method, the seed's own effect on a
    method (the same in all its studies) and each run's remainder, recovered from many
    simulated runs of 12 methods alike."""
    rng = np.random.default_rng(11)
    seeds = 200
    shared = rng.normal(0, 2.0, seeds)
    results = {}
    for m in range(12):
        own = rng.normal(0, 0.6, seeds)
        results[f"m{m}"] = {
            k: {s: shift + shared[s] + own[s] + rng.normal(0, 0.4) for s in range(seeds)}
            for k, shift in enumerate(rng.normal(0, 1.0, 3))
        }
    spread = spreads(results)
    assert spread.remainder == pytest.approx(0.4, rel=0.1)
    assert spread.own == pytest.approx(0.6, rel=0.1)
    assert spread.shared == pytest.approx(2.0, rel=0.1)
    assert spread.within == pytest.approx(math.sqrt(2.0**2 + 0.6**2 + 0.4**2), rel=0.1)
    assert 0.5 < spread.between < 1.6  # 12 methods' spreads over 3 studies each


def test_intervals_of_equal_methods_rarely_separate_when_seeds_dominate() -> None:
    spread = Spreads(between=0.0, shared=1.0, own=0.0, remainder=1.0)
    rate = false_separation_rate(3, 5, spread, trials=60, resamples=200)
    assert 0.0 <= rate <= 0.1


def test_the_tuning_guides_error_rates_are_the_simulations() -> None:
    """The rates the tuning guide quotes for 3 studies of 5 seeds are `false_separation_rate`'s
    (its defaults, the leaderboard's), at the ratios of the studies' spread to the noise the
    guide names: all remainder, then all the seed's own effect on a method."""
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "tuning.md").read_text()
    text = " ".join(guide.split())
    ratios = (0.0, 0.3, 1.0, 3.0)
    remainder = [
        false_separation_rate(3, 5, Spreads(between=r, shared=1.0, own=0.0, remainder=1.0))
        for r in ratios
    ]
    own = [
        false_separation_rate(3, 5, Spreads(between=r, shared=1.0, own=1.0, remainder=0.0))
        for r in ratios
    ]
    quoted = (
        f"where the noise is all remainder: {remainder[0]:.1%} and {remainder[1]:.1%} where the "
        "studies differ little (a spread between studies 0 or 0.3 times it), "
        f"{remainder[2]:.1%} where the two are equal, {remainder[3]:.1%} where the studies' "
        "spread is three times the remainder's; where it is all the seed's own effect, "
        f"{min(own):.1%} to {max(own):.1%} whatever the studies' spread"
    )
    assert quoted in text, quoted


def test_the_leaderboard_of_a_suite_of_several_studies(tmp_path: Path) -> None:
    """Final runs under ``final/<method>/study_<k>/seed_<s>`` are ranked by their mean with
    intervals; the table shows each study's rank and what each study searched; the notes give
    the false separation rate, the detectable difference and the ranks that move."""
    root = tmp_path / "suite"
    setting = root / "digits"
    levels = {"fedavg": 0.80, "fedprox": 0.78, "local": 0.70}
    luck = {("fedprox", 1): 0.03}  # one lucky study: fedprox's rank moves with the study
    for method, level in levels.items():
        for study in (0, 1):
            for seed, effect in ((1, -0.02), (2, 0.01), (3, 0.03)):
                value = level + effect + luck.get((method, study), 0.0)
                fake_final_run(
                    setting / "final" / method / f"study_{study}" / f"seed_{seed}", value
                )
            chosen = {
                "params": {"train.lr": 0.01 * (study + 1)},
                "search": {"configurations": 7, "to_the_end": 2, "study": study},
            }
            path = setting / "chosen" / method / f"study_{study}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(chosen))
    suite = {"name": "tiny", "final_seeds": [1, 2, 3], "studies": 2, "tune_seeds": [0, 1000]}
    (root / "suite.yaml").write_text(yaml.safe_dump(suite))
    text, rows = render(root)
    header = rows[0]
    assert header[:3] == ["setting", "rank", "95% rank interval"]
    by_method = {row[3]: dict(zip(header, row, strict=True)) for row in rows[1:]}
    assert [row[3] for row in rows[1:]] == ["FedAvg", "FedProx", "Local"]  # by the mean
    assert by_method["FedProx"]["rank by study"] == "2/1 (moves)"
    assert by_method["Local"]["rank by study"] == "3/3"
    assert by_method["FedAvg"]["runs"] == "2 x 3"
    assert by_method["FedAvg"]["configurations (to the end)"] == "14 (4)"
    assert by_method["FedAvg"]["chosen per study"] == "0: lr=0.01; 1: lr=0.02"
    assert by_method["Local"]["95% rank interval"] == "3-3"
    # every run of every study: 78, 81, 83 twice
    assert by_method["FedAvg"]["final Acc(L) %"] == "80.67 ± 2.25"
    assert by_method["FedAvg"]["last-10% Acc(L) %"] == "80.67 ± 2.25"
    assert by_method["FedAvg"]["between studies (pts)"] == "0.00"
    assert by_method["FedProx"]["between studies (pts)"] == "3.00"
    assert "in 2 independent studies (tuning seeds [0, 1000])" in text
    assert "Ranks are tied unless a paired t-test" not in text  # another protocol's words
    assert "disjoint intervals in" in text and "Smallest difference" in text
    assert "have changed ('moves'), most first: FedAvg (1 to 2), FedProx (1 to 2)." in text
    # study ranks 1, 2, 3 and 2, 1, 3: Spearman's rho 0.5
    assert (
        "Spearman's rank correlation of the 3 methods' study ranks, for studies 0 and 1: 0.50; "
        "a method's study ranks spread over a median of 1 place, most for FedAvg (1 to 2)."
    ) in text


def test_a_failed_final_run_is_scored_zero_not_left_out_of_the_mean() -> None:
    """A failure tends to come on a hard seed; leaving it out ranks the method on the seeds it
    survived against the others' means over every seed. Scored 0, it costs what a run without
    a model costs, and the difference pairs the failed seed like any other."""
    results = {"steady": _method(90.0), "fragile": _method(90.5)}
    completed = {k: dict(runs) for k, runs in results["fragile"].items()}
    del completed[0][1]  # seed 1, the hardest (-4 points), diverged in study 0
    survived = rank_intervals({"steady": results["steady"], "fragile": completed}, 300)
    assert survived[0].method == "fragile"  # what leaving the run out would say
    fragile = scored(completed, {0: [1]})
    assert fragile[0][1] == FAILED == 0.0 and list(fragile[0]) == [1, 2, 3, 4, 5]
    ranked = rank_intervals({"steady": results["steady"], "fragile": fragile}, 300)
    assert [r.method for r in ranked] == ["steady", "fragile"]
    assert ranked[1].mean == pytest.approx((15 * 90.5 + sum(SEED_EFFECT.values()) * 3 - 86.5) / 15)
    d = difference(fragile, results["steady"])
    assert d.seeds == 5 and d.mean == pytest.approx(0.5 - 86.5 / 3 / 5)


def test_the_leaderboard_counts_a_failed_run_and_names_its_study(tmp_path: Path) -> None:
    """Runs column, means and notes of a suite of several studies with a failed final run and a
    run that left a client out of its final evaluation (scored 0 there); the same seed failing
    in two studies is two runs, each named."""
    setting = tmp_path / "suite" / "digits"
    error = "Round 15: all 20 clients failed, nothing to aggregate.\n  client 0: NaN"
    for method in ("fedavg", "apple", "fedfomo"):
        for study in (0, 1):
            for seed in (1, 2, 3):
                run = setting / "final" / method / f"study_{study}" / f"seed_{seed}"
                if (method == "apple" and seed == 3) or method == "fedfomo":
                    run.mkdir(parents=True)
                    summary = {"status": "failed", "error": error}
                    (run / "summary.json").write_text(json.dumps(summary))
                else:
                    fake_final_run(run, 0.8 + 0.01 * seed + (0.05 if method == "apple" else 0))
    short = setting / "final" / "apple" / "study_1" / "seed_2" / "summary.json"
    summary = json.loads(short.read_text())
    summary["final"]["L1"]["num_clients"] = 19
    summary["failures"] = [
        {"round": 2, "stage": "failure", "phase": phase, "client": 7, "error": "array 0 NaN"}
        for phase in ("fit", "evaluate")
    ]
    short.write_text(json.dumps(summary))
    suite = {"name": "tiny", "final_seeds": [1, 2, 3], "studies": 2, "tune_seeds": [0, 1000]}
    (tmp_path / "suite" / "suite.yaml").write_text(yaml.safe_dump(suite))
    text, rows = render(tmp_path / "suite")
    by_method = {row[3]: dict(zip(rows[0], row, strict=True)) for row in rows[1:]}
    # apple: 86, 87 in study 0, 86 and 87 x 19/20 (a client left out at 0) in study 1, and two
    # failures at 0 -> mean 56.94, below fedavg's 82
    assert [row[3] for row in rows[1:]] == ["FedAvg", "APPLE", "FedFomo"]
    # a method whose every run failed is ranked, last, not left out as "pending"
    assert by_method["FedFomo"]["final Acc(L) %"] == "0.00 ± 0.00"
    assert by_method["FedFomo"]["runs"] == "2 x 3, 6 failed (scored 0%)"
    assert "not yet" not in text
    assert by_method["APPLE"]["final Acc(L) %"] == "56.94 ± 44.13"
    assert by_method["APPLE"]["runs"] == "2 x 3, 2 failed (scored 0%), 1 short of clients"
    assert by_method["FedAvg"]["runs"] == "2 x 3"
    assert "- APPLE, study 0 seed 3: Round 15: all 20 clients failed" in text
    assert "- APPLE, study 1 seed 3: Round 15: all 20 clients failed" in text
    assert "- APPLE, study 1 seed 2: 2 client replies rejected" in text
    assert "the 19 clients that replied, 1 left out; in the means 82.65%" in text
    assert "a final run that failed (diverged) is scored 0" in text
    line = compare(tmp_path / "suite", "apple", "fedavg")[0]
    # study 0: seeds 1-2 +5, seed 3 -83; study 1: seed 2 +0.65 (82.65 - 82)
    assert line.startswith("digits: APPLE - FedAvg = -25.06 points")


def test_a_collapse_in_one_study_is_named_with_its_study(tmp_path: Path) -> None:
    """FedMPR tuned in three studies whose third chose no pruning: that study's runs are
    FedAvg's, and the row says which study; where every study collapses, the row is the base
    method."""
    setting = tmp_path / "suite" / "digits"
    off = {"prune_ratio": 0.0, "dropout": 0.0, "noise_sigma": 0.0}
    for method, ratios in (("fedmpr", (0.4, 0.2, 0.0)), ("fedprox", (None,) * 3)):
        for study, ratio in enumerate(ratios):
            overrides = [f"strategy={method}", "dataset=digits", "model=mlp"]
            if ratio is not None:
                overrides += [
                    f"strategy.{k}={ratio if k == 'prune_ratio' else v}" for k, v in off.items()
                ]
            else:
                overrides += ["strategy.mu=0"]
            config = resolved_config(compose_config(overrides))
            for seed in (1, 2, 3):
                run = setting / "final" / method / f"study_{study}" / f"seed_{seed}"
                fake_final_run(run, 0.8 + 0.01 * seed)
                summary = json.loads((run / "summary.json").read_text())
                (run / "summary.json").write_text(json.dumps({**summary, "config": config}))
            chosen = setting / "chosen" / method / f"study_{study}.yaml"
            chosen.parent.mkdir(parents=True, exist_ok=True)
            chosen.write_text(yaml.safe_dump({"params": {}, "space": {}}))
    text, rows = render(tmp_path / "suite")
    by_method = {row[3]: dict(zip(rows[0], row, strict=True)) for row in rows[1:]}
    assert by_method["FedMPR"]["collapse"] == "study 2 = FedAvg"
    assert by_method["FedProx"]["collapse"] == "= FedAvg"
    # a study whose runs all failed: the others' collapse is not the whole method's
    for seed in (1, 2, 3):
        failed = setting / "final" / "fedprox" / "study_2" / f"seed_{seed}" / "summary.json"
        failed.write_text(json.dumps({"status": "failed", "error": "Round 3: all failed"}))
    _, rows = render(tmp_path / "suite")
    by_method = {row[3]: dict(zip(rows[0], row, strict=True)) for row in rows[1:]}
    assert by_method["FedProx"]["collapse"] == "study 0 = FedAvg; study 1 = FedAvg"
    assert "- FedMPR study 2 = FedAvg (at prune_ratio=0, dropout=0, noise_sigma=0)" in text
    assert "- FedProx = FedAvg (at mu=0)" in text


def test_a_method_with_one_study_so_far_shows_no_spread_between_studies(tmp_path: Path) -> None:
    setting = tmp_path / "suite" / "digits"
    for method, studies_run in (("fedavg", (0, 1)), ("local", (0,))):
        for study in studies_run:
            for seed in (1, 2, 3):
                run = setting / "final" / method / f"study_{study}" / f"seed_{seed}"
                fake_final_run(run, 0.7 + 0.01 * seed + 0.02 * study)
    _, rows = render(tmp_path / "suite")
    by_method = {row[3]: dict(zip(rows[0], row, strict=True)) for row in rows[1:]}
    assert by_method["Local"]["runs"] == "1 x 3"
    assert by_method["Local"]["between studies (pts)"] == "-"
    assert by_method["FedAvg"]["between studies (pts)"] == "2.00"


def test_a_method_whose_studies_are_not_all_in_is_not_ranked_yet(tmp_path: Path) -> None:
    """A suite of several studies completes over several invocations; a method with only some
    of its studies' final runs would be ranked on less than the others, and its rank (and
    theirs) would move as the rest came in: it is named as in progress instead, the suite's
    listed methods and one added to its folder alike. A run that failed by itself is in
    (scored 0); an interrupted one is not."""
    suite_dir = tmp_path / "suite"
    setting = suite_dir / "digits"
    runs = {"fedavg": [(0, 1), (0, 2), (1, 1), (1, 2)], "local": [(0, 1), (0, 2), (1, 1)]}
    runs |= {"ditto": [(0, 1), (0, 2), (1, 1)], "fedper": [(0, 1), (0, 2), (1, 1)]}
    for method, done in runs.items():
        for study, seed in done:
            fake_final_run(setting / "final" / method / f"study_{study}" / f"seed_{seed}", 0.9)
    for method, status in (("ditto", "failed"), ("fedper", "interrupted")):
        run = setting / "final" / method / "study_1" / "seed_2"
        run.mkdir(parents=True)
        summary = {"status": status, "error": "diverged" if status == "failed" else None}
        (run / "summary.json").write_text(json.dumps(summary))
    suite = {"name": "tiny", "methods": ["fedavg", "local", "ditto", "fedrep"]}
    suite |= {"final_seeds": [1, 2], "studies": 2, "tune_seeds": [0, 1000]}
    (suite_dir / "suite.yaml").write_text(yaml.safe_dump(suite))
    text, rows = render(suite_dir)
    assert sorted(row[3].removesuffix(" (!)") for row in rows[1:]) == ["Ditto", "FedAvg"]
    assert (
        "2 of 4 methods are ranked; not yet: local (3 of its 4 final runs in), fedrep. "
        "Also under way: fedper (3 of its 4 final runs in)."
    ) in text
    # no final seeds recorded: those the setting's methods ran are planned
    (suite_dir / "suite.yaml").write_text(yaml.safe_dump({**suite, "final_seeds": []}))
    assert "local (3 of its 4 final runs in)" in render(suite_dir)[0]
    # a setting with nothing all in yet: no table, and the CSV's header is the studies' one
    for method in ("fedavg", "ditto"):
        shutil.rmtree(setting / "final" / method / "study_1")
    text, rows = render(suite_dir)
    assert rows == [["setting", *rows[0][1:]]] and "rank interval" in rows[0][2]
    assert "| rank |" not in text and "0 of 4 methods are ranked" in text


def test_a_difference_of_one_study_each_is_the_paired_t_test_over_the_seeds() -> None:
    first = {0: {1: 0.90, 2: 0.93, 3: 0.88, 4: 0.95, 5: 0.91}}
    second = {0: {1: 0.89, 2: 0.93, 3: 0.86, 4: 0.94, 5: 0.92}}
    d = difference(first, second)
    a, b = (list(m[0].values()) for m in (first, second))
    paired = stats.ttest_rel(a, b)
    low, high = paired.confidence_interval(0.95)
    assert d.mean == pytest.approx(statistics.fmean(a) - statistics.fmean(b))
    assert d.p_value == pytest.approx(paired.pvalue)
    assert d.interval == pytest.approx((low, high))
    assert (d.studies, d.seeds, d.df) == ((1, 1), 5, pytest.approx(4))


def test_a_difference_counts_each_methods_studies_as_well_as_the_seeds() -> None:
    """A method whose studies found different configurations is less certain to be above
    another than its seeds alone say: the study means' variance enters the interval, with
    Welch-Satterthwaite degrees of freedom."""
    seeds = {1: -0.02, 2: 0.01, 3: 0.03, 4: -0.01, 5: 0.0}
    luck = {0: 0.0, 1: 0.02, 2: -0.01}  # the first method's studies differ
    first = {k: {s: 0.81 + e + luck[k] for s, e in seeds.items()} for k in luck}
    second = {k: {s: 0.80 + e for s, e in seeds.items()} for k in range(3)}
    d = difference(first, second)
    study_means = [0.81 + statistics.fmean(seeds.values()) + luck[k] for k in luck]
    # the per-seed differences are all equal (the seeds cancel): only the studies vary
    variance = statistics.variance(study_means) / 3
    half = stats.t.ppf(0.975, 2) * math.sqrt(variance)
    assert d.mean == pytest.approx(0.01 + statistics.fmean(luck.values()))
    assert d.df == pytest.approx(2)
    assert d.interval == pytest.approx((d.mean - half, d.mean + half))
    assert not d.separated  # the seeds alone would call it certain
    same = difference(second, second)
    assert (same.mean, same.p_value, same.separated) == (0.0, 1.0, False)
    with pytest.raises(ValueError, match="fewer than 2 final seeds"):
        difference({0: {1: 0.5}}, {0: {1: 0.4, 2: 0.4}})


def test_compare_prints_each_settings_difference_and_refuses_unknown_methods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "suite"
    for method, level in {"fedavg": 0.80, "local": 0.70}.items():
        for study in (0, 1):
            for seed, effect in ((1, -0.02), (2, 0.01), (3, 0.03)):
                run = root / "digits" / "final" / method / f"study_{study}" / f"seed_{seed}"
                fake_final_run(run, level + effect + 0.01 * study)
    assert report_main([str(root), "--compare", "fedavg,local"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("digits: FedAvg - Local = +10.00 points, 95% interval +")
    assert "(above; 2 and 2 studies, 3 paired seeds)" in line
    # a setting where the two share fewer than 2 seeds says so, and the others still print
    for seed in (2, 3):
        for study in (0, 1):
            run = root / "other" / "final" / "local" / f"study_{study}" / f"seed_{seed}"
            fake_final_run(run, 0.5)
    fake_final_run(root / "other" / "final" / "fedavg" / "study_0" / "seed_1", 0.9)
    assert report_main([str(root), "--compare", "fedavg,local"]) == 0
    out = capsys.readouterr().out
    assert "digits: FedAvg - Local = +10.00 points" in out
    assert "other: FedAvg and Local cannot be compared: the two methods share fewer" in out
    # a setting where one of the two has no final runs is named, not left out
    fake_final_run(root / "third" / "final" / "local" / "study_0" / "seed_1", 0.5)
    assert report_main([str(root), "--compare", "fedavg,local"]) == 0
    assert "third: not compared, no final runs of fedavg there" in capsys.readouterr().out
    assert report_main([str(tmp_path / "missing"), "--compare", "fedavg,local"]) == 2
    assert "is not a folder of `pflower tune` results" in capsys.readouterr().out
    assert report_main([str(root), "--compare", "fedavg,nope"]) == 2
    assert "no final runs of 'nope'" in capsys.readouterr().out
    assert report_main([str(root), "--compare", "fedavg"]) == 2
    assert "--compare takes two methods" in capsys.readouterr().out


def test_a_leaderboard_of_what_is_not_a_suite_folder_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A setting's folder, a missing folder or one without final runs: exit 2, one line that
    says what to give instead, nothing written (a setting's folder used to get a leaderboard of
    no setting; a missing one, a traceback)."""
    root = tmp_path / "suite"
    fake_final_run(root / "digits" / "final" / "fedavg" / "study_0" / "seed_1", 0.8)
    (tmp_path / "empty").mkdir()
    cases = {
        root / "digits": f"is one setting of a suite: give the suite's folder, {root}",
        tmp_path / "missing": "is not a folder of `pflower tune` results",
        tmp_path / "empty": "holds no setting with final runs",
    }
    for path, said in cases.items():
        for argv in (["--leaderboard", str(path)], [str(path), "--compare", "fedavg,local"]):
            assert report_main(argv) == 2
            out = capsys.readouterr().out
            assert said in out and out.count("\n") == 1, out
        assert not list(tmp_path.rglob("leaderboard.*"))
    assert report_main(["--leaderboard", str(root)]) == 0
    assert (root / "leaderboard.md").is_file()


def test_the_tuning_guides_compare_example_is_what_the_command_prints() -> None:
    root = Path(__file__).resolve().parents[1]
    line = compare(root / "results" / "tuning" / "cpu-v1", "diversifed", "local")[0]
    head, _, tail = line.partition(" (")
    guide = (root / "docs" / "guide" / "tuning.md").read_text()
    assert f"# {head}" in guide and f"#   ({tail}" in guide, line


def test_the_ranks_that_move_most_with_the_study_are_named_first() -> None:
    """Where most methods move, the note names those that move more than the median method,
    most first, and says how far the rest move at most (it used to list every method of the
    setting, in rank order)."""
    from pflower.reporting.studies import StudyRanks
    from pflower.reporting.studies_board import notes

    spans = {"a": (1, 2), "b": (1, 9), "c": (3, 4), "d": (4, 3), "e": (5, 5), "f": (2, 7)}
    ranked = [
        StudyRanks(method, 0.9, rank, (1, 6), {0: 0.9, 1: 0.9}, {0: s0, 1: s1}, 5)
        for rank, (method, (s0, s1)) in enumerate(spans.items(), start=1)
    ]
    text = "\n".join(notes({}, ranked, {"b": "B-method"}))
    assert (
        "('moves'), most first: B-method (1 to 9), f (2 to 7); 3 more by at most 1 place."
    ) in text


def test_a_client_left_out_of_an_evaluation_is_scored_zero() -> None:
    """A run's score over every client it evaluated: each client whose evaluation reply was
    rejected or lost counts 0, in the final round and in each round of the last-10% window, and
    a client that failed only to train is scored as it evaluated."""
    nan = "array 0 contains NaN or Inf"
    summary = {
        "final_round": 10,
        "last10_rounds": [9, 10],
        "final": {"L1": {"num_clients": 18, "acc_local": {"mean": 0.9}}},
        "last10": {"L1": {"num_clients": 18.5, "acc_local": {"mean": 0.8}}},
        "failures": [
            {"round": 9, "phase": "evaluate", "client": 3, "error": nan},
            {"round": 10, "phase": "evaluate", "client": 3, "error": nan},
            {"round": 10, "phase": "evaluate", "client": 5, "error": "timed out"},
            {"round": 10, "phase": "fit", "client": 7, "error": nan},
            {"round": 8, "phase": "evaluate", "client": 8, "error": nan},  # before the window
        ],
    }
    assert every_client_acc(summary) == pytest.approx(0.9 * 18 / 20)
    # the window: 18.5 replied and 1.5 left out per round on average
    assert every_client_acc(summary, "last10") == pytest.approx(0.8 * 18.5 / 20)
    assert rejected_replies(summary).missing_at_end == 2  # type: ignore[union-attr]
    summary["failures"] = [f for f in summary["failures"] if f["phase"] == "fit"]
    assert every_client_acc(summary) == 0.9 and every_client_acc(summary, "last10") == 0.8


def test_the_fair_comparisons_page_quotes_apples_stored_runs() -> None:
    """The page's APPLE figures come from the committed final runs of the cpu suite: the mean of
    the runs that completed, averaged over the clients that replied and with those left out at 0
    (the leaderboard's)."""
    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "concepts" / "fair-comparisons.md").read_text()
    final = root / "results" / "tuning" / "cpu" / "fmnist_dir01" / "final" / "apple"
    summaries = [
        json.loads(p.read_text()) for p in sorted(final.glob("study_*/seed_*/summary.json"))
    ]
    completed = [s for s in summaries if s["status"] == "completed"]
    replied = statistics.fmean(s["final"]["L1"]["acc_local"]["mean"] for s in completed) * 100
    counted = statistics.fmean(every_client_acc(s) for s in completed) * 100
    short = [s for s in completed if (r := rejected_replies(s)) is not None and r.missing_at_end]
    assert (len(summaries), len(completed), len(short)) == (15, 14, 5)
    assert f"APPLE's 14 other runs came to {replied:.2f}" in page
    assert f"at 0 they come to {counted:.2f}" in page


def test_a_held_out_clients_lost_reply_is_not_counted_against_l1() -> None:
    """Clients held out of training (``eval.unseen_fraction``) evaluate at stage U: their lost
    replies, told from L1's by count (those held out less stage U's replies), are not L1's
    left-out clients; the count is the run's ``num_unseen``."""
    overrides = ["dataset=digits", "num_clients=10", "eval.unseen_fraction=0.2"]
    config = resolved_config(compose_config(overrides))
    assert validate(compose_config(overrides)).num_unseen == 2
    failures = [
        {"round": 3, "phase": "evaluate", "client": client, "error": "timed out"}
        for client in (1, 4, 7)
    ]
    summary = {
        "config": config,
        "final_round": 3,
        "final": {"L1": {"num_clients": 7, "acc_local": {"mean": 0.8}}, "U": {"num_clients": 0}},
        "failures": failures,
    }
    # 3 lost: 2 held out (no stage-U reply came) and 1 of the 8 training clients
    assert every_client_acc(summary) == pytest.approx(0.8 * 7 / 8)
    assert rejected_replies(summary).missing_at_end == 1  # type: ignore[union-attr]
    summary["final"]["U"]["num_clients"] = 2  # the held-out clients replied: all 3 were L1's
    assert every_client_acc(summary) == pytest.approx(0.8 * 7 / 10)
