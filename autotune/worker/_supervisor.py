"""The study process's end of a worker (``WorkerExecutor``, see ``autotune.worker``); each
worker's temporary files live in a scratch folder removed with it."""

from __future__ import annotations

import ast
import contextlib
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from autotune import supervision
from autotune.config import TrialConfig
from autotune.errors import WorkerError
from autotune.faults import FaultKind, TrialFault, describe_exit, oom_kills, worker_died
from autotune.machine.interference import CpuMeter
from autotune.results import Reporter, TrialResult
from autotune.spacefile import Spec, WorkloadSpec
from autotune.speed import BurstPlan, SpeedMeasurement, no_evaluations
from autotune.supervision import Child, Done, Evaluated, MeasureSpeed, Request, RunTrial
from autotune.worker._process import parent_start_method, worker_main
from autotune.worker._protocol import StartFailed, Warmed

START_TIMEOUT_SECONDS = 600.0  # importing torch and loading the data; generous for big data
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


def refuse_unguarded_main() -> None:
    """WorkerError when the main script (run as a file) starts a worker from its top level,
    outside ``if __name__ == "__main__":``: the spawned worker re-imports that script, which would
    start the study again inside it and fail, blaming the workload."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    frame: FrameType | None = sys._getframe()
    while frame is not None and not (
        frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"
    ):
        frame = frame.f_back
    if frame is None or path is None:
        return  # an interactive session, a notebook, python -c, or a call not from the script
    try:
        statements = ast.parse(Path(path).read_text()).body
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return
    for node in statements:
        if node.lineno <= frame.f_lineno <= (node.end_lineno or node.lineno):
            guard = isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"')
            if guard not in ('__name__ == "__main__"', '"__main__" == __name__'):
                raise WorkerError(
                    f"{path}:{frame.f_lineno} runs autotune at the top level of the script: "
                    f"its worker process imports the script again; put the call under "
                    f'if __name__ == "__main__":'
                )


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
        self._worker: Child | None = None
        self.started_pids: list[int] = []  # every worker started, in order
        self._scratch: str | None = None  # the current worker's temporary directory
        self.scratch_dirs: list[str] = []  # every worker's, in order (removed with it)
        self._ran: TrialConfig | None = None  # what the current worker ran last
        self._starting = False  # launched, and not yet known to be ready

    # -- the worker's life ------------------------------------------------------------------

    def _launch(self) -> None:
        """Start the worker process; it imports torch and loads the workload meanwhile."""
        refuse_unguarded_main()
        # DataLoader workers must start in the worker as they would in this process
        args = (self.workload, self.score, self.base_dir, self.verbose, parent_start_method())
        try:
            (worker,) = supervision.start(
                worker_main, [(*args, self._new_scratch())], "autotune-worker"
            )
        except BaseException:
            self._kill()  # removes the scratch directory made for it
            raise
        if worker.process.pid is not None:
            self.started_pids.append(worker.process.pid)
        self._worker, self._starting = worker, True

    def _await_start(self) -> None:
        """Wait for the launched worker to say it is ready; WorkerError when it cannot be."""
        assert self._worker is not None
        process = self._worker.process
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        try:
            while (heard := supervision.next_message([self._worker])) is None:
                if not process.is_alive():
                    raise WorkerError(
                        f"the worker process died while starting "
                        f"({describe_exit(process.exitcode)})"
                    )
                if time.monotonic() > deadline:
                    raise WorkerError(f"the worker did not start in {START_TIMEOUT_SECONDS:g} s")
            if isinstance(heard[1], StartFailed):
                raise WorkerError(heard[1].message)
            self._starting = False
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
        """Kill the worker and everything it started, then remove its temporary directory."""
        if self._worker is not None:
            supervision.kill([self._worker])
        self._worker, self._ran, self._starting = None, None, False
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def close(self) -> None:
        """Ask an idle worker to exit; kill it if it does not (or is still starting)."""
        if self._worker is not None and not self._starting:
            supervision.ask_to_exit([self._worker])
        self._kill()

    def start(self) -> None:
        """Start the worker process now (it imports torch and loads the workload) rather than
        at the first trial; nothing when one is running. WorkerError when it cannot start."""
        if self._worker is None or not self._worker.process.is_alive():
            self._kill()
            self._launch()
        if self._starting:  # launched ahead (``launch``): ready by now, or soon
            self._await_start()

    @classmethod
    def of(cls, spec: Spec, base_dir: Path | None, verbose: bool = False) -> WorkerExecutor:
        """The worker a study of ``spec`` trains in (its workload, score and trial timeout)."""
        return cls(
            spec.workload, base_dir, spec.study.trial_timeout, verbose, spec.objective.score
        )

    def serves(self, other: WorkerExecutor) -> bool:
        """Whether this worker runs trials as ``other`` would: the same workload (its device
        aside, which loading it does not read: each trial's configuration names its own),
        score, folder, timeout and verbosity."""
        workload = self.workload.model_copy(update={"device": other.workload.device})
        settings = (self.score, self.base_dir, self.trial_timeout, self.verbose)
        wanted = (other.score, other.base_dir, other.trial_timeout, other.verbose)
        return workload == other.workload and settings == wanted

    def launch(self) -> None:
        """Start the worker process and return at once: its imports and its copy of the
        workload overlap what this process does meanwhile (``prepare``: loading and checking
        the same workload). The first request, or ``start``, waits for it to be ready."""
        if self._worker is None:
            self._launch()

    # -- one trial ----------------------------------------------------------------------------

    def train(self, config: TrialConfig, report: Reporter) -> TrialResult:
        """Train one trial in the worker; TrialFault for every way it can end badly."""
        outcome = self._supervise(RunTrial(config), report)
        assert isinstance(outcome, TrialResult)
        return outcome

    def measure(self, config: TrialConfig, plan: BurstPlan) -> SpeedMeasurement:
        """Time one configuration in the worker (speed stage); TrialFault as ``train``."""
        outcome = self._supervise(MeasureSpeed(config, plan), no_evaluations)
        assert isinstance(outcome, SpeedMeasurement)
        return outcome

    def _supervise(self, request: Request, report: Reporter) -> TrialResult | SpeedMeasurement:
        from autotune.training.trainer import (
            cudnn_plans_differ,  # torch: not before the worker starts
        )

        if self._ran is not None and cudnn_plans_differ(self._ran, request.config):
            self._kill()  # a fresh process: a cuDNN plan cache of its own
        self.start()
        assert self._worker is not None
        self._ran = request.config
        limit = self.trial_timeout
        if isinstance(request, MeasureSpeed) and request.plan.time_limit_seconds is not None:
            limit = min(limit or math.inf, request.plan.time_limit_seconds)
        try:
            with CpuMeter() as meter:  # whether a timeout is the machine's or the trial's
                done = self._exchange(self._worker, request, report, meter, limit)
        except BaseException:
            # a crash or timeout found there, an interruption (Ctrl-C, SIGTERM), or a failing
            # reporter: the worker may be mid-trial, so it goes, with its DataLoader workers
            self._kill()
            raise
        if done.needs_fresh_process:  # it exits (a leak, a broken CUDA context): the next
            self._kill()  # request starts a new worker
        if isinstance(done.outcome, TrialFault):
            raise done.outcome  # the worker survived it and waits for the next request
        return done.outcome

    @staticmethod
    def _exchange(
        worker: Child, request: Request, report: Reporter, meter: CpuMeter, limit: float | None
    ) -> Done:
        """Send the request, answer its evaluations, and return how it ended; TrialFault when
        the worker died, or ran past ``limit`` seconds. Neither the process's one-time warm-up
        (which has a ``limit`` of its own) nor the time it waited for its evaluations' answers
        is counted."""
        killed_before = oom_kills()  # a death by SIGKILL: the OOM killer's, or another's
        started, warming = time.monotonic(), True  # until Warmed: the warm-up is timed apart
        supervision.tell([worker], request)
        while True:
            heard = supervision.next_message([worker])
            if heard is None:
                if worker.pipe.closed or not worker.process.is_alive():
                    worker.process.join(EXIT_REPORT_SECONDS)  # its pipe closed as it dies
                    raise worker_died(worker.process.exitcode, killed_before)
                if limit is not None and time.monotonic() - started > limit:
                    raise _timed_out(limit, warming, meter)
            elif isinstance(heard[1], Warmed):  # the process's one-time costs: not the trial's
                started, warming = time.monotonic(), False
            elif isinstance(heard[1], Evaluated):
                started += supervision.answer(worker, heard[1], report)
            else:
                return heard[1]


def _timed_out(limit: float, warming: bool, meter: CpuMeter) -> TrialFault:
    """The fault of a request that ran past ``limit`` seconds; killed after this is read."""
    share = meter.so_far()  # before the kill: the trial's own processes still count
    phase = " (still warming up: the process's first steps)" if warming else ""
    killed = (
        f"no result after {round(limit, 1):g} s{phase}; the worker and its DataLoader "
        f"workers were killed"
    )
    if share is not None and share.interfered:
        # a busy machine is not a wall of this configuration: not a constraint
        return TrialFault(
            FaultKind.TIMEOUT_UNDER_LOAD,
            f"{killed}; other processes took {share.other_share:.0%} of its cores "
            f"meanwhile, so the timeout is not held against the configuration",
        )
    return TrialFault(FaultKind.TRIAL_TIMEOUT, killed)
