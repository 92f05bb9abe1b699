"""The shared loop's mini-batches, for algorithms that write their own local training loop
(FedRoD's two heads, FedPHP's MMD alignment, pFedMe's K inner steps, APFL's model pair, ...),
and the optimizer step of the shared loop
([`optimizer_step`][pflower.strategies.batches.optimizer_step]).

[`pflower.core.client.PersonalClient.local_train`][pflower.core.client.PersonalClient.local_train]
draws a client's data order from a
generator seeded by (experiment seed, round, partition id); a custom loop that uses
[`data_generator`][pflower.strategies.batches.data_generator] and
[`train_batches`][pflower.strategies.batches.train_batches] visits the same batches in the same
order, so
its identities with FedAvg hold bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from flwr.common import Scalar
from torch import nn

from pflower.api import PersonalClient
from pflower.core.augment import augmenter
from pflower.core.client import server_round
from pflower.core.training import (
    Regularizer,
    TrainSettings,
    batch_indices,
    data_order,
    model_device,
)


def data_generator(
    client: PersonalClient, config: dict[str, Scalar], *extra: int
) -> torch.Generator:
    """The generator of the shared loop's data order for ``client`` in this round; ``extra``
    entries give a further, independent stream (e.g. a second pass over other batches)."""
    return data_order(
        client.experiment.settings.seed, server_round(config), client.partition_id, *extra
    )


def train_batches(
    client: PersonalClient, settings: TrainSettings, config: dict[str, Scalar]
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(prepared inputs, labels) of the client's train split on its model's device, in the
    shared loop's order: ``settings.epochs`` passes, or ``settings.steps`` batches, augmented
    as the shared loop augments them (``settings.augment``)."""
    data = client.data.train
    generator = data_generator(client, config)
    augment = augmenter(settings.augment, generator)
    for index in batch_indices(
        len(data), settings.batch_size, generator, settings.epochs, settings.steps
    ):
        device = model_device(client.model)
        images = client.data.prepare(augment(data.images[index]))
        yield images.to(device), data.labels[index].to(device)


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    model: nn.Module,
    regularizer: Regularizer | None = None,
    after_step: Callable[[nn.Module], None] | None = None,
) -> None:
    """One step of the shared loop on ``loss``: the algorithm's ``regularizer`` term added, the
    gradients reset, backward, the optimizer step, then ``after_step``."""
    if regularizer is not None:
        loss = loss + regularizer(model)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if after_step is not None:
        after_step(model)
