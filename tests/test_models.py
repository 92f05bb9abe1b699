"""Tests of the model zoo: shapes, exact parameter counts, FedMPR regularizers, errors, configs."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from pflower.compose import group_block
from pflower.models import (
    MODELS,
    NOISE_MODES,
    Regularization,
    ResNet,
    apply_regularization,
    build_model,
)
from pflower.registry import ConfigError

# A small input each model takes, with its class count; options shrink the big ResNets.
SMOKE_CASES: dict[str, tuple[dict, tuple[int, int, int], int]] = {
    "mnist_cnn": ({}, (1, 28, 28), 10),
    "fliu_cifar_cnn": ({}, (3, 32, 32), 10),
    "fedavg_cnn": ({}, (1, 28, 28), 10),
    "lenet_cnn": ({}, (1, 28, 28), 9),
    "flame_cnn": ({}, (3, 32, 32), 10),
    "flame_cnn1": ({}, (3, 64, 64), 6),
    "flame_cnn2": ({}, (1, 28, 28), 62),
    "mlp": ({}, (1, 28, 28), 10),
    "small_cnn": ({}, (1, 8, 8), 10),
    "resnet8": ({"width": 8}, (3, 32, 32), 100),
    "resnet18": ({"width": 8}, (1, 28, 28), 10),
}

# The models that read token ids: options, input shape (1, 1, L), class count, vocabulary.
TEXT_CASES: dict[str, tuple[dict, tuple[int, int, int], int, int]] = {
    "shakespeare_lstm": ({"hidden_size": 16}, (1, 1, 80), 80, 80),
    "sent140_lstm": ({"hidden_size": 16}, (1, 1, 25), 2, 100),
}

PARAMETER_COUNTS = [
    ("mnist_cnn", {}, (1, 28, 28), 10, 1_663_370),
    ("fliu_cifar_cnn", {}, (3, 32, 32), 10, 2_193_418),
    ("fedavg_cnn", {}, (1, 28, 28), 10, 582_026),
    ("fedavg_cnn", {}, (3, 32, 32), 10, 878_538),
    ("fedavg_cnn", {}, (3, 32, 32), 100, 924_708),
    ("fedavg_cnn", {}, (3, 64, 64), 200, 5_694_600),
    ("lenet_cnn", {}, (3, 32, 32), 10, 62_006),
    ("flame_cnn", {}, (3, 32, 32), 10, 268_650),
    ("flame_cnn1", {}, (3, 64, 64), 6, 206_678),
    ("flame_cnn2", {}, (1, 28, 28), 62, 214_590),
    ("mlp", {"hidden": [128, 64]}, (1, 28, 28), 10, 109_386),
    ("mlp", {"hidden": [64]}, (1, 28, 28), 10, 50_890),
    ("small_cnn", {}, (1, 8, 8), 10, 9_930),
    ("resnet8", {}, (3, 32, 32), 100, 1_258_404),
    ("resnet18", {}, (3, 32, 32), 10, 11_173_962),
    ("resnet18", {"stem": "imagenet"}, (3, 64, 64), 200, 11_279_112),
]


@pytest.fixture(autouse=True)
def _few_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def count_parameters(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


_REGULARIZATION_KEYS = ("dropout", "noise_sigma", "noise_mode", "reg_stages")


def small_resnet18(**options: Any) -> nn.Module:
    """A width-4 ResNet-18; FedMPR's regularization keys (``strategy.*``) are applied as its
    client applies them."""
    regularization = {k: options.pop(k) for k in _REGULARIZATION_KEYS if k in options}
    model = build_model("resnet18", {"width": 4, **options}, (1, 12, 12), 3)
    if regularization:
        stages = regularization.pop("reg_stages", (1, 2, 3, 4))
        apply_regularization(model, Regularization(**regularization), stages)
    return model


def test_smoke_cases_cover_every_registered_model() -> None:
    assert sorted([*SMOKE_CASES, *TEXT_CASES]) == MODELS.names


@pytest.mark.parametrize(
    ("name", "vocab", "expected"),
    [("shakespeare_lstm", 80, 819_920), ("sent140_lstm", 10_000, 1_174_786)],
)
def test_text_parameter_counts(name: str, vocab: int, expected: int) -> None:
    _, shape, classes, _ = TEXT_CASES[name]
    assert count_parameters(build_model(name, {}, shape, classes, vocab)) == expected


@pytest.mark.parametrize("name", sorted(SMOKE_CASES))
def test_forward_backward_and_head(name: str) -> None:
    options, shape, classes = SMOKE_CASES[name]
    torch.manual_seed(0)
    model = build_model(name, options, shape, classes)
    assert isinstance(model.fc, nn.Linear)
    assert model.fc.out_features == classes
    model.train()
    logits = model(torch.randn(2, *shape))
    assert logits.shape == (2, classes)
    assert torch.isfinite(logits).all()
    nn.functional.cross_entropy(logits, torch.tensor([0, 1])).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize(("name", "options", "shape", "classes", "expected"), PARAMETER_COUNTS)
def test_parameter_counts(
    name: str, options: dict, shape: tuple[int, int, int], classes: int, expected: int
) -> None:
    assert count_parameters(build_model(name, options, shape, classes)) == expected


@pytest.mark.parametrize("name", sorted(SMOKE_CASES))
def test_same_seed_same_parameters(name: str) -> None:
    options, shape, classes = SMOKE_CASES[name]
    states = []
    for _ in range(2):
        torch.manual_seed(7)
        states.append(build_model(name, options, shape, classes).state_dict())
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][key], states[1][key]) for key in states[0])


def test_lenet_pads_28px_input_to_keep_flatten_400() -> None:
    for shape in [(1, 28, 28), (3, 32, 32)]:
        assert build_model("lenet_cnn", {}, shape, 10).hidden.fc1.in_features == 400


def test_fedavg_cnn_registration_order_matches_pflib() -> None:
    names = [name for name, _ in build_model("fedavg_cnn", {}, (1, 28, 28), 10).named_parameters()]
    assert [name.rsplit(".", 2)[-2] for name in names] == [
        "conv1",
        "conv1",
        "conv2",
        "conv2",
        "fc1",
        "fc1",
        "fc",
        "fc",
    ]


def test_imagenet_resnet18_matches_torchvision_state_dict() -> None:
    torchvision = pytest.importorskip("torchvision")
    reference = torchvision.models.resnet18(weights=None, num_classes=7).state_dict()
    ours = build_model("resnet18", {"stem": "imagenet"}, (3, 64, 64), 7).state_dict()
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in reference.items()}


def test_resnet8_uses_kaiming_fan_out_init() -> None:
    torch.manual_seed(0)
    model = build_model("resnet8", {}, (3, 32, 32), 100)
    expected_std = (2.0 / (64 * 7 * 7)) ** 0.5
    assert model.conv1.weight.std().item() == pytest.approx(expected_std, rel=0.05)
    assert torch.equal(model.bn1.weight, torch.ones(64))
    assert torch.equal(model.bn1.bias, torch.zeros(64))


# --- FedMPR regularization (Göksu & Pugeault, Sec. IV-B) ------------------------------------------


def test_regularization_is_off_by_default_and_draws_no_random_numbers() -> None:
    model = small_resnet18()
    assert all(not block.regularization.active for stage in model.stages() for block in stage)
    model.train()
    x = torch.randn(4, 1, 12, 12)
    rng_before = torch.get_rng_state()
    model(x)
    assert torch.equal(torch.get_rng_state(), rng_before)


def test_regularization_adds_no_parameters_or_state() -> None:
    plain = small_resnet18().state_dict()
    regularized = small_resnet18(dropout=0.2, noise_sigma=0.4).state_dict()
    assert {k: v.shape for k, v in plain.items()} == {k: v.shape for k, v in regularized.items()}


@pytest.mark.parametrize(
    "options",
    [{"dropout": 0.2}, *({"noise_sigma": 0.4, "noise_mode": mode} for mode in NOISE_MODES)],
    ids=["dropout", *NOISE_MODES],
)
def test_regularization_active_in_train_and_off_in_eval(options: dict) -> None:
    torch.manual_seed(0)
    model = small_resnet18(**options)
    x = torch.randn(4, 1, 12, 12)

    model.train()
    assert not torch.allclose(model(x), model(x))

    plain = small_resnet18()
    plain.load_state_dict(model.state_dict())
    model.eval()
    plain.eval()
    with torch.no_grad():
        first, second, reference = model(x), model(x), plain(x)
    assert torch.equal(first, second)
    assert torch.equal(first, reference)


@pytest.mark.parametrize("mode", [m for m in NOISE_MODES if m != "activation"])
def test_weight_noise_leaves_stored_weights_unchanged_and_passes_gradients(mode: str) -> None:
    model = small_resnet18(noise_sigma=0.4, noise_mode=mode)
    before = {k: v.clone() for k, v in model.state_dict().items() if "conv" in k}
    model.train()
    model(torch.randn(4, 1, 12, 12)).sum().backward()
    after = model.state_dict()
    assert all(torch.equal(value, after[key]) for key, value in before.items())
    assert model.layer1[0].conv1.weight.grad is not None
    assert model.layer1[0].conv1.weight.grad.abs().sum() > 0


def test_reg_stages_select_blocks() -> None:
    model = small_resnet18(dropout=0.2, reg_stages=[1, 2])
    active = [block.regularization.active for stage in model.stages() for block in stage]
    assert active == [True] * 4 + [False] * 4


def test_apply_regularization_errors() -> None:
    with pytest.raises(ConfigError, match="stages"):
        apply_regularization(
            build_model("resnet8", {"width": 4}, (3, 16, 16), 2),
            Regularization(dropout=0.1),
            stages=[4],
        )
    with pytest.raises(ConfigError, match="needs a ResNet"):
        apply_regularization(build_model("small_cnn", {}, (1, 8, 8), 2), Regularization())
    assert isinstance(small_resnet18(), ResNet)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dropout": 1.0}, "dropout"),
        ({"noise_sigma": -0.1}, "noise_sigma"),
        ({"noise_mode": "gaussian"}, "weight_relative"),
        ({"stem": "tiny"}, "cifar, imagenet"),
        ({"init": "xavier"}, "default, kaiming"),
        ({"width": 0}, "width"),
    ],
)
def test_resnet18_rejects_bad_option_values(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        small_resnet18(**options)


# --- configuration errors --------------------------------------------------------------------


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match=r"Unknown model 'resnet50'.*fedavg_cnn.*small_cnn"):
        build_model("resnet50", {}, (3, 32, 32), 10)


def test_unknown_option_lists_allowed_keys() -> None:
    with pytest.raises(ConfigError, match=r"'depth'.*Allowed keys: stem, width, init"):
        build_model("resnet18", {"depth": 34}, (3, 32, 32), 10)


def test_dataset_keys_cannot_be_set_in_model_options() -> None:
    with pytest.raises(ConfigError, match="num_classes must not be set"):
        build_model("mlp", {"num_classes": 10}, (1, 28, 28), 10)


@pytest.mark.parametrize(
    ("name", "shape"),
    [("fedavg_cnn", (1, 8, 8)), ("mnist_cnn", (1, 3, 3)), ("small_cnn", (1, 1, 1))],
)
def test_too_small_input_is_a_clear_config_error(name: str, shape: tuple[int, int, int]) -> None:
    with pytest.raises(ConfigError, match=rf"'{name}' cannot take input of shape .* too small"):
        build_model(name, {}, shape, 10)


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("fliu_cifar_cnn", {"conv3_kernel": 4}),
        ("mlp", {"hidden": [64, 0]}),
        ("flame_cnn1", {"dropout": -0.5}),
        ("lenet_cnn", {"conv1_padding": -1}),
    ],
)
def test_bad_option_values_are_config_errors(name: str, options: dict) -> None:
    _, shape, classes = SMOKE_CASES[name]
    with pytest.raises(ConfigError):
        build_model(name, options, shape, classes)


def test_bad_input_shape_or_class_count() -> None:
    with pytest.raises(ConfigError, match="input_shape"):
        build_model("mlp", {}, (0, 28, 28), 10)
    with pytest.raises(ConfigError, match="num_classes"):
        build_model("mlp", {}, (1, 28, 28), 0)


# --- the model blocks (pflower.blocks) ----------------------------------------------------------


@pytest.mark.parametrize("name", MODELS.names)
def test_config_file_mirrors_factory_defaults(name: str) -> None:
    config = group_block("model", name)
    assert config.pop("name") == name
    parameters = inspect.signature(MODELS.get(name)).parameters
    defaults = {
        key: list(p.default) if isinstance(p.default, tuple) else p.default
        for key, p in parameters.items()
        if key not in ("input_shape", "num_classes", "vocab_size")
    }
    assert config == defaults


@pytest.mark.parametrize("name", MODELS.names)
def test_model_builds_from_its_hydra_config(name: str) -> None:
    config = group_block("model", name)
    if name in TEXT_CASES:
        _, shape, classes, vocab = TEXT_CASES[name]
    else:
        (_, shape, classes), vocab = SMOKE_CASES[name], 0
    model = build_model(config.pop("name"), config, shape, classes, vocab)
    assert model.fc.out_features == classes
