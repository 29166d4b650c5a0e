"""A study's workload again, in the user's own training loop (the Python API): the collate
function its data function gave, its loss, where its batches hold the inputs and the target, and
what a Trainer needs to take a batch as the DataLoader gives it (``WholeBatches``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, cast

import torch

from autotune.pipeline import Collate
from autotune.spec import WorkloadSpec
from autotune.workloads._load import call_entry, loss_function
from autotune.workloads._registry import (
    DataSplits,
    WorkloadError,
    resolve_data,
    resolve_entry_point,
)
from autotune.workloads.batches import BatchError, BatchLayout, LayoutError, ModelInputs
from autotune.workloads.scoring import LossFn

__all__ = ["WholeBatches", "data_collate", "recorded_layout", "study_loss", "study_workload"]

_WHOLE: Any = object()  # train_step's targets when the batch comes whole


def study_workload(
    section: Mapping[str, Any], folder: str | None
) -> tuple[WorkloadSpec | None, Path | None]:
    """A study's workload section (None when empty: a configuration that holds none) and the
    folder its ``package.module:function`` entries were found in; WorkloadError, one line, for
    a section no space file could hold (an edited export)."""
    try:
        spec = WorkloadSpec.model_validate(dict(section)) if section else None
    except ValueError as err:  # pydantic's lines, made one
        raise WorkloadError(f"the workload is not one: {' '.join(str(err).split())}") from None
    return spec, Path(folder) if folder else None


def study_loss(spec: WorkloadSpec | None, folder: Path | None, classes_last: bool) -> LossFn:
    """The loss the study trained with (cross-entropy when ``spec`` is None); WorkloadError
    when the user's cannot be imported."""
    try:
        return loss_function(spec.loss if spec else "cross_entropy", folder, classes_last)
    except WorkloadError as err:
        raise WorkloadError(f"the study's {err}; pass make_trainer(..., loss_fn=...)") from None


def data_collate(spec: WorkloadSpec | None, base_dir: Path | None = None) -> Collate | None:
    """The collate function ``spec``'s data function returns (``DataSplits.collate_fn``), or
    None: the user's data function is called (with ``data_args``) to learn it; autotune's own
    data sets have none, nor has a configuration without a workload (``spec`` None). Raises
    WorkloadError when it cannot be called."""
    if spec is None or ":" not in spec.data:
        return None
    try:
        data_fn = resolve_data(spec, base_dir)
        splits = call_entry(data_fn, dict(spec.data_args), "data set", spec.data)
    except WorkloadError as err:
        raise WorkloadError(
            f"the study's collate_fn comes from {err}; pass make_loader(..., collate_fn=...)"
        ) from None
    return splits.collate_fn if isinstance(splits, DataSplits) else None


def recorded_layout(
    record: Mapping[str, Any] | None, base_dir: Path | None = None
) -> BatchLayout | None:
    """The batch layout a study recorded, its batch_fn imported (from the working directory,
    then ``base_dir``); None when it recorded none. WorkloadError for a record that is not one
    (an edited export), or a batch_fn that cannot be imported."""
    if record is None:
        return None
    try:
        layout = BatchLayout.from_record(dict(record))
    except (KeyError, TypeError, ValueError):
        raise WorkloadError(f"the study's batch layout is not one: {dict(record)!r}") from None
    if layout.batch_fn_name is None:
        return layout
    try:
        batch_fn = resolve_entry_point(layout.batch_fn_name, "batch_fn", base_dir)
    except WorkloadError as err:
        raise WorkloadError(f"the study's batches cannot be split here: {err}") from None
    return BatchLayout(batch_fn=batch_fn, batch_fn_name=layout.batch_fn_name)


class _Trainer(Protocol):
    """What ``WholeBatches`` needs of the Trainer it is mixed into (``autotune.trainer``)."""

    def to_device(self, inputs: Any, targets: Any) -> tuple[Any, Any]: ...

    def train_step(self, inputs: Any, targets: Any) -> torch.Tensor: ...


class WholeBatches:
    """Mixed into ``autotune.trainer.Trainer`` (first among the bases): ``train_step(batch)``
    takes a batch as the data set and its DataLoader give it (a pair, a longer tuple, a dict
    such as a tokenizer's), finds the model's inputs and the target where the study found them,
    and moves them to the device; ``train_step(inputs, targets)`` still takes them split and on
    the device, as the Trainer does. (Not a Trainer itself: this package is below the trainer.)
    """

    # where the study's batches hold the inputs and the target; None (a configuration from
    # before layouts were recorded): found from the first batch with what ``workload`` declares,
    # as the study found it from its first sample
    layout: BatchLayout | None = None
    workload: WorkloadSpec | None = None

    def split(self, batch: Any) -> tuple[ModelInputs, Any]:
        """(what the model is called with, the target) of a batch as the DataLoader gives it,
        on the device; ValueError naming what the batch holds when the study's layout does not
        fit it. ``model(*inputs.args, **inputs.kwargs)`` calls the model with them."""
        if self.layout is None:
            spec = self.workload
            try:
                self.layout = BatchLayout.of(
                    batch,
                    spec.inputs if spec else None,
                    spec.target if spec else None,
                    spec is not None and spec.loss == "model",
                )
            except LayoutError as error:
                raise ValueError(f"the batch does not fit the study's workload: {error}") from None
        try:
            inputs, targets = self.layout.split(batch)
        except BatchError:  # the user's batch_fn failed: its own message names it
            raise
        except (KeyError, IndexError, TypeError) as error:
            raise ValueError(
                f"the batch does not fit the study's batch layout (inputs {self.layout.inputs}, "
                f"target {self.layout.target!r}): {type(error).__name__}: {error}"
            ) from None
        moved = cast(_Trainer, self).to_device(inputs, targets)
        return cast(tuple[ModelInputs, Any], moved)  # to_device keeps the tree's types

    def train_step(self, inputs: Any, targets: Any = _WHOLE) -> torch.Tensor:
        """One micro-batch; an optimizer step when it completes an accumulation group.

        ``train_step(batch)``: the batch as the DataLoader gives it, split and moved here.
        ``train_step(inputs, targets)``: already split and on the device (``Trainer``'s form).
        Returns the (detached, on-device) loss of this micro-batch.
        """
        if targets is _WHOLE:
            inputs, targets = self.split(inputs)
        return cast(_Trainer, super()).train_step(inputs, targets)
