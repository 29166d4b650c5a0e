"""How many classes a data set has when it does not say: one bounded pass over its labels,
read where the workload's batch layout finds the target, batched as the trials batch them."""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

from autotune.pipeline import Collate
from autotune.semantics import IGNORE_INDEX
from autotune.workloads._check import batch_of, read_sample, split_batch
from autotune.workloads._registry import DataSplits
from autotune.workloads.batches import BatchLayout, is_integer

# Samples read for their labels, both splits together, when the data set does not say how many
# classes it has. A sample of tensors reads in microseconds (10,000: well under a second), one
# decoded from a file in up to a millisecond (10,000: seconds, once per process that loads the
# workload; image folders say their classes anyway). A split larger than what is left of this is
# not read at all, rather than in part: a part could miss the highest class and build a model
# with too few outputs, found only when a trial meets that label; the user is asked for
# num_classes instead (or the model function's default stands).
LABEL_READ_LIMIT = 10_000
CHUNK = 256  # samples batched together to read their labels


class _NotClassIndices(Exception):
    """The targets are not integer class indices (a regression's floats, a structure)."""


def _largest(targets: Any) -> int | None:
    """The largest class index among ``targets``, ``IGNORE_INDEX`` left out (None: all are)."""
    if not isinstance(targets, torch.Tensor) or not is_integer(targets):
        raise _NotClassIndices
    scored = targets[targets != IGNORE_INDEX]
    return int(scored.max()) if scored.numel() else None


def _tensor_labels(split: Dataset, layout: BatchLayout) -> torch.Tensor | None:
    """A TensorDataset's labels as one tensor, no sample read (None: not found so)."""
    if not isinstance(split, TensorDataset) or layout.batch_fn is not None or layout.is_dict:
        return None
    target = layout.target
    if isinstance(target, int) and target < len(split.tensors):
        return split.tensors[target]
    return None


def _read_largest(
    split: Dataset, layout: BatchLayout, collate: Collate | None, name: str, data: str
) -> int | None:
    """The largest label of every sample of ``split``, batched ``CHUNK`` at a time."""
    size = len(split)  # type: ignore[arg-type]  # map-style: sized
    largest: int | None = None
    for start in range(0, size, CHUNK):
        indices = range(start, min(start + CHUNK, size))
        samples = [read_sample(split, name, data, index) for index in indices]
        _, targets = split_batch(layout, batch_of(samples, collate, data, name))
        found = _largest(targets)
        if found is not None:
            largest = found if largest is None else max(largest, found)
    return largest


def count_classes(
    splits: DataSplits, layout: BatchLayout, data: str, declared: Any = None
) -> int | None:
    """How many classes ``splits`` hold: as the data function says; else ``declared``
    (``model_args.num_classes``); else one more than the largest integer label of the training
    split (and the validation split, when both fit in ``LABEL_READ_LIMIT`` samples); None when
    nothing tells. Draws nothing from torch's random state (augmentations draw from it)."""
    if splits.num_classes:
        return splits.num_classes
    classes = getattr(splits.train, "classes", None)
    if isinstance(classes, Sized) and len(classes) > 0:
        return len(classes)
    if isinstance(declared, int) and not isinstance(declared, bool) and declared > 0:
        return declared
    budget = LABEL_READ_LIMIT
    largest: int | None = None
    try:
        with torch.random.fork_rng(devices=[]):
            for name, split in (("training", splits.train), ("validation", splits.val)):
                labels = _tensor_labels(split, layout)
                if labels is not None:
                    found = _largest(labels)
                elif len(split) <= budget:  # type: ignore[arg-type]  # map-style: sized
                    budget -= len(split)  # type: ignore[arg-type]
                    found = _read_largest(split, layout, splits.collate_fn, name, data)
                elif name == "training":
                    return None
                else:  # the training labels tell; the validation split is too large to add
                    break
                if found is not None:
                    largest = found if largest is None else max(largest, found)
    except _NotClassIndices:
        return None
    return None if largest is None or largest < 0 else largest + 1
