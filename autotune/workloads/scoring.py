"""How a classification batch is scored: accuracy and cross-entropy over every target element.

A target is one class index per sample (``[batch]``, image classification) or per element
(``[batch, *d]``: a class per pixel in segmentation, per token in a language model); the model's
logits carry the classes in dimension 1 (``[batch, classes, *d]``), as ``cross_entropy`` reads
them. Accuracy is the share of scored target elements predicted right: never divided by the batch
size alone, so a score is in [0, 1] for any target shape. Targets equal to ``IGNORE_INDEX`` (the
padding label of Hugging Face and ``cross_entropy``'s default) are neither trained on nor scored.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["IGNORE_INDEX", "classification_sums"]

IGNORE_INDEX = -100


def classification_sums(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(right predictions, summed cross-entropy in nats, scored target elements) of one batch,
    as device tensors: adding them up over batches reads nothing back from the device."""
    scored = targets != IGNORE_INDEX
    right = ((logits.argmax(dim=1) == targets) & scored).sum()
    loss = nn.functional.cross_entropy(
        logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return right, loss, scored.sum()
