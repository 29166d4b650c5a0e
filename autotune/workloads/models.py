"""General-purpose built-in models (standalone: ``autotune export`` copies their source)."""

from __future__ import annotations

import math

from torch import nn


def mlp(
    num_classes: int, input_shape: tuple[int, ...], hidden: int = 256, depth: int = 2
) -> nn.Module:
    """A multilayer perceptron on flattened inputs: ``depth`` hidden layers of ``hidden`` units."""
    if depth < 0 or hidden < 1:
        raise ValueError(f"mlp needs depth >= 0 and hidden >= 1, got {depth} and {hidden}")
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU(inplace=True)]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)
