"""Image files in folders: one folder per class, optionally inside one folder per client.

Layouts (``dataset.path``; any image format PIL reads):

- ``<class>/<image>``: the classes' folders; ``client_map`` (a CSV ``file,client`` with paths
  relative to ``path``) optionally tags each image with its client;
- ``<client>/<class>/<image>`` (``per_client: true``): one folder per client, whose class folders
  hold that client's images; the client is each image's group.

Either layout may sit under ``train/`` and ``test/`` (the official split); without them the test
split is empty (use ``split.pool=all``). Classes are the distinct class folder names, sorted;
clients the distinct client names, sorted, and ``partition=natural`` makes one client of each.
Images are converted to ``channels`` (1: grayscale, 3: RGB) and resized to ``image_size``.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from pflower.datasets.arrays import dataset_from_arrays, index_of, split_of
from pflower.datasets.base import DatasetNotFoundError, ImageDataset, ImageSplit
from pflower.datasets.sources import Stats
from pflower.registry import ConfigError

_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}

Entry = tuple[Path, str, str | None]
"""An image file, its class folder's name and its client (``None``: not tagged)."""


def load_image_folder(
    path: str = "",
    per_client: bool = False,
    client_map: str | None = None,
    image_size: int = 28,
    channels: int = 1,
    mean: Stats = None,
    std: Stats = None,
) -> ImageDataset:
    """The images under ``path`` (see the module docstring for the layouts).

    Raises:
        DatasetNotFoundError: no image files in the layout.
        ConfigError: a ``client_map`` that misses an image, or an unreadable image.
    """
    root = Path(path).expanduser()
    parts = [root / "train", root / "test"] if (root / "train").is_dir() else [root]
    entries = [_entries(part, per_client) for part in parts]
    if not entries[0]:
        layout = "<client>/<class>/<image>" if per_client else "<class>/<image>"
        raise DatasetNotFoundError(
            "image_folder", root, [layout], "put one folder of images per class there"
        )
    if client_map:
        entries = [_mapped(part, root, Path(client_map).expanduser()) for part in entries]
    classes = index_of([label for part in entries for _, label, _ in part])
    tagged = entries[0][0][2] is not None
    clients = index_of([client for part in entries for _, _, client in part]) if tagged else None
    splits = [_decode(part, classes, clients, image_size, channels) for part in entries]
    if len(splits) == 1:
        empty = np.zeros((0, channels, image_size, image_size), np.float32)
        splits.append(split_of(empty, np.zeros(0), None if clients is None else np.zeros(0)))
    return dataset_from_arrays("image_folder", splits[0], splits[1], len(classes), mean, std)


def class_names(path: str, per_client: bool) -> list[str]:
    """The sorted class folder names under ``path`` (the number of classes, read without listing
    the images)."""
    root = Path(path).expanduser()
    parts = [root / "train", root / "test"] if (root / "train").is_dir() else [root]
    owners = [d for part in parts if part.is_dir() for d in part.iterdir() if d.is_dir()]
    if not per_client:
        return sorted({owner.name for owner in owners})
    return sorted({d.name for owner in owners for d in owner.iterdir() if d.is_dir()})


def _entries(folder: Path, per_client: bool) -> list[Entry]:
    if not folder.is_dir():
        return []
    found: list[Entry] = []
    owners = sorted(d for d in folder.iterdir() if d.is_dir()) if per_client else [folder]
    for owner in owners:
        for class_dir in sorted(d for d in owner.iterdir() if d.is_dir()):
            client = owner.name if per_client else None
            for file in sorted(class_dir.iterdir()):
                if file.suffix.lower() in _SUFFIXES:
                    found.append((file, class_dir.name, client))
    return found


def _mapped(entries: list[Entry], root: Path, client_map: Path) -> list[Entry]:
    """``entries`` tagged with their clients from a ``file,client`` CSV (paths under ``root``)."""
    if not client_map.is_file():
        raise ConfigError(f"dataset.client_map {client_map} does not exist")
    with client_map.open(newline="") as stream:
        owner = {str(Path(row[0])): row[1] for row in csv.reader(stream) if len(row) >= 2}
    tagged: list[Entry] = []
    for file, label, _ in entries:
        key = str(file.relative_to(root))
        if key not in owner:
            raise ConfigError(f"dataset.client_map {client_map} gives no client for {key}")
        tagged.append((file, label, owner[key]))
    return tagged


def _decode(
    entries: list[Entry],
    classes: dict[object, int],
    clients: dict[object, int] | None,
    size: int,
    channels: int,
) -> ImageSplit:
    from PIL import Image, UnidentifiedImageError

    images = np.zeros((len(entries), channels, size, size), np.float32)
    for row, (file, _, _) in enumerate(entries):
        try:
            with Image.open(file) as image:
                images[row] = to_pixels(image, channels, size)
        except (OSError, UnidentifiedImageError) as error:
            raise ConfigError(f"cannot read image {file}: {error}") from error
    labels = [classes[label] for _, label, _ in entries]
    groups = None if clients is None else [clients[client] for _, _, client in entries]
    return split_of(images, labels, groups)


def to_pixels(image: Any, channels: int, size: int) -> np.ndarray:
    """A PIL image (or an array PIL can read) as ``(channels, size, size)`` values in [0, 1]."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        image = Image.fromarray(np.asarray(image))
    mode = {1: "L", 3: "RGB"}[channels]
    pixels = np.asarray(image.convert(mode).resize((size, size)), np.float32)
    return pixels.reshape(size, size, channels).transpose(2, 0, 1) / 255.0
