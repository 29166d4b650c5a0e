"""A trial's training loss: summed on the device, read back only at evaluations, and the faults
it shows (no longer finite, fp16 steps skipped without end, diverged)."""

from __future__ import annotations

import math
from typing import Any

import torch

from autotune.config import TrialConfig
from autotune.faults import TrialFault
from autotune.machine import ranks
from autotune.training.trainer import Trainer
from autotune.workloads.batches import ModelInputs, count_tokens

DIVERGENCE_FACTOR = 10.0  # a mean training loss this many times the lowest seen has diverged
DIVERGENCE_MIN_RISE = 1.0  # ... and risen by this much (nats): 0.001 -> 0.011 is still healthy
MAX_SKIPPED_IN_A_ROW = 25  # fp16 steps skipped for overflow in a row (scale / 2**25): a fault
MIN_SPAN_FOR_ALL_SKIPPED = 8  # ... or every step between two evaluations, if there were this many


class TrainingLosses:
    """The training loss since the last evaluation and the tokens trained on, summed on the
    device and read back only at evaluations. Under fp16 a non-finite loss is an overflow
    GradScaler recovers from (it skips that step), so only finite losses are averaged."""

    def __init__(self, config: TrialConfig, device: torch.device, counts_tokens: bool) -> None:
        self.config = config
        self.fp16 = config.precision == "fp16"
        self.sum = torch.zeros((), dtype=torch.float32, device=device)
        # the losses summed: counted on the device under fp16 (only finite ones), else an int
        self.count: torch.Tensor | int = torch.zeros_like(self.sum) if self.fp16 else 0
        # tokens in the batches trained on, for token inputs (a device tensor when masks count)
        self.tokens: torch.Tensor | int | None = 0 if counts_tokens else None
        self.lowest = math.inf
        self.evaluations = 0  # evaluations so far
        self.skipped_before = 0  # GradScaler's skipped steps at the previous evaluation
        self.steps_before = 0

    def count_tokens(self, inputs: Any) -> None:
        if self.tokens is not None and isinstance(inputs, ModelInputs):
            counted = count_tokens(inputs)  # a device tensor: added, never read here
            if counted is not None:  # (``counted or 0`` would wait for the device)
                self.tokens = self.tokens + counted

    def add(self, loss: torch.Tensor) -> None:
        if self.fp16:
            finite = torch.isfinite(loss)
            self.sum += torch.where(finite, loss, 0.0)
            self.count += finite
        else:
            self.sum += loss
            self.count += 1

    def since_last_evaluation(self, trainer: Trainer, epoch: float) -> float:
        """The mean training loss since the last evaluation, over every process of a
        distributed trial (reads the device once); TrialFault when training went astray."""
        if isinstance(self.count, torch.Tensor):  # fp16: only finite losses were summed
            counted = self.count.float()
        else:
            counted = torch.full((), float(self.count), device=self.sum.device)
        total, count = ranks.sum_over_ranks(torch.stack([self.sum, counted])).tolist()
        loss = self._checked(trainer, total, count, epoch)
        self.lowest = min(self.lowest, loss)
        self.evaluations += 1
        self.skipped_before, self.steps_before = trainer.skipped_steps, trainer.steps
        self.sum.zero_()
        self.count = self.count.zero_() if isinstance(self.count, torch.Tensor) else 0
        return loss

    def _checked(self, trainer: Trainer, total: float, count: float, epoch: float) -> float:
        """The mean loss ``total / count``; TrialFault when training went astray since the
        previous evaluation: not finite, fp16 steps skipped for overflow without end (a few are
        normal), or far above its lowest (``DIVERGENCE_FACTOR`` and ``DIVERGENCE_MIN_RISE``)."""
        lr, precision = f"lr {self.config.lr:.3g}", self.config.precision
        if count == 0 or not math.isfinite(total):
            shown = "inf or nan at every step" if count == 0 else f"{total / count}"
            raise TrialFault(
                "nonfinite_loss",
                f"training loss is {shown} after {epoch:.2f} epochs ({lr}, {precision})",
            )
        skipped = trainer.skipped_steps - self.skipped_before
        attempted = trainer.steps - self.steps_before
        whole_span = attempted >= MIN_SPAN_FOR_ALL_SKIPPED and skipped == attempted
        if trainer.skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW or whole_span:
            raise TrialFault(
                "nonfinite_loss",
                f"fp16 gradients overflowed in {trainer.skipped_in_a_row} optimizer steps in a "
                f"row after {epoch:.2f} epochs: GradScaler cannot recover ({lr})",
            )
        loss, lowest = total / count, self.lowest
        if loss > DIVERGENCE_FACTOR * lowest and loss - lowest > DIVERGENCE_MIN_RISE:
            raise TrialFault(
                "diverged",
                f"training loss {loss:.4g} after {epoch:.2f} epochs is over "
                f"{DIVERGENCE_FACTOR:g}x its lowest, {lowest:.4g} ({lr})",
            )
        return loss
