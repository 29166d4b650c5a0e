"""The worker process: loads the workload once, then serves one request after another (a
trial, a speed measurement), each answered through the pipe (``_protocol``)."""

from __future__ import annotations

import dataclasses
import io
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
import warnings
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.faults import MemoryWatch, as_fault, needs_fresh_process, release_memory
from autotune.machine.scaleout import die_with_parent
from autotune.spacefile import WorkloadSpec
from autotune.supervision import (
    Faulted,
    Finished,
    Measured,
    MeasureSpeed,
    RunTrial,
    exit_at_once,
    reporter,
)
from autotune.worker._protocol import Ready, StartFailed, Warmed

if TYPE_CHECKING:
    from autotune.executor import InProcessExecutor


def parent_start_method() -> str:
    """How this process starts child processes (fork on Linux up to Python 3.13)."""
    return (
        multiprocessing.get_start_method(allow_none=True)
        or multiprocessing.get_context().get_start_method()
    )


def worker_main(
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
    die_with_parent(signal.SIGKILL)  # with the study process, even when it is SIGKILLed
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the study process decides what to stop
    tally = PrintTally()
    if not verbose:  # the user's prints would scroll the study's display away: counted instead
        sys.stdout = tally
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        _quiet_compiler()

    # torch and the training code: imported here, in the worker, so that the study process
    # starts it before importing them itself (``WorkerExecutor.launch``)
    from autotune import workloads
    from autotune.distributed import WorkloadSource
    from autotune.executor import InProcessExecutor

    try:
        workload = workloads.load(workload_spec, base_dir, score)
    except Exception as error:  # reported to the study process, which says it in one line
        connection.send(StartFailed(f"the worker could not load the workload: {error}"))
        return
    connection.send(Ready())
    source = WorkloadSource(workload_spec, base_dir, score)
    executor = InProcessExecutor(
        workload, source=source, on_warmed=lambda: connection.send(Warmed())
    )
    try:
        _serve(connection, executor, tally)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the study process left mid-request (it gave up on its database, or was killed)
    finally:
        executor.close()
    exit_at_once()  # (torch's interpreter shutdown is seconds the parent waits for)


# Inductor's switches for its autotuning reports (kernels shown per operation; statistics)
_INDUCTOR_REPORTS = (
    "TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED",
    "TORCHINDUCTOR_MAX_AUTOTUNE_REPORT_CHOICES_STATS",
)


def _quiet_compiler() -> None:
    """Keep Inductor's own reports off the user's terminal: max-autotune writes a table of
    every kernel it benchmarked, and its statistics, to stderr at each tuned operation, and it
    warns that fp32 leaves TF32 off (as the configuration asked) and of its own deprecated
    calls. What a trial measured is said by autotune; ``--verbose`` keeps all of it. Read by
    Inductor's config at its import, which comes later in this process and in its compile
    workers. A user who set either variable gets Inductor's reports as set."""
    warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores for float32")
    warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
    if any(name in os.environ for name in _INDUCTOR_REPORTS):
        return
    for name in _INDUCTOR_REPORTS:
        os.environ[name] = "0"
    config = sys.modules.get("torch._inductor.config")  # imported already: set it there
    if config is not None:
        config.autotune_num_choices_displayed = 0  # type: ignore[attr-defined]
        config.max_autotune_report_choices_stats = False  # type: ignore[attr-defined]


class PrintTally(io.TextIOBase):
    """The worker's sys.stdout (without ``--verbose``): what the user's code prints is counted
    in lines, the first of them kept, and nothing written to the study's terminal."""

    def __init__(self) -> None:
        self.lines = 0
        self.first: str | None = None
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *whole, self._partial = (self._partial + text).split("\n")
        self.lines += len(whole)
        if whole and self.first is None:
            self.first = whole[0][:200]
        return len(text)

    def taken(self) -> tuple[int, str | None]:
        """(lines, the first) since the previous call; counting starts again."""
        taken = (self.lines + bool(self._partial), self.first or self._partial[:200] or None)
        self.lines, self.first, self._partial = 0, None, ""
        return taken


def _serve(connection: Connection, executor: InProcessExecutor, tally: PrintTally) -> None:
    """The worker's loop: one request (a trial, a speed measurement) after another, each
    answered when the process has paid its one-time costs for it (``Warmed``, from
    ``executor``), then with its outcome."""
    watch = MemoryWatch()  # device memory back after each request, or a fresh process
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return  # the study process is gone
        if not isinstance(message, RunTrial | MeasureSpeed):  # Exit
            return
        config = message.config
        tally.taken()  # what was printed before this request is not its
        try:
            if isinstance(message, MeasureSpeed):
                measured = executor.measure(config, message.plan)
            else:
                result = executor.train(config, reporter(connection))
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
        # the executor emptied the CUDA cache: memory that did not come back is a leak, and
        # the next trial gets a fresh process instead
        left = watch.left_after(config.device)
        if isinstance(message, MeasureSpeed):
            connection.send(Measured(measured, needs_fresh_process=left is not None))
        else:
            lines, first = tally.taken()
            result = dataclasses.replace(
                result, memory_left_bytes=left, printed_lines=lines, first_printed=first
            )
            connection.send(Finished(result, needs_fresh_process=left is not None))
        if left is not None:
            return
