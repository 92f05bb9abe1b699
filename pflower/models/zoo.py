"""The model zoo: every model of the five papers, by config name, built for a dataset's input.

A config block ``model: {name: <registered name>, <option>: <value>, ...}`` chooses a model;
[`build_model`][pflower.models.zoo.build_model] adds the dataset's ``input_shape`` ``(C, H, W)`` and
``num_classes``, which are
never set in a model config (and, for the models that read token sequences, the text dataset's
``vocab_size``: a factory with a ``vocab_size`` parameter reads text, every other one images).
Each factory's keyword defaults are the model's defaults, the same
as its ``model`` block's ([`pflower.blocks`][pflower.blocks], checked by a test). Every model's
classification
layer is the ``nn.Linear`` attribute
``fc`` (the head of FedRep-style base/head splits), declared by its class's ``head_module`` with a
``represent(x)`` method giving the head's input ([`pflower.models.split`][pflower.models.split]).
Parameter counts in
the docstrings are asserted in ``tests/test_models.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from pflower.models.feedforward import ConvSpec, FeedForwardNet
from pflower.models.recurrent import TokenLSTM
from pflower.models.resnet import ResNet
from pflower.registry import ConfigError, Registry

MODELS: Registry[nn.Module] = Registry("model")

_DATASET_KEYS = ("input_shape", "num_classes", "vocab_size")
_TEXT_MODELS = "model=shakespeare_lstm (LEAF Shakespeare) or model=sent140_lstm (LEAF Sent140)"


def build_model(
    name: str,
    options: Mapping[str, Any],
    input_shape: tuple[int, int, int],
    num_classes: int,
    vocab_size: int = 0,
) -> nn.Module:
    """Build the model registered as ``name`` with config ``options`` for the given input.

    Initialization draws from torch's global RNG: seed it (``torch.manual_seed``) first.

    Args:
        vocab_size: the token vocabulary of a text dataset; 0 for images and feature vectors.

    Raises:
        ConfigError: unknown name or option (the message lists the valid ones), a bad option
            value, or an input the model cannot take (e.g. too small for its poolings, or
            token sequences for an image model and the reverse).
    """
    fixed = [key for key in _DATASET_KEYS if key in options]
    if fixed:
        raise ConfigError(
            f"model option(s) {', '.join(fixed)} must not be set: the input shape and class count "
            f"come from the dataset"
        )
    shape = tuple(int(size) for size in input_shape)
    context: dict[str, Any] = {"input_shape": shape, "num_classes": int(num_classes)}
    reads_tokens = "vocab_size" in MODELS.accepted_keys(name)
    if vocab_size and not reads_tokens:
        raise ConfigError(
            f"model={name} takes images or feature vectors, but the dataset holds token "
            f"sequences (text): choose {_TEXT_MODELS}"
        )
    if reads_tokens and not vocab_size:
        raise ConfigError(
            f"model={name} reads token sequences, but the dataset holds images or feature "
            f"vectors: use it with a text dataset (dataset=leaf dataset.kind=shakespeare|sent140)"
        )
    if reads_tokens:
        context["vocab_size"] = int(vocab_size)
    return MODELS.build(name, options, **context)


@MODELS.register("mnist_cnn")
def mnist_cnn(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """McMahan et al. (2017) CNN with 'same' padding, FLIU's MNIST model (FLIU paper, Sec. IV-C).

    conv5x5(32, pad 2) → pool → conv5x5(64, pad 2) → pool → fc1 512 → fc.
    1,663,370 parameters on 1x28x28 with 10 classes (McMahan et al.'s count, which fixes the
    padding).
    """
    return FeedForwardNet(
        "mnist_cnn",
        input_shape,
        num_classes,
        convs=[ConvSpec(32, 5, padding=2), ConvSpec(64, 5, padding=2)],
        hidden=[512],
    )


@MODELS.register("fliu_cifar_cnn")
def fliu_cifar_cnn(
    input_shape: tuple[int, int, int],
    num_classes: int,
    conv3_channels: int = 64,
    conv3_kernel: int = 3,
) -> nn.Module:
    """FLIU's CIFAR-10 CNN: ``mnist_cnn`` plus a third conv before the FC layers (Sec. IV-C).

    The paper does not give the third conv's size, so it is pflower's choice: no pooling, 'same'
    padding, configurable channels and odd kernel size.
    2,193,418 parameters on 3x32x32 with 10 classes (defaults).
    """
    _check_positive("conv3_channels", conv3_channels)
    _check_positive("conv3_kernel", conv3_kernel)
    if conv3_kernel % 2 == 0:
        raise ConfigError(f"conv3_kernel must be odd for 'same' padding, got {conv3_kernel}")
    return FeedForwardNet(
        "fliu_cifar_cnn",
        input_shape,
        num_classes,
        convs=[
            ConvSpec(32, 5, padding=2),
            ConvSpec(64, 5, padding=2),
            ConvSpec(conv3_channels, conv3_kernel, padding=conv3_kernel // 2, pool=False),
        ],
        hidden=[512],
    )


@MODELS.register("fedavg_cnn")
def fedavg_cnn(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """FedALA's 4-layer CNN ("Experimental Setup"), as PFLlib's "FedAvgCNN": no padding.

    conv5x5(32) → pool → conv5x5(64) → pool → fc1 512 → fc. Parameters: 582,026 on 1x28x28 /
    10 classes; 878,538 on 3x32x32 / 10; 924,708 on 3x32x32 / 100; 5,694,600 on 3x64x64 / 200.
    """
    return FeedForwardNet(
        "fedavg_cnn",
        input_shape,
        num_classes,
        convs=[ConvSpec(32, 5), ConvSpec(64, 5)],
        hidden=[512],
    )


@MODELS.register("lenet_cnn")
def lenet_cnn(
    input_shape: tuple[int, int, int], num_classes: int, conv1_padding: int | None = None
) -> nn.Module:
    """DiversiFed's LeNet-5-style CNN (DiversiFed, Sec. V-B; 62.01K parameters in Table VIII).

    conv5x5(6) → pool → conv5x5(16) → pool → fc1 120 → fc2 84 → fc. 62,006 parameters on
    3x32x32 with 10 classes. ``conv1_padding = None`` pads inputs smaller than 32 px up to 32, as
    classic LeNet-5 does for 28x28 digits (padding 2), so the flatten stays 16·5·5 = 400.
    """
    if conv1_padding is None:
        conv1_padding = max(0, (32 - min(input_shape[1:]) + 1) // 2)
    elif conv1_padding < 0:
        raise ConfigError(f"conv1_padding must be >= 0 or null (auto), got {conv1_padding}")
    return FeedForwardNet(
        "lenet_cnn",
        input_shape,
        num_classes,
        convs=[ConvSpec(6, 5, padding=conv1_padding), ConvSpec(16, 5)],
        hidden=[120, 84],
    )


@MODELS.register("flame_cnn")
def flame_cnn(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """FLAME's CIFAR-10 CNN (FLAME, Sec. VI-A and Table II; layer sizes from the authors' code).

    conv3x3(16, pad 1) → pool → conv3x3(32, pad 1) → pool → fc1 128 → fc.
    268,650 parameters on 3x32x32 with 10 classes.
    """
    return FeedForwardNet(
        "flame_cnn",
        input_shape,
        num_classes,
        convs=[ConvSpec(16, 3, padding=1), ConvSpec(32, 3, padding=1)],
        hidden=[128],
    )


@MODELS.register("flame_cnn1")
def flame_cnn1(
    input_shape: tuple[int, int, int], num_classes: int, dropout: float = 0.2
) -> nn.Module:
    """FLAME's "CNN1" for Medical-MNIST (Sec. VI-A and Table II; sizes from the authors' code).

    conv3x3(32) → pool → conv3x3(16) → pool → dropout → fc1 64 → fc.
    206,678 parameters on 3x64x64 with 6 classes.
    """
    _check_rate("dropout", dropout)
    return FeedForwardNet(
        "flame_cnn1",
        input_shape,
        num_classes,
        convs=[ConvSpec(32, 3), ConvSpec(16, 3)],
        hidden=[64],
        dropout=dropout,
    )


@MODELS.register("flame_cnn2")
def flame_cnn2(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """FLAME's "CNN2" for FEMNIST (Sec. VI-A and Table II; sizes from the authors' code).

    conv7x7(32, pad 3) → pool → conv3x3(64, pad 1) → pool → fc (no hidden layer).
    214,590 parameters on 1x28x28 with 62 classes (the paper's output width).
    """
    return FeedForwardNet(
        "flame_cnn2",
        input_shape,
        num_classes,
        convs=[ConvSpec(32, 7, padding=3), ConvSpec(64, 3, padding=1)],
    )


@MODELS.register("mlp")
def mlp(
    input_shape: tuple[int, int, int], num_classes: int, hidden: Sequence[int] = (128, 64)
) -> nn.Module:
    """MLP on the flattened input: ``Linear + ReLU`` per ``hidden`` width, then ``fc``.

    FLAME (Sec. VI-A: two hidden layers; widths from the authors' code): hidden [128, 64],
    109,386 parameters on 1x28x28 / 10 classes. DiversiFed (Sec. V-B: one hidden layer of 64
    units; 50.89K parameters in Table VIII): hidden [64], 50,890 parameters.
    """
    widths = [int(width) for width in hidden]
    for width in widths:
        _check_positive("hidden width", width)
    return FeedForwardNet("mlp", input_shape, num_classes, hidden=widths)


@MODELS.register("small_cnn")
def small_cnn(input_shape: tuple[int, int, int], num_classes: int, width: int = 16) -> nn.Module:
    """A small CNN for tests and CPU smoke runs, e.g. on the embedded 8x8 ``digits`` dataset.

    conv3x3(width, pad 1) → conv3x3(2·width, pad 1) → pool → fc. Works on any input of at least
    2x2 pixels; 9,930 parameters on 1x8x8 with 10 classes (default width).
    """
    _check_positive("width", width)
    return FeedForwardNet(
        "small_cnn",
        input_shape,
        num_classes,
        convs=[ConvSpec(width, 3, padding=1, pool=False), ConvSpec(2 * width, 3, padding=1)],
    )


@MODELS.register("resnet8")
def resnet8(
    input_shape: tuple[int, int, int], num_classes: int, width: int = 64, init: str = "kaiming"
) -> nn.Module:
    """DiversiFed's ResNet-8 (Sec. V-B), laid out as Fling's ``resnet8`` (1.26M in Table VIII).

    7x7 stride-2 stem + max-pool, three stages of one BasicBlock (widths w, 2w, 4w), Kaiming
    init. 1,258,404 parameters on 3x32x32 with 100 classes.
    """
    return ResNet(input_shape, num_classes, (1, 1, 1), width=width, stem="imagenet", init=init)


@MODELS.register("resnet18")
def resnet18(
    input_shape: tuple[int, int, int],
    num_classes: int,
    stem: str = "cifar",
    width: int = 64,
    init: str = "default",
) -> nn.Module:
    """ResNet-18 (four stages of two BasicBlocks, widths w, 2w, 4w, 8w).

    - ``stem = "cifar"`` (FedMPR on 28-32 px images, Sec. V-C): 3x3 stem, no max-pool;
      11,173,962 parameters on 3x32x32 with 10 classes at width 64.
    - ``stem = "imagenet"`` (FedMPR's CelebA; FedALA's torchvision ``resnet18``, then also set
      ``init = "kaiming"``): 11,279,112 parameters on 3x64x64 with 200 classes at width 64.

    FedMPR's dropout and weight noise (Sec. IV-B) are the algorithm's options
    (``strategy.dropout``, ``strategy.noise_sigma``, ``strategy.noise_mode``,
    ``strategy.reg_stages``); its client switches them on in the BasicBlocks for local training
    only ([`apply_regularization`][pflower.models.resnet.apply_regularization]). Built here, the
    model is the
    plain ResNet-18 of the baselines.
    """
    return ResNet(input_shape, num_classes, (2, 2, 2, 2), width=width, stem=stem, init=init)


@MODELS.register("shakespeare_lstm")
def shakespeare_lstm(
    input_shape: tuple[int, int, int],
    num_classes: int,
    vocab_size: int,
    embedding_dim: int = 8,
    hidden_size: int = 256,
    num_layers: int = 2,
) -> nn.Module:
    """LEAF's next-character model for Shakespeare (Caldas et al. 2018, Sec. 4; LEAF's
    ``models/shakespeare/stacked_lstm.py``): embedding 8 → 2 LSTM layers of 256 → fc over the
    80 letters, from the last of the 80 steps. 819,920 parameters with 80 letters: 2,048 more
    than LEAF's TensorFlow model (817,872), as PyTorch's LSTM has two bias vectors per layer
    where TensorFlow's ``BasicLSTMCell`` has one.
    """
    return _token_lstm(vocab_size, num_classes, embedding_dim, hidden_size, num_layers, ())


@MODELS.register("sent140_lstm")
def sent140_lstm(
    input_shape: tuple[int, int, int],
    num_classes: int,
    vocab_size: int,
    embedding_dim: int = 100,
    hidden_size: int = 100,
    num_layers: int = 2,
    dense: Sequence[int] = (128,),
) -> nn.Module:
    """LEAF's sentiment model for Sent140 (LEAF's ``models/sent140/stacked_lstm.py``): embedding
    → 2 LSTM layers of 100 → dense 128 (no activation, as LEAF's) → fc over the 2 sentiments,
    from the last of the 25 word steps. LEAF's embedding rows are GloVe's vocabulary; here they
    are the training split's ``dataset.vocab_size`` word ids, learned (a documented deviation:
    [`pflower.datasets.text`][pflower.datasets.text]). 1,174,786 parameters with the default
    10,000 ids.
    """
    widths = [int(width) for width in dense]
    for width in widths:
        _check_positive("dense width", width)
    return _token_lstm(vocab_size, num_classes, embedding_dim, hidden_size, num_layers, widths)


def _token_lstm(
    vocab_size: int,
    num_classes: int,
    embedding_dim: int,
    hidden_size: int,
    num_layers: int,
    dense: Sequence[int],
) -> nn.Module:
    for key, value in (
        ("embedding_dim", embedding_dim),
        ("hidden_size", hidden_size),
        ("num_layers", num_layers),
    ):
        _check_positive(key, value)
    return TokenLSTM(vocab_size, num_classes, embedding_dim, hidden_size, num_layers, dense)


def _check_positive(key: str, value: int) -> None:
    if int(value) < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value}")


def _check_rate(key: str, value: float) -> None:
    if not 0.0 <= float(value) < 1.0:
        raise ConfigError(f"{key} must be in [0, 1), got {value}")
