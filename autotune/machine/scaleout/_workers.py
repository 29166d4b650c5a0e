"""The workers 1..N-1 that worker 0 starts; a started worker waits for stage 1 and stops with
worker 0."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.machine.scaleout._shares import (
    WORKER_CORES_ENV,
    ScaleOutError,
    WorkerShare,
    apply_share,
    gpus_argument,
    plan_shares,
    unshared_environment,
)

# the storage URL a worker joins, passed in its environment: a password stays out of `ps`
WORKER_STORAGE_ENV = "AUTOTUNE_WORKER_STORAGE"
# worker 0's pid: a worker started after it died does not run
WORKER_PARENT_ENV = "AUTOTUNE_WORKER_PARENT"
# a file worker 0 makes once stage 1 is measured: the others, which time their share of it
# on their own cores, wait for it before their first trial
STAGE1_MEASURED_ENV = "AUTOTUNE_STAGE1_MEASURED"


def wait_for_stage1() -> None:
    """In a worker started by worker 0: wait until worker 0 has measured stage 1."""
    measured = os.environ.pop(STAGE1_MEASURED_ENV, None)
    while measured is not None and not os.path.exists(measured):
        time.sleep(0.1)


PR_SET_PDEATHSIG = 1  # Linux prctl: signal this process when its parent dies


def die_with_parent(signum: int) -> None:
    """Ask Linux to send this process ``signum`` when its parent dies (even by SIGKILL)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum)


class WorkerGone(ScaleOutError):
    """Worker 0 died before this worker it started could ask to stop with it."""


def take_share(
    gpus_per_trial: int, workers: int | None, gpus: str | None, as_worker: int | None
) -> list[WorkerShare] | None:
    """The workers' shares (None without --workers or --gpus), this process's (``as_worker``,
    else 0) applied before torch sees a GPU; ScaleOutError where they cannot be had, WorkerGone
    where worker 0 died before this worker it started."""
    shares = plan_shares(workers, gpus, gpus_per_trial) if workers or gpus else None
    if as_worker is not None and (shares is None or not 0 < as_worker < len(shares)):
        raise ScaleOutError("--as-worker is for the workers autotune starts itself")
    if shares is not None:
        apply_share(shares[as_worker or 0])
    if as_worker is not None:
        os.environ.pop(WORKER_CORES_ENV, None)  # not for what this worker starts
        # when worker 0 dies, this one records its running trial as interrupted and stops, as
        # at a Ctrl-C; where worker 0 died before this worker could ask, it does not run at all
        die_with_parent(signal.SIGINT)
        parent = os.environ.pop(WORKER_PARENT_ENV, None)
        if parent is not None and os.getppid() != int(parent):
            raise WorkerGone("worker 1 of this study is gone: this worker does not start")
    return shares


@dataclass
class _Started:
    share: WorkerShare
    process: subprocess.Popen[bytes]
    log: Path


def start_workers(
    shares: list[WorkerShare], space_file: Path, spec: Any, study_name: str, log_dir: Path
) -> Workers:
    """Start workers 1..N-1 on the study (``autotune run SPACE ... --as-worker K``) with the
    same resolved settings and the storage in their environment; they wait for
    ``Workers.start_trials``."""
    arguments = [str(space_file), "--study-name", study_name, "--n-trials"]
    arguments += [str(spec.study.n_trials), "--isolation", spec.study.isolation]
    arguments += ["--device", spec.workload.device]
    if spec.study.seed is not None:
        arguments += ["--seed", str(spec.study.seed)]
    if spec.study.timeout is not None:
        arguments += ["--timeout", f"{max(spec.study.timeout, 0.001):.3f}"]
    if shares[0].gpu is not None:
        arguments += ["--gpus", gpus_argument(shares)]
    else:
        arguments += ["--workers", str(len(shares))]
    workers = Workers(log_dir, tuple(sorted({c for share in shares for c in share.cores})))
    workers.start(shares[1:], arguments, {WORKER_STORAGE_ENV: spec.study.storage})
    return workers


class Workers:
    """The workers 1..N-1 that worker 0 starts, each with its share and a log file."""

    def __init__(self, log_dir: Path, cores: tuple[int, ...]) -> None:
        self.log_dir = log_dir
        self.cores = cores  # those the shares were made of
        self.started: list[_Started] = []
        self.reported: set[int] = set()  # workers whose exit was said
        self.interrupted = False  # SIGINT was passed on to them (once: a second cuts short)
        self.trials_started = False  # told to start training (stage 1 is measured)
        self.stage1_measured = log_dir / "stage-1-measured"
        self._lock = threading.Lock()  # ended_badly() is asked from worker 0's display thread too

    def start(
        self, shares: list[WorkerShare], arguments: list[str], environment: dict[str, str]
    ) -> None:
        """Start a worker per share, ``environment`` added to theirs; if one cannot be started,
        those already started are stopped before the error is raised."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stage1_measured.unlink(missing_ok=True)  # an earlier run's
        try:
            for share in shares:
                self._start_one(share, arguments, environment)
        except BaseException:
            self.interrupt()
            self.wait(60)
            raise

    def _start_one(
        self, share: WorkerShare, arguments: list[str], environment: dict[str, str]
    ) -> None:
        log = self.log_dir / f"worker-{share.index + 1}.log"
        command = [sys.executable, "-m", "autotune", "run", *arguments]
        command += ["--as-worker", str(share.index)]
        full = {
            **unshared_environment(dict(os.environ)),  # the GPUs worker 0 had, not its share
            **environment,
            WORKER_CORES_ENV: ",".join(str(core) for core in self.cores),
            WORKER_PARENT_ENV: str(os.getpid()),
            STAGE1_MEASURED_ENV: str(self.stage1_measured),
        }
        with open(log, "wb") as output:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=full,
                # a session of its own: a Ctrl-C at the terminal reaches worker 0 alone,
                # which passes it on once (two would cut a worker's recording short)
                start_new_session=True,
            )
        self.started.append(_Started(share, process, log))

    def start_trials(self) -> None:
        """Let the workers train: stage 1 is measured (they reuse its measurements)."""
        self.stage1_measured.touch()
        self.trials_started = True

    def ended_badly(self) -> list[str]:
        """A line for each worker that ended badly since last asked (130 and 143 are not bad
        once worker 0 interrupted them)."""
        lines = []
        with self._lock:
            for started in self.started:
                code, share = started.process.poll(), started.share
                if code is None or share.index in self.reported:
                    continue
                self.reported.add(share.index)
                if code != 0 and not (self.interrupted and code in (130, 143)):
                    lines.append(
                        f"{share.describe()} ended with exit status {code}; its log: {started.log}"
                    )
        return lines

    def stop(self, interrupt: bool, timeout: float) -> list[str]:
        """Wait, ``timeout`` seconds in all, for the workers to end (interrupted first, where
        ``interrupt``); ``ended_badly``'s lines."""
        if interrupt:
            self.interrupt()  # each records its running trial as interrupted
        self.wait(timeout)
        return self.ended_badly()

    def interrupt(self) -> None:
        """SIGINT every worker still running, as Ctrl-C (once, however often asked)."""
        if self.interrupted:
            return
        self.interrupted = True
        for started in self.started:
            if started.process.poll() is None:
                started.process.send_signal(signal.SIGINT)

    def wait(self, timeout: float) -> None:
        """Wait ``timeout`` seconds for the workers to end; interrupt the rest, kill them a
        minute later."""
        deadline = time.monotonic() + timeout
        for started in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                started.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        if all(started.process.poll() is not None for started in self.started):
            return
        self.interrupt()
        deadline = time.monotonic() + 60
        for started in self.started:
            try:
                started.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                started.process.kill()
                started.process.wait()
