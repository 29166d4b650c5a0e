"""Tiny workloads and fault-injection hooks for autotune's own tests (and for trying it out).

Use them from a space file like any user's workload::

    workload:
      model: autotune.testing:tiny_mlp
      data: autotune.testing:blobs

They train in a fraction of a second on a CPU, so a whole study fits in a test.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from autotune.workloads import DataSplits

__all__ = ["SlowDataset", "blobs", "broken_model", "tiny_mlp"]


def blobs(
    n_train: int = 256,
    n_val: int = 128,
    n_features: int = 16,
    n_classes: int = 4,
    spread: float = 1.0,
    seed: int = 0,
    image: bool = False,
    val_delay_seconds: float = 0.0,
) -> DataSplits:
    """Gaussian clusters, one per class: learnable in a few steps, deterministic from ``seed``.

    ``image`` shapes each sample as a (1, s, s) image (``n_features`` must be a square) so that
    channels_last applies; ``val_delay_seconds`` makes every validation sample that slow to load.
    """
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(n_classes, n_features, generator=generator) * 3.0

    def draw(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.arange(count) % n_classes
        points = centers[labels] + spread * torch.randn(count, n_features, generator=generator)
        if image:
            side = math.isqrt(n_features)
            if side * side != n_features:
                raise ValueError(f"image=True needs a square n_features, got {n_features}")
            points = points.reshape(count, 1, side, side)
        return points, labels

    train = TensorDataset(*draw(n_train))
    val: Dataset = TensorDataset(*draw(n_val))
    if val_delay_seconds > 0:
        val = SlowDataset(val, val_delay_seconds)
    return DataSplits(train=train, val=val, num_classes=n_classes)


class SlowDataset(Dataset):
    """Wraps a data set so that every item takes ``delay_seconds`` to load."""

    def __init__(self, inner: Dataset, delay_seconds: float) -> None:
        self.inner, self.delay_seconds = inner, delay_seconds

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay_seconds)
        return self.inner[index]


class _NanAfter(nn.Module):
    """Passes its input through until ``steps`` training forwards, then returns NaN."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps, self.calls = steps, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls > self.steps:
                return x * float("nan")
        return x


def tiny_mlp(
    num_classes: int,
    input_shape: tuple[int, ...],
    hidden: int = 32,
    nan_after_steps: int | None = None,
) -> nn.Module:
    """Flatten, one hidden ReLU layer, a linear classifier.

    ``nan_after_steps`` injects a fault: after that many training forwards the logits are NaN.
    """
    layers: list[nn.Module] = [
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    ]
    if nan_after_steps is not None:
        layers.append(_NanAfter(nan_after_steps))
    return nn.Sequential(*layers)


class _Broken(nn.Module):
    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError(self.message)


def broken_model(message: str = "a bug in forward") -> nn.Module:
    """A model whose forward always raises ValueError(message): a bug, not a configuration."""
    return _Broken(message)
