"""A trained model judged on the validation split, as the study's score asks: a built-in score
summed on the device with one synchronization at the end (``semantics.validation_sums``), or the
user's score function on the eager model in eval mode. The runner stops its clock first."""

from __future__ import annotations

import math
import traceback
from typing import Any

import torch
from torch.utils.data import DataLoader

from autotune import semantics
from autotune.faults import FaultKind, TrialFault, classify
from autotune.pipeline import DeviceBatches
from autotune.semantics import IGNORE_INDEX, TOP_K, builtin_score
from autotune.training.trainer import Trainer
from autotune.workloads import Workload, user_frame
from autotune.workloads.batches import call_model
from autotune.workloads.scoring import score_value


@torch.no_grad()
def evaluate(
    trainer: Trainer, loader: DataLoader | DeviceBatches, workload: Workload
) -> tuple[float, float | None]:
    """(score, mean cross-entropy per scored target element, or None under the user's score) of
    the eager model on ``loader``; one sync at the end."""
    model = trainer.model
    model.eval()
    try:
        if workload.score_fn is not None:
            return _user_score(trainer, loader, workload), None
        return _builtin_score(trainer, loader, workload)
    finally:
        model.train()


def _builtin_score(
    trainer: Trainer, loader: DataLoader | DeviceBatches, workload: Workload
) -> tuple[float, float]:
    def forward(model: torch.nn.Module, batch: Any, device: torch.device) -> tuple[Any, Any]:
        inputs, targets = trainer.split(batch)
        return call_model(model, inputs), targets

    right, loss_sum, scored = semantics.validation_sums(
        trainer.model,
        loader,
        forward,
        trainer.config.precision,
        trainer.device,
        TOP_K if workload.score == "top5" else 1,
        workload.classes_last,
    )
    if scored == 0:
        raise TrialFault(
            FaultKind.ERROR,
            f"every validation target is {IGNORE_INDEX} (ignored): nothing to score",
        )
    score = builtin_score(workload.score, right, loss_sum, scored)
    if not math.isfinite(score):  # val_loss or perplexity of a model gone NaN
        raise TrialFault(FaultKind.NONFINITE_LOSS, f"the validation {workload.score} is {score}")
    return score, loss_sum / scored


def _user_score(trainer: Trainer, loader: DataLoader | DeviceBatches, workload: Workload) -> float:
    assert workload.score_fn is not None
    try:
        with trainer.autocast():
            value = workload.score_fn(trainer.model, loader, trainer.device)
    except Exception as error:
        if classify(error)[0] != FaultKind.ERROR:
            raise  # out of memory, a DataLoader worker that died, ...: that fault, as it is
        raise TrialFault(
            FaultKind.ERROR,
            f"score '{workload.score}' raised {type(error).__name__}: {error}{user_frame(error)}",
            traceback.format_exc()[-4000:],
        ) from None
    try:
        return score_value(value, workload.score)
    except ValueError as error:
        raise TrialFault(FaultKind.ERROR, str(error)) from None
