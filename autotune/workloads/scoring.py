"""How a batch is scored and its loss taken: accuracy and cross-entropy over every target element.

A target is one class index per sample (``[batch]``, image classification) or per element
(``[batch, *d]``: a class per pixel in segmentation, per token in a language model); the model's
logits carry the classes in dimension 1 (``[batch, classes, *d]``), as ``cross_entropy`` reads
them. Accuracy is the share of scored target elements predicted right: never divided by the batch
size alone, so a score is in [0, 1] for any target shape. Targets equal to ``IGNORE_INDEX`` (the
padding label of Hugging Face and ``cross_entropy``'s default) are neither trained on nor scored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

__all__ = [
    "IGNORE_INDEX",
    "LossFn",
    "classification_sums",
    "cross_entropy_loss",
    "logits_of",
    "model_loss",
]

IGNORE_INDEX = -100

LossFn = Callable[[Any, Any], torch.Tensor]  # (model output, target) -> scalar loss


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


def logits_of(output: Any) -> torch.Tensor:
    """The logits in a model's output: the output itself, its ``logits`` entry (a dict), or its
    ``.logits`` (a Hugging Face ``ModelOutput``); TypeError saying what the output is otherwise."""
    if isinstance(output, torch.Tensor):
        return output
    logits = (
        output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    )
    if not isinstance(logits, torch.Tensor):
        raise TypeError(
            f"the model returned {type(output).__name__} without a tensor of logits (a "
            f"tensor, or a 'logits' entry or attribute)"
        )
    return logits


def cross_entropy_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the output's logits over the scored target elements."""
    return nn.functional.cross_entropy(logits_of(output), target, ignore_index=IGNORE_INDEX)


def model_loss(output: Any, target: Any) -> torch.Tensor:
    """The loss the model computed itself (``loss: model``): its output's ``loss`` entry or
    ``.loss``, as a Hugging Face model returns when it is given the labels."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"loss: model, but the model returned {type(output).__name__} without a 'loss' "
            f"entry or attribute (a Hugging Face model computes one when given the labels)"
        )
    return loss
