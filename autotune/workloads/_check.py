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
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from autotune.workloads._registry import WorkloadError
from autotune.workloads.scoring import IGNORE_INDEX, classification_sums

__all__ = ["MIN_SCORED_TARGETS", "check", "check_labels", "first_sample", "user_frame"]

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
    """Where ``error`` was raised in the user's code: ``path:line in function`` of the innermost
    frame outside Python's library, installed packages and autotune (the innermost frame when
    every frame is there); the path is relative to the working directory when it is inside."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "no traceback"
    users = [frame for frame in frames if not frame.filename.startswith(_NOT_USER_CODE)]
    frame = (users or frames)[-1]
    path = Path(frame.filename)
    try:
        shown = str(path.relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    return f"{shown}:{frame.lineno} in {frame.name}"


def _describe(value: Any) -> str:
    """A batch element in a few words: ``float32 [2, 1, 8, 8]``, or its type."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')} {list(value.shape)}"
    if isinstance(value, tuple | list):
        return f"{type(value).__name__} of {', '.join(_describe(v) for v in value[:4])}"
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
    if not integer and not (isinstance(label, torch.Tensor) and _is_index(label)):
        raise WorkloadError(
            f"data set '{data}': a label is {_describe(label)}; it must be an integer class "
            f"index, or an integer tensor of them (one per pixel or token)"
        )


def _is_index(tensor: torch.Tensor) -> bool:
    return (
        not tensor.is_floating_point() and not tensor.is_complex() and tensor.dtype != torch.bool
    )


def first_sample(split: Dataset, name: str, data: str, index: int = 0) -> tuple[Any, Any]:
    """Sample ``index`` of a split as an (input, label) pair; one line when reading it raises
    or it is not a pair."""
    try:
        sample = split[index]
    except Exception as error:
        raise WorkloadError(
            f"data set '{data}': reading {name} sample {index} raised {type(error).__name__}: "
            f"{error} (at {user_frame(error)})"
        ) from None
    if not (isinstance(sample, tuple | list) and len(sample) == 2):
        raise WorkloadError(
            f"data set '{data}': a {name} sample must be an (input, label) pair, "
            f"got {_describe(sample)}"
        )
    return sample[0], sample[1]


def _batch(split: Dataset, name: str, data: str) -> tuple[Any, torch.Tensor]:
    size = min(CHECK_BATCH, len(split))  # type: ignore[arg-type]  # map-style: sized
    samples = [first_sample(split, name, data, index) for index in range(size)]
    for _, label in samples:
        check_labels(label, data)
    try:
        inputs, targets = default_collate(samples)
    except Exception as error:
        raise WorkloadError(
            f"data set '{data}': {name} samples cannot be stacked into a batch "
            f"({type(error).__name__}: {error}); every input must have the same shape"
        ) from None
    return inputs, targets


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


def _run_model(
    model: nn.Module, inputs: Any, targets: torch.Tensor, split: str, entry: str
) -> torch.Tensor:
    try:
        output = model(inputs)
    except Exception as error:
        raise WorkloadError(
            f"model '{entry}' fails on a {split} batch ({_describe(inputs)}): "
            f"{type(error).__name__}: {error} (at {user_frame(error)})"
        ) from None
    if not isinstance(output, torch.Tensor):
        logits = "logits" in output if isinstance(output, dict) else hasattr(output, "logits")
        hint = "return its .logits from forward" if logits else "return a tensor of logits"
        raise WorkloadError(
            f"model '{entry}' returned {_describe(output)}; the loss and the score read a "
            f"tensor of logits [batch, classes, ...]: {hint}"
        )
    problem = _shape_problem(output, targets)
    if problem is not None:
        raise WorkloadError(f"model '{entry}': {problem}")
    return output


@torch.no_grad()
def check(
    model: nn.Module,
    train: Dataset,
    val: Dataset,
    num_classes: int | None,
    model_entry: str,
    data_entry: str,
) -> tuple[str, ...]:
    """Run ``model`` on a small batch of each split and compute the loss and the score as trials
    do. Raises WorkloadError with one line for a workload that cannot train or be scored;
    returns warnings (one line each) for one that can, but not well."""
    model.eval()
    warnings: list[str] = []
    for split, dataset in (("training", train), ("validation", val)):
        inputs, targets = _batch(dataset, split, data_entry)
        output = _run_model(model, inputs, targets, split, model_entry)
        classes = output.shape[1]
        if num_classes is not None and classes != num_classes:
            raise WorkloadError(
                f"model '{model_entry}' outputs {classes} classes but data set '{data_entry}' "
                f"has {num_classes}: build the model with num_classes (autotune passes it when "
                f"the model function takes it), or have the data function return "
                f"DataSplits(..., num_classes={classes}) if the data set really has {classes}"
            )
        labels = targets[targets != IGNORE_INDEX]
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= classes):
            raise WorkloadError(
                f"data set '{data_entry}': {split} labels go from {int(labels.min())} to "
                f"{int(labels.max())}, but model '{model_entry}' outputs {classes} classes "
                f"(0 to {classes - 1}; {IGNORE_INDEX} marks a target not scored)"
            )
        _, loss, scored = classification_sums(output, targets)
        if scored and not math.isfinite(float(loss)):
            raise WorkloadError(
                f"model '{model_entry}' gives a {split} loss of {float(loss)} before any "
                f"training: its weights or the inputs hold NaN or infinity"
            )
        if split == "validation":
            per_sample = int(scored) / targets.shape[0]
            total = round(per_sample * len(val))  # type: ignore[arg-type]  # map-style: sized
            if total < MIN_SCORED_TARGETS:
                warnings.append(
                    f"the validation split has {total} scored targets: accuracy moves in steps "
                    f"of {1 / max(total, 1):.3g}, too coarse to tell close configurations apart"
                )
    return tuple(warnings)
