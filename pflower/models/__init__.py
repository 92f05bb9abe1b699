"""Model zoo: ``build_model(name, options, input_shape, num_classes)`` and the model registry.

See [`pflower.models.zoo`][pflower.models.zoo] for the registered names and their options.
"""

from pflower.models.regularization import NOISE_MODES, Regularization
from pflower.models.resnet import ResNet, apply_regularization
from pflower.models.zoo import MODELS, build_model

__all__ = [
    "MODELS",
    "NOISE_MODES",
    "Regularization",
    "ResNet",
    "apply_regularization",
    "build_model",
]
