"""build_federation: split semantics, disjointness, indexing, determinism, noise, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pflower.compose import group_block, group_options
from pflower.datasets import builder
from pflower.datasets.base import ImageDataset, ImageSplit
from pflower.datasets.federation import Federation, InputNoise, SplitConfig, build_federation
from pflower.registry import ConfigError

CONF = Path(__file__).resolve().parents[1] / "conf"


def toy_dataset(
    n_train: int = 600,
    n_test: int = 200,
    num_classes: int = 5,
    seed: int = 0,
    train_groups: bool = False,
) -> ImageDataset:
    """Random 1x4x4 uint8 images with skewed labels; optional writer ids on the train split."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(num_classes, 3.0))

    def split(n: int, groups: bool) -> ImageSplit:
        images = torch.from_numpy(rng.integers(0, 256, (n, 1, 4, 4), dtype=np.uint8))
        labels = torch.from_numpy(rng.choice(num_classes, n, p=probs))
        tags = torch.from_numpy(rng.integers(0, 30, n)) if groups else None
        return ImageSplit(images, labels, tags)

    return ImageDataset(
        "toy", split(n_train, train_groups), split(n_test, False), num_classes, (0.5,), (0.5,)
    )


def build(
    partition: dict[str, Any] | None = None,
    split: dict[str, Any] | None = None,
    clients: int = 5,
    seed: int = 0,
    dataset: ImageDataset | None = None,
) -> Federation:
    return build_federation(
        dataset or toy_dataset(), clients, seed, partition or {"name": "iid"}, split or {}
    )


def labels_of(federation: Federation) -> np.ndarray:
    return federation.pool.labels.numpy()


def all_shares(federation: Federation) -> list[np.ndarray]:
    return [
        share for client in federation.clients for share in (client.train, client.test, client.val)
    ]


def assert_pairwise_disjoint(shares: list[np.ndarray]) -> None:
    everything = np.concatenate(shares)
    assert len(np.unique(everything)) == len(everything)


def test_default_holdout_is_stratified_disjoint_and_global_test_is_the_union() -> None:
    dataset = toy_dataset()
    federation = build({"name": "ls"}, dataset=dataset)
    labels = labels_of(federation)
    n_train = len(dataset.train)
    assert len(federation.pool) == n_train + len(dataset.test)
    assert_pairwise_disjoint(all_shares(federation))
    for client in federation.clients:
        n = len(client.train) + len(client.test)
        assert len(client.test) == n - int(np.floor(0.75 * n))  # sklearn's rule
        assert len(client.val) == 0
        assert client.train.max() < n_train and client.test.max() < n_train  # pool: train
        share = np.concatenate([client.train, client.test])
        for label in np.unique(labels[share]):  # stratified: class shares follow the client's
            expected = (labels[share] == label).sum() * len(client.test) / n
            assert abs((labels[client.test] == label).sum() - expected) < 1
    union = np.unique(np.concatenate([client.test for client in federation.clients]))
    np.testing.assert_array_equal(federation.global_test, union)
    trained = np.concatenate([c.train for c in federation.clients] + [union])
    assert len(trained) == n_train  # ls uses every training sample exactly once


def test_unstratified_holdout_matches_the_fedala_split_sizes() -> None:
    federation = build({"name": "iid"}, {"test_fraction": 0.25, "stratify": False}, clients=1)
    (client,) = federation.clients
    assert (len(client.train), len(client.test)) == (450, 150)


def test_mirror_draws_disjoint_proportional_tests_from_the_official_split() -> None:
    dataset = toy_dataset()
    federation = build({"name": "pathological", "classes_per_client": 2}, {"client_test": "mirror"})
    labels = labels_of(federation)
    n_train = len(dataset.train)
    test_counts = np.bincount(dataset.test.labels.numpy(), minlength=5)
    train = np.stack([np.bincount(labels[c.train], minlength=5) for c in federation.clients])
    assert_pairwise_disjoint(all_shares(federation))
    for k, client in enumerate(federation.clients):
        assert client.test.min() >= n_train  # official test samples only
        got = np.bincount(labels[client.test], minlength=5)
        expected = train[k] / np.maximum(train.sum(axis=0), 1) * test_counts
        assert np.all(np.abs(got - expected) < 1)  # A_test[k, l] = n_kl / N_l * M_l, rounded
    held = np.flatnonzero(train.sum(axis=0))
    used = np.isin(dataset.test.labels.numpy(), held).sum()
    assert len(federation.global_test) == used  # every test sample of a held class, once


def test_fedmpr_official_global_test_and_class_groups() -> None:
    dataset = toy_dataset()
    federation = build(
        {"name": "class_groups"}, {"client_test": "mirror", "global_test": "official"}, clients=2
    )
    n_train, n_test = len(dataset.train), len(dataset.test)
    np.testing.assert_array_equal(federation.global_test, np.arange(n_train, n_train + n_test))
    labels = labels_of(federation)
    assert set(labels[federation.clients[0].test]) <= {0, 1, 2}
    assert set(labels[federation.clients[1].test]) <= {3, 4}
    split = federation.global_test_split()
    assert torch.equal(split.images, dataset.test.images)


@pytest.mark.parametrize(
    ("partition", "split"),
    [
        ({"name": "dirichlet", "alpha": 0.5}, {}),
        ({"name": "class_groups"}, {"client_test": "mirror", "global_test": "official"}),
        ({"name": "dir_quantity_skew", "disjoint": False, "min_size": 20}, {}),
    ],
)
def test_evaluate_on_val_scores_validation_shares_and_reads_no_test_sample(
    partition: dict[str, Any], split: dict[str, Any]
) -> None:
    """Tuning mode: the same training shares as the final run with the same validation share,
    every evaluation on validation data, and not one test sample (client or global) anywhere."""
    split = {**split, "val_fraction": 0.2}
    clients = 2 if partition["name"] == "class_groups" else 5
    final = build(partition, split, clients=clients, dataset=toy_dataset(n_train=2000))
    tuning = build(
        partition, {**split, "evaluate_on": "val"}, clients=clients, dataset=toy_dataset(2000)
    )
    tests = [client.test for client in final.clients]
    for final_client, tuning_client in zip(final.clients, tuning.clients, strict=True):
        np.testing.assert_array_equal(tuning_client.train, final_client.train)
        np.testing.assert_array_equal(tuning_client.val, final_client.val)
        np.testing.assert_array_equal(tuning_client.test, final_client.val)
    np.testing.assert_array_equal(
        tuning.global_test, np.unique(np.concatenate([c.val for c in final.clients]))
    )
    read = np.concatenate([*all_shares(tuning), tuning.global_test])
    assert not np.isin(read, np.concatenate([*tests, final.global_test])).any()


def test_pool_all_indexes_train_then_test() -> None:
    dataset = toy_dataset()
    federation = build({"name": "iid"}, {"pool": "all", "test_fraction": 0.2}, clients=4)
    n_train = len(dataset.train)
    everything = np.concatenate(all_shares(federation))
    assert np.sort(everything).tolist() == list(range(len(federation.pool)))
    assert (everything >= n_train).any()
    index = int(everything[everything >= n_train][0])
    assert torch.equal(federation.pool.images[index], dataset.test.images[index - n_train])
    assert federation.pool.labels[index] == dataset.test.labels[index - n_train]


def test_quality_skew_blocks_and_noise_metadata() -> None:
    federation = build(
        {"name": "quality_skew", "sigma": 0.5},
        {"pool": "all", "test_fraction": 0.2, "stratify": False},
        clients=4,
    )
    assert federation.input_noise is not None
    assert federation.input_noise.std == pytest.approx((0.0, 0.125, 0.25, 0.375))
    assert not federation.input_noise.fixed
    blocks = np.array_split(np.arange(len(federation.pool)), 4)
    for block, client in zip(blocks, federation.clients, strict=True):
        np.testing.assert_array_equal(np.sort(np.concatenate([client.train, client.test])), block)
    assert build({"name": "iid"}).input_noise is None


def test_input_noise_apply() -> None:
    noise = InputNoise((0.0, 0.5), fixed=False, seed=3)
    images = torch.zeros(8, 1, 4, 4)
    assert noise.apply(0, images, np.arange(8)) is images  # client 0 is clean
    first = noise.apply(1, images, np.arange(8), torch.Generator().manual_seed(1))
    again = noise.apply(1, images, np.arange(8), torch.Generator().manual_seed(1))
    assert torch.equal(first, again) and 0.3 < float(first.std()) < 0.7
    fixed = InputNoise((0.0, 0.5), fixed=True, seed=3)
    batch = fixed.apply(1, images[:2], np.array([5, 9]))
    reordered = fixed.apply(1, images[:2], np.array([9, 5]))
    assert torch.equal(batch[0], reordered[1])  # the same sample gets the same noise
    assert not torch.equal(batch[0], batch[1])


def test_val_is_carved_from_train_and_disjoint() -> None:
    federation = build({"name": "dirichlet", "alpha": 1.0}, {"val_fraction": 0.2})
    assert_pairwise_disjoint(all_shares(federation))
    for client in federation.clients:
        total = len(client.train) + len(client.val)
        assert len(client.val) == total - int(np.floor(0.8 * total))
        assert len(client.train) >= 1 and len(client.val) >= 1
        split = federation.client_val(0)
        assert len(split) == len(federation.clients[0].val)


@pytest.mark.parametrize(
    ("partition", "split"),
    [
        ({"name": "dir_label_skew", "disjoint": False}, {"pool": "all", "test_fraction": 0.2}),
        ({"name": "dir_quantity_skew", "disjoint": False, "min_size": 20}, {}),
        ({"name": "hybrid_skew", "disjoint": False, "min_size": 20}, {"stratify": False}),
    ],
)
def test_sample_sharing_schemes_draw_held_out_shares_from_reserves(
    partition: dict[str, Any], split: dict[str, Any]
) -> None:
    """Overlapping shares: tests and validation come from reserves no client trains on, with
    the client's train class mix and the configured fractions."""
    split = {**split, "val_fraction": 0.1}
    fraction = split.get("test_fraction", 0.25)
    federation = build(partition, split, dataset=toy_dataset(n_train=2000, n_test=500))
    labels = labels_of(federation)
    trains = [client.train for client in federation.clients]
    trained = np.unique(np.concatenate(trains))
    assert len(trained) < sum(map(len, trains))  # the scheme still lets clients share samples
    held = np.concatenate([federation.global_test] + [c.val for c in federation.clients])
    assert not np.intersect1d(held, trained).size
    vals = np.concatenate([client.val for client in federation.clients])
    assert not np.intersect1d(federation.global_test, vals).size  # separate reserves
    for client in federation.clients:
        n = len(client.train)
        for share, part in ((client.test, fraction), (client.val, 0.1)):
            assert len(share) == max(1, round(n * part / (1 - part)))
            assert len(np.unique(share)) == len(share)
            expected = np.bincount(labels[client.train], minlength=5) * len(share) / n
            assert np.all(np.abs(np.bincount(labels[share], minlength=5) - expected) < 1)


def test_a_leaking_scheme_that_does_not_declare_sharing_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PFLOWER_CACHE", "off")  # a cached (correct) federation would hide it
    monkeypatch.setattr(builder, "shares_samples", lambda partitioner: False)
    with pytest.raises(RuntimeError, match="held-out samples leak"):
        build({"name": "dir_quantity_skew", "disjoint": False, "min_size": 20})


def test_subsample_fraction_is_stratified() -> None:
    dataset = toy_dataset()
    federation = build({"name": "iid"}, {"subsample_fraction": 0.5, "client_test": "mirror"})
    shared = np.concatenate([np.concatenate([c.train, c.test]) for c in federation.clients])
    train_part = shared[shared < len(dataset.train)]
    assert len(train_part) == 300
    full = np.bincount(dataset.train.labels.numpy(), minlength=5)
    kept = np.bincount(labels_of(federation)[train_part], minlength=5)
    assert np.all(np.abs(kept - full / 2) < 1)
    assert len(federation.global_test) == 100  # the official test split is halved too


def test_diversifed_scheme_draws_fixed_size_tests() -> None:
    dataset = toy_dataset()
    federation = build(
        {"name": "diversifed_pathological", "train_size": 30, "test_size": 10},
        {"client_test": "partitioner"},
        clients=8,
    )
    labels = labels_of(federation)
    for client in federation.clients:
        assert len(client.train) == 30 and len(client.test) == 10
        assert client.test.min() >= len(dataset.train)
        assert set(labels[client.train]) == set(labels[client.test])
    union = np.unique(np.concatenate([c.test for c in federation.clients]))
    np.testing.assert_array_equal(federation.global_test, union)  # overlaps counted once


def test_groups_reach_the_partitioner_and_test_groups_default_to_none() -> None:
    dataset = toy_dataset(train_groups=True)
    federation = build({"name": "feature_skew"}, dataset=dataset, clients=3)
    assert federation.pool.groups is not None
    assert (federation.pool.groups[len(dataset.train) :] == -1).all()
    groups = federation.pool.groups.numpy()
    writers = [set(groups[np.concatenate([c.train, c.test])]) for c in federation.clients]
    assert all(len(w) == 10 for w in writers) and not set.intersection(*writers)


def test_same_arguments_same_federation_other_seed_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PFLOWER_CACHE", "off")  # the builder itself, not a cached copy
    dataset = toy_dataset()
    args = ({"name": "lsqs", "min_size": 5}, {"client_test": "mirror", "val_fraction": 0.1})
    first = build(*args, dataset=dataset)
    again = build(*args, dataset=dataset)
    other = build(*args, dataset=dataset, seed=1)
    for a, b in zip(all_shares(first), all_shares(again), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(first.global_test, again.global_test)
    assert any(
        not np.array_equal(a, b) for a, b in zip(all_shares(first), all_shares(other), strict=True)
    )


def test_split_presets_are_valid() -> None:
    names = set(group_options("split"))
    assert names == {"default", "fliu", "flame", "fedala", "fedmpr", "diversifed", "file"}
    for name in names:
        SplitConfig.from_mapping(group_block("split", name))
    assert SplitConfig.from_mapping(group_block("split", "default")) == SplitConfig()


@pytest.mark.parametrize(
    ("split", "message"),
    [
        ({"test_frac": 0.2}, "Allowed keys: pool"),
        ({"pool": "both"}, "split.pool must be one of train, all"),
        ({"pool": "all", "client_test": "mirror"}, "pool=all shares the official test split"),
        ({"pool": "all", "global_test": "official"}, "pool=all shares the official test split"),
        ({"test_fraction": 1.0}, r"test_fraction must be in \[0, 1\)"),
        ({"subsample_fraction": 0.0}, r"subsample_fraction must be in \(0, 1\]"),
        ({"stratify": "yes"}, "stratify must be true or false"),
        ({"client_test": "partitioner"}, "'iid' does not: use client_test=holdout or mirror"),
        ({"client_test": "file"}, r"client_test=file .* set split\.pool=all"),
        ({"pool": "all", "client_test": "file"}, "use partition=from_file partition.path"),
        ({"evaluate_on": "val"}, r"evaluate_on=val .* set split\.val_fraction > 0"),
        ({"evaluate_on": "train"}, "split.evaluate_on must be one of test, val"),
    ],
)
def test_bad_splits_are_refused(split: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build({"name": "iid"}, split)


def test_impossible_federations_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"set split\.client_test=partitioner"):
        build({"name": "diversifed_dirichlet", "train_size": 10, "test_size": 5})
    with pytest.raises(ConfigError, match="too few to split off a test share"):
        build({"name": "iid"}, clients=600)
    with pytest.raises(ConfigError, match="600 samples"):
        build({"name": "iid"}, clients=601)
    # class 4 only in the train split: the client holding only it gets no mirrored test sample
    dataset = toy_dataset()
    test_labels = dataset.test.labels.clone()
    test_labels[test_labels == 4] = 0
    no_four = ImageDataset(
        "toy",
        dataset.train,
        ImageSplit(dataset.test.images, test_labels),
        5,
        (0.5,),
        (0.5,),
    )
    with pytest.raises(ConfigError, match=r"leaves clients \[4\] without test samples"):
        build({"name": "class_groups"}, {"client_test": "mirror"}, dataset=no_four)


def _shares_equal(first: Federation, second: Federation) -> bool:
    return all(
        np.array_equal(a, b) for a, b in zip(all_shares(first), all_shares(second), strict=True)
    ) and np.array_equal(first.global_test, second.global_test)


@pytest.mark.parametrize(
    ("partition", "split"),
    [
        ({"name": "dirichlet", "alpha": 0.5}, {"val_fraction": 0.1}),
        ({"name": "quality_skew", "sigma": 0.5}, {}),
        ({"name": "dir_quantity_skew", "disjoint": False, "min_size": 20}, {"val_fraction": 0.1}),
    ],
)
def test_cached_federation_equals_the_built_one_and_is_read_back(
    partition: dict[str, Any],
    split: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cache hit gives the federation the builder gives (noise included) without running it."""
    dataset = toy_dataset(n_train=2000)
    monkeypatch.setenv("PFLOWER_CACHE", "off")
    built = build(partition, split, dataset=dataset)
    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path))
    stored = build(partition, split, dataset=dataset)
    (entry,) = (tmp_path / "federations").glob("*.npz")
    monkeypatch.setattr(builder, "share_out", lambda *args: pytest.fail("the builder ran"))
    read = build(partition, split, dataset=dataset)
    for federation in (stored, read):
        assert _shares_equal(federation, built)
        assert federation.input_noise == built.input_noise
    assert entry.is_file()


def test_a_damaged_or_leaking_cache_file_is_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path))
    partition, split = {"name": "dirichlet", "alpha": 0.5}, {"val_fraction": 0.1}
    first = build(partition, split)
    (entry,) = (tmp_path / "federations").glob("*.npz")
    entry.write_bytes(b"not a zip file")
    assert _shares_equal(build(partition, split), first)
    with np.load(entry) as stored:
        arrays = {name: stored[name] for name in stored.files}
    arrays["test"] = arrays["train"][: len(arrays["test"])]  # every test sample is trained on
    np.savez(entry, **arrays)
    assert _shares_equal(build(partition, split), first)


def test_a_rewritten_partition_file_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``partition=from_file`` counts by its file's content: same path, new lists, new shares."""
    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "shares.json"
    dataset = toy_dataset()

    def write(sizes: tuple[int, int]) -> None:  # indices into the train split (pool=train)
        order = np.random.default_rng(0).permutation(len(dataset.train))
        lists = np.split(order[: sum(sizes)], [sizes[0]])
        payload = {"num_samples": len(dataset.train), "clients": [s.tolist() for s in lists]}
        path.write_text(json.dumps(payload))

    def train_sizes() -> list[int]:
        federation = build({"name": "from_file", "path": str(path)}, clients=2, dataset=dataset)
        return [len(client.train) + len(client.test) for client in federation.clients]

    write((300, 300))
    assert train_sizes() == [300, 300]
    write((100, 500))
    assert train_sizes() == [100, 500]
