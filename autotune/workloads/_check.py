"""One real batch through the model before any trial is spent on it: a workload that would burn
trials in raw PyTorch errors, or train and be scored wrongly, is refused with one line that says
what to change."""

from __future__ import annotations

import contextlib
import math
import traceback
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils._pytree import tree_leaves
from torch.utils.data import DataLoader, Dataset, Subset, default_collate

from autotune import faults
from autotune.pipeline import Collate
from autotune.semantics import IGNORE_INDEX, TOP_K, logits_of
from autotune.spacefile import LOSSES, SCORES
from autotune.workloads._registry import DataSplits, WorkloadError
from autotune.workloads.batches import BatchError, BatchLayout, ModelInputs, call_model, is_integer
from autotune.workloads.scoring import LossFn, ScoreFn, cross_entropy_classes_last, score_value

CHECK_BATCH = 2  # samples per split run through the model before the study
MIN_SCORED_TARGETS = 100  # fewer validation targets: accuracy moves in steps over 1%


def user_frame(error: BaseException) -> str:
    """`` (at path:line in function)``: where ``error`` was raised in the user's code; empty
    when no frame is the user's."""
    where = faults.user_frame("".join(traceback.format_tb(error.__traceback__)))
    return f" (at {where})" if where else ""


@contextlib.contextmanager
def failing(what: str, where: bool = True) -> Iterator[None]:
    """An exception inside as one WorkloadError line: ``what``, the exception, and where in the
    user's code it was raised (when ``where``)."""
    try:
        yield
    except Exception as error:
        shown = f"{type(error).__name__}: {error}{user_frame(error) if where else ''}"
        raise WorkloadError(f"{what} {shown}") from None


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


_FOR_OTHER_TARGETS = (
    "; for other targets (regression, ...) set workload.loss and objective.score to functions "
    "of your own"
)


def check_labels(label: Any, data: str, loss: str, score: str) -> None:
    """Refuse labels (collated, as the trials' batches hold them) that cross-entropy or a
    built-in score cannot read as class indices."""
    reading = [f"the loss ({loss})"] if loss == "cross_entropy" else []
    readers = " and ".join([*reading, *([f"the score ({score})"] if score in SCORES else [])])
    if isinstance(label, torch.Tensor) and label.is_floating_point():
        raise WorkloadError(
            f"data set '{data}': labels are {str(label.dtype).removeprefix('torch.')}; "
            f"{readers} need integer class indices{_FOR_OTHER_TARGETS}"
        )
    if not (isinstance(label, torch.Tensor) and is_integer(label)):
        raise WorkloadError(
            f"data set '{data}': a label is {_describe(label)}; it must be an integer class "
            f"index, or an integer tensor of them (one per pixel or token)"
        )


def read_sample(split: Dataset, name: str, data: str, index: int = 0) -> Any:
    """Sample ``index`` of a split; one line when reading it raises."""
    with failing(f"data set '{data}': reading {name} sample {index} raised"):
        return split[index]


def split_batch(layout: BatchLayout, batch: Any) -> tuple[ModelInputs, Any]:
    """``layout.split(batch)``; WorkloadError when the user's batch_fn fails."""
    try:
        return layout.split(batch)
    except BatchError as error:
        cause = error.__cause__
        where = user_frame(cause) if cause is not None else ""
        raise WorkloadError(f"{error}{where}") from None


def batch_of(
    samples: list[Any], collate: Collate | None, data: str, name: str = "training"
) -> Any:
    """``samples`` collated as the trials' DataLoaders will; WorkloadError when they cannot be."""
    if collate is not None:
        with failing(f"data set '{data}': its collate_fn fails on {name} samples:"):
            return collate(samples)
    try:
        return default_collate(samples)
    except Exception as error:
        raise WorkloadError(
            f"data set '{data}': {name} samples cannot be stacked into a batch "
            f"({type(error).__name__}: {error}); every input must have the same shape, or "
            f"the data function returns DataSplits(..., collate_fn=...) to batch them"
        ) from None


def _classes_last(output: torch.Tensor, targets: torch.Tensor, names: WorkloadNames) -> bool:
    """Whether ``output`` holds the classes last (``[batch, *d, classes]``) rather than in
    dimension 1, as ``workload.class_dim`` or else the shapes say; WorkloadError when neither
    fits ``targets``, or both do."""
    shapes = f"output {list(output.shape)} against targets {list(targets.shape)}"
    fits_first = output.dim() >= 2 and output.shape[0] == targets.shape[0]
    fits_first = fits_first and output.shape[2:] == targets.shape[1:]
    fits = {1: fits_first, -1: output.dim() >= 2 and output.shape[:-1] == targets.shape}
    if names.class_dim is not None:
        if fits[names.class_dim]:
            return names.class_dim == -1 and output.dim() > 2
        raise WorkloadError(
            f"model '{names.model}': {shapes} cannot hold the classes in dimension "
            f"{names.class_dim} (workload.class_dim)"
        )
    if fits[1] and fits[-1] and output.dim() > 2:  # [B, n, n] against [B, n]: either reads
        raise WorkloadError(
            f"model '{names.model}': {shapes} could hold the classes in dimension 1 or in the "
            f"last; say which with workload.class_dim: 1 or -1 (a language model's logits "
            f"[batch, sequence, vocabulary] hold them in -1)"
        )
    if fits[1] or fits[-1]:
        return not fits[1]
    expected = "[" + ", ".join(map(str, [targets.shape[0], "classes", *targets.shape[1:]])) + "]"
    raise WorkloadError(
        f"model '{names.model}': output {list(output.shape)} does not fit targets "
        f"{list(targets.shape)}: cross-entropy needs logits {expected}, the classes in "
        f"dimension 1 (or in the last)"
    )


def _logits(output: Any, targets: torch.Tensor, names: WorkloadNames) -> tuple[torch.Tensor, bool]:
    """The logits in ``output``, classes in dimension 1, and whether the model gives them last."""
    entry = names.model
    try:
        logits = logits_of(output)
    except TypeError:
        reader = f"the score ({names.score})" if names.score in SCORES else "the loss"
        raise WorkloadError(
            f"model '{entry}' returned {_describe(output)}; {reader} reads a tensor of logits "
            f"[batch, classes, ...]: return one, or an object with .logits"
        ) from None
    last = _classes_last(logits, targets, names)
    return (logits.movedim(-1, 1) if last else logits), last


def _loss(loss_fn: LossFn, output: Any, targets: Any, split: str, names: WorkloadNames) -> float:
    what = f"loss '{names.loss}' fails on a {split} batch of model '{names.model}':"
    with failing(what, where=names.loss not in LOSSES):
        loss = loss_fn(output, targets)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shown = _describe(loss)
        raise WorkloadError(
            f"loss '{names.loss}' returned {shown}; it must be one number, a tensor averaged "
            f"over the batch"
        )
    return float(loss)


def _finite(output: Any) -> bool:
    """Whether every floating-point tensor in ``output`` is finite."""
    tensors = [leaf for leaf in tree_leaves(output) if isinstance(leaf, torch.Tensor)]
    return all(bool(t.isfinite().all()) for t in tensors if t.is_floating_point())


class Checked(NamedTuple):
    """What the check found of a workload that can train."""

    warnings: tuple[str, ...]  # doubtful, one line each
    classes_last: bool  # its logits hold the classes in the last dimension, not in dimension 1
    untrained_score: float | None = None  # the user's score of the fresh model (None: built-in)


class WorkloadNames(NamedTuple):
    """The space file's names of the workload's parts, for messages."""

    model: str
    data: str
    loss: str
    score: str = "accuracy"
    class_dim: int | None = None  # workload.class_dim: where the logits hold the classes


def _user_score(
    score_fn: ScoreFn, model: nn.Module, dataset: Dataset, collate: Collate | None, entry: str
) -> float:
    """The user's score of ``model`` on the first validation samples; WorkloadError when it
    raises or returns no number."""
    size = min(2 * CHECK_BATCH, len(dataset))  # type: ignore[arg-type]  # map-style: sized
    loader = DataLoader(Subset(dataset, range(size)), batch_size=CHECK_BATCH, collate_fn=collate)
    with failing(f"score '{entry}' fails on the validation split:"):
        value = score_fn(model, loader, torch.device("cpu"))
    try:
        return score_value(value, entry)
    except ValueError as error:
        raise WorkloadError(str(error)) from None


@torch.no_grad()
def check(
    model: nn.Module,
    splits: DataSplits,
    layout: BatchLayout,
    loss_fn: LossFn,
    score_fn: ScoreFn | None,
    num_classes: int | None,
    names: WorkloadNames,
) -> Checked:
    """Run the fresh ``model`` (eval mode, no gradients, on the CPU) on a small batch of each
    split, with the loss and the score as trials compute them: WorkloadError, one line, for a
    workload that cannot train or be scored; warnings for one that can, but not well."""
    model.eval()
    warnings: list[str] = []
    classes_last = False
    # the output is read as class logits by the default loss and by every built-in score
    classifies = score_fn is None or names.loss == "cross_entropy"
    for split, dataset in zip(("training", "validation"), splits, strict=True):
        size = min(CHECK_BATCH, len(dataset))  # type: ignore[arg-type]  # map-style: sized
        samples = [read_sample(dataset, split, names.data, index) for index in range(size)]
        batch = batch_of(samples, splits.collate_fn, names.data, split)
        inputs, targets = split_batch(layout, batch)
        if classifies:
            check_labels(targets, names.data, names.loss, names.score)
        with failing(f"model '{names.model}' fails on a {split} batch ({_describe(inputs)}):"):
            output = call_model(model, inputs)
        if classifies:
            logits, classes_last = _logits(output, targets, names)
            _check_classes(logits, targets, split, num_classes, names)
            if classes_last and names.loss == "cross_entropy":  # as the trials will take it
                loss_fn = cross_entropy_classes_last
        loss = _loss(loss_fn, output, targets, split, names)
        # a mean loss over no scored target (every one IGNORE_INDEX) is NaN: not the model's
        nothing_scored = classifies and not bool((targets != IGNORE_INDEX).any())
        if not math.isfinite(loss) and not nothing_scored:
            if names.loss not in LOSSES and _finite(output):
                raise WorkloadError(
                    f"loss '{names.loss}' returns {loss} on a {split} batch before any training, "
                    f"from finite outputs of model '{names.model}'"
                )
            raise WorkloadError(
                f"model '{names.model}' gives a {split} loss of {loss} before any training: "
                f"its weights or the inputs hold NaN or infinity"
            )
        if split == "validation" and score_fn is None:
            per_sample = int((targets != IGNORE_INDEX).sum()) / targets.shape[0]
            total = round(per_sample * len(dataset))  # type: ignore[arg-type]  # sized
            if total < MIN_SCORED_TARGETS and names.score in ("accuracy", "top5"):
                warnings.append(
                    f"the validation split has {total} scored targets: {names.score} moves in "
                    f"steps of {1 / max(total, 1):.3g}, too coarse to tell close configurations "
                    f"apart"
                )
    untrained = None
    if score_fn is not None:
        untrained = _user_score(score_fn, model, splits.val, splits.collate_fn, names.score)
    return Checked(tuple(warnings), classes_last, untrained)


def _check_classes(
    logits: torch.Tensor,
    targets: torch.Tensor,
    split: str,
    num_classes: int | None,
    names: WorkloadNames,
) -> None:
    """The model's class count against the data set's and the labels', and enough for top5."""
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
    if names.score == "top5" and classes <= TOP_K:
        raise WorkloadError(
            f"score top5: model '{names.model}' outputs {classes} classes, so every target is "
            f"among its {TOP_K} highest logits; use score accuracy"
        )
