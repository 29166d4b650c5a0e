"""How the study runs a trial: the executor interface, and trials in the study process
(``InProcessExecutor``; ``autotune.worker.WorkerExecutor`` runs them in a supervised one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from autotune import distributed, stops
from autotune.config import TrialConfig
from autotune.distributed import WorkloadSource
from autotune.errors import ReportFailed, UserError, WorkerError
from autotune.faults import TrialFault, as_fault, needs_fresh_process, release_memory
from autotune.results import Reporter, TrialResult
from autotune.speed import BurstPlan, SpeedMeasurement
from autotune.training import bursts, runner
from autotune.training.warmup import Warmth
from autotune.workloads import Workload


class TrialExecutor(Protocol):
    """Trains one trial: ``train(config, report) -> TrialResult``, or times one configuration:
    ``measure(config, plan) -> SpeedMeasurement``; both raise on faults."""

    def train(self, config: TrialConfig, report: Reporter) -> TrialResult: ...

    def measure(self, config: TrialConfig, plan: BurstPlan) -> SpeedMeasurement: ...

    def close(self) -> None: ...


Outcome = TypeVar("Outcome")


def attempt(call: Callable[[], Outcome]) -> Outcome | TrialFault:
    """Run one executor call (a trial, a measurement, a confirmation run): what it returned, or
    the fault that stopped it, classified where it happened, with the memory it left behind
    released. The study's trials, stage 1 and the confirmation round all call an executor
    through here. An interruption (Ctrl-C, SIGTERM), a worker that cannot start and a study
    that cannot record an evaluation are not a configuration's faults: they propagate; one that
    a callback swallowed is raised again before and after the call (``stops``)."""
    stops.raise_pending()
    try:
        outcome = call()
    except (KeyboardInterrupt, WorkerError, ReportFailed):
        raise
    except Exception as error:
        fault = as_fault(error)
    else:
        stops.raise_pending()
        return outcome
    if not needs_fresh_process(fault):  # a broken CUDA context raises again when touched
        release_memory()
    stops.raise_pending()
    return fault


class InProcessExecutor:
    """Trials in this process: the study process itself (``--isolation none``, for debugging:
    nothing is supervised, a crash ends the study and a hang is not timed out), or a worker
    (``autotune.worker``). Memory a failed trial left is released by the caller (``attempt``)."""

    def __init__(
        self,
        workload: Workload,
        warmth: Warmth | None = None,
        source: WorkloadSource | None = None,
        on_warmed: Callable[[], None] | None = None,
    ) -> None:
        self.workload = workload
        self.warmth = warmth or Warmth()
        # the processes of distributed trials (built from the workload's spec), kept between
        self.ranks = distributed.RankPool(source) if source is not None else None
        self.on_warmed = on_warmed  # told when a request's own work, and its clock, start

    def _ranks(self) -> distributed.RankPool:
        if self.ranks is None:
            raise UserError("a distributed trial needs the workload's spec to start its ranks")
        return self.ranks

    def train(self, config: TrialConfig, report: Reporter) -> TrialResult:
        if config.distributed:  # its own processes, each warmed before its clock
            result = self._ranks().train(config, report)
        else:
            self._warm(config)
            result = runner.train(config, self.workload, report)
        release_memory()  # the next trial's peak memory is its own
        return result

    def measure(self, config: TrialConfig, plan: BurstPlan) -> SpeedMeasurement:
        if config.distributed:
            measured = self._ranks().measure(config, plan)
        else:
            self._warm(config)
            measured = bursts.measure(config, self.workload, plan)
        release_memory()
        return measured

    def _warm(self, config: TrialConfig) -> None:
        self.warmth.warm_for(config, self.workload)  # what this process pays once: on no clock
        if self.on_warmed is not None:
            self.on_warmed()

    def close(self) -> None:
        self.warmth.close()
        if self.ranks is not None:
            self.ranks.close()
