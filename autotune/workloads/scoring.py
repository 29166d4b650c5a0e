"""The training losses (cross-entropy over every scored target element, the model's own) and the
user's score. A target is a class index per sample or per element (``[batch, *d]``); logits
hold the classes in dimension 1, or last where the check before the study finds them so;
targets equal to ``IGNORE_INDEX`` are neither trained on nor scored. The built-in scores are
``semantics``' (the exported script carries them)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from autotune.semantics import IGNORE_INDEX, logits_of

LossFn = Callable[[Any, Any], torch.Tensor]  # (model output, target) -> scalar loss
# (model, validation batches, device) -> the score of the model on them
ScoreFn = Callable[[nn.Module, Iterable[Any], torch.device], Any]


def score_value(value: Any, entry: str) -> float:
    """A user's score function's answer as a float: a number, or a tensor of one element;
    ValueError saying what it returned otherwise, or that it is not finite."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        shown = (
            f"a tensor of shape {list(value.shape)}"
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
        raise ValueError(f"score '{entry}' returned {shown}; it must return one number")
    if not math.isfinite(value):
        raise ValueError(f"score '{entry}' returned {value}; it must be a finite number")
    return float(value)


def cross_entropy_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the output's logits over the scored target elements."""
    return nn.functional.cross_entropy(logits_of(output), target, ignore_index=IGNORE_INDEX)


def cross_entropy_classes_last(output: Any, target: torch.Tensor) -> torch.Tensor:
    """``cross_entropy_loss`` for logits with the classes in their last dimension
    (``[batch, *d, classes]``, as Hugging Face token classification gives them)."""
    return nn.functional.cross_entropy(
        logits_of(output).movedim(-1, 1), target, ignore_index=IGNORE_INDEX
    )


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
