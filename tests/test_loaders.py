"""Dataset loaders: real MNIST/FMNIST files, tiny files in the exact original formats for the rest.

CIFAR, SVHN and CelebA are not available offline, so these tests write a few samples in their
original on-disk formats into ``tmp_path`` and read them back through the real loader code.
Those tiny files cannot match the official MD5s, so the tests pass ``verify=False`` except where
the checksum error itself is under test.
"""

from __future__ import annotations

import gzip
import inspect
import pickle
import shutil
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import scipy.io
import torch
from omegaconf import MISSING
from PIL import Image

from pflower.compose import group_block, group_options
from pflower.datasets import celeba, idx
from pflower.datasets.base import DatasetNotFoundError, resolve_data_root
from pflower.datasets.celeba import (
    CELEBA_ATTRIBUTES,
    attribute_pool,
    balanced_positions,
    load_celeba_gender,
)
from pflower.datasets.cifar import load_cifar10, load_cifar100
from pflower.datasets.digits import load_digits
from pflower.datasets.idx import idx_source
from pflower.datasets.loaders import DATASETS, load_dataset
from pflower.datasets.sources import CorruptDatasetError, locate
from pflower.datasets.svhn import load_svhn
from pflower.datasets.synthetic import load_synthetic
from pflower.registry import ConfigError

REPO = Path(__file__).resolve().parents[1]
IDX_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
CELEBA_COLUMNS = [
    "5_o_Clock_Shadow",
    "Arched_Eyebrows",
    "Attractive",
    "Bags_Under_Eyes",
    "Bald",
    "Bangs",
    "Big_Lips",
    "Big_Nose",
    "Black_Hair",
    "Blond_Hair",
    "Blurry",
    "Brown_Hair",
    "Bushy_Eyebrows",
    "Chubby",
    "Double_Chin",
    "Eyeglasses",
    "Goatee",
    "Gray_Hair",
    "Heavy_Makeup",
    "High_Cheekbones",
    "Male",
    "Mouth_Slightly_Open",
    "Mustache",
    "Narrow_Eyes",
    "No_Beard",
    "Oval_Face",
    "Pale_Skin",
    "Pointy_Nose",
    "Receding_Hairline",
    "Rosy_Cheeks",
    "Sideburns",
    "Smiling",
    "Straight_Hair",
    "Wavy_Hair",
    "Wearing_Earrings",
    "Wearing_Hat",
    "Wearing_Lipstick",
    "Wearing_Necklace",
    "Wearing_Necktie",
    "Young",
]


def require_real_idx(name: str) -> Path:
    """The folder with the original ``name`` (mnist, fmnist) files under the data root.

    The data root is found exactly as the loaders find it (``$PFLOWER_DATA``, else the user cache
    directory). Without the files the test is skipped with the loader's own message: the files
    looked for, the folder searched, and how to provide them.
    """
    try:
        return locate(idx_source(name), resolve_data_root(None), download=False, verify=False)
    except DatasetNotFoundError as missing:
        pytest.skip(f"real {name} files not available. {' '.join(str(missing).split())}")


# --- MNIST / Fashion-MNIST: the real files ---------------------------------------------------


@pytest.mark.parametrize(
    ("name", "mean", "std"), [("mnist", 0.1307, 0.3081), ("fmnist", 0.2860, 0.3530)]
)
def test_real_idx_datasets(name: str, mean: float, std: float) -> None:
    require_real_idx(name)
    dataset = load_dataset(name, {})
    assert dataset.train.images.shape == (60000, 1, 28, 28)
    assert dataset.test.images.shape == (10000, 1, 28, 28)
    assert dataset.train.images.dtype == torch.uint8
    assert dataset.train.labels.dtype == torch.int64
    for split in (dataset.train, dataset.test):
        assert set(split.labels.unique().tolist()) == set(range(10))
    assert dataset.num_classes == 10
    assert (dataset.mean, dataset.std, dataset.scale) == ((mean,), (std,), 255.0)
    normalized = dataset.normalize(dataset.train.images)
    assert abs(float(normalized.mean())) < 0.01
    assert abs(float(normalized.std()) - 1.0) < 0.01
    assert load_dataset(name, {}) is dataset  # cached per process
    assert load_dataset(name, {"root": str(resolve_data_root(None))}) is dataset  # same folder


def test_mnist_torchvision_layout_and_mean_override(tmp_path: Path) -> None:
    source = require_real_idx("mnist")
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in IDX_FILES:
        (raw / name).symlink_to(source / name)
    dataset = idx.load_mnist(root=tmp_path, mean=0.5, std=[0.5])
    assert len(dataset.train) == 60000
    assert (dataset.mean, dataset.std) == ((0.5,), (0.5,))


def test_mnist_download_uses_official_names_and_md5(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = require_real_idx("mnist")
    requested = []

    def fake_download(url: str, root: str, filename: str, md5: str) -> None:
        requested.append((url, filename, md5))
        Path(root).mkdir(parents=True, exist_ok=True)
        shutil.copy(source / filename, Path(root) / filename)

    monkeypatch.setattr("torchvision.datasets.utils.download_url", fake_download)
    dataset = idx.load_mnist(root=tmp_path, download=True)
    assert len(dataset.test) == 10000
    assert sorted(name for _, name, _ in requested) == sorted(IDX_FILES)
    assert ("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873") in {
        (name, md5) for _, name, md5 in requested
    }
    assert all(url.startswith("https://ossci-datasets") for url, _, _ in requested)
    assert (tmp_path / "mnist" / IDX_FILES[0]).is_file()


def test_failed_download_is_a_clear_not_found_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(url: str, root: str, filename: str, md5: str) -> None:
        raise URLError("no network")

    monkeypatch.setattr("torchvision.datasets.utils.download_url", offline)
    with pytest.raises(DatasetNotFoundError, match=r"downloading failed.*no network"):
        idx.load_fmnist(root=tmp_path, download=True)


def _write_idx(path: Path, array: np.ndarray, header: bytes | None = None) -> None:
    dims = b"".join(int(size).to_bytes(4, "big") for size in array.shape)
    magic = header if header is not None else bytes([0, 0, 8, array.ndim])
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as stream:
        stream.write(magic + dims + array.astype(np.uint8).tobytes())


def _write_tiny_mnist(folder: Path, images: np.ndarray, labels: np.ndarray) -> None:
    for prefix in ("train", "t10k"):
        _write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", images)
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)


def test_idx_parser_round_trip_and_checksum(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    labels = np.array([0, 9, 3, 3, 7], dtype=np.uint8)
    _write_tiny_mnist(tmp_path / "mnist", images, labels)
    dataset = idx.load_mnist(root=tmp_path, verify=False)
    assert torch.equal(dataset.train.images[:, 0], torch.from_numpy(images))
    assert dataset.test.labels.tolist() == [0, 9, 3, 3, 7]
    with pytest.raises(CorruptDatasetError, match=r"MD5 is .* official file's is f68b3c2d"):
        idx.load_mnist(root=tmp_path)


def test_idx_bad_header_and_size(tmp_path: Path) -> None:
    images = np.zeros((2, 28, 28), dtype=np.uint8)
    _write_idx(tmp_path / "bad.gz", images, header=bytes([0, 0, 0x0D, 3]))
    with pytest.raises(CorruptDatasetError, match="bad magic number"):
        idx.read_idx(tmp_path / "bad.gz")
    _write_idx(tmp_path / "short.gz", images, header=bytes([0, 0, 8, 2]))
    with pytest.raises(CorruptDatasetError, match="header says"):
        idx.read_idx(tmp_path / "short.gz")
    (tmp_path / "plain.gz").write_bytes(b"not gzip at all")
    with pytest.raises(CorruptDatasetError, match="not a readable gzip"):
        idx.read_idx(tmp_path / "plain.gz")


# --- CIFAR ------------------------------------------------------------------------------------


def _pickle(path: Path, content: dict[bytes, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as stream:
        pickle.dump(content, stream, protocol=2)


def _cifar_rows(rng: np.random.Generator, count: int) -> np.ndarray:
    return rng.integers(0, 256, (count, 3072), dtype=np.uint8)


def test_cifar10_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    folder = tmp_path / "cifar-10-batches-py"
    batches = []
    for number in range(1, 6):
        rows, labels = _cifar_rows(rng, 3), [number, 0, 9]
        batches.append((rows, labels))
        _pickle(folder / f"data_batch_{number}", {b"data": rows, b"labels": labels})
    test_rows = _cifar_rows(rng, 2)
    _pickle(folder / "test_batch", {b"data": test_rows, b"labels": [4, 2]})
    _pickle(folder / "batches.meta", {b"label_names": [b"class%d" % i for i in range(10)]})

    dataset = load_dataset("cifar10", {"root": str(tmp_path), "verify": False})
    assert dataset.train.images.shape == (15, 3, 32, 32)
    assert dataset.train.images.dtype == torch.uint8
    assert dataset.train.labels.tolist() == [label for _, labels in batches for label in labels]
    assert dataset.test.labels.tolist() == [4, 2]
    first = batches[0][0][0]
    image = dataset.train.images[0]
    # A row is the red plane, then green, then blue, each 32x32 row-major.
    assert int(image[0, 0, 1]) == first[1]
    assert int(image[0, 1, 0]) == first[32]
    assert int(image[1, 0, 0]) == first[1024]
    assert int(image[2, 31, 31]) == first[3071]
    assert torch.equal(dataset.test.images.reshape(2, -1), torch.from_numpy(test_rows))
    assert dataset.mean == (0.4914, 0.4822, 0.4465)
    with pytest.raises(CorruptDatasetError, match="MD5"):
        load_cifar10(root=tmp_path)


def test_cifar100_fine_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    folder = tmp_path / "cifar-100-python"
    train_rows = _cifar_rows(rng, 4)
    train = {b"data": train_rows, b"fine_labels": [99, 0, 50, 7], b"coarse_labels": [19, 0, 1, 2]}
    _pickle(folder / "train", train)
    _pickle(folder / "test", {b"data": _cifar_rows(rng, 2), b"fine_labels": [1, 98]})
    names = [b"fine%d" % i for i in range(100)]
    _pickle(folder / "meta", {b"fine_label_names": names, b"coarse_label_names": names[:20]})
    dataset = load_cifar100(root=tmp_path, verify=False, mean=0.5, std=0.5)
    assert dataset.num_classes == 100
    assert dataset.train.labels.tolist() == [99, 0, 50, 7]
    assert torch.equal(dataset.train.images.reshape(4, -1), torch.from_numpy(train_rows))
    assert dataset.mean == (0.5, 0.5, 0.5)


def test_cifar_rejects_malformed_and_unsafe_pickles(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    rows = np.zeros((2, 3072), dtype=np.uint8)
    for number in range(1, 6):
        _pickle(folder / f"data_batch_{number}", {b"data": rows, b"labels": [0, 1]})
    _pickle(folder / "batches.meta", {b"label_names": [b"x"] * 10})
    _pickle(folder / "test_batch", {b"data": rows[:, :100], b"labels": [0, 1]})
    with pytest.raises(CorruptDatasetError, match="rows have 100 values"):
        load_cifar10(root=tmp_path, verify=False)
    (folder / "test_batch").write_bytes(pickle.dumps(Path("/etc/passwd")))
    with pytest.raises(CorruptDatasetError, match="refusing to load"):
        load_cifar10(root=tmp_path, verify=False)


# --- SVHN -------------------------------------------------------------------------------------


def _write_svhn(folder: Path, rng: np.random.Generator, labels: list[int]) -> np.ndarray:
    folder.mkdir(parents=True, exist_ok=True)
    images = rng.integers(0, 256, (32, 32, 3, len(labels)), dtype=np.uint8)
    y = np.array(labels, dtype=np.uint8).reshape(-1, 1)
    for name in ("train_32x32.mat", "test_32x32.mat"):
        scipy.io.savemat(folder / name, {"X": images, "y": y})
    return images


def test_svhn_round_trip_and_label_ten_is_zero(tmp_path: Path) -> None:
    images = _write_svhn(tmp_path / "svhn", np.random.default_rng(3), [10, 1, 9, 10, 5])
    dataset = load_svhn(root=tmp_path, verify=False)
    assert dataset.train.images.shape == (5, 3, 32, 32)
    assert dataset.train.labels.tolist() == [0, 1, 9, 0, 5]
    # Stored as X[h, w, c, n]; loaded as images[n, c, h, w].
    assert int(dataset.train.images[3, 2, 5, 7]) == images[5, 7, 2, 3]
    assert torch.equal(dataset.test.images, torch.from_numpy(images.transpose(3, 2, 0, 1)))
    assert dataset.std == (0.1980, 0.2010, 0.1970)


def test_svhn_root_layout_checksum_and_corrupt_file(tmp_path: Path) -> None:
    _write_svhn(tmp_path, np.random.default_rng(4), [1, 2])
    assert len(load_svhn(root=tmp_path, verify=False).test) == 2
    with pytest.raises(CorruptDatasetError, match="official file's is e26dedcc"):
        load_svhn(root=tmp_path)
    (tmp_path / "test_32x32.mat").write_bytes(b"garbage" * 50)
    with pytest.raises(CorruptDatasetError, match="not a readable MATLAB file"):
        load_svhn(root=tmp_path, verify=False)


# --- CelebA-Gender ----------------------------------------------------------------------------


def test_attribute_pools_on_a_synthetic_table() -> None:
    rng = np.random.default_rng(5)
    active = rng.random((2000, 5)) < 0.4
    candidates = rng.random(2000) < 0.8
    low, low_groups = attribute_pool(active, "low", candidates)
    assert low_groups is None
    assert np.array_equal(low, np.flatnonzero(candidates & active.all(axis=1)))
    high, groups = attribute_pool(active, "high", candidates)
    assert groups is not None
    assert (active[high].sum(axis=1) == 1).all() and candidates[high].all()
    assert np.array_equal(active[high, groups], np.ones(len(high), dtype=bool))
    assert len(high) == int((candidates & (active.sum(axis=1) == 1)).sum())


def test_gender_balance_per_group_is_seeded() -> None:
    rng = np.random.default_rng(6)
    male = rng.random(500) < 0.3
    groups = rng.integers(0, 4, 500)
    kept = balanced_positions(male, groups, np.random.default_rng(0))
    for group in range(4):
        in_group = kept[groups[kept] == group]
        men = int(male[in_group].sum())
        assert men == len(in_group) - men == int(male[groups == group].sum())
    again = balanced_positions(male, groups, np.random.default_rng(0))
    assert np.array_equal(kept, again)
    capped = balanced_positions(male, None, np.random.default_rng(0), per_gender=10)
    assert len(capped) == 20 and int(male[capped].sum()) == 10


# Rows of the fake CelebA table: (partition, male, attributes among the first three).
_CELEBA_ROWS = [
    *[(0, 1, "BSH")] * 3,  # train, all three attributes: 3 men ...
    *[(0, 0, "BSH")] * 2,  # ... and 2 women -> low pool keeps 2 + 2
    (1, 0, "BSH"),  # validation partition: never used
    *[(0, 1, "B")] * 2,
    *[(0, 0, "B")] * 2,  # only Black_Hair: 2 + 2 kept
    (0, 1, "S"),
    *[(0, 0, "S")] * 3,  # only Smiling: 1 + 1 kept
    *[(0, 1, "H")] * 2,
    (0, 0, "H"),  # only High_Cheekbones: 1 + 1 kept
    *[(0, 1, "")] * 2,  # no attribute: in no pool
    *[(2, 1, "S")] * 3,
    *[(2, 0, "BS")] * 5,  # test: 3 men, 5 women -> 3 + 3 kept
]


def _write_celeba(folder: Path) -> None:
    """Write CelebA's three inputs in their original layout, one distinct colour per image."""
    images = folder / "img_align_celeba"
    images.mkdir(parents=True)
    letters = dict(zip("BSH", CELEBA_ATTRIBUTES[:3], strict=False))
    partition_lines, attribute_lines = [], []
    for row, (partition, male, present) in enumerate(_CELEBA_ROWS):
        filename = f"{row + 1:06d}.jpg"
        pixels = np.zeros((218, 178, 3), dtype=np.uint8)  # black bands above and below the crop
        pixels[20:198] = (8 * row, 200, 100)
        Image.fromarray(pixels).save(images / filename, quality=95)
        names = {letters[letter] for letter in present} | ({"Male"} if male else set())
        values = " ".join(f"{1 if name in names else -1:2d}" for name in CELEBA_COLUMNS)
        attribute_lines.append(f"{filename} {values}")
        partition_lines.append(f"{filename} {partition}")
    header = f"{len(_CELEBA_ROWS)}\n{' '.join(CELEBA_COLUMNS)} \n"
    (folder / "list_attr_celeba.txt").write_text(header + "\n".join(attribute_lines) + "\n")
    (folder / "list_eval_partition.txt").write_text("\n".join(partition_lines) + "\n")


def _rows_of(images: torch.Tensor) -> list[int]:
    """Decode each image's source row from its red channel (crop removed the black bands)."""
    assert int(images[:, 1].min()) > 170  # green is 200 everywhere inside the crop
    return [round(float(image[0].float().mean()) / 8) for image in images]


@pytest.fixture(scope="module")
def celeba_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("celeba_root")
    _write_celeba(root / "celeba")
    return root


def test_celeba_low_shift(celeba_root: Path) -> None:
    options = {"root": str(celeba_root), "verify": False, "num_attributes": 3, "image_size": 16}
    dataset = load_dataset("celeba_gender", options)
    assert dataset.train.images.shape == (4, 3, 16, 16)
    assert dataset.train.images.dtype == torch.uint8
    assert dataset.train.groups is None
    assert sorted(dataset.train.labels.tolist()) == [0, 0, 1, 1]
    rows = _rows_of(dataset.train.images)
    assert set(rows) <= {0, 1, 2, 3, 4}  # train rows with all three attributes
    assert dataset.train.labels.tolist() == [_CELEBA_ROWS[row][1] for row in rows]
    test_rows = _rows_of(dataset.test.images)
    assert all(_CELEBA_ROWS[row][0] == 2 for row in test_rows)
    assert sorted(dataset.test.labels.tolist()) == [0, 0, 0, 1, 1, 1]
    assert (dataset.num_classes, dataset.mean, dataset.std) == (2, (0.5,) * 3, (0.5,) * 3)


def test_celeba_high_shift_groups(celeba_root: Path) -> None:
    dataset = load_celeba_gender(
        root=celeba_root, verify=False, num_attributes=3, shift="high", image_size=8, test_size=4
    )
    rows = _rows_of(dataset.train.images)
    assert dataset.train.groups is not None
    groups = dataset.train.groups.tolist()
    assert sorted(groups) == [0, 0, 0, 0, 1, 1, 2, 2]
    for row, group, label in zip(rows, groups, dataset.train.labels.tolist(), strict=True):
        partition, male, present = _CELEBA_ROWS[row]
        assert (partition, male) == (0, label)
        assert present == "BSH"[group]  # exactly one attribute, and it is the group's
    labels = dataset.train.labels.tolist()
    for group in range(3):
        in_group = [label for g, label in zip(groups, labels, strict=True) if g == group]
        assert sum(in_group) * 2 == len(in_group)  # gender-balanced within each attribute
    assert sorted(dataset.test.labels.tolist()) == [0, 0, 1, 1]
    assert dataset.test.groups is not None
    expected = [1 if _CELEBA_ROWS[row][2] == "S" else -1 for row in _rows_of(dataset.test.images)]
    assert dataset.test.groups.tolist() == expected  # "BS" has two attributes: no single group


def test_celeba_options_and_missing_files(tmp_path: Path, celeba_root: Path) -> None:
    with pytest.raises(ConfigError, match="num_attributes"):
        load_celeba_gender(root=celeba_root, verify=False, num_attributes=8)
    with pytest.raises(ConfigError, match="shift"):
        load_celeba_gender(root=celeba_root, verify=False, shift="medium")
    with pytest.raises(CorruptDatasetError, match="75e246fa"):
        load_celeba_gender(root=celeba_root, num_attributes=3)
    with pytest.raises(DatasetNotFoundError) as error:
        load_celeba_gender(root=tmp_path, download=True)
    message = str(error.value)
    assert str(tmp_path / "celeba" / "list_attr_celeba.txt") in message
    assert "img_align_celeba" in message and "cannot be downloaded" in message


def test_celeba_bad_attribute_file(tmp_path: Path) -> None:
    _write_celeba(tmp_path / "celeba")
    path = tmp_path / "celeba" / "list_attr_celeba.txt"
    path.write_text(path.read_text().replace("Smiling", "Smirking", 1))
    with pytest.raises(CorruptDatasetError, match="lacks the attributes"):
        celeba.read_attribute_table(path)


# --- generated datasets -----------------------------------------------------------------------


def test_digits_split_and_upsampling() -> None:
    dataset = load_dataset("digits", {})
    assert (len(dataset.train), len(dataset.test)) == (1438, 359)
    assert dataset.train.images.shape[1:] == (1, 8, 8)
    assert dataset.scale == 16.0 and float(dataset.train.images.max()) == 16.0
    assert set(dataset.test.labels.tolist()) == set(range(10))
    counts = torch.bincount(dataset.test.labels) / torch.bincount(
        torch.cat([dataset.train.labels, dataset.test.labels])
    )
    assert torch.allclose(counts, torch.full((10,), 0.2), atol=0.01)  # stratified
    again = load_digits()
    assert torch.equal(again.test.images, dataset.test.images)
    large = load_digits(image_size=28)
    assert large.input_shape == (1, 28, 28)
    assert torch.equal(large.test.labels, dataset.test.labels)


def test_synthetic_is_seeded_and_learnable() -> None:
    options = {"image_shape": [3, 8, 8], "num_classes": 4, "num_train": 400, "num_test": 100}
    dataset = load_dataset("synthetic", options)
    assert load_dataset("synthetic", {**options, "image_shape": (3, 8, 8)}) is dataset
    assert dataset.train.images.shape == (400, 3, 8, 8)
    assert dataset.train.images.dtype == torch.float32
    assert set(dataset.train.labels.tolist()) == {0, 1, 2, 3}
    same = load_synthetic(image_shape=(3, 8, 8), num_classes=4, num_train=400, num_test=100)
    assert torch.equal(same.train.images, dataset.train.images)
    other = load_synthetic(image_shape=(3, 8, 8), num_classes=4, num_train=400, seed=1)
    assert not torch.equal(other.train.images, dataset.train.images)
    flat_train = dataset.normalize(dataset.train.images).flatten(1)
    centroids = torch.stack([flat_train[dataset.train.labels == c].mean(0) for c in range(4)])
    flat_test = dataset.normalize(dataset.test.images).flatten(1)
    predictions = torch.cdist(flat_test, centroids).argmin(1)
    assert float((predictions == dataset.test.labels).float().mean()) > 0.8  # chance is 0.25


# --- registry, options, missing data, config files -------------------------------------------


def test_unknown_name_and_option_list_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match=r"Valid names: .*celeba_gender.*mnist"):
        load_dataset("imagenet", {})
    with pytest.raises(ConfigError, match="Allowed keys: root, download, verify, mean, std"):
        load_dataset("mnist", {"rooot": "/data"})
    with pytest.raises(ConfigError, match="'mean' needs one number or 3 numbers"):
        load_dataset("synthetic", {"image_shape": [3, 4, 4], "mean": [0.1, 0.2]})
    with pytest.raises(ConfigError, match="must be a number, string or list"):
        load_dataset("synthetic", {"noise": {"a": 1}})


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("mnist", "mnist/train-images-idx3-ubyte.gz"),
        ("fmnist", "fashion-mnist/t10k-labels-idx1-ubyte.gz"),
        ("cifar10", "cifar-10-batches-py/data_batch_1"),
        ("cifar100", "cifar-100-python/meta"),
        ("svhn", "svhn/test_32x32.mat"),
    ],
)
def test_missing_files_name_files_directory_and_remedy(
    tmp_path: Path, name: str, expected: str
) -> None:
    with pytest.raises(DatasetNotFoundError) as error:
        load_dataset(name, {"root": str(tmp_path)})
    message = str(error.value)
    assert str(tmp_path / expected) in message
    assert f"was not found under {tmp_path}" in message
    assert "download=true" in message


def test_data_root_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PFLOWER_DATA", str(tmp_path / "from_env"))
    with pytest.raises(DatasetNotFoundError, match="from_env"):
        load_svhn()


def test_relative_data_root_is_made_absolute_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative PFLOWER_DATA or dataset.root names the folder relative to the directory the
    run starts in; links into it and later changes of directory keep working."""
    images = np.random.default_rng(0).integers(0, 256, (4, 28, 28), dtype=np.uint8)
    _write_tiny_mnist(tmp_path / "data" / "mnist", images, np.array([1, 2, 3, 4], dtype=np.uint8))
    monkeypatch.chdir(tmp_path / "data")
    monkeypatch.setenv("PFLOWER_DATA", "../data")
    root = resolve_data_root(None)
    assert root == tmp_path.resolve() / "data" and root.is_absolute()
    assert resolve_data_root("../data") == root  # dataset.root: same rule
    source = locate(idx_source("mnist"), root, download=False, verify=False)
    torchvision_root = tmp_path / "tv"
    (torchvision_root / "MNIST" / "raw").mkdir(parents=True)
    for name in IDX_FILES:  # links to files under the (relative) data root must resolve
        (torchvision_root / "MNIST" / "raw" / name).symlink_to(source / name)
    monkeypatch.chdir(tmp_path / "tv")  # a relative root would now name another folder
    assert len(idx.load_mnist(root=torchvision_root, verify=False).train) == 4
    monkeypatch.chdir(tmp_path / "data")
    dataset = load_dataset("mnist", {"verify": False})
    assert dataset is load_dataset("mnist", {"root": str(root), "verify": False})
    monkeypatch.chdir(tmp_path)  # "../data" now names tmp_path.parent/data: not the cached one
    with pytest.raises(DatasetNotFoundError, match=f"not found under {tmp_path.parent / 'data'}"):
        load_dataset("mnist", {"verify": False})


def test_every_dataset_has_a_config_with_the_loader_defaults() -> None:
    configs = {name: group_block("dataset", name) for name in group_options("dataset")}
    assert sorted(config["name"] for config in configs.values()) == DATASETS.names
    for config in configs.values():
        defaults = inspect.signature(DATASETS.get(config["name"])).parameters
        options = {key: value for key, value in config.items() if key != "name"}
        assert sorted(options) == sorted(DATASETS.accepted_keys(config["name"]))
        for key, value in options.items():
            if value == MISSING:  # required in config (a path to the user's own data)
                continue
            default = defaults[key].default
            assert (tuple(value) if isinstance(value, list) else value) == default, key
