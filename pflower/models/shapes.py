"""Spatial-size bookkeeping for CNNs whose flatten size depends on the dataset's input shape.

The zoo never hard-codes a flatten width such as ``7 * 7 * 64``: each model walks its convolutions
and poolings through [`SpatialSize`][pflower.models.shapes.SpatialSize], which computes the
feature-map size with PyTorch's
formula and fails with a [`ConfigError`][pflower.registry.ConfigError] naming the model, the input
and
the layer at which the map vanished, instead of a shape error in the first forward pass.
"""

from __future__ import annotations

from pflower.registry import ConfigError


def check_input(input_shape: tuple[int, int, int], num_classes: int) -> None:
    """Reject an input shape that is not a positive ``(C, H, W)``, or ``num_classes < 1``."""
    if len(input_shape) != 3 or any(int(size) < 1 for size in input_shape):
        raise ConfigError(
            f"input_shape must be (channels, height, width) with positive sizes, got {input_shape}"
        )
    if num_classes < 1:
        raise ConfigError(f"num_classes must be at least 1, got {num_classes}")


class SpatialSize:
    """The (height, width) of a feature map as it passes through a model's layers."""

    def __init__(self, model: str, input_shape: tuple[int, int, int]) -> None:
        self._model = model
        self._input_shape = tuple(input_shape)
        self.height, self.width = int(input_shape[1]), int(input_shape[2])

    def conv(self, kernel: int, stride: int = 1, padding: int = 0) -> SpatialSize:
        """Apply a square ``Conv2d(kernel, stride, padding)``; returns ``self`` for chaining."""
        layer = f"conv {kernel}x{kernel} (stride {stride}, padding {padding})"
        return self._apply(layer, kernel, stride, padding)

    def pool(self, kernel: int, stride: int | None = None, padding: int = 0) -> SpatialSize:
        """Apply a square ``MaxPool2d(kernel, stride, padding)`` (stride defaults to kernel)."""
        stride = kernel if stride is None else stride
        return self._apply(f"pool {kernel}x{kernel} (stride {stride})", kernel, stride, padding)

    def flat(self, channels: int) -> int:
        """Number of features after flattening a ``channels``-deep map of the current size."""
        return channels * self.height * self.width

    def _apply(self, layer: str, kernel: int, stride: int, padding: int) -> SpatialSize:
        before = (self.height, self.width)
        self.height, self.width = ((size + 2 * padding - kernel) // stride + 1 for size in before)
        if self.height < 1 or self.width < 1:
            raise ConfigError(
                f"Model '{self._model}' cannot take input of shape {self._input_shape}: the "
                f"{before[0]}x{before[1]} feature map is too small for its {layer}. Use a larger "
                f"input (or resize the dataset), or a model made for small inputs (e.g. small_cnn)."
            )
        return self
