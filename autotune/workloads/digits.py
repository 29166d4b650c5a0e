"""scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes, no download), and a
small CNN; the validation split is stratified and fixed. ``autotune export`` copies this source."""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset


def digits(val_fraction: float = 0.2, split_seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """Digits as (1, 8, 8) float images standardized with training-split statistics."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be between 0 and 1, got {val_fraction}")
    images, labels = load_digits(return_X_y=True)
    train_x, val_x, train_y, val_y = train_test_split(
        images, labels, test_size=val_fraction, stratify=labels, random_state=split_seed
    )
    train_images = torch.tensor(train_x, dtype=torch.float32).reshape(-1, 1, 8, 8)
    val_images = torch.tensor(val_x, dtype=torch.float32).reshape(-1, 1, 8, 8)
    mean, std = train_images.mean(), train_images.std()
    train = TensorDataset((train_images - mean) / std, torch.tensor(train_y))
    val = TensorDataset((val_images - mean) / std, torch.tensor(val_y))
    return train, val


def digits_cnn(num_classes: int = 10, width: int = 32, in_channels: int = 1) -> nn.Module:
    """Two 3x3 convolutions with batch norm, a max-pool and a two-layer classifier head.

    Sized for 8x8 inputs: about 0.15M parameters at width 32.
    """
    return nn.Sequential(
        nn.Conv2d(in_channels, width, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.Conv2d(width, 2 * width, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * width * 4 * 4, 4 * width),
        nn.ReLU(inplace=True),
        nn.Linear(4 * width, num_classes),
    )
