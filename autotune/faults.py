"""Why a trial did not complete: exceptions classified into named fault kinds.

Every trial that does not complete is stored with ``fail_kind`` (a ``FaultKind``) and a one-line
``fail_msg``. Configuration faults (this configuration cannot train here: out of memory, a loss
that is not finite, a compile that fails, a worker that hangs or dies) are recorded as PRUNED with
a violated constraint so the sampler learns to avoid them; a bare FAIL would be ignored by TPE.
``error`` is anything unrecognised, most likely a bug in the workload's code; ``interrupted`` is
the user stopping the study.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import sysconfig
import traceback
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path


class FaultKind(StrEnum):
    """Why a trial did not complete; stored as the trial's ``fail_kind`` attribute (its value)."""

    PRUNED = "pruned"  # stopped early by the pruner: behind other trials at the same point
    # stopped early: even a perfect score at the pace it trained could not beat the best answer
    CANNOT_WIN = "cannot_win"
    OOM = "oom"  # ran out of memory at this batch size, precision and compile mode
    NONFINITE_LOSS = "nonfinite_loss"  # the loss became NaN or infinite, or fp16 grads overflowed
    DIVERGED = "diverged"  # the training loss rose far above the lowest it had reached
    COMPILE_ERROR = "compile_error"  # torch.compile failed for this model and mode
    INVALID_CONFIG = "invalid_config"  # cannot run on this workload (batch > data set)
    DATALOADER_WORKER_DIED = "dataloader_worker_died"  # killed, or out of memory
    DATALOADER_TIMEOUT = "dataloader_timeout"  # a worker delivered no batch within the timeout
    TRIAL_TIMEOUT = "trial_timeout"  # past study.trial_timeout; its processes were killed
    # the same while other processes took its cores: the machine was busy, which says nothing of
    # the configuration
    TIMEOUT_UNDER_LOAD = "timeout_under_load"
    WORKER_CRASHED = "worker_crashed"  # the process running the trial died (a crash or a signal)
    # the process running the trial was killed by another (an operator, a scheduler): it says
    # nothing of the configuration
    KILLED = "killed"
    INTERRUPTED = "interrupted"  # the study was stopped (Ctrl-C, SIGTERM, its process was lost)
    ERROR = "error"  # an unexpected exception, most likely a bug in the model or data code

    @property
    def is_configuration_fault(self) -> bool:
        """Whether the configuration itself cannot train here (see the module's docstring)."""
        return self in CONFIGURATION_FAULTS


CONFIGURATION_FAULTS = frozenset(
    {
        FaultKind.OOM,
        FaultKind.NONFINITE_LOSS,
        FaultKind.DIVERGED,
        FaultKind.COMPILE_ERROR,
        FaultKind.INVALID_CONFIG,
        FaultKind.DATALOADER_WORKER_DIED,
        FaultKind.DATALOADER_TIMEOUT,
        FaultKind.TRIAL_TIMEOUT,
        FaultKind.WORKER_CRASHED,
    }
)


class TrialFault(Exception):
    """A trial cannot go on, for a reason of a named kind; ``details`` carries a traceback
    when the fault came from another process."""

    def __init__(self, kind: FaultKind | str, message: str, details: str = "") -> None:
        super().__init__(message)
        self.kind = FaultKind(kind)  # ValueError for a kind that does not exist
        self.message = message
        self.details = details


def _first_line(text: str) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= 300 else line[:297] + "..."


def _is_compile_error(error: BaseException) -> bool:
    module = type(error).__module__
    return module.startswith(("torch._dynamo", "torch._inductor")) or type(error).__name__ in {
        "BackendCompilerFailed",
        "InductorError",
    }


def _is_broken_worker_pipe(error: BaseException) -> bool:
    """A pipe error raised inside the DataLoader: a worker died while its batch was read (torch
    names the dead worker only when its own check runs first; otherwise the read fails)."""
    if not isinstance(error, ConnectionError | EOFError):
        return False
    frames = traceback.extract_tb(error.__traceback__)
    return any("torch/utils/data/" in frame.filename.replace("\\", "/") for frame in frames)


# what an error says when the device ran out of memory (CUDA libraries that cannot allocate
# their workspace say it by name)
_OUT_OF_MEMORY = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")
# failures that out of memory causes among others: counted as such only when the device is
# nearly full (a cuDNN plan that found no workspace; a CUDA-graph capture an allocation broke)
_UNDER_PRESSURE = (
    "CUDNN_STATUS_INTERNAL_ERROR",
    "CUDNN_STATUS_EXECUTION_FAILED",
    "CUDNN_STATUS_NOT_SUPPORTED",
    "CUDNN_STATUS_BAD_PARAM",
    "capture invalidated",
    "operation not permitted when stream is capturing",
)
NEARLY_FULL = 0.9  # share of the device's memory in use above which it is nearly full


def _memory_pressure() -> bool:
    """Whether the current CUDA device has less than ``1 - NEARLY_FULL`` of its memory free
    (False without CUDA, or when it cannot be asked)."""
    import torch

    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return False
        free, total = torch.cuda.mem_get_info()
    except Exception:  # a broken context: not a question it can answer
        return False
    return total > 0 and free < (1 - NEARLY_FULL) * total


def wrapped(error: BaseException) -> Iterator[BaseException]:
    """``error`` and everything it wraps (causes, contexts, SQLAlchemy's ``.orig``), each once."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)
        pending += [current.__cause__, current.__context__]
        pending.append(orig if isinstance(orig, BaseException) else None)


def _out_of_memory(error: BaseException) -> bool:
    """Whether ``error``, or an error it ``wrapped``, says the device ran out of memory."""
    import torch

    for current in wrapped(error):
        if isinstance(current, torch.OutOfMemoryError | MemoryError):
            return True
        if any(phrase in str(current) for phrase in _OUT_OF_MEMORY):
            return True
    text = str(error)
    return any(name in text for name in _UNDER_PRESSURE) and _memory_pressure()


def classify(error: BaseException) -> tuple[FaultKind, str]:
    """(fail kind, one-line message) for an exception raised while training a trial."""
    if isinstance(error, TrialFault):
        return error.kind, error.message
    text = str(error)
    if _out_of_memory(error):
        return FaultKind.OOM, _first_line(text) or type(error).__name__
    if _is_compile_error(error):
        return FaultKind.COMPILE_ERROR, f"{type(error).__name__}: {_first_line(text)}"
    if "DataLoader worker" in text and ("killed" in text or "exited unexpectedly" in text):
        return FaultKind.DATALOADER_WORKER_DIED, _first_line(text)
    if _is_broken_worker_pipe(error):
        return (
            FaultKind.DATALOADER_WORKER_DIED,
            f"a DataLoader worker exited unexpectedly ({type(error).__name__} on its pipe)",
        )
    if "DataLoader timed out" in text:
        return FaultKind.DATALOADER_TIMEOUT, _first_line(text)
    return FaultKind.ERROR, f"{type(error).__name__}: {_first_line(text)}"


def as_fault(error: BaseException) -> TrialFault:
    """``error`` as the TrialFault it stands for, classified once, where it happened: a
    TrialFault as it is; anything else with its kind, its one-line message and, in ``details``,
    the traceback being handled (call it inside the ``except`` block). An unexpected error's
    message ends with where the user's own code raised it (``user_frame``)."""
    if isinstance(error, TrialFault):
        return error
    kind, message = classify(error)
    details = traceback.format_exc()[-4000:]
    where = user_frame(details) if kind == FaultKind.ERROR else None
    return TrialFault(kind, f"{message} (at {where})" if where else message, details)


_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)', re.M)
_NOT_USERS = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,  # autotune itself
    sysconfig.get_paths()["stdlib"] + os.sep,
    sysconfig.get_paths()["purelib"] + os.sep,  # torch, torchvision, the user's dependencies
    sysconfig.get_paths()["platlib"] + os.sep,
)


def user_frame(details: str) -> str | None:
    """Where in the user's own code a traceback's error was raised: ``my_model.py:42 in
    forward`` (relative to the working directory when under it), the deepest frame outside
    autotune, Python and installed packages; None when there is none (autotune's own error, or
    a library's called from autotune)."""
    found = None
    for frame in _FRAME.finditer(details):
        path = os.path.abspath(frame["path"])
        if path.startswith(_NOT_USERS) or frame["path"].startswith("<"):
            continue
        shown = os.path.relpath(path) if path.startswith(os.getcwd() + os.sep) else path
        found = f"{shown}:{frame['line']} in {frame['name']}"
    return found


def needs_fresh_process(error: BaseException) -> bool:
    """Whether the process that raised ``error`` should not run another trial: a CUDA error (an
    illegal memory access, a device-side assert) leaves the CUDA context unusable, and only a
    new process gets a working device back."""
    return type(error).__name__ == "AcceleratorError" or "CUDA error" in str(error)


def describe_exit(exitcode: int | None) -> str:
    """'signal 9 (SIGKILL)' or 'exit status 3' for a process's exit code."""
    if exitcode is None:
        return "an unknown status"
    if exitcode < 0:
        try:
            return f"signal {-exitcode} ({signal.Signals(-exitcode).name})"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit status {exitcode}"


# signals another process sends to stop one (a crash raises SIGSEGV, SIGABRT, SIGBUS, ...)
STOPPING_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (/proc/vmstat; None
    where it cannot be read)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    return None


def worker_died(exitcode: int | None, oom_kills_before: int | None) -> TrialFault:
    """The fault of a worker that died during a trial, ``oom_kills()`` read as it started: a
    stopping signal while the OOM killer killed nobody came from another process (KILLED: not
    the configuration's doing, not taught to the sampler); the OOM killer's is OOM; any other
    death is a crash of the trial's own (a segfault, an abort)."""
    how = describe_exit(exitcode)
    stopped = exitcode is not None and exitcode < 0 and -exitcode in STOPPING_SIGNALS
    if not stopped:
        return TrialFault(
            FaultKind.WORKER_CRASHED, f"the worker process died during the trial ({how})"
        )
    after = oom_kills()
    if after is not None and oom_kills_before is not None and after > oom_kills_before:
        return TrialFault(
            FaultKind.OOM,
            f"the kernel's OOM killer killed the worker process during the trial ({how}): "
            f"the machine's memory ran out",
        )
    return TrialFault(
        FaultKind.KILLED,
        f"the worker process was killed from outside during the trial ({how}): not the "
        f"configuration's doing, so not counted and not learnt from",
    )


# device memory a trial may leave allocated beyond the worker's first trial before the worker
# is replaced: compile caches and cuBLAS workspaces stay a little; a leak grows trial by trial
LEAK_BYTES = 256 * 2**20


def device_memory_in_use(device: str) -> int | None:
    """Bytes of device memory tensors hold on ``device`` now (CUDA's caching allocator,
    released blocks excluded); None on a device without such a count (the CPU)."""
    if not device.startswith("cuda"):
        return None
    import torch

    return int(torch.cuda.memory_allocated(torch.device(device)))


class MemoryWatch:
    """Whether a long-lived worker gets its device memory back after each trial or
    measurement. The first one sets the baseline (what warm caches and workspaces hold once);
    after each later one, more than ``LEAK_BYTES`` beyond it is a leak (a compile cache, a
    CUDA-graph pool or a tensor kept alive), which the worker must not carry into the next
    trial: it would cut that trial's memory and set a false memory wall."""

    def __init__(self) -> None:
        self.baseline: int | None = None

    def left_after(self, device: str) -> int | None:
        """Called after ``release_memory()``: the bytes held beyond the baseline when they
        exceed LEAK_BYTES (the worker should be replaced), else None."""
        in_use = device_memory_in_use(device)
        if in_use is None:
            return None
        if self.baseline is None:
            self.baseline = in_use
            return None
        left = in_use - self.baseline
        return left if left > LEAK_BYTES else None


def release_memory() -> None:
    """Free what a failed trial left behind: unreachable tensors, then the CUDA cache."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
