"""How a trial's training is timed (``TrialClocks``), each epoch's start included (``Epochs``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from autotune.pipeline import DeviceBatches
from autotune.results import Plan
from autotune.training.telemetry import GpuSampler
from autotune.training.timing import PhaseProbe, TrainClock

PROBE_MICRO_BATCHES = 32  # the window of steady-state micro-batches whose phases are timed


class Epochs:
    """The training batches, epoch after epoch, each epoch's start timed on the host (the last
    epoch's workers stopped, new ones started, the first batch loaded); no synchronization, so
    a start is counted at most in full."""

    def __init__(self, loader: DataLoader | DeviceBatches) -> None:
        self.loader = loader
        self.start_seconds: list[float] = []  # per epoch begun, the first one's included
        self._epoch: Iterator[Any] = iter(())

    def __iter__(self) -> Epochs:
        return self

    def __next__(self) -> Any:
        began = time.perf_counter()
        batch = next(self._epoch, _END)
        if batch is _END:
            self._epoch = iter(self.loader)
            batch = next(self._epoch)
            self.start_seconds.append(time.perf_counter() - began)
        return batch

    def end_pass(self) -> None:
        """Abandon this epoch: the next batch begins another (a stage-1 burst's)."""
        self._epoch = iter(())

    def recurring(self) -> float:
        """What starting an epoch costs each time: the median start after the first; 0 until a
        second epoch has begun."""
        later = sorted(self.start_seconds[1:])
        return later[len(later) // 2] if later else 0.0


_END = object()


class TrialClocks:
    """How a trial's training is timed: the training clock (evaluation excluded), the warm-up
    window's end, the phase probe over the first steady micro-batches, and NVML sampling of
    steady-state training only (after the warm-up, outside evaluations)."""

    def __init__(
        self,
        device: torch.device,
        plan: Plan,
        accumulation: int,
        loader: DataLoader | DeviceBatches,
    ) -> None:
        self.clock = TrainClock(device)
        self.warmup_steps = plan.warmup_steps
        self.probe = PhaseProbe(
            device,
            first_micro_batch=plan.warmup_steps * accumulation + 1,
            micro_batches=PROBE_MICRO_BATCHES,
        )
        self.sampler = GpuSampler(device)
        self.sampler.paused = True  # until the warm-up ends
        self.warmup_seconds: float | None = None
        self.warmup_micro_batches = 0
        self.epochs_in_warmup = 0  # epochs begun by the warm-up's end
        self.breakdown: dict[str, float] | None = None
        self.epochs = Epochs(loader)

    def __enter__(self) -> TrialClocks:
        self.sampler.__enter__()
        self.clock.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sampler.__exit__(*exc)

    def warmed_up(self, micro_batches: int) -> None:
        """The warm-up window ends here, after ``micro_batches``; GPU sampling starts."""
        self.warmup_seconds = self.clock.read()
        self.warmup_micro_batches = micro_batches
        self.epochs_in_warmup = len(self.epochs.start_seconds)
        self.sampler.paused = False

    def pause(self, final: bool) -> float:
        """Stop the clock and the sampling for an evaluation; the training seconds so far."""
        train_seconds = self.clock.pause()
        self.sampler.paused = True
        self.breakdown = self.breakdown or self.probe.result(final=final)
        return train_seconds

    def resume(self) -> None:
        """Training goes on after an evaluation."""
        self.sampler.paused = False
        self.clock.resume()

    def overhead(self, train_seconds: float, steps: int) -> float:
        """Warm-up seconds beyond what the same steps take in steady state, the first epoch's
        start counted as the recurring cost it is (0 until known)."""
        steady_steps = steps - self.warmup_steps
        if self.warmup_seconds is None or steady_steps <= 0:
            return 0.0
        steady_step_seconds = (train_seconds - self.warmup_seconds) / steady_steps
        recurring = self.epochs.recurring()
        return max(0.0, self.warmup_seconds - self.warmup_steps * steady_step_seconds - recurring)

    def steady_seconds(self, train_seconds: float, micro_batches: int, per_epoch: int) -> float:
        """The seconds after the warm-up with one epoch start per epoch trained in it (a short
        window holds more or fewer: from the middle of epoch 1 to the end of epoch 3, two in 2.5
        epochs)."""
        assert self.warmup_seconds is not None
        epochs = (micro_batches - self.warmup_micro_batches) / per_epoch
        starts = len(self.epochs.start_seconds) - self.epochs_in_warmup
        recurring = self.epochs.recurring()
        return train_seconds - self.warmup_seconds + (epochs - starts) * recurring
