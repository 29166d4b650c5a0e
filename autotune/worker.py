"""Trials in a supervised worker process.

A long-lived worker process loads the workload once and trains trial after trial, so a short
trial does not pay a torch import each time. It streams every evaluation to the study process,
which answers whether to stop (the pruner runs there, next to the storage). When the worker
crashes, hangs past the trial timeout, or its CUDA context breaks, the study process kills its
whole process group (DataLoader workers included), records the trial and starts a fresh worker;
GPU memory is released between such trials by construction.

The pipe carries the frozen message types below (pickled), and nothing else:
    study -> worker   RunTrial, then a StopOrGoOn after each Evaluated; or MeasureSpeed;
                      Exit when idle
    worker -> study   Ready or StartFailed once; per trial Evaluated..., then Finished or
                      Faulted; per speed measurement Measured or Faulted
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import math
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

from autotune import bursts, distributed, runner
from autotune.config import TrialConfig
from autotune.executor import WorkerError
from autotune.faults import (
    FaultKind,
    MemoryWatch,
    TrialFault,
    as_fault,
    describe_exit,
    needs_fresh_process,
    release_memory,
)
from autotune.interference import CpuMeter
from autotune.results import Evaluation, Reporter, TrialResult
from autotune.spec import WorkloadSpec
from autotune.speed import BurstPlan, SpeedMeasurement
from autotune.trainer import cudnn_plans_differ
from autotune.warmup import Warmth

if TYPE_CHECKING:
    from autotune.workloads import Workload

__all__ = ["WorkerExecutor"]

# ---------------------------------------------------------------------------------------------
# The messages
# ---------------------------------------------------------------------------------------------


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
class Evaluated:
    """worker -> study: an evaluation of the running trial; a StopOrGoOn must answer it."""

    evaluation: Evaluation


@dataclass(frozen=True)
class Finished:
    """worker -> study: the running trial trained to its end (or was stopped by a StopOrGoOn);
    with ``result.memory_left_bytes`` set, the worker exits after sending it (a leak)."""

    result: TrialResult


@dataclass(frozen=True)
class Measured:
    """worker -> study: the speed measurement asked for."""

    measurement: SpeedMeasurement
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


ToWorker = RunTrial | MeasureSpeed | StopOrGoOn | Exit
FromWorker = Ready | StartFailed | Evaluated | Finished | Measured | Faulted
Request = RunTrial | MeasureSpeed

POLL_SECONDS = 0.2  # how often the supervisor checks the worker between messages
START_TIMEOUT_SECONDS = 600.0  # importing torch and loading the data; generous for big data
PR_SET_PDEATHSIG = 1  # Linux prctl: signal this process when its parent dies
EXIT_REPORT_SECONDS = 5.0  # how long a worker whose pipe closed may take to exit


SCRATCH_PREFIX = "autotune-worker-"


def remove_orphaned_scratch(directory: str | None = None) -> list[Path]:
    """Remove workers' temporary directories whose study process is gone (it was SIGKILLed, so
    nobody removed them), in ``directory`` (the temporary directory by default); they are
    removed only when this user owns them. The directories removed."""
    removed = []
    for path in Path(directory or tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*-*"):
        owner = path.name.removeprefix(SCRATCH_PREFIX).partition("-")[0]
        with contextlib.suppress(OSError):
            if not owner.isdigit() or path.stat().st_uid != os.getuid() or _alive(int(owner)):
                continue
            shutil.rmtree(path)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts as existing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class WorkerExecutor:
    """Trials in a supervised, long-lived worker process (the default isolation)."""

    def __init__(
        self,
        workload: WorkloadSpec,
        base_dir: Path | None,
        trial_timeout: float | None = None,
        verbose: bool = False,
        score: str = "accuracy",
    ) -> None:
        self.workload = workload
        self.score = score  # objective.score: what the workload is judged by
        self.base_dir = base_dir
        self.trial_timeout = trial_timeout
        self.verbose = verbose
        self._context = multiprocessing.get_context("spawn")  # no fork of a threaded process
        self._process: multiprocessing.process.BaseProcess | None = None
        self._connection: Connection | None = None
        self.started_pids: list[int] = []  # every worker started, in order
        self._scratch: str | None = None  # the current worker's temporary directory
        self.scratch_dirs: list[str] = []  # every worker's, in order (removed with it)
        self._ran: TrialConfig | None = None  # what the current worker ran last

    # -- the worker's life ------------------------------------------------------------------

    def _start(self) -> None:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_worker_main,
            # DataLoader workers must start in the worker as they would in this process
            args=(
                child,
                self.workload,
                self.score,
                self.base_dir,
                self.verbose,
                _start_method(),
                self._new_scratch(),
            ),
            name="autotune-worker",
        )
        try:
            process.start()
        except BaseException:
            self._kill()  # removes the scratch directory made for it
            raise
        child.close()
        if process.pid is not None:
            self.started_pids.append(process.pid)
        self._process, self._connection = process, parent
        try:
            deadline = time.monotonic() + START_TIMEOUT_SECONDS
            while not parent.poll(POLL_SECONDS):
                if not process.is_alive():
                    raise WorkerError(
                        f"the worker process died while starting "
                        f"({describe_exit(process.exitcode)})"
                    )
                if time.monotonic() > deadline:
                    raise WorkerError(f"the worker did not start in {START_TIMEOUT_SECONDS:g} s")
            message: FromWorker = parent.recv()
            if isinstance(message, StartFailed):
                raise WorkerError(message.message)
        except BaseException:  # including Ctrl-C while torch imports in the worker
            self._kill()
            raise

    def _new_scratch(self) -> str:
        """A temporary directory for the next worker: everything it writes to temporary files
        (torch.compile's caches included) goes there, and goes when the worker goes, even when
        it was killed mid-trial. Its name holds this process's id, so that when this process
        is killed outright the next study removes it (``remove_orphaned_scratch``)."""
        if not self.scratch_dirs:
            remove_orphaned_scratch()
        self._scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
        self.scratch_dirs.append(self._scratch)
        return self._scratch

    def _kill(self) -> None:
        """Kill the worker and everything it started (its process group), then reap it and
        remove its temporary directory."""
        process, self._process = self._process, None
        self._ran = None
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if process is not None:
            if process.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError, AttributeError):
                process.kill()  # one killed before its setsid() has no process group yet
            process.join(timeout=10)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def close(self) -> None:
        """Ask an idle worker to exit; kill it if it does not."""
        if self._process is not None and self._connection is not None:
            with contextlib.suppress(OSError):
                self._connection.send(Exit())
            self._process.join(timeout=5)
        self._kill()

    def start(self) -> None:
        """Start the worker process now (it imports torch and loads the workload) rather than
        at the first trial; nothing when one is running. WorkerError when it cannot start."""
        if self._process is None or not self._process.is_alive():
            self._kill()
            self._start()

    # -- one trial ----------------------------------------------------------------------------

    def run(self, config: TrialConfig, report: Reporter) -> TrialResult:
        """Run one trial in the worker; TrialFault for every way it can end badly."""
        outcome = self._supervise(RunTrial(config), report)
        assert isinstance(outcome, TrialResult)
        return outcome

    def measure(self, config: TrialConfig, plan: BurstPlan) -> SpeedMeasurement:
        """Time one configuration in the worker (speed stage); TrialFault as ``run``."""
        outcome = self._supervise(MeasureSpeed(config, plan), _no_evaluations)
        assert isinstance(outcome, SpeedMeasurement)
        return outcome

    def _supervise(self, request: Request, report: Reporter) -> TrialResult | SpeedMeasurement:
        if self._ran is not None and cudnn_plans_differ(self._ran, request.config):
            self._kill()  # a fresh process: a cuDNN plan cache of its own
        if self._process is None or not self._process.is_alive():
            self._kill()
            self._start()
        assert self._process is not None and self._connection is not None
        self._ran = request.config
        started = time.monotonic()
        limit = self.trial_timeout
        if isinstance(request, MeasureSpeed) and request.plan.time_limit_seconds is not None:
            limit = min(limit or math.inf, request.plan.time_limit_seconds)
        with CpuMeter() as meter:  # whether a timeout is the machine's or the trial's
            outcome = self._exchange(request, report, started, meter, limit)
        if isinstance(outcome, TrialFault):
            raise outcome  # the worker survived it and waits for the next request
        return outcome

    def _exchange(
        self,
        request: Request,
        report: Reporter,
        started: float,
        meter: CpuMeter,
        limit: float | None,
    ) -> TrialResult | SpeedMeasurement | TrialFault:
        """Send the request, answer its evaluations, and return how it ended; past ``limit``
        seconds (the time it waited for its evaluations' answers not counted) it is killed."""
        assert self._connection is not None
        connection = self._connection
        try:
            connection.send(request)
            while True:
                if not connection.poll(POLL_SECONDS):
                    self._check_alive_and_on_time(started, meter, limit)
                    continue
                message: FromWorker = connection.recv()
                if isinstance(message, Evaluated):
                    asked = time.monotonic()
                    stop = report(message.evaluation)
                    # the worker waited for the answer (a database that restarts): not its time
                    started += time.monotonic() - asked
                    connection.send(StopOrGoOn(stop=stop))
                elif isinstance(message, Finished):
                    if message.result.memory_left_bytes is not None:
                        self._kill()  # it leaked device memory and exits: the next is fresh
                    return message.result
                elif isinstance(message, Measured):
                    if message.needs_fresh_process:
                        self._kill()
                    return message.measurement
                elif isinstance(message, Faulted):
                    if message.needs_fresh_process:  # its CUDA context is broken: it exits;
                        self._kill()  # the next trial starts a new worker, not a dead one
                    return TrialFault(message.kind, message.message, message.details)
                else:
                    raise TypeError(f"unexpected message from the worker: {message!r}")
        except (EOFError, OSError):
            # the pipe closed: the worker is dying; give it a moment to report how
            exitcode = None
            if self._process is not None:
                self._process.join(timeout=EXIT_REPORT_SECONDS)
                exitcode = self._process.exitcode
            self._kill()
            raise TrialFault(
                "worker_crashed",
                f"the worker process died during the trial ({describe_exit(exitcode)})",
            ) from None
        except BaseException:
            # a crash or timeout found above, an interruption (Ctrl-C, SIGTERM), or a failing
            # reporter: the worker may be mid-trial, so it goes, with its DataLoader workers
            self._kill()
            raise

    def _check_alive_and_on_time(
        self, started: float, meter: CpuMeter, limit: float | None
    ) -> None:
        assert self._process is not None
        if not self._process.is_alive():
            exitcode = self._process.exitcode
            self._kill()
            raise TrialFault(
                "worker_crashed",
                f"the worker process died during the trial ({describe_exit(exitcode)})",
            )
        if limit is not None and time.monotonic() - started > limit:
            share = meter.so_far()  # before the kill: the trial's own processes still count
            self._kill()
            killed = (
                f"no result after {round(limit, 1):g} s; the worker and its DataLoader "
                f"workers were killed"
            )
            if share is not None and share.interfered:
                # a busy machine is not a wall of this configuration: not a constraint
                raise TrialFault(
                    FaultKind.TIMEOUT_UNDER_LOAD,
                    f"{killed}; other processes took {share.other_share:.0%} of its cores "
                    f"meanwhile, so the timeout is not held against the configuration",
                )
            raise TrialFault(FaultKind.TRIAL_TIMEOUT, killed)


def _no_evaluations(evaluation: Evaluation) -> bool:
    raise TypeError("a speed measurement does not evaluate")


# ---------------------------------------------------------------------------------------------
# The worker process
# ---------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the study process dies (even by SIGKILL)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _start_method() -> str:
    """How this process starts child processes (fork on Linux up to Python 3.13)."""
    return (
        multiprocessing.get_start_method(allow_none=True)
        or multiprocessing.get_context().get_start_method()
    )


def _worker_main(
    connection: Connection,
    workload_spec: WorkloadSpec,
    score: str,
    base_dir: Path | None,
    verbose: bool,
    start_method: str,
    scratch: str,
) -> None:
    os.setsid()  # a process group of our own: killing it takes the DataLoader workers along
    # temporary files in a directory the study process removes when this worker ends
    os.environ["TMPDIR"] = tempfile.tempdir = scratch
    # A spawned process inherits "spawn" as its way to start children; DataLoader workers
    # started that way would import torch at every epoch. Start them as the study would.
    multiprocessing.set_start_method(start_method, force=True)
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the study process decides what to stop
    if not verbose:
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", message="This DataLoader will create")

    from autotune import workloads

    try:
        workload = workloads.load(workload_spec, base_dir, score)
    except Exception as error:  # reported to the study process, which says it in one line
        connection.send(StartFailed(f"the worker could not load the workload: {error}"))
        return
    connection.send(Ready())
    warmth = Warmth()
    # the processes of distributed trials, kept from one to the next (started at the first)
    ranks = distributed.RankPool(distributed.WorkloadSource(workload_spec, base_dir, score))
    try:
        _serve(connection, workload, warmth, ranks)
    finally:
        ranks.close()


def _serve(
    connection: Connection, workload: Workload, warmth: Warmth, ranks: distributed.RankPool
) -> None:
    """The worker's loop: one request (a trial, a speed measurement) after another."""
    watch = MemoryWatch()  # device memory back after each request, or a fresh process
    while True:
        try:
            message: ToWorker = connection.recv()
        except (EOFError, OSError):
            return  # the study process is gone
        if not isinstance(message, RunTrial | MeasureSpeed):  # Exit
            return
        config = message.config

        def report(evaluation: Evaluation) -> bool:
            connection.send(Evaluated(evaluation))
            verdict: StopOrGoOn = connection.recv()
            return verdict.stop

        try:
            if config.distributed:  # its own processes, each warmed before its clock
                if isinstance(message, MeasureSpeed):
                    measured = ranks.measure(config, message.plan)
                else:
                    result = ranks.train(config, report)
            elif isinstance(message, MeasureSpeed):
                warmth.before(config, workload)  # what this process pays once: not on a clock
                measured = bursts.measure(config, workload, message.plan)
            else:
                warmth.before(config, workload)
                result = runner.train(config, workload, report)
        except Exception as error:
            fault, fresh = as_fault(error), needs_fresh_process(error)
            del error
            if not fresh:  # a broken CUDA context is not touched again (releasing its memory
                release_memory()  # raises the sticky error); the next trial gets a new process
                fresh = watch.left_after(config.device) is not None
            connection.send(Faulted(fault.kind, fault.message, fault.details, fresh))
            if fresh:
                return
            continue
        # the next trial starts from an empty CUDA cache, its peak its own; memory that does
        # not come back is a leak, and the next trial gets a fresh process instead
        release_memory()
        left = watch.left_after(config.device)
        if isinstance(message, MeasureSpeed):
            connection.send(Measured(measured, needs_fresh_process=left is not None))
        else:
            connection.send(Finished(dataclasses.replace(result, memory_left_bytes=left)))
        if left is not None:
            return
