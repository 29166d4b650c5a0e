"""One real batch through the model before any trial is spent on it.

A model with the wrong number of outputs, labels the loss cannot read, shapes that do not line up
or a forward pass that raises would otherwise burn trials and end in raw PyTorch errors, or worse,
train and be scored wrongly. ``check`` runs the fresh model (eval mode, no gradients, on the CPU)
on a small batch of each split, computes the loss and the score as the trials will, and turns
each problem into one line that says what to change.
"""

from __future__ import annotations

import math
import os
import sysconfig
import traceback
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from autotune.pipeline import Collate
from autotune.spec import LOSSES
from autotune.workloads._registry import DataSplits, WorkloadError
from autotune.workloads.batches import BatchLayout, ModelInputs, call_model, is_integer
from autotune.workloads.scoring import IGNORE_INDEX, LossFn, classification_sums, logits_of

__all__ = ["MIN_SCORED_TARGETS", "Entries", "check", "check_labels", "read_sample", "user_frame"]

CHECK_BATCH = 2  # samples per split run through the model before the study
MIN_SCORED_TARGETS = 100  # fewer validation targets: accuracy moves in steps over 1%

_NOT_USER_CODE = tuple(
    str(Path(root)) + os.sep
    for root in {
        *(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")),
        str(Path(__file__).resolve().parents[1]),  # autotune itself
    }
)


def user_frame(error: BaseException) -> str:
    """Where ``error`` was raised in the user's code, as `` (at path:line in function)``: the
    innermost frame outside Python's library, installed packages and autotune, its path relative
    to the working directory when inside it; empty when no frame is the user's (an error in how
    torch called their code, such as arguments that do not fit)."""
    frames = traceback.extract_tb(error.__traceback__)
    users = [frame for frame in frames if not frame.filename.startswith(_NOT_USER_CODE)]
    if not users:
        return ""
    frame = users[-1]
    path = Path(frame.filename)
    try:
        shown = str(path.relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    return f" (at {shown}:{frame.lineno} in {frame.name})"


def _describe(value: Any) -> str:
    """A batch element in a few words: ``float32 [2, 1, 8, 8]``, or its type."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')} {list(value.shape)}"
    if isinstance(value, ModelInputs):
        parts = [
            *map(_describe, value.args),
            *(f"{k}={_describe(v)}" for k, v in value.kwargs.items()),
        ]
        return ", ".join(parts) or "no inputs"
    if isinstance(value, tuple | list):
        return f"{type(value).__name__} of {', '.join(_describe(v) for v in value[:4])}"
    if isinstance(value, dict):
        return f"dict of {', '.join(repr(key) for key in list(value)[:6])}"
    return type(value).__name__


def check_labels(label: Any, data: str) -> None:
    """Refuse labels the default loss (cross-entropy over class indices) cannot read."""
    if isinstance(label, torch.Tensor) and label.is_floating_point():
        raise WorkloadError(
            f"data set '{data}': labels are {str(label.dtype).removeprefix('torch.')}; the loss "
            f"(cross-entropy) and the score (accuracy) need integer class indices"
        )
    if isinstance(label, float):
        raise WorkloadError(
            f"data set '{data}': labels are floats ({label!r}); the loss (cross-entropy) and "
            f"the score (accuracy) need integer class indices"
        )
    integer = isinstance(label, int) and not isinstance(label, bool)
    if not integer and not (isinstance(label, torch.Tensor) and is_integer(label)):
        raise WorkloadError(
            f"data set '{data}': a label is {_describe(label)}; it must be an integer class "
            f"index, or an integer tensor of them (one per pixel or token)"
        )


def read_sample(split: Dataset, name: str, data: str, index: int = 0) -> Any:
    """Sample ``index`` of a split; one line when reading it raises."""
    try:
        return split[index]
    except Exception as error:
        raise WorkloadError(
            f"data set '{data}': reading {name} sample {index} raised {type(error).__name__}: "
            f"{error}{user_frame(error)}"
        ) from None


def _batch(split: Dataset, name: str, data: str, collate: Collate | None) -> Any:
    size = min(CHECK_BATCH, len(split))  # type: ignore[arg-type]  # map-style: sized
    samples = [read_sample(split, name, data, index) for index in range(size)]
    if collate is not None:
        try:
            return collate(samples)
        except Exception as error:
            raise WorkloadError(
                f"data set '{data}': its collate_fn fails on {name} samples: "
                f"{type(error).__name__}: {error}{user_frame(error)}"
            ) from None
    try:
        return default_collate(samples)
    except Exception as error:
        raise WorkloadError(
            f"data set '{data}': {name} samples cannot be stacked into a batch "
            f"({type(error).__name__}: {error}); every input must have the same shape, or "
            f"the data function returns DataSplits(..., collate_fn=...) to batch them"
        ) from None


def _shape_problem(output: torch.Tensor, targets: torch.Tensor) -> str | None:
    expected = "[" + ", ".join(map(str, [targets.shape[0], "classes", *targets.shape[1:]])) + "]"
    if output.dim() >= 2 and output.shape[0] == targets.shape[0]:
        if output.shape[2:] == targets.shape[1:]:
            return None
        if output.shape[:-1] == targets.shape:
            return (
                f"output {list(output.shape)} has its classes in the last dimension; "
                f"cross-entropy reads them in dimension 1: return "
                f"logits.movedim(-1, 1) ({expected})"
            )
    return (
        f"output {list(output.shape)} does not fit targets {list(targets.shape)}: "
        f"cross-entropy needs logits {expected}, the classes in dimension 1"
    )


def _run_model(model: nn.Module, inputs: ModelInputs, split: str, entry: str) -> Any:
    try:
        return call_model(model, inputs)
    except Exception as error:
        raise WorkloadError(
            f"model '{entry}' fails on a {split} batch ({_describe(inputs)}): "
            f"{type(error).__name__}: {error}{user_frame(error)}"
        ) from None


def _logits(output: Any, targets: torch.Tensor, entry: str) -> torch.Tensor:
    try:
        logits = logits_of(output)
    except TypeError:
        raise WorkloadError(
            f"model '{entry}' returned {_describe(output)}; the score (accuracy) reads a tensor "
            f"of logits [batch, classes, ...]: return one, or an object with .logits"
        ) from None
    problem = _shape_problem(logits, targets)
    if problem is not None:
        raise WorkloadError(f"model '{entry}': {problem}")
    return logits


def _loss(loss_fn: LossFn, output: Any, targets: Any, split: str, names: Entries) -> float:
    try:
        loss = loss_fn(output, targets)
    except Exception as error:
        where = "" if names.loss in LOSSES else user_frame(error)
        raise WorkloadError(
            f"loss '{names.loss}' fails on a {split} batch of model '{names.model}': "
            f"{type(error).__name__}: {error}{where}"
        ) from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shown = _describe(loss)
        raise WorkloadError(
            f"loss '{names.loss}' returned {shown}; it must be one number, a tensor averaged "
            f"over the batch"
        )
    return float(loss)


class Entries(NamedTuple):
    """The space file's names of the workload's parts, for messages."""

    model: str
    data: str
    loss: str


@torch.no_grad()
def check(
    model: nn.Module,
    splits: DataSplits,
    layout: BatchLayout,
    loss_fn: LossFn,
    num_classes: int | None,
    names: Entries,
) -> tuple[str, ...]:
    """Run ``model`` on a small batch of each split and compute the loss and the score as trials
    do. Raises WorkloadError with one line for a workload that cannot train or be scored;
    returns warnings (one line each) for one that can, but not well."""
    model.eval()
    warnings: list[str] = []
    for split, dataset in zip(("training", "validation"), splits, strict=True):
        inputs, targets = layout.split(_batch(dataset, split, names.data, splits.collate_fn))
        check_labels(targets, names.data)
        output = _run_model(model, inputs, split, names.model)
        logits = _logits(output, targets, names.model)
        classes = logits.shape[1]
        if num_classes is not None and classes != num_classes:
            raise WorkloadError(
                f"model '{names.model}' outputs {classes} classes but data set '{names.data}' "
                f"has {num_classes}: build the model with num_classes (autotune passes it when "
                f"the model function takes it), or have the data function return "
                f"DataSplits(..., num_classes={classes}) if the data set really has {classes}"
            )
        labels = targets[targets != IGNORE_INDEX]
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= classes):
            raise WorkloadError(
                f"data set '{names.data}': {split} labels go from {int(labels.min())} to "
                f"{int(labels.max())}, but model '{names.model}' outputs {classes} classes "
                f"(0 to {classes - 1}; {IGNORE_INDEX} marks a target not scored)"
            )
        loss = _loss(loss_fn, output, targets, split, names)
        _, _, scored = classification_sums(logits, targets)
        if scored and not math.isfinite(loss):
            raise WorkloadError(
                f"model '{names.model}' gives a {split} loss of {loss} before any training: "
                f"its weights or the inputs hold NaN or infinity"
            )
        if split == "validation":
            per_sample = int(scored) / targets.shape[0]
            total = round(per_sample * len(dataset))  # type: ignore[arg-type]  # sized
            if total < MIN_SCORED_TARGETS:
                warnings.append(
                    f"the validation split has {total} scored targets: accuracy moves in steps "
                    f"of {1 / max(total, 1):.3g}, too coarse to tell close configurations apart"
                )
    return tuple(warnings)
