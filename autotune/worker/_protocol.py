"""The pipe between the study process and its worker: the frozen message types (pickled), and
nothing else crosses it. Those a distributed trial's ranks speak too are ``supervision``'s.

    study -> worker   RunTrial, then a StopOrGoOn after each Evaluated; or MeasureSpeed;
                      Exit when idle
    worker -> study   Ready or StartFailed once; per trial Warmed, Evaluated..., then Finished
                      or Faulted; per speed measurement Warmed, then Measured or Faulted
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.faults import FaultKind, TrialFault
from autotune.supervision import Finished, Measured


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


@dataclass(frozen=True)
class Faulted:
    """worker -> study: the running trial could not finish."""

    kind: FaultKind
    message: str
    details: str  # the traceback, for unexpected errors
    # a broken CUDA context, or device memory that did not come back: this worker exits
    # after sending it
    needs_fresh_process: bool

    @property
    def outcome(self) -> TrialFault:
        return TrialFault(self.kind, self.message, self.details)


Done = Finished | Measured | Faulted  # how a request ended: ``outcome``, and whether the
# worker exits after sending it (``needs_fresh_process``)
