"""The pipe between the study process and its worker: the frozen message types (pickled), and
nothing else crosses it. Those a distributed trial's ranks speak too are ``supervision``'s.

    study -> worker   RunTrial, then a StopOrGoOn after each Evaluated; or MeasureSpeed;
                      Exit when idle
    worker -> study   Ready or StartFailed once; per trial Warmed, Evaluated..., then Finished
                      or Faulted; per speed measurement Warmed, then Measured or Faulted
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ready:
    """worker -> study: the workload is loaded; send trials."""


@dataclass(frozen=True)
class StartFailed:
    """worker -> study: the worker cannot run trials (the workload did not load)."""

    message: str


@dataclass(frozen=True)
class Warmed:
    """worker -> study: the process has paid its one-time costs for the request (``Warmth``:
    its first kernels, the compiler's machinery); the request's own work, and its clock, start
    now."""
