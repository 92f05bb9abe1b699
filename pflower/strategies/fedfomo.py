r"""FedFomo: Zhang, Sapra, Fidler, Yeung and Alvarez, "Personalized Federated Learning with
First Order Model Optimization", ICLR 2021 (a baseline of the DiversiFed paper, Wu et al.,
Sec. V-B).

Each client i keeps a personalized model and a validation share of its training data: the
experiment's (``split.val_fraction``) if it has one, else the client holds out a seeded
``holdout`` fraction (default 0.2, the paper's 20%) of its train share itself and trains on the
rest. Every round (FedFomo's Alg. 1):

- server: sends client i the stored latest models of the M other clients with the highest
  affinity P[i, ·] (ties broken by a seeded draw), or with probability $ε$ (``epsilon``) M clients
  drawn uniformly at random (the paper's $ε$-greedy exploration);
- client: with its previous model $θ_i^{t−1}$ and the received $θ_n$, the first-order weights
  $w_n$ = max(0, $(L_{val}(θ_i^{t−1}) − L_{val}(θ_n))$ / ($\|θ_n − θ_i^{t−1}\|$ + 1e−5)),
  normalized to sum to 1 when their sum is positive (else all 0); then
  $θ_i \leftarrow  θ_i^{t−1} + \sum _n w_n (θ_n − θ_i^{t−1})$ over the trainable parameters
  (BatchNorm statistics stay the client's), then local training for the configured epochs;
- server: P[i, n] += $w_n$ (the affinity update).

What crosses the wire: fit sends the M chosen models, concatenated (M × the ``state_dict``
arrays), with config ``server-round`` and ``fomo-ids`` (their partition ids, comma separated,
in the order of the arrays); the client uploads its trained model and reports the weights as
the fit metric ``fomo-weights`` (``id:w`` pairs separated by ``;``). Downlink: M models per
client per round. A client first sampled before any other client uploaded receives none.

Server state: the base class's ClientModelStore (latest upload per partition id) and the
affinity matrix ``affinity`` (N × N, by partition id). No global model: stage G evaluates the
mean of the stored models (labelled ``mean_of_client_models``). Client state:
``fomo_personal``, its model $θ_i$ (read at fit and evaluate: stage L1 is the personalized
model); a client starts from $Θ^0$. With M = 0 the method is local training.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
from flwr.common import NDArrays, Scalar
from torch import nn

from pflower.api import AlgorithmOptions, PersonalizedStrategy, register_algorithm
from pflower.config import require
from pflower.core.declared import state
from pflower.core.experiment import ClientData, Experiment
from pflower.core.state import ClientState
from pflower.core.strategy import ClientUpdate
from pflower.core.training import evaluate, set_weights, trainable_mask
from pflower.searchspace import tunable
from pflower.strategies.model_mixing import MEAN_OF_CLIENT_MODELS, OwnModelClient, mean_of_stored

PERSONAL = "fomo_personal"
"""Client state: the personalized model θ_i (all ``state_dict`` arrays)."""
IDS_KEY = "fomo-ids"
WEIGHTS_KEY = "fomo-weights"
_FOMO_PHASE = 3
"""Random stream of FedFomo's choice of models (distinct from the base's sampling phases)."""


def choose_models(
    affinity_row: np.ndarray,
    candidates: list[int],
    count: int,
    epsilon: float,
    rng: np.random.Generator,
) -> list[int]:
    """The ``count`` candidates with the highest affinity (seeded tie-break), or with
    probability ``epsilon`` ``count`` candidates drawn uniformly."""
    count = min(count, len(candidates))
    if count == 0:
        return []
    order = rng.permutation(len(candidates))
    if epsilon > 0 and rng.random() < epsilon:
        return sorted(candidates[k] for k in order[:count])
    shuffled = [candidates[k] for k in order]
    ranked = sorted(shuffled, key=lambda pid: -affinity_row[pid])  # stable: ties stay shuffled
    return ranked[:count]


def fomo_weights(old_loss: float, losses: list[float], distances: list[float]) -> np.ndarray:
    """FedFomo's first-order weights max(0, (L(θ_old) − L(θ_n)) / (‖θ_n − θ_old‖ + 1e−5)),
    normalized if their sum is positive."""
    raw = np.maximum(
        0.0, (old_loss - np.asarray(losses)) / (np.asarray(distances, dtype=np.float64) + 1e-5)
    )
    total = raw.sum()
    return raw / total if total > 0 else np.zeros_like(raw)


def encode_weights(ids: list[int], weights: np.ndarray) -> str:
    return ";".join(f"{pid}:{float(w)!r}" for pid, w in zip(ids, weights, strict=True))


def decode_weights(text: str) -> dict[int, float]:
    pairs = [item.split(":") for item in text.split(";") if item]
    return {int(pid): float(w) for pid, w in pairs}


def hold_out(data: ClientData, fraction: float, seed: int) -> ClientData:
    """``data`` with a seeded ``fraction`` of its train share moved to its validation share."""
    count = len(data.train)
    order = np.random.default_rng([seed, _FOMO_PHASE, data.partition_id]).permutation(count)
    size = round(fraction * count)
    return replace(
        data,
        train=data.train.subset(np.sort(order[size:])),
        val=data.train.subset(np.sort(order[:size])),
    )


class FedFomoStrategy(PersonalizedStrategy["FedFomoOptions"]):
    """Sends each client the M stored models it has the most affinity with; learns P."""

    robust_aggregation: ClassVar[bool] = False

    text_metrics = frozenset({WEIGHTS_KEY})

    keeps_client_models: ClassVar[bool] = True
    global_model_label: ClassVar[str | None] = MEAN_OF_CLIENT_MODELS

    affinity: np.ndarray = state(factory=lambda s: np.zeros((s.settings.num_clients,) * 2))
    """P[i, n]: how much client i gained from client n's models so far."""
    chosen: dict[int, list[int]] = state({})
    """The models sent to each client in the latest round (partition ids)."""

    def client_messages(
        self, server_round: int, partition_ids: list[int], global_weights: NDArrays
    ) -> dict[int, NDArrays]:
        messages = {}
        for pid in partition_ids:
            rng = np.random.default_rng([self.settings.seed, _FOMO_PHASE, server_round, pid])
            candidates = [n for n in self.client_models.partition_ids if n != pid]
            chosen = choose_models(
                self.affinity[pid], candidates, self.options.num_models, self.options.epsilon, rng
            )
            self.chosen[pid] = chosen
            messages[pid] = [a for n in chosen for a in self.client_models.model(n)]
        return messages

    def fit_config(self, server_round: int, partition_id: int) -> dict[str, Scalar]:
        ids = ",".join(str(n) for n in self.chosen.get(partition_id, []))
        return {**super().fit_config(server_round, partition_id), IDS_KEY: ids}

    def aggregate(
        self, server_round: int, updates: list[ClientUpdate], current: NDArrays
    ) -> NDArrays:
        for update in updates:
            for neighbor, weight in decode_weights(
                str(update.metrics.get(WEIGHTS_KEY, ""))
            ).items():
                self.affinity[update.partition_id, neighbor] += weight
        return mean_of_stored(self)


class FedFomoClient(OwnModelClient["FedFomoOptions"]):
    """Weighs the received models on its validation share, moves toward them, then trains."""

    model_key: ClassVar[str] = PERSONAL

    def __init__(
        self,
        options: FedFomoOptions,
        experiment: Experiment,
        data: ClientData,
        model: nn.Module,
        state: ClientState,
    ) -> None:
        super().__init__(options, experiment, data, model, state)
        if len(data.val) == 0 and options.holdout > 0:
            self.data = hold_out(data, options.holdout, experiment.settings.seed)

    def val_loss(self, weights: NDArrays) -> float:
        set_weights(self.model, weights)
        batch_size = self.experiment.settings.eval.batch_size
        return evaluate(self.model, self.data.val, self.data.prepare, batch_size).loss

    def start_model(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        old = self.own_model()
        ids = [int(n) for n in str(config.get(IDS_KEY, "")).split(",") if n]
        self._weights_text = ""
        if not ids:
            return old
        if len(self.data.val) == 0:
            raise ValueError(
                "FedFomo weighs the received models on a validation share: set "
                "split.val_fraction > 0 or strategy.holdout > 0 (the paper holds out 0.2)"
            )
        per_model = len(old)
        received = [global_weights[k * per_model : (k + 1) * per_model] for k in range(len(ids))]
        mask = trainable_mask(self.model)
        old_loss = self.val_loss(old)
        losses = [self.val_loss(model) for model in received]
        distances = [
            float(
                np.sqrt(
                    sum(
                        np.sum((n.astype(np.float64) - o.astype(np.float64)) ** 2)
                        for n, o, m in zip(model, old, mask, strict=True)
                        if m
                    )
                )
            )
            for model in received
        ]
        weights = fomo_weights(old_loss, losses, distances)
        self._weights_text = encode_weights(ids, weights)
        start = []
        for index, (array, selected) in enumerate(zip(old, mask, strict=True)):
            if not selected:
                start.append(array)
                continue
            moved = array.astype(np.float64)
            for weight, model in zip(weights, received, strict=True):
                moved = moved + weight * (model[index].astype(np.float64) - array)
            start.append(moved.astype(array.dtype))
        return start

    def fit_metrics(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        return {WEIGHTS_KEY: getattr(self, "_weights_text", "")}


@register_algorithm("fedfomo", strategy=FedFomoStrategy, client=FedFomoClient)
@dataclass
class FedFomoOptions(AlgorithmOptions):
    """Attributes:
    num_models: M, the number of other clients' models sent to each client (0 = local training).
    epsilon: probability of sending M random models instead of the top-M (ε-greedy).
    holdout: fraction of the train share a client holds out for validation when the
        experiment has no validation share (``split.val_fraction = 0``).
    """

    display_name: ClassVar[str] = "FedFomo"
    display_rank: ClassVar[int] = 41

    num_models: int = tunable(5, low=1, high=10, source="FedFomo (Zhang et al., ICLR 2021), Sec. 5")
    epsilon: float = 0.0
    holdout: float = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.num_models >= 0, f"strategy.num_models must be >= 0, got {self.num_models}")
        require(0 <= self.epsilon <= 1, f"strategy.epsilon must be in [0, 1], got {self.epsilon}")
        require(0 <= self.holdout < 1, f"strategy.holdout must be in [0, 1), got {self.holdout}")
