"""Honest clocks: the device is synchronized at every boundary and never inside the hot loop."""

from __future__ import annotations

import time

import torch

__all__ = ["TrainClock", "synchronize"]


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on ``device`` (a no-op on the CPU, which runs synchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TrainClock:
    """Accumulates training wall-clock seconds; time while paused (evaluation) is not counted.

    Every reading synchronizes the device first, so the seconds include the GPU work that the
    host has queued but the GPU has not yet finished.
    """

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
