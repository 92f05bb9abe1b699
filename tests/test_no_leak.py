"""No held-out sample is trained on: every partition scheme x every split preset.

For every registered scheme (its ``conf/partition`` block; both ``disjoint`` values where the
scheme has that option) and every ``conf/split`` preset, the federation is built and checked:

- no client's test sample and no global test sample is in any client's train or validation share;
- no validation sample is in any client's train share.

Samples are identified twice: by their pool index (the federation's one index space: official
train ``0..n_train-1``, then official test), and independently by a tag written into each image,
``(split, position in that split)``, read back through the federation's public accessors. The
tags show that indices drawn from the official test split (``mirror``, ``partitioner``,
``global_test: official``) and from the shared pool are compared in the same space.

Combinations the builder refuses (a DiversiFed scheme, which draws its own test shares, with a
split that does not take them; any other scheme with the ``diversifed`` split) are asserted to
raise a :class:`ConfigError` whose message says what to change.

Data: the labels of the registered ``synthetic`` dataset (12,000 train / 4,000 test, 10 classes:
large enough for every scheme's default options with 10 clients) with tag images. The two schemes
that split by per-sample groups get the same labels plus groups in their dataset's format:
``feature_skew`` writer ids (FEMNIST-like, on both splits), and ``attribute_groups`` a tiny
CelebA-Gender-like set (label = gender, group = index of the single active attribute among 5, -1
on test images without exactly one) with 5 clients, since 5 attributes feed at most 5 clients.
``from_file`` reads a partition file written from an IID federation of the same pool.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pflower.compose import group_block, group_options
from pflower.datasets.base import DatasetNotFoundError, ImageDataset, ImageSplit, resolve_data_root
from pflower.datasets.federation import ClientSplit, Federation, build_federation, check_no_leak
from pflower.datasets.idx import idx_source
from pflower.datasets.loaders import load_dataset
from pflower.datasets.partitioners import PARTITIONERS, TestAwarePartitioner, build_partitioner
from pflower.datasets.partitioners.from_file import write_federation, write_index_lists
from pflower.datasets.sources import locate
from pflower.datasets.synthetic import load_synthetic
from pflower.registry import ConfigError

CONF = Path(__file__).resolve().parents[1] / "conf"
NUM_CLIENTS = 10
SEED = 0
CLIENTS_OF = {"attribute_groups": 5}
"""Client counts other than :data:`NUM_CLIENTS` (5 CelebA attributes feed at most 5 clients)."""
DRAWS_OWN_TESTS = {"diversifed_pathological", "diversifed_dirichlet", "diversifed_practical"}
"""Schemes that draw their clients' test shares themselves (only the ``diversifed`` split)."""
TRAIN, TEST = 0, 1
"""Split codes in the image tags."""


def _block(name: str) -> dict[str, Any]:
    return group_block("partition", name)


def _variants() -> list[tuple[str, bool | None]]:
    """Every registered scheme; both ``disjoint`` values where the scheme has that option."""
    variants: list[tuple[str, bool | None]] = []
    for name in PARTITIONERS.names:
        if "disjoint" in _block(name):
            variants += [(name, True), (name, False)]
        else:
            variants.append((name, None))
    return variants


VARIANTS = _variants()
PRESETS = group_options("split")


def _variant_id(variant: tuple[str, bool | None]) -> str:
    name, disjoint = variant
    return name if disjoint is None else f"{name}-disjoint={str(disjoint).lower()}"


# --- datasets: real label structure, images that say which sample they are ---------------------


def _tag_images(split: int, count: int) -> torch.Tensor:
    """``(count, 1, 1, 2)`` float32 images holding ``(split, position)``, exact below 2**24."""
    tags = torch.zeros(count, 1, 1, 2, dtype=torch.float32)
    tags[:, 0, 0, 0] = float(split)
    tags[:, 0, 0, 1] = torch.arange(count, dtype=torch.float32)
    return tags


def _tagged(
    name: str,
    train_labels: torch.Tensor,
    test_labels: torch.Tensor,
    groups: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> ImageDataset:
    train_groups, test_groups = groups if groups is not None else (None, None)
    train = ImageSplit(_tag_images(TRAIN, len(train_labels)), train_labels, train_groups)
    test = ImageSplit(_tag_images(TEST, len(test_labels)), test_labels, test_groups)
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    return ImageDataset(name, train, test, num_classes, (0.0,), (1.0,), scale=1.0)


@functools.cache
def _synthetic_labels() -> tuple[torch.Tensor, torch.Tensor]:
    synthetic = load_synthetic(image_shape=(1, 1, 1), num_train=12000, num_test=4000)
    return synthetic.train.labels, synthetic.test.labels


@functools.cache
def _dataset(scheme: str) -> ImageDataset:
    """The tagged dataset for ``scheme`` (with groups where the scheme splits by them)."""
    train_labels, test_labels = _synthetic_labels()
    rng = np.random.default_rng(1)
    if scheme in ("feature_skew", "natural"):  # writer ids on both splits, as in FEMNIST
        count = NUM_CLIENTS if scheme == "natural" else 50  # natural: one client per writer
        writers = [torch.from_numpy(rng.integers(0, count, len(s))) for s in _synthetic_labels()]
        name = f"synthetic_writers_{count}"
        return _tagged(name, train_labels, test_labels, (writers[0], writers[1]))
    if scheme == "attribute_groups":
        return _celeba_like(rng)
    return _tagged("synthetic", train_labels, test_labels)


def _celeba_like(rng: np.random.Generator) -> ImageDataset:
    """CelebA-Gender's high-shift format: gender labels balanced within each of 5 attribute
    groups on the train split; test images tagged with their attribute, or -1 (none/several)."""
    train_groups = np.repeat(np.arange(5), 400)
    train_labels = np.tile(np.repeat([0, 1], 200), 5)
    test_groups = rng.integers(-1, 5, 500)
    test_labels = np.tile([0, 1], 250)
    groups = (torch.from_numpy(train_groups), torch.from_numpy(test_groups))
    return _tagged(
        "celeba_like", torch.from_numpy(train_labels), torch.from_numpy(test_labels), groups
    )


# --- what a federation holds, by pool index and by tag ------------------------------------------


def _tags(split: ImageSplit) -> set[tuple[int, int]]:
    pairs = split.images[:, 0, 0, :].to(torch.int64).tolist()
    return {(int(code), int(position)) for code, position in pairs}


def _expected_tags(indices: np.ndarray, n_train: int) -> set[tuple[int, int]]:
    return {(TRAIN, int(i)) if i < n_train else (TEST, int(i) - n_train) for i in indices}


def _union(shares: list[np.ndarray]) -> np.ndarray:
    return np.unique(np.concatenate(shares)) if shares else np.zeros(0, dtype=np.int64)


def assert_no_leak(federation: Federation) -> None:
    """Held-out samples are never trained on, by pool index and by image tag."""
    clients = federation.clients
    n_train = len(federation.dataset.train)
    trained = _union([c.train for c in clients])
    validated = _union([c.val for c in clients])
    tested = _union([c.test for c in clients])
    for share in (trained, validated, tested, federation.global_test):
        assert share.size == 0 or (share.min() >= 0 and share.max() < len(federation.pool))
    assert not np.intersect1d(tested, np.union1d(trained, validated)).size, "client test leak"
    assert not np.intersect1d(federation.global_test, np.union1d(trained, validated)).size
    assert not np.intersect1d(validated, trained).size, "validation sample trained on"

    train_tags: set[tuple[int, int]] = set()
    held_tags: set[tuple[int, int]] = set()
    for pid, client in enumerate(clients):
        for indices, split, into in (
            (client.train, federation.client_train(pid), train_tags),
            (client.val, federation.client_val(pid), held_tags),
            (client.test, federation.client_test(pid), held_tags),
        ):
            seen = _tags(split)
            assert seen == _expected_tags(indices, n_train)  # the pool index space is train+test
            into |= seen
    global_tags = _tags(federation.global_test_split())
    assert global_tags == _expected_tags(federation.global_test, n_train)
    assert not train_tags & (held_tags | global_tags), "a held-out image is a training image"


def _assert_usable(federation: Federation) -> None:
    """The check is not vacuous: every client trains and tests on something."""
    assert all(len(c.train) and len(c.test) for c in federation.clients)
    assert len(federation.global_test)


def _refusal(scheme: str, preset: dict[str, Any]) -> str | None:
    """The message the builder must refuse with, or ``None`` if the combination is valid."""
    wants_scheme_tests = preset["client_test"] == "partitioner"
    if scheme in DRAWS_OWN_TESTS and not wants_scheme_tests:
        return r"draws its own client test shares; set split\.client_test=partitioner"
    if scheme not in DRAWS_OWN_TESTS and wants_scheme_tests:
        return "needs a scheme that draws client test shares"
    if preset["client_test"] == "file" and scheme != "from_file":
        return "takes each client's test share from a partition file"
    return None


_FILES = tempfile.TemporaryDirectory(prefix="pflower-no-leak-")
"""Where the ``from_file`` cases keep the partition files they read (removed at exit)."""


@functools.cache
def _partition_file(pool: str, tests: bool = False) -> str:
    """A ``from_file`` partition of the pool ``pool`` (``train`` or ``all``): the clients'
    whole sample sets of an IID federation, as ``pflower partition`` writes them; with
    ``tests``, their train and validation samples and, apart, their test samples (as
    ``pflower partition import`` writes them, for ``split=file``)."""
    default = group_block("split", "default")
    source = build_federation(
        _dataset("iid"), NUM_CLIENTS, SEED, _block("iid"), {**default, "pool": pool}
    )
    path = Path(_FILES.name) / f"{pool}{'_tests' if tests else ''}.json"
    if not tests:
        return str(write_federation(path, source, pool))
    trains = [np.concatenate([c.train, c.val]) for c in source.clients]
    labels = source.pool.labels.numpy()
    return str(
        write_index_lists(path, trains, labels, len(labels), [c.test for c in source.clients])
    )


def _build(scheme: str, disjoint: bool | None, split: dict[str, Any]) -> Federation:
    block = _block(scheme)
    if disjoint is not None:
        block["disjoint"] = disjoint
    if scheme == "from_file":
        block["path"] = _partition_file(split["pool"], split["client_test"] == "file")
    clients = CLIENTS_OF.get(scheme, NUM_CLIENTS)
    return build_federation(_dataset(scheme), clients, SEED, block, split)


# --- the matrix ---------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("variant", VARIANTS, ids=_variant_id)
def test_no_held_out_sample_is_trained_on(variant: tuple[str, bool | None], preset: str) -> None:
    scheme, disjoint = variant
    split = group_block("split", f"{preset}")
    message = _refusal(scheme, split)
    if message is not None:
        with pytest.raises(ConfigError, match=message):
            _build(scheme, disjoint, split)
        return
    federation = _build(scheme, disjoint, split)
    _assert_usable(federation)
    assert_no_leak(federation)
    if split["global_test"] == "official":  # drawn from the official test split, all of it
        assert federation.global_test.min() >= len(federation.dataset.train)


@pytest.mark.parametrize("preset", ["default", "flame", "fliu"])
@pytest.mark.parametrize("scheme", ["dir_label_skew", "dir_quantity_skew", "hybrid_skew"])
def test_validation_shares_of_sharing_schemes_are_not_trained_on(scheme: str, preset: str) -> None:
    split = {**group_block("split", f"{preset}"), "val_fraction": 0.1}
    federation = _build(scheme, False, split)
    assert all(len(c.val) for c in federation.clients)
    assert_no_leak(federation)


def test_the_matrix_covers_every_scheme_preset_and_refusal_rule() -> None:
    assert {name for name, _ in VARIANTS} == set(PARTITIONERS.names)
    assert PRESETS == ["default", "diversifed", "fedala", "fedmpr", "file", "flame", "fliu"]
    for name in PARTITIONERS.names:
        block = _block(name)
        if name == "from_file":
            block["path"] = _partition_file("train")
        partitioner = build_partitioner(block, NUM_CLIENTS, SEED)
        assert isinstance(partitioner, TestAwarePartitioner) == (name in DRAWS_OWN_TESTS)


def test_the_guard_refuses_a_leaking_federation() -> None:
    clean = ClientSplit(np.array([0, 1]), np.array([2]), np.array([3]))
    check_no_leak((clean,), np.array([2]))
    leaks = [
        ((clean, ClientSplit(np.array([2]), np.array([4]), np.zeros(0, np.int64))), [2, 4]),
        ((clean,), [1]),  # global test sample trained on
        ((clean, ClientSplit(np.array([3]), np.array([5]), np.zeros(0, np.int64))), [2, 5]),
    ]
    for clients, global_test in leaks:
        with pytest.raises(RuntimeError, match="held-out samples leak"):
            check_no_leak(clients, np.array(global_test))


def _real_mnist() -> ImageDataset:
    try:
        locate(idx_source("mnist"), resolve_data_root(None), download=False, verify=False)
    except DatasetNotFoundError as missing:
        pytest.skip(f"real MNIST files not available. {' '.join(str(missing).split())}")
    return load_dataset("mnist", {})


@pytest.mark.parametrize("scheme", ["dir_label_skew", "dir_quantity_skew", "hybrid_skew"])
def test_flame_fidelity_mode_on_real_mnist(scheme: str) -> None:
    """The reviewed case: split=flame, disjoint=false, MNIST, 10 clients. Before the reserve,
    48% / 52% / 77% of the global test set was some client's training data."""
    split = group_block("split", "flame")
    federation = build_federation(
        _real_mnist(), NUM_CLIENTS, SEED, {**_block(scheme), "disjoint": False}, split
    )
    trained = _union([c.train for c in federation.clients])
    assert not np.isin(federation.global_test, trained).any()
    for client in federation.clients:  # still FLAME's 80/20 per client, up to rounding
        assert abs(len(client.test) / (len(client.train) + len(client.test)) - 0.2) < 0.01
    assert len(np.unique(trained)) < sum(len(c.train) for c in federation.clients)  # still shared
