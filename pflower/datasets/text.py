"""Text as integer token tensors: LEAF's Shakespeare and Sent140 encodings (Caldas et al., "LEAF:
A Benchmark for Federated Settings", 2018, and LEAF's reference implementation,
``models/utils/language_utils.py``).

A text dataset is an [`ImageDataset`][pflower.datasets.base.ImageDataset] whose samples are int64
token ids laid out as ``(N, 1, 1, L)`` (one "row" of ``L`` tokens) with ``vocab_size > 0``: every
split, partition scheme, cache and client carries them as it carries images, normalization
leaves them as they are, and only a model that reads tokens (``model=shakespeare_lstm``,
``model=sent140_lstm``) accepts them.

- Shakespeare (next-character prediction): each ``x`` is a string of 80 characters, each ``y``
  the character that follows; both are encoded by their position in LEAF's letter table
  [`ALL_LETTERS`][pflower.datasets.text.ALL_LETTERS] (``word_to_indices``/``letter_to_vec``),
  so ``L = 80`` and the 80 letters are both the vocabulary and the classes.
- Sent140 (tweet sentiment): each ``x`` is the row LEAF's ``data_to_json.py`` keeps of
  Sentiment140's CSV, ``[id, date, query, user, text, ...]``; the tweet is ``x[4]``, split into
  words by LEAF's ``split_line`` and encoded as LEAF's ``line_to_indices`` does (the first ``L``
  words, padded with the unknown-word id; ``L = 25`` in LEAF). ``y`` is 0 or 1.
  **Deviation:** LEAF looks words up in the 300-d GloVe vocabulary, which cannot be downloaded
  here; pflower learns the embedding over a vocabulary built from the *training* split only
  (the ``vocab_size - 1`` most frequent training words, ties by the word; id ``vocab_size - 1``
  is the unknown word and the padding, as ``len(word2id)`` is in LEAF), so no test word leaks
  into the encoding and the model's shape is known from the configuration alone.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from numpy.typing import ArrayLike

from pflower.datasets.arrays import check_splits
from pflower.datasets.base import ImageDataset, ImageSplit
from pflower.registry import ConfigError

ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
"""LEAF's Shakespeare letter table (``language_utils.ALL_LETTERS``): a character's id is its
position here, for the inputs and the next-character labels alike (80 letters)."""

_LETTER_IDS = {letter: index for index, letter in enumerate(ALL_LETTERS)}
_WORD = re.compile(r"[\w']+|[.,!?;]")
_TEXT_FIELD = 4
"""Position of the tweet in a Sent140 ``x`` row ``[id, date, query, user, text, ...]``."""


def encode_characters(strings: Sequence[str], length: int, source: Path) -> np.ndarray:
    """Shakespeare strings as an ``(N, length)`` int64 array of letter ids.

    Raises:
        ConfigError: a string that is not ``length`` characters long, or a character outside
            LEAF's table (LEAF's ``str.find`` would give it the invalid id -1).
    """
    ids = np.empty((len(strings), length), dtype=np.int64)
    for row, text in enumerate(strings):
        if not isinstance(text, str) or len(text) != length:
            raise ConfigError(
                f"{source}: Shakespeare sample {row} is {text!r}, not a string of {length} "
                "characters (LEAF writes 80; set dataset.seq_len to the files' length)"
            )
        ids[row] = [_letter_id(letter, source) for letter in text]
    return ids


def encode_letters(letters: Sequence[str], source: Path) -> np.ndarray:
    """Shakespeare's next-character labels (one-character strings) as int64 letter ids."""
    for letter in letters:
        if not isinstance(letter, str) or len(letter) != 1:
            raise ConfigError(f"{source}: Shakespeare label {letter!r} is not one character")
    return np.asarray([_letter_id(letter, source) for letter in letters], dtype=np.int64)


def _letter_id(letter: str, source: Path) -> int:
    try:
        return _LETTER_IDS[letter]
    except KeyError:
        raise ConfigError(
            f"{source}: character {letter!r} is not in LEAF's Shakespeare letter table "
            "(ALL_LETTERS of LEAF's language_utils); regenerate the data with LEAF's scripts"
        ) from None


def split_words(line: str) -> list[str]:
    """A phrase split into words and punctuation marks (LEAF's ``split_line``)."""
    return _WORD.findall(line)


def tweets(rows: Sequence[object], source: Path) -> list[str]:
    """The tweet text ``x[4]`` of each Sent140 row ``[id, date, query, user, text, ...]``."""
    texts = []
    for number, row in enumerate(rows):
        if not isinstance(row, list) or len(row) <= _TEXT_FIELD:
            raise ConfigError(
                f"{source}: Sent140 sample {number} is {row!r}, not a row [id, date, query, "
                "user, text, ...] as LEAF's data_to_json.py writes it"
            )
        texts.append(str(row[_TEXT_FIELD]))
    return texts


def word_ids(training_lines: Sequence[str], vocab_size: int) -> dict[str, int]:
    """The vocabulary of the training split: its ``vocab_size - 1`` most frequent words (ties
    broken by the word), numbered from 0 by frequency; ``vocab_size - 1`` is left for unknown
    words and padding."""
    counts = Counter(word for line in training_lines for word in split_words(line))
    ranked = sorted(counts, key=lambda word: (-counts[word], word))[: vocab_size - 1]
    return {word: index for index, word in enumerate(ranked)}


def encode_lines(
    lines: Sequence[str], ids: dict[str, int], length: int, vocab_size: int
) -> np.ndarray:
    """Phrases as an ``(N, length)`` int64 array of word ids (LEAF's ``line_to_indices``): the
    first ``length`` words, unknown words and the padding after the last word as
    ``vocab_size - 1``."""
    unknown = vocab_size - 1
    encoded = np.full((len(lines), length), unknown, dtype=np.int64)
    for row, line in enumerate(lines):
        words = split_words(line)[:length]
        encoded[row, : len(words)] = [ids.get(word, unknown) for word in words]
    return encoded


def token_split(
    tokens: np.ndarray, labels: ArrayLike, groups: ArrayLike | None = None
) -> ImageSplit:
    """An [`ImageSplit`][pflower.datasets.base.ImageSplit] of ``(N, L)`` token ids, laid out
    ``(N, 1, 1, L)``, with their labels and optional group ids."""
    return ImageSplit(
        torch.from_numpy(np.ascontiguousarray(tokens[:, None, None, :], dtype=np.int64)),
        torch.from_numpy(np.asarray(labels, dtype=np.int64)),
        None if groups is None else torch.from_numpy(np.asarray(groups, dtype=np.int64)),
    )


def token_dataset(
    name: str, train: ImageSplit, test: ImageSplit, num_classes: int, vocab_size: int
) -> ImageDataset:
    """The dataset of two token splits: ids in ``0..vocab_size - 1``, never normalized.

    Raises:
        ConfigError: an empty train split, or a label outside ``0..num_classes - 1``.
    """
    check_splits(
        name,
        train,
        test,
        num_classes,
        "LEAF Sent140's y is 0 or 1; dataset=hf: set dataset.num_classes",
    )
    return ImageDataset(
        name=name,
        train=train,
        test=test,
        num_classes=num_classes,
        mean=(0.0,),
        std=(1.0,),
        scale=1.0,
        vocab_size=vocab_size,
    )
