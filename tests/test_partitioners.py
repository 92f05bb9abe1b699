"""Property tests of every partition scheme on random label arrays, plus the rounding machinery."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr_datasets.partitioner import Partitioner
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pflower.compose import group_block, group_options
from pflower.datasets.base import DatasetNotFoundError, resolve_data_root
from pflower.datasets.idx import idx_source, read_idx
from pflower.datasets.partitioners import (
    PARTITIONERS,
    IndexPartitioner,
    Partition,
    TestAwarePartitioner,
    build_partitioner,
    partition_labels,
    shares_samples,
    to_hf_dataset,
)
from pflower.datasets.partitioners.allocation import largest_remainder, round_matrix
from pflower.datasets.partitioners.sinkhorn import sinkhorn
from pflower.datasets.sources import locate
from pflower.registry import ConfigError

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
CONF = Path(__file__).resolve().parents[1] / "conf"

SCHEMES = {
    "iid",
    "stratified_iid",
    "pathological",
    "shards",
    "dirichlet",
    "ls",
    "qs",
    "lsqs",
    "class_groups",
    "q_label_skew",
    "dir_label_skew",
    "quality_skew",
    "dir_quantity_skew",
    "feature_skew",
    "hybrid_skew",
    "attribute_groups",
    "natural",
    "pflib_pathological",
    "pflib_practical",
    "diversifed_pathological",
    "diversifed_dirichlet",
    "diversifed_practical",
}
SMALL_OPTIONS: dict[str, dict[str, Any]] = {
    "dir_quantity_skew": {"min_size": 2},
    "hybrid_skew": {"min_size": 2, "q": 1},
    "qs": {"min_size": 2},
    "lsqs": {"min_size": 2},
    "dirichlet": {"min_size": 1},
    "dir_label_skew": {"min_size": 1},
    "pflib_practical": {"least_samples": 1},
    "diversifed_pathological": {"train_size": 6, "test_size": 2},
    "diversifed_dirichlet": {"train_size": 6, "test_size": 2},
    "diversifed_practical": {"train_size": 6, "test_size": 2, "num_groups": 2},
}
"""Options that make each scheme feasible on the small random data of these tests."""
RANDOM_SCHEMES = SCHEMES - {
    "quality_skew",
    "feature_skew",
    "class_groups",
    "attribute_groups",
    "natural",
}
"""Schemes whose partition changes with the seed (the others are deterministic by design)."""


def random_labels(n: int, num_classes: int, seed: int) -> np.ndarray:
    """``n`` labels over ``num_classes`` classes with skewed class frequencies."""
    rng = np.random.default_rng(seed)
    return rng.choice(num_classes, n, p=rng.dirichlet(np.full(num_classes, 2.0)))


@st.composite
def problems(
    draw: st.DrawFn, min_classes: int = 2, max_clients: int = 20
) -> tuple[np.ndarray, int, int]:
    """(labels, num_clients, seed): 50-2000 samples, 2-20 classes, 2-20 clients."""
    n = draw(st.integers(50, 2000))
    labels = random_labels(n, draw(st.integers(min_classes, 20)), draw(st.integers(0, 2**31)))
    return labels, draw(st.integers(2, max_clients)), draw(st.integers(0, 2**31))


def run(name: str, labels: np.ndarray, clients: int, seed: int = 0, **options: Any) -> Partition:
    groups = options.pop("groups", None)
    test_labels = options.pop("test_labels", None)
    return partition_labels(
        {"name": name, **options}, clients, seed, labels, groups=groups, test_labels=test_labels
    )


def check_shares(
    shares: tuple[np.ndarray, ...], n: int, clients: int, *, disjoint: bool, complete: bool
) -> None:
    """One non-empty share per client, valid positions, no repeats within a client; optionally no
    sample in two clients and every sample assigned."""
    assert len(shares) == clients
    for share in shares:
        assert len(share) > 0
        assert share.min() >= 0 and share.max() < n
        assert len(np.unique(share)) == len(share)
    everything = np.concatenate(shares)
    if disjoint:
        assert len(np.unique(everything)) == len(everything)
    if complete:
        assert set(everything.tolist()) == set(range(n))


def shares_or_refusal(
    name: str, labels: np.ndarray, clients: int, seed: int, reason: str, **options: Any
) -> tuple[np.ndarray, ...] | None:
    """The training shares of ``run``, or ``None`` where the scheme refused the problem with a
    ConfigError that names ``reason`` (a draw budget or size rule that this problem cannot meet)."""
    try:
        return run(name, labels, clients, seed, **options).train
    except ConfigError as error:
        assert reason in str(error)
        return None


def shares_of_min_size(
    name: str, problem: tuple[np.ndarray, int, int], reason: str, min_size: int, **options: Any
) -> tuple[np.ndarray, ...] | None:
    """The shares of ``name`` with ``min_size`` samples or more each, checked valid: disjoint and
    complete, unless ``disjoint=False`` is among the options (then neither is required). ``None``
    where the scheme refused the problem naming ``reason``."""
    labels, clients, seed = problem
    shares = shares_or_refusal(name, labels, clients, seed, reason, min_size=min_size, **options)
    if shares is not None:
        disjoint = options.get("disjoint", True)
        check_shares(shares, len(labels), clients, disjoint=disjoint, complete=disjoint)
        assert min(len(share) for share in shares) >= min_size
    return shares


def counts_matrix(labels: np.ndarray, shares: tuple[np.ndarray, ...]) -> np.ndarray:
    width = int(labels.max()) + 1
    return np.stack([np.bincount(labels[share], minlength=width) for share in shares])


def classes_held(labels: np.ndarray, share: np.ndarray) -> set[int]:
    return set(np.unique(labels[share]).tolist())


FILE_SCHEMES = {"from_file"}
"""Schemes that read a partition from a file (tested in tests/test_split_partition_files.py)."""


def test_registry_holds_every_scheme_and_every_config_builds() -> None:
    assert set(PARTITIONERS.names) == SCHEMES | FILE_SCHEMES
    names = group_options("partition")
    assert set(names) == SCHEMES | FILE_SCHEMES
    for name in names:
        if name in FILE_SCHEMES:
            continue
        block = group_block("partition", name)
        assert block["name"] == name
        assert isinstance(build_partitioner(block, 4, 0), Partitioner)


def test_load_partition_selects_the_rows_of_each_client() -> None:
    """The Flower Datasets interface returns the same rows as the index fast path."""
    labels = random_labels(300, 5, 0)
    for name, extra in (
        ("ls", {}),
        ("diversifed_pathological", SMALL_OPTIONS["diversifed_pathological"]),
    ):
        partitioner = build_partitioner({"name": name, **extra}, 4, 0)
        partitioner.dataset = to_hf_dataset(labels)
        if isinstance(partitioner, TestAwarePartitioner):
            partitioner.test_dataset = to_hf_dataset(labels[:100])
            rows = partitioner.load_test_partition(2)
            np.testing.assert_array_equal(rows["index"][:], partitioner.test_partition_indices(2))
        assert isinstance(partitioner, IndexPartitioner)
        for pid in range(4):
            rows = partitioner.load_partition(pid)
            np.testing.assert_array_equal(rows["index"][:], partitioner.partition_indices(pid))
            np.testing.assert_array_equal(
                rows["label"][:], labels[partitioner.partition_indices(pid)]
            )


# --- machinery ---------------------------------------------------------------------------------


@SETTINGS
@given(
    st.integers(1, 30),
    st.integers(1, 15),
    st.floats(0.05, 5.0),
    st.integers(0, 2**31),
)
def test_round_matrix_keeps_column_sums_and_rounds_entries_and_rows(
    clients: int, classes: int, alpha: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    columns = rng.integers(0, 500, classes)
    real = rng.dirichlet(np.full(clients, alpha), size=classes).T * columns
    counts = round_matrix(real)
    np.testing.assert_array_equal(counts.sum(axis=0), columns)  # integerization loses no sample
    assert np.all(np.abs(counts - real) < 1 + 1e-9)
    rows = real.sum(axis=1)
    totals = counts.sum(axis=1)
    assert np.all(totals >= np.floor(rows + 1e-9)) and np.all(totals <= np.ceil(rows - 1e-9))


def test_largest_remainder_breaks_ties_to_the_lower_index() -> None:
    np.testing.assert_array_equal(largest_remainder(np.array([1.5, 1.5, 1.0]), 4), [2, 1, 1])
    with pytest.raises(ValueError, match="cannot round"):
        largest_remainder(np.array([1.0, 1.0]), 5)


@SETTINGS
@given(st.integers(1, 30), st.integers(1, 20), st.floats(0.01, 10.0), st.integers(0, 2**31))
def test_sinkhorn_meets_row_and_column_marginals(
    rows: int, columns: int, alpha: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    matrix = rng.dirichlet(np.full(columns, alpha), size=rows)
    column_targets = rng.integers(1, 1000, columns).astype(float)
    row_targets = rng.dirichlet(np.ones(rows)) * column_targets.sum() + 1e-3
    row_targets *= column_targets.sum() / row_targets.sum()
    scaled = sinkhorn(matrix, row_targets, column_targets)
    np.testing.assert_allclose(scaled.sum(axis=0), column_targets, rtol=1e-9)
    np.testing.assert_allclose(scaled.sum(axis=1), row_targets, rtol=1e-6)
    assert np.all(scaled > 0)


def test_sinkhorn_refuses_inconsistent_totals() -> None:
    with pytest.raises(ValueError, match="sum to"):
        sinkhorn(np.ones((2, 2)), np.array([1.0, 1.0]), np.array([1.0, 2.0]))


# --- every scheme: structure, determinism, refusals ---------------------------------------------


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_every_scheme_gives_valid_shares_or_a_clear_refusal(name: str) -> None:
    """On random problems a scheme either returns valid shares or refuses with a ConfigError."""

    @settings(max_examples=12, deadline=None, derandomize=True)
    @given(problems())
    def check(problem: tuple[np.ndarray, int, int]) -> None:
        labels, clients, seed = problem
        rng = np.random.default_rng(seed)
        options = dict(SMALL_OPTIONS.get(name, {}))
        options["groups"] = rng.integers(0, 40, len(labels))
        options["test_labels"] = random_labels(len(labels) // 2 + 10, 20, seed)
        try:
            result = run(name, labels, clients, seed, **options)
        except ConfigError as error:
            assert name in str(error)
            return
        # a scheme that does not declare sample sharing must deal every sample at most once:
        # the federation builder relies on it to keep test samples out of training
        block = {"name": name, **SMALL_OPTIONS.get(name, {})}
        overlap = shares_samples(build_partitioner(block, clients, seed))
        check_shares(result.train, len(labels), clients, disjoint=not overlap, complete=False)

    check()


SHARING_SCHEMES = {
    "dir_label_skew",
    "dir_quantity_skew",
    "hybrid_skew",
    "diversifed_pathological",
    "diversifed_dirichlet",
    "diversifed_practical",
}
"""The schemes with a ``disjoint`` option; ``disjoint: false`` lets clients share samples."""


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_sample_sharing_is_declared_exactly_by_disjoint_false(name: str) -> None:
    block = group_block("partition", name)
    assert ("disjoint" in block) == (name in SHARING_SCHEMES)
    for disjoint in (True, False) if name in SHARING_SCHEMES else (None,):
        if disjoint is not None:
            block["disjoint"] = disjoint
        assert shares_samples(build_partitioner(block, 4, 0)) == (disjoint is False)


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_same_seed_same_partition_and_other_seed_another(name: str) -> None:
    labels = random_labels(1200, 6, 1)
    options = {
        **SMALL_OPTIONS.get(name, {}),
        "groups": np.arange(1200) % (6 if name == "natural" else 12),  # natural: one per client
        "test_labels": random_labels(600, 6, 2),
    }
    first = run(name, labels, 6, 7, **dict(options))
    again = run(name, labels, 6, 7, **dict(options))
    other = run(name, labels, 6, 8, **dict(options))
    for a, b in zip(first.train, again.train, strict=True):
        np.testing.assert_array_equal(a, b)
    differs = any(
        not np.array_equal(np.sort(a), np.sort(b))
        for a, b in zip(first.train, other.train, strict=True)
    )
    assert differs == (name in RANDOM_SCHEMES)


@pytest.mark.parametrize("name", sorted(SCHEMES - {"feature_skew", "attribute_groups"}))
def test_more_clients_than_samples_is_refused(name: str) -> None:
    labels = np.array([0, 1, 0, 1, 2])
    with pytest.raises(ConfigError, match=name):
        run(name, labels, 6, test_labels=labels, **SMALL_OPTIONS.get(name, {}))


@pytest.mark.parametrize(
    ("name", "option"),
    [
        ("dirichlet", "alpha"),
        ("ls", "alpha"),
        ("qs", "alpha"),
        ("lsqs", "alpha"),
        ("dir_label_skew", "beta"),
        ("dir_quantity_skew", "beta"),
        ("hybrid_skew", "beta"),
        ("pflib_practical", "beta"),
        ("diversifed_dirichlet", "alpha"),
    ],
)
@pytest.mark.parametrize("value", [0.0, -1.0])
def test_non_positive_concentration_is_refused(name: str, option: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"{option} must be > 0"):
        run(name, random_labels(200, 4, 0), 4, **{option: value})


@pytest.mark.parametrize(
    ("name", "option"),
    [
        ("pathological", "classes_per_client"),
        ("q_label_skew", "q"),
        ("pflib_pathological", "classes_per_client"),
        ("diversifed_pathological", "classes_per_client"),
    ],
)
def test_more_classes_per_client_than_classes_is_refused(name: str, option: str) -> None:
    labels = np.arange(300) % 3
    for extra in ({}, {"assignment": "random"}) if name == "pathological" else ({},):
        with pytest.raises(ConfigError, match=r"only 3 classes; allowed: 1\.\.3|dataset=3\."):
            run(name, labels, 4, test_labels=labels, **{option: 4, **extra})


def test_configuration_mistakes_are_refused_with_the_allowed_values() -> None:
    labels = random_labels(200, 4, 0)
    with pytest.raises(ConfigError, match="Valid names: attribute_groups"):
        run("nope", labels, 4)
    with pytest.raises(ConfigError, match=r"does not take 'alpah'\. Allowed keys: alpha"):
        run("ls", labels, 4, alpah=1.0)
    with pytest.raises(ConfigError, match="run-level keys"):
        partition_labels({"name": "iid", "seed": 3}, 4, 0, labels)
    with pytest.raises(ConfigError, match="'balanced' or 'random'"):
        run("pathological", labels, 4, assignment="even")
    with pytest.raises(ConfigError, match="needs per-sample group ids"):
        run("feature_skew", labels, 4)
    with pytest.raises(ConfigError, match="at most 4 clients"):
        run("class_groups", np.arange(100) % 4, 5)
    with pytest.raises(ConfigError, match="need 400 samples, only 200"):
        run("qs", labels, 40, min_size=10)


# --- scheme-specific properties -----------------------------------------------------------------


@SETTINGS
@given(problems())
def test_iid_equal_sizes_and_complete(problem: tuple[np.ndarray, int, int]) -> None:
    labels, clients, seed = problem
    shares = run("iid", labels, clients, seed).train
    check_shares(shares, len(labels), clients, disjoint=True, complete=True)
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1


@SETTINGS
@given(problems())
def test_stratified_iid_splits_every_class_evenly(problem: tuple[np.ndarray, int, int]) -> None:
    labels, clients, seed = problem
    shares = run("stratified_iid", labels, clients, seed).train
    check_shares(shares, len(labels), clients, disjoint=True, complete=True)
    counts = counts_matrix(labels, shares)
    assert np.all(counts.max(axis=0) - counts.min(axis=0) <= 1)
    assert counts.sum(axis=1).max() - counts.sum(axis=1).min() <= 1


@SETTINGS
@given(problems(), st.integers(1, 4))
def test_pathological_balanced_holds_k_classes_each_held_equally(
    problem: tuple[np.ndarray, int, int], k: int
) -> None:
    labels, clients, seed = problem
    num_classes = len(np.unique(labels))
    assume(k <= num_classes)
    holders_max = math.ceil(clients * k / num_classes)
    assume(np.bincount(labels).min(initial=len(labels)) >= holders_max)
    shares = run("pathological", labels, clients, seed, classes_per_client=k).train
    held = [classes_held(labels, share) for share in shares]
    assert all(len(classes) == k for classes in held)
    holders = np.bincount([c for classes in held for c in classes], minlength=labels.max() + 1)
    present = holders[np.unique(labels)]
    # each class held by K*k/L clients (2K/L for k = 2), floor or ceiling when not an integer
    assert present.min() >= math.floor(clients * k / num_classes)
    assert present.max() <= holders_max
    complete = clients * k >= num_classes
    check_shares(shares, len(labels), clients, disjoint=True, complete=complete)
    for label in np.unique(labels):  # a class is split evenly among its holders
        per_holder = [int((labels[share] == label).sum()) for share in shares]
        per_holder = [count for count in per_holder if count]
        assert max(per_holder, default=0) - min(per_holder, default=0) <= 1


@SETTINGS
@given(problems(max_clients=10), st.integers(1, 3))
def test_pathological_random_holds_k_classes_and_drops_undrawn(
    problem: tuple[np.ndarray, int, int], k: int
) -> None:
    labels, clients, seed = problem
    assume(k <= len(np.unique(labels)))
    assume(np.bincount(labels).min(initial=len(labels)) >= clients)
    shares = run("pathological", labels, clients, seed, classes_per_client=k, assignment="random")
    held = [classes_held(labels, share) for share in shares.train]
    assert all(len(classes) == k for classes in held)
    check_shares(shares.train, len(labels), clients, disjoint=True, complete=False)
    assigned = set(labels[np.concatenate(shares.train)].tolist())
    assert assigned == set().union(*held)  # classes nobody drew are not assigned at all
    for label in assigned:  # every drawn class is used completely
        assert sum(int((labels[share] == label).sum()) for share in shares.train) == int(
            (labels == label).sum()
        )


@SETTINGS
@given(problems(), st.integers(1, 3))
def test_shards_gives_equal_shard_counts(problem: tuple[np.ndarray, int, int], per: int) -> None:
    labels, clients, seed = problem
    shares = run("shards", labels, clients, seed, shards_per_client=per).train
    check_shares(shares, len(labels), clients, disjoint=True, complete=False)
    size = len(labels) // (clients * per)
    assert all(len(share) == per * size for share in shares)


@SETTINGS
@given(problems(), st.floats(0.1, 10.0))
def test_dirichlet_is_complete_and_respects_min_size(
    problem: tuple[np.ndarray, int, int], alpha: float
) -> None:
    # "attempts": the min-size rule failed after the allowed redraws
    shares_of_min_size("dirichlet", problem, "attempts", 3, alpha=alpha)


@SETTINGS
@given(problems(), st.floats(0.05, 5.0))
def test_ls_equal_sizes_up_to_one_and_complete(
    problem: tuple[np.ndarray, int, int], alpha: float
) -> None:
    labels, clients, seed = problem
    shares = run("ls", labels, clients, seed, alpha=alpha).train
    check_shares(shares, len(labels), clients, disjoint=True, complete=True)
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1


@SETTINGS
@given(problems(), st.floats(0.3, 5.0))
def test_qs_keeps_global_class_proportions(
    problem: tuple[np.ndarray, int, int], alpha: float
) -> None:
    assume(len(problem[0]) >= 2 * problem[1])
    shares = shares_of_min_size("qs", problem, "draws", 2, alpha=alpha, max_draws=200)
    if shares is None:
        return
    labels = problem[0]
    counts = counts_matrix(labels, shares)
    expected = np.outer(counts.sum(axis=1), np.bincount(labels)) / len(labels)
    assert np.all(np.abs(counts - expected) < 2)  # each entry rounds q_k * N_l


@SETTINGS
@given(problems(), st.floats(0.3, 5.0))
def test_lsqs_is_complete_and_respects_min_size(
    problem: tuple[np.ndarray, int, int], alpha: float
) -> None:
    assume(len(problem[0]) >= 2 * problem[1])
    shares_of_min_size("lsqs", problem, "draws", 2, alpha=alpha, max_draws=200)


@SETTINGS
@given(problems())
def test_class_groups_are_disjoint_and_contiguous(problem: tuple[np.ndarray, int, int]) -> None:
    labels, clients, seed = problem
    classes = np.unique(labels)
    assume(clients <= len(classes))
    shares = run("class_groups", labels, clients, seed).train
    check_shares(shares, len(labels), clients, disjoint=True, complete=True)
    groups = [sorted(classes_held(labels, share)) for share in shares]
    expected = [group.tolist() for group in np.array_split(classes, clients)]
    assert groups == expected


@SETTINGS
@given(problems(), st.integers(1, 4))
def test_q_label_skew_has_at_most_q_labels(problem: tuple[np.ndarray, int, int], q: int) -> None:
    labels, clients, seed = problem
    classes = np.unique(labels)
    assume(q <= len(classes))
    assume(np.bincount(labels)[classes].min() >= math.ceil(q * clients / len(classes)))
    shares = run("q_label_skew", labels, clients, seed, q=q).train
    check_shares(shares, len(labels), clients, disjoint=True, complete=False)
    assert all(len(classes_held(labels, share)) <= q for share in shares)


@SETTINGS
@given(problems(), st.floats(0.2, 5.0))
def test_dir_label_skew_overlapping_mode_may_share_samples(
    problem: tuple[np.ndarray, int, int], beta: float
) -> None:
    # overlap across clients is allowed (FLAME's code), repeats within a client are not
    shares_of_min_size("dir_label_skew", problem, "min_size", 3, beta=beta, disjoint=False)


@SETTINGS
@given(problems(), st.floats(0.0, 1.0))
def test_quality_skew_contiguous_blocks_and_noise_std(
    problem: tuple[np.ndarray, int, int], sigma: float
) -> None:
    labels, clients, seed = problem
    result = run("quality_skew", labels, clients, seed, sigma=sigma, fixed_noise=True)
    check_shares(result.train, len(labels), clients, disjoint=True, complete=True)
    blocks = np.array_split(np.arange(len(labels)), clients)
    for expected, share in zip(blocks, result.train, strict=True):
        np.testing.assert_array_equal(share, expected)
    assert result.noise_std == pytest.approx([sigma * i / clients for i in range(clients)])
    assert result.fixed_noise


@SETTINGS
@given(problems(), st.floats(0.1, 5.0), st.booleans())
def test_dir_quantity_skew_floor_and_disjointness(
    problem: tuple[np.ndarray, int, int], beta: float, disjoint: bool
) -> None:
    labels, clients, seed = problem
    floor = len(labels) // (2 * clients)
    shares = run(
        "dir_quantity_skew", labels, clients, seed, beta=beta, min_size=floor, disjoint=disjoint
    ).train
    # disjoint: a permutation cut into pieces; otherwise FLAME's per-client draws may overlap
    check_shares(shares, len(labels), clients, disjoint=disjoint, complete=disjoint)
    assert min(len(share) for share in shares) >= floor


@SETTINGS
@given(problems(), st.integers(2, 12))
def test_feature_skew_gives_whole_consecutive_writers(
    problem: tuple[np.ndarray, int, int], writers_per_client: int
) -> None:
    labels, clients, seed = problem
    writers = writers_per_client * clients + 1
    assume(len(labels) >= 2 * writers)
    groups = np.random.default_rng(seed).permutation(np.arange(len(labels)) % writers)
    shares = run("feature_skew", labels, clients, seed, groups=groups).train
    check_shares(shares, len(labels), clients, disjoint=True, complete=False)
    for client, share in enumerate(shares):
        owned = np.unique(groups[share])
        start = client * writers_per_client
        np.testing.assert_array_equal(owned, np.arange(start, start + writers_per_client))
        assert len(share) == np.isin(groups, owned).sum()  # all samples of those writers
    assert not np.isin(groups[np.concatenate(shares)], [writers - 1]).any()  # W mod K dropped


@SETTINGS
@given(problems(), st.booleans())
def test_hybrid_skew_halves(problem: tuple[np.ndarray, int, int], disjoint: bool) -> None:
    labels, clients, seed = problem
    assume(len(labels) >= 8 * clients)
    # "shards": a class too small for the "#label = q" half
    options = {"q": 1, "min_size": 2, "disjoint": disjoint}
    shares = shares_or_refusal("hybrid_skew", labels, clients, seed, "shards", **options)
    if shares is None:
        return
    # disjoint: each half has its own samples; otherwise both halves use the whole pool
    check_shares(shares, len(labels), clients, disjoint=disjoint, complete=False)
    assert all(len(classes_held(labels, s)) == 1 for s in shares[: math.ceil(clients / 2)])


@SETTINGS
@given(problems(max_clients=6), st.booleans())
def test_attribute_groups_round_robin_and_equal_sizes(
    problem: tuple[np.ndarray, int, int], equal_sizes: bool
) -> None:
    labels, clients, seed = problem
    groups = np.random.default_rng(seed).integers(-1, 7, len(labels))  # -1 = no attribute
    assume(len(np.unique(groups[groups >= 0] % clients)) == clients)
    shares = run(
        "attribute_groups", labels, clients, seed, groups=groups, equal_sizes=equal_sizes
    ).train
    check_shares(shares, len(labels), clients, disjoint=True, complete=False)
    for client, share in enumerate(shares):
        assert np.all(groups[share] % clients == client) and np.all(groups[share] >= 0)
    if equal_sizes:
        assert len({len(share) for share in shares}) == 1
    else:
        assert sum(len(share) for share in shares) == int((groups >= 0).sum())


@SETTINGS
@given(problems(), st.integers(1, 3))
def test_pflib_pathological_class_budgets_and_groups(
    problem: tuple[np.ndarray, int, int], per_client: int
) -> None:
    labels, clients, seed = problem
    classes = np.unique(labels)
    assume(per_client <= len(classes) and clients * per_client <= len(classes) * 4)
    holders = max(1, int(clients * per_client / len(classes)))
    assume(holders * len(classes) >= clients * per_client)  # every client receives a class
    assume(np.bincount(labels)[classes].min() >= 2 * holders)
    shares = run("pflib_pathological", labels, clients, seed, classes_per_client=per_client).train
    check_shares(shares, len(labels), clients, disjoint=True, complete=False)
    assert all(len(classes_held(labels, share)) <= per_client for share in shares)
    # clients come in groups of `holders` consecutive ids that share their classes
    for start in range(0, clients - holders + 1, holders):
        group = [classes_held(labels, shares[c]) for c in range(start, start + holders)]
        assert all(held <= set().union(*group) for held in group)


@SETTINGS
@given(problems(), st.floats(0.1, 5.0))
def test_pflib_practical_balancing_and_least_samples(
    problem: tuple[np.ndarray, int, int], beta: float
) -> None:
    labels, clients, seed = problem
    try:
        shares = run("pflib_practical", labels, clients, seed, beta=beta, least_samples=2).train
    except ConfigError as error:
        assert "draws" in str(error)
        return
    check_shares(shares, len(labels), clients, disjoint=True, complete=True)
    assert min(len(share) for share in shares) >= 2


@SETTINGS
@given(problems(), st.integers(1, 3), st.booleans())
def test_diversifed_pathological_fixed_sizes_equal_class_counts(
    problem: tuple[np.ndarray, int, int], k: int, disjoint: bool
) -> None:
    labels, clients, seed = problem
    test_labels = np.random.default_rng(seed).permutation(labels)[: len(labels) // 2]
    try:
        result = run(
            "diversifed_pathological",
            labels,
            clients,
            seed,
            classes_per_client=k,
            train_size=4 * k,
            test_size=2 * k,
            disjoint=disjoint,
            test_labels=test_labels,
        )
    except ConfigError as error:
        assert "available" in str(error) or "allowed" in str(error)
        return
    assert result.test is not None
    # independent per-client draws: clients may share samples unless disjoint (spec A11)
    check_shares(result.train, len(labels), clients, disjoint=disjoint, complete=False)
    check_shares(result.test, len(test_labels), clients, disjoint=disjoint, complete=False)
    for train, test in zip(result.train, result.test, strict=True):
        assert len(train) == 4 * k and len(test) == 2 * k
        train_counts = np.unique(labels[train], return_counts=True)
        test_counts = np.unique(test_labels[test], return_counts=True)
        np.testing.assert_array_equal(train_counts[0], test_counts[0])  # same classes
        assert set(train_counts[1].tolist()) == {4} and set(test_counts[1].tolist()) == {2}


@SETTINGS
@given(problems(), st.floats(0.1, 5.0))
def test_diversifed_dirichlet_fixed_sizes_same_mix(
    problem: tuple[np.ndarray, int, int], alpha: float
) -> None:
    labels, clients, seed = problem
    try:  # equal train and test sizes: the same q_i then gives the same class counts
        result = run(
            "diversifed_dirichlet",
            labels,
            clients,
            seed,
            alpha=alpha,
            train_size=20,
            test_size=20,
            test_labels=labels,
        )
    except ConfigError as error:
        assert "available" in str(error)
        return
    assert result.test is not None
    # independent per-client draws: clients may share samples (spec A11)
    check_shares(result.train, len(labels), clients, disjoint=False, complete=False)
    for train, test in zip(result.train, result.test, strict=True):
        assert len(train) == 20 and len(test) == 20
        np.testing.assert_array_equal(
            np.bincount(labels[train], minlength=20), np.bincount(labels[test], minlength=20)
        )


def test_diversifed_practical_dominant_groups() -> None:
    labels = np.arange(9000) % 9
    result = run(
        "diversifed_practical", labels, 20, 0, test_labels=np.arange(3000) % 9, train_size=500
    )
    assert result.test is not None
    for client, (train, test) in enumerate(zip(result.train, result.test, strict=True)):
        group = [0] * 7 + [1] * 7 + [2] * 6  # 20 clients in groups 7/7/6
        group = group[client]
        dominant = {3 * group, 3 * group + 1, 3 * group + 2}
        assert np.isin(labels[train], list(dominant)).sum() == 400
        assert np.isin((np.arange(3000) % 9)[test], list(dominant)).sum() == 80


def real_mnist_train_labels() -> np.ndarray:
    """MNIST's 60,000 training labels from the data root (found as the loaders find it).

    Skips, naming the files looked for, the folder searched and how to provide them, when the
    original files are not there.
    """
    try:
        folder = locate(idx_source("mnist"), resolve_data_root(None), download=False, verify=False)
    except DatasetNotFoundError as missing:
        pytest.skip(f"real MNIST files not available. {' '.join(str(missing).split())}")
    return read_idx(folder / "train-labels-idx1-ubyte.gz").astype(np.int64)


def test_lsqs_on_real_mnist_labels() -> None:
    labels = real_mnist_train_labels()
    assert len(labels) == 60_000
    start = time.perf_counter()
    shares = run("lsqs", labels, 10, 0).train
    elapsed = time.perf_counter() - start
    check_shares(shares, len(labels), 10, disjoint=True, complete=True)
    assert min(len(share) for share in shares) >= 10
    assert elapsed < 10.0


@SETTINGS
@given(problems(max_clients=8))
def test_natural_gives_each_client_exactly_its_own_group(
    problem: tuple[np.ndarray, int, int],
) -> None:
    labels, clients, seed = problem
    ids = np.random.default_rng(seed).permutation(np.arange(clients) * 3 + 5)  # any distinct ids
    groups = np.where(np.arange(len(labels)) % 7 == 0, -1, ids[np.arange(len(labels)) % clients])
    assume(len(np.unique(groups[groups >= 0])) == clients)
    shares = run("natural", labels, clients, seed, groups=groups).train
    check_shares(shares, len(labels), clients, disjoint=True, complete=False)
    for client, share in enumerate(shares):  # ids in ascending order, every sample of the id
        np.testing.assert_array_equal(share, np.flatnonzero(groups == np.sort(ids)[client]))
    with pytest.raises(ConfigError, match=f"set num_clients={clients}"):
        run("natural", labels, clients + 1, seed, groups=groups)
