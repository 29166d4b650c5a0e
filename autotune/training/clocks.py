"""How a trial's training is timed (``TrialClocks``), each epoch's start included (``Epochs``),
and what its steady speed is (``SteadyPace``: the exported script pastes it, with ``Epochs``
and ``warmup_steps``, and reports its own speed by the same rule)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from autotune.config import TrialConfig
from autotune.pipeline import DeviceBatches
from autotune.results import Plan
from autotune.training.telemetry import GpuSampler
from autotune.training.timing import PhaseProbe, TrainClock

PROBE_MICRO_BATCHES = 32  # the window of steady-state micro-batches whose phases are timed
MAX_WARMUP_STEPS = 5  # optimizer steps timed as warm-up (at most half the first evaluation span)


def warmup_steps(first_evaluation_step: int) -> int:
    """The first optimizer steps of a run, left out of its steady speed: what they take beyond
    the steady pace is one-time cost (compilation, cuDNN autotuning, workers starting)."""
    return min(MAX_WARMUP_STEPS, max(1, first_evaluation_step // 2))


class Epochs:
    """The training batches, epoch after epoch, each epoch's start timed on the host (the last
    epoch's workers stopped, new ones started, the first batch loaded); no synchronization, so
    a start is counted at most in full."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        self.start_seconds: list[float] = []  # per epoch begun, the first one's included
        self._epoch: Iterator[Any] = iter(())
        self._ended = 0.0  # seconds ending this epoch's pass took (``end_epoch``)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        began = time.perf_counter()
        batch = next(self._epoch, _END)
        if batch is _END:
            self._epoch = iter(self.loader)
            batch = next(self._epoch)
            self.start_seconds.append(time.perf_counter() - began + self._ended)
            self._ended = 0.0
        return batch

    def end_epoch(self) -> None:
        """Read this epoch's pass past its last batch, as the next epoch's first batch would:
        its sampler's last draw from the loader's generator (a shuffling DataLoader's draws the
        permutation that ends its iterator) is made now, so a checkpoint keeps the state the
        next epoch begins from. Timed as part of the next epoch's start."""
        began = time.perf_counter()
        if next(self._epoch, _END) is not _END:
            raise RuntimeError("end_epoch: the epoch has batches left")
        self._epoch = iter(())
        self._ended += time.perf_counter() - began

    def end_pass(self) -> None:
        """Abandon this epoch: the next batch begins another (a stage-1 burst's)."""
        self._epoch = iter(())

    def recurring(self) -> float:
        """What starting an epoch costs each time: the median start after the first; 0 until a
        second epoch has begun."""
        later = sorted(self.start_seconds[1:])
        return later[len(later) // 2] if later else 0.0


_END = object()


class SteadyPace:
    """A run's steady speed, as every trial and every exported script measure it: the samples
    trained after the first ``warmup_steps`` optimizer steps over the training seconds after
    them (evaluations left out), each epoch's start (``epochs``) counted once per epoch at its
    recurring cost, however many the window happens to hold."""

    def __init__(
        self, warmup_steps: int, epochs: Epochs, per_epoch: int, batch_samples: int
    ) -> None:
        self.warmup_steps = warmup_steps
        self.epochs = epochs
        self.per_epoch = per_epoch  # micro-batches trained in an epoch
        self.batch_samples = batch_samples  # samples in a micro-batch, every process's
        # at the warm-up's end: (training seconds, micro-batches trained, epochs begun)
        self.mark: tuple[float, int, int] | None = None

    def warmed_up(self, seconds: float, micro_batches: int) -> None:
        """The warm-up ends here: ``seconds`` of training, ``micro_batches`` trained."""
        self.mark = (seconds, micro_batches, len(self.epochs.start_seconds))

    def samples_per_second(self, seconds: float, micro_batches: int) -> float | None:
        """Samples per second in steady state after ``seconds`` of training in which
        ``micro_batches`` were trained; None while the run is still in its warm-up (a run that
        ended in it has no steady speed)."""
        if self.mark is None or micro_batches <= self.mark[1]:
            return None
        warm_seconds, warm_micro_batches, warm_epochs = self.mark
        steady = micro_batches - warm_micro_batches
        # the window from the middle of epoch 1 to the end of epoch 3 holds two starts in 2.5
        # epochs: it is charged 2.5
        starts = len(self.epochs.start_seconds) - warm_epochs
        charged = (steady / self.per_epoch - starts) * self.epochs.recurring()
        window = seconds - warm_seconds + charged
        return steady * self.batch_samples / window if window > 0 else None


class TrialClocks:
    """How a trial's training is timed: the training clock (evaluation excluded), the warm-up
    window's end, the phase probe over the first steady micro-batches, and NVML sampling of
    steady-state training only (after the warm-up, outside evaluations)."""

    def __init__(
        self,
        device: torch.device,
        plan: Plan,
        config: TrialConfig,
        loader: DataLoader | DeviceBatches,
    ) -> None:
        self.clock = TrainClock(device)
        self.probe = PhaseProbe(
            device,
            first_micro_batch=plan.warmup_steps * config.accumulation_steps + 1,
            micro_batches=PROBE_MICRO_BATCHES,
        )
        self.sampler = GpuSampler(device)
        self.sampler.paused = True  # until the warm-up ends
        self.breakdown: dict[str, float] | None = None
        self.epochs = Epochs(loader)
        batch_samples = config.batch_size * config.world_size
        self.pace = SteadyPace(
            plan.warmup_steps, self.epochs, plan.micro_batches_per_epoch, batch_samples
        )

    def __enter__(self) -> TrialClocks:
        self.sampler.__enter__()
        self.clock.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sampler.__exit__(*exc)

    def warmed_up(self, micro_batches: int) -> None:
        """The warm-up window ends here, after ``micro_batches``; GPU sampling starts."""
        self.pace.warmed_up(self.clock.read(), micro_batches)
        self.sampler.paused = False

    @property
    def warmup_seconds(self) -> float | None:
        """Training seconds of the warm-up window; None until it has ended."""
        return self.pace.mark[0] if self.pace.mark else None

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
        warmup, warmup_seconds = self.pace.warmup_steps, self.warmup_seconds
        if warmup_seconds is None or steps <= warmup:
            return 0.0
        steady_step_seconds = (train_seconds - warmup_seconds) / (steps - warmup)
        recurring = self.epochs.recurring()
        return max(0.0, warmup_seconds - warmup * steady_step_seconds - recurring)
