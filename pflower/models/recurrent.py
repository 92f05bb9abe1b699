"""Recurrent models of token sequences: LEAF's stacked LSTMs for Shakespeare and Sent140
(Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018, Sec. 4, and LEAF's reference
implementation, ``models/shakespeare/stacked_lstm.py`` and ``models/sent140/stacked_lstm.py``).

The input is a batch of int64 token ids laid out ``(N, 1, 1, L)``, as a text dataset stores
them ([`pflower.datasets.text`][pflower.datasets.text]): embedding → stacked LSTM → the last
step's hidden state → optional dense layers → ``fc``. The body/head split of
[`pflower.models.split`][pflower.models.split] is the zoo's: ``fc`` is the head and
[`represent`][pflower.models.recurrent.TokenLSTM.represent] the input of ``fc``, so FedPer, FedRep,
FedBABU, FedRoD and the other split-model methods personalize the classifier over the LSTM's
(and dense layers') features. There is no normalization layer (FedBN has nothing of its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch
from torch import nn


class TokenLSTM(nn.Module):
    """Embedding, stacked LSTM (batch first) and dense layers over the last step, then ``fc``.

    Args:
        vocab_size: rows of the embedding (token ids ``0..vocab_size - 1``).
        num_classes: outputs of ``fc``.
        embedding_dim: width of the embedding.
        hidden_size: width of every LSTM layer.
        num_layers: stacked LSTM layers.
        dense: widths of linear layers between the LSTM and ``fc``, without activation, as
            LEAF's ``tf.layers.dense`` (activation None) for Sent140.
    """

    head_module = "fc"

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        embedding_dim: int,
        hidden_size: int,
        num_layers: int,
        dense: Sequence[int] = (),
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_size, num_layers, batch_first=True)
        widths = [hidden_size, *dense]
        self.dense = nn.Sequential(*(nn.Linear(a, b) for a, b in pairwise(widths)))
        self.fc = nn.Linear(widths[-1], num_classes)

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        """The features ``fc`` classifies: the last step's top LSTM output through ``dense``."""
        tokens = x.reshape(x.shape[0], -1).long()
        outputs, _ = self.lstm(self.embedding(tokens))
        features: torch.Tensor = self.dense(outputs[:, -1])
        return features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.fc(self.represent(x))
        return logits
