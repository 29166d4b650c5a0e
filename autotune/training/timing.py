"""Honest clocks: the device is synchronized at every boundary and never inside the hot loop."""

from __future__ import annotations

import time

import torch

from autotune.results import PHASES


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on ``device`` (a no-op on the CPU, which runs synchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TrainClock:
    """Training wall-clock seconds, time while paused (evaluation) left out; every reading
    synchronizes the device first, so the seconds include the GPU work the host has queued."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._total = 0.0
        self._since: float | None = None

    def start(self) -> None:
        """Start (or resume after ``pause``) counting."""
        synchronize(self._device)
        self._since = time.perf_counter()

    resume = start

    def read(self) -> float:
        """Training seconds so far, the running interval included."""
        synchronize(self._device)
        running = time.perf_counter() - self._since if self._since is not None else 0.0
        return self._total + running

    def pause(self) -> float:
        """Stop counting; return the training seconds so far."""
        self._total = self.read()
        self._since = None
        return self._total


BUSY_SHARE = 0.8  # a device busy less than this share of the time is starved
DATA_STARVED_SHARE = 0.2  # waiting for batches this share of the time: starved by data


class PhaseProbe:
    """Where a window of training steps spends its time, phase by phase (PHASES, in order:
    ``with probe.phase(name)`` around each one's work; the first begins the next micro-batch).

    Outside its window every call is a cheap no-op. Inside it, boundaries are timestamped
    without synchronizing: CUDA events on a GPU (the span between two is the GPU's time on that
    phase, idle waits for the host included), the host clock on a CPU. The events are read only
    in ``result()``, at an evaluation, where the device is synchronized anyway.
    """

    def __init__(self, device: torch.device, first_micro_batch: int, micro_batches: int) -> None:
        self._cuda = device.type == "cuda"
        self._first = first_micro_batch
        self._last = first_micro_batch + micro_batches - 1
        self._marks: list[tuple[str, object]] = []  # (phase that ends here, stamp)
        self._micro_batch = 0
        self._phase = ""  # the phase ``with probe.phase(...)`` is in
        self._active = False
        self.completed = False

    def _stamp(self) -> object:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def phase(self, phase: str) -> PhaseProbe:
        """``with probe.phase(phase):`` around that phase's work (a plain context manager:
        cheap on every micro-batch)."""
        self._phase = phase
        return self

    def __enter__(self) -> None:
        if self._phase != PHASES[0]:
            return
        self._micro_batch += 1
        self._active = self._first <= self._micro_batch <= self._last
        if self._active:
            self._marks.append(("", self._stamp()))
        elif self._micro_batch > self._last and self._marks:
            self.completed = True

    def __exit__(self, *_: object) -> None:
        if self._active:  # the phase's work has been issued
            self._marks.append((self._phase, self._stamp()))

    def result(self, final: bool = False) -> dict[str, float] | None:
        """Seconds per phase over the window; None until it is complete (or, when ``final``,
        until it has seen a whole micro-batch)."""
        if not (self.completed or (final and len(self._marks) > len(PHASES))):
            return None
        seconds = dict.fromkeys(PHASES, 0.0)
        for (_, start), (phase, end) in zip(self._marks, self._marks[1:], strict=False):
            if not phase:
                continue  # from the last mark of one micro-batch to the start of the next
            seconds[phase] += (
                # marks are CUDA events on a GPU, perf_counter() seconds elsewhere
                start.elapsed_time(end) / 1000  # type: ignore[attr-defined]
                if self._cuda
                else end - start  # type: ignore[operator]
            )
        return seconds


def bottleneck(fractions: dict[str, float], busy: float | None = None) -> str:
    """One word for what limits a training step, from the shares of PHASES (``fractions``) and
    the device's NVML utilization (``busy``, 0..1): ``data`` when it waits for batches a fifth
    of the time, else ``overhead`` (Python, launches, small ops) when it is busy less than 80%.
    Without ``busy`` (a CPU, a GPU without NVML) the phase spans cannot tell a GPU's idle gaps
    from its work, so only ``data`` or ``compute`` is said."""
    if fractions["data_wait"] >= DATA_STARVED_SHARE:
        return "data"
    if busy is None or busy >= BUSY_SHARE:
        return "compute"
    return "overhead"
