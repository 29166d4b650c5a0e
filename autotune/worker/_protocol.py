"""The pipe between the study process and its worker: the frozen message types (pickled), and
nothing else crosses it.

    study -> worker   RunTrial, then a StopOrGoOn after each Evaluated; or MeasureSpeed;
                      Exit when idle
    worker -> study   Ready or StartFailed once; per trial Warmed, Evaluated..., then Finished
                      or Faulted; per speed measurement Warmed, then Measured or Faulted
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.config import TrialConfig
from autotune.faults import FaultKind, TrialFault
from autotune.results import Evaluation, TrialResult
from autotune.speed import BurstPlan, SpeedMeasurement


@dataclass(frozen=True)
class RunTrial:
    """study -> worker: train this configuration."""

    config: TrialConfig


@dataclass(frozen=True)
class MeasureSpeed:
    """study -> worker: time bursts of this configuration's training steps (speed stage)."""

    config: TrialConfig
    plan: BurstPlan


@dataclass(frozen=True)
class StopOrGoOn:
    """study -> worker: the answer to an evaluation (the pruner's, or a reached target)."""

    stop: bool


@dataclass(frozen=True)
class Exit:
    """study -> worker: no more trials; exit."""


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
class Evaluated:
    """worker -> study: an evaluation of the running trial; a StopOrGoOn must answer it."""

    evaluation: Evaluation


@dataclass(frozen=True)
class Finished:
    """worker -> study: the running trial trained to its end (or was stopped by a StopOrGoOn)."""

    outcome: TrialResult
    needs_fresh_process: bool = False  # it leaked device memory: this worker exits


@dataclass(frozen=True)
class Measured:
    """worker -> study: the speed measurement asked for."""

    outcome: SpeedMeasurement
    needs_fresh_process: bool = False  # its device memory did not come back: this one exits


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


ToWorker = RunTrial | MeasureSpeed | StopOrGoOn | Exit
Done = Finished | Measured | Faulted  # how a request ended: ``outcome``, and whether the
# worker exits after sending it (``needs_fresh_process``)
FromWorker = Ready | StartFailed | Warmed | Evaluated | Done
Request = RunTrial | MeasureSpeed
