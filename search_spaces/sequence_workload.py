"""A sequence model judged by your own score: a GRU reads generated signals and names their
pattern; the study scores it by macro-averaged F1 (``macro_f1``), not by accuracy.

The classes are imbalanced (the most common is over half of the data), so a model that ignores
the rare classes can have good accuracy and poor macro F1: the score is what decides which
configuration is worth its seconds. Generated, so nothing is downloaded. Used by
``sequence_model.yaml`` beside this file.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import TensorDataset

CLASS_SHARES = (0.55, 0.25, 0.12, 0.08)  # how often each pattern occurs


def signals(
    train_size: int = 2000,
    val_size: int = 600,
    length: int = 24,
    noise: float = 0.6,
    seed: int = 0,
):
    """(train, val) of ``[length, 2]`` float signals and their pattern (0 to 3): a sine wave
    whose frequency names the class, in a second channel its phase-shifted copy, under noise."""
    generator = torch.Generator().manual_seed(seed)

    def split(size: int) -> TensorDataset:
        labels = torch.multinomial(torch.tensor(CLASS_SHARES), size, True, generator=generator)
        frequency = (1.0 + labels.float()) * math.pi / length  # one to four half-waves
        phase = torch.rand(size, 1, generator=generator) * 2 * math.pi
        steps = torch.arange(length).float()
        angle = frequency[:, None] * steps[None, :] * 2 + phase
        clean = torch.stack([angle.sin(), angle.cos()], dim=-1)
        return TensorDataset(clean + noise * torch.randn(clean.shape, generator=generator), labels)

    return split(train_size), split(val_size)


class GRUClassifier(nn.Module):
    """A GRU over the time steps; its last hidden state names the class."""

    def __init__(self, features: int, num_classes: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, signal: torch.Tensor) -> torch.Tensor:
        _, last = self.gru(signal)  # last: [layers, batch, hidden]
        return self.head(last[-1])


def gru(num_classes: int, input_shape: tuple[int, ...], hidden: int = 48, layers: int = 1):
    """The model: autotune passes the classes and one sample's shape ([length, features])."""
    return GRUClassifier(input_shape[-1], num_classes, hidden, layers)


@torch.no_grad()
def macro_f1(model: nn.Module, val_loader, device: torch.device) -> float:
    """Macro-averaged F1 over the validation batches: each class's F1, averaged, so a rare class
    counts as much as a common one. autotune calls it with the model in eval mode."""
    counts = torch.zeros(0, 0, dtype=torch.long)  # true class x predicted class
    for signal, labels in val_loader:
        logits = model(signal.to(device, non_blocking=True))
        classes = logits.shape[1]
        if counts.numel() == 0:
            counts = torch.zeros(classes, classes, dtype=torch.long)
        pairs = labels.cpu() * classes + logits.argmax(dim=1).cpu()
        counts += torch.bincount(pairs, minlength=classes * classes).view(classes, classes)
    right = counts.diag().double()
    precision = right / counts.sum(dim=0).clamp(min=1)
    recall = right / counts.sum(dim=1).clamp(min=1)
    f1 = 2 * precision * recall / (precision + recall).clamp(min=1e-12)
    return float(f1.mean())
