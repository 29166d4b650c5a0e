"""A study's workload again, in the user's own training loop (the Python API): its collate
function, its loss, and its batch layout."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.pipeline import Collate
from autotune.spacefile import WorkloadSpec
from autotune.workloads._load import call_entry, loss_function
from autotune.workloads._registry import (
    DataSplits,
    WorkloadError,
    resolve_data,
    resolve_entry_point,
)
from autotune.workloads.batches import BatchLayout
from autotune.workloads.scoring import LossFn


def study_workload(
    section: Mapping[str, Any], folder: str | None
) -> tuple[WorkloadSpec | None, Path | None]:
    """A study's workload section (None when empty) and the folder its entries were found in;
    WorkloadError for a section no space file could hold (an edited export)."""
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
    """The collate function the user's data function returns (it is called to learn it), or
    None (autotune's own data sets, no workload); WorkloadError when it cannot be called."""
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


def runnable_layout(
    record: Mapping[str, Any] | None, base_dir: Path | None = None
) -> BatchLayout | None:
    """The batch layout a study recorded (None: none), able to split batches here: its batch_fn
    imported (``export``'s ``recorded_layout`` reads it without importing anything); WorkloadError
    for a record that is not one (an edited export), or a batch_fn that cannot be imported."""
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
