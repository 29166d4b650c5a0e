"""The child processes a trial runs in (a worker; the ranks of a distributed trial), supervised
by the process that started them: each is spawned with a pipe, spoken to through it in the
messages below, and killed with everything it started. The supervisor answers the evaluations
they send and watches their ends (``next_message``); what a death or a timeout means is its
own (``worker._supervisor``, ``distributed._pool``). Nothing here imports torch: a worker is
started before the study process imports it."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn

from autotune.config import TrialConfig
from autotune.faults import FaultKind, TrialFault
from autotune.results import Evaluation, Reporter, TrialResult
from autotune.speed import BurstPlan, SpeedMeasurement

POLL_SECONDS = 0.2  # how long a supervisor waits for a message before it looks at its children
EXIT_GRACE_SECONDS = 10.0  # how long children asked to exit may take before they are killed


@dataclass(frozen=True)
class RunTrial:
    """supervisor -> child: train this configuration."""

    config: TrialConfig


@dataclass(frozen=True)
class MeasureSpeed:
    """supervisor -> child: time bursts of this configuration's training steps (stage 1)."""

    config: TrialConfig
    plan: BurstPlan


@dataclass(frozen=True)
class StopOrGoOn:
    """supervisor -> child: the answer to an evaluation (the pruner's, or a reached target)."""

    stop: bool


@dataclass(frozen=True)
class Exit:
    """supervisor -> child: no more requests; exit."""


@dataclass(frozen=True)
class Evaluated:
    """child -> supervisor: an evaluation of the running trial; a StopOrGoOn must answer it."""

    evaluation: Evaluation


@dataclass(frozen=True)
class Finished:
    """child -> supervisor: the running trial trained to its end (or was stopped by a
    StopOrGoOn)."""

    outcome: TrialResult
    needs_fresh_process: bool = False  # it leaked device memory: this worker exits


@dataclass(frozen=True)
class Measured:
    """child -> supervisor: the speed measurement asked for."""

    outcome: SpeedMeasurement
    needs_fresh_process: bool = False  # its device memory did not come back: this one exits


@dataclass(frozen=True)
class Faulted:
    """child -> supervisor: the running trial could not finish."""

    kind: FaultKind
    message: str
    details: str  # the traceback, for unexpected errors
    # a broken CUDA context, or device memory that did not come back: this worker exits
    # after sending it (a rank always exits after its fault)
    needs_fresh_process: bool
    lost_peer: bool = False  # a rank's collective failed because another rank went away

    @property
    def outcome(self) -> TrialFault:
        return TrialFault(self.kind, self.message, self.details)


Request = RunTrial | MeasureSpeed
Done = Finished | Measured | Faulted  # how a request ended: ``outcome``, and whether the
# worker exits after sending it (``needs_fresh_process``)


def reporter(pipe: Connection) -> Reporter:
    """A child's ``report``: each evaluation goes to the supervisor, whose answer it returns."""

    def report(evaluation: Evaluation) -> bool:
        pipe.send(Evaluated(evaluation))
        answer: StopOrGoOn = pipe.recv()
        return answer.stop

    return report


@dataclass(frozen=True)
class Child:
    """A child process and the supervisor's end of its pipe."""

    process: BaseProcess
    pipe: Connection


def start(target: Callable[..., None], args: list[tuple[Any, ...]], name: str) -> list[Child]:
    """A process per entry of ``args`` running ``target(pipe, *entry)``, spawned (a threaded
    process is not forked)."""
    context = multiprocessing.get_context("spawn")
    children: list[Child] = []
    try:
        for entry in args:
            ours, theirs = context.Pipe()
            process = context.Process(target=target, args=(theirs, *entry), name=name)
            children.append(Child(process, ours))
            try:
                process.start()
            finally:
                theirs.close()
    except BaseException:
        kill(children)
        raise
    return children


def tell(children: list[Child], message: object) -> None:
    """Send ``message`` to each child; one that is gone is found by ``next_message``."""
    for child in children:
        with contextlib.suppress(OSError):
            child.pipe.send(message)


def next_message(children: list[Child]) -> tuple[int, Any] | None:
    """The next message of any child: (its index, the message); None when none came within
    POLL_SECONDS or a child's process ended, when the caller looks for deaths and timeouts.
    A child whose pipe closed is not listened to again: how its process ended says why."""
    listening = [child.pipe for child in children if not child.pipe.closed]
    ready = wait([*listening, *(child.process.sentinel for child in children)], POLL_SECONDS)
    for index, child in enumerate(children):
        if child.pipe in ready:
            try:
                return index, child.pipe.recv()
            except (EOFError, OSError):
                child.pipe.close()
    return None


def answer(child: Child, evaluated: Evaluated, report: Reporter) -> float:
    """Answer a child's evaluation with ``report``'s verdict; the seconds ``report`` took (the
    child waited for it meanwhile: a database that restarts, say)."""
    asked = time.monotonic()
    tell([child], StopOrGoOn(report(evaluated.evaluation)))
    return time.monotonic() - asked


def ask_to_exit(children: list[Child]) -> None:
    """Ask each child to exit, and wait up to EXIT_GRACE_SECONDS for them (the caller then
    ``kill``s what is left)."""
    tell(children, Exit())
    deadline = time.monotonic() + EXIT_GRACE_SECONDS
    for child in children:
        child.process.join(max(0.0, deadline - time.monotonic()))


def exit_at_once() -> NoReturn:
    """End a child that was asked to exit (``Exit``), its work closed: skip the interpreter's
    shutdown, which takes a second or more after torch was imported and which the parent
    waits for at each close. Nothing is left to tidy: the parent ``kill``s the child's process
    group, and the worker's scratch folder is removed by the study process."""
    for stream in (sys.__stdout__, sys.stderr):
        if stream is not None:
            stream.flush()
    os._exit(0)


def kill(children: list[Child]) -> None:
    """Kill each child and everything it started (its process group, where it leads one),
    reap it and close its pipe."""
    for child in children:
        child.pipe.close()
        if child.process.pid is None:  # never started
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            child.process.kill()  # one killed before its setsid() has no process group yet
        child.process.join(timeout=10)
