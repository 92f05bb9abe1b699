r"""Per-FedAvg (first-order): Fallah, Mokhtari and Ozdaglar, "Personalized Federated Learning with
Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020 (Sec. 4,
Algorithm 1 with the first-order approximation "Per-FedAvg (FO)").

The global model w is a meta-model: good after one local gradient step. Each local step of
client i takes two independent batches D and D' of its training data and sets

$$
\begin{aligned}
\tilde w &= w − α ∇f_i(w; D) && \text{(the inner, adaptation step)} \\
w &\leftarrow w − β ∇f_i(\tilde w; D')
    && \text{(the outer step, first-order: the Hessian term is dropped)}
\end{aligned}
$$

for the round's local epochs or steps; the client uploads w and the server averages as FedAvg
does (weighted by $n_i$). $β$ is ``train.lr`` (the round's optimizer; plain SGD in the paper), $α$
is ``alpha`` (null: equal to $β$, as in the FedALA paper's comparison).

Stage L1 evaluates the personalized model the paper defines, the global model after
``eval_steps`` gradient steps of size $α$ on batches of the client's *training* data (the
authors' released evaluation adapts on test batches, which leaks test data; not done here).

Batches: D' comes from the same seeded stream as every algorithm's local training (so the outer
steps see FedAvg's batches); D from a second stream. Hence ``alpha = 0`` makes w̃ = w and
Per-FedAvg is FedAvg exactly (stages L1 and L2).

What crosses the wire: FedAvg's. No client state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
from flwr.common import NDArrays, Scalar
from torch import nn

from pflower.api import AlgorithmOptions, PersonalClient, PersonalizedStrategy, register_algorithm
from pflower.config import require
from pflower.core.augment import augmenter
from pflower.core.training import (
    Regularizer,
    TrainSettings,
    batch_indices,
    get_weights,
    model_device,
    set_weights,
)
from pflower.searchspace import tunable
from pflower.strategies.batches import data_generator

INNER_STREAM = 2
EVAL_STREAM = 3


class PerFedAvgStrategy(PersonalizedStrategy["PerFedAvgOptions"]):
    """Server side identical to FedAvg."""


class PerFedAvgClient(PersonalClient["PerFedAvgOptions"]):
    """First-order MAML steps locally; one-step adaptation before evaluation."""

    def alpha(self, settings: TrainSettings) -> float:
        return settings.lr if self.options.alpha is None else self.options.alpha

    def _stream(self, config: dict[str, Scalar], purpose: int) -> Iterator[torch.Tensor]:
        generator = data_generator(self, config, purpose)
        return batch_indices(
            len(self.data.train), self.train_settings(config).batch_size, generator, epochs=2**31
        )

    def _adapt(self, batch: torch.Tensor, alpha: float, parameters: list[nn.Parameter]) -> None:
        """w ← w − α ∇f(w; batch), in place."""
        data, device = self.data.train, model_device(self.model)
        loss = nn.functional.cross_entropy(
            self.model(self.data.prepare(data.images[batch]).to(device)),
            data.labels[batch].to(device),
        )
        grads = torch.autograd.grad(loss, parameters)
        with torch.no_grad():
            for param, grad in zip(parameters, grads, strict=True):
                param.sub_(alpha * grad)

    def local_train(
        self,
        settings: TrainSettings,
        config: dict[str, Scalar],
        regularizer: Regularizer | None = None,
        after_step: Callable[[nn.Module], None] | None = None,
    ) -> float:
        model, data = self.model, self.data.train
        generator = data_generator(self, config)
        augment = augmenter(settings.augment, generator)
        outer = batch_indices(
            len(data), settings.batch_size, generator, settings.epochs, settings.steps
        )
        inner = self._stream(config, INNER_STREAM)
        alpha = self.alpha(settings)
        model.train()
        parameters = [param for param in model.parameters() if param.requires_grad]
        optimizer = settings.make_optimizer(iter(parameters))
        total, batches = 0.0, 0
        for batch in outer:
            saved = [param.detach().clone() for param in parameters]
            self._adapt(next(inner), alpha, parameters)  # w̃ = w − α∇f(w; D)
            optimizer.zero_grad(set_to_none=True)
            device = model_device(model)
            loss = nn.functional.cross_entropy(
                model(self.data.prepare(augment(data.images[batch])).to(device)),
                data.labels[batch].to(device),
            )
            total += float(loss.detach())
            if regularizer is not None:
                loss = loss + regularizer(model)
            loss.backward()  # ∇f(w̃; D')
            with torch.no_grad():
                for param, value in zip(parameters, saved, strict=True):
                    param.copy_(value)
            optimizer.step()  # w ← w − β∇f(w̃; D')
            if after_step is not None:
                after_step(model)
            batches += 1
        return total / max(batches, 1)

    def personalize(self, global_weights: NDArrays, config: dict[str, Scalar]) -> NDArrays:
        set_weights(self.model, global_weights)
        if len(self.data.train) == 0:
            return global_weights
        self.model.train()
        parameters = [param for param in self.model.parameters() if param.requires_grad]
        stream = self._stream(config, EVAL_STREAM)
        alpha = self.alpha(self.train_settings(config))
        for _ in range(self.options.eval_steps):
            self._adapt(next(stream), alpha, parameters)
        return get_weights(self.model)


@register_algorithm("perfedavg", strategy=PerFedAvgStrategy, client=PerFedAvgClient)
@dataclass
class PerFedAvgOptions(AlgorithmOptions):
    """Attributes:
    alpha: step size α of the adaptation step (null: ``train.lr``, i.e. α = β).
    eval_steps: adaptation steps on training batches before evaluation (the paper: one).
    """

    display_name: ClassVar[str] = "Per-FedAvg"
    display_rank: ClassVar[int] = 240

    alpha: float | None = tunable(
        None,
        low=1e-3,
        high=0.3,
        log=True,
        source="Per-FedAvg (Fallah et al., NeurIPS 2020)",
    )
    eval_steps: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.alpha is None or self.alpha >= 0,
            f"strategy.alpha must be >= 0 or null, got {self.alpha}",
        )
        require(self.eval_steps >= 0, f"strategy.eval_steps must be >= 0, got {self.eval_steps}")
