"""Why a trial did not complete: exceptions classified into named fault kinds.

Every trial that does not complete is stored with ``fail_kind`` (one of ``KINDS``) and a one-line
``fail_msg``. Configuration faults (this configuration cannot train here: out of memory, a loss
that is not finite, a compile that fails, a worker that hangs or dies) are recorded as PRUNED with
a violated constraint so the sampler learns to avoid them; a bare FAIL would be ignored by TPE.
``error`` is anything unrecognised, most likely a bug in the workload's code; ``interrupted`` is
the user stopping the study.
"""

from __future__ import annotations

import gc
import signal

import torch

__all__ = [
    "CONFIGURATION_FAULTS",
    "KINDS",
    "TrialFault",
    "classify",
    "describe_exit",
    "needs_fresh_process",
    "release_memory",
]

KINDS = {
    "pruned": "stopped early by the pruner: it was behind other trials at the same point",
    "oom": "ran out of memory at this batch size, precision and compile mode",
    "nonfinite_loss": "the loss became NaN or infinite, or fp16 gradients kept overflowing",
    "diverged": "the training loss rose far above the lowest it had reached",
    "compile_error": "torch.compile failed for this model and mode",
    "invalid_config": "the configuration cannot run on this workload (e.g. batch > data set)",
    "dataloader_worker_died": "a DataLoader worker process died (killed, or out of memory)",
    "dataloader_timeout": "a DataLoader worker did not deliver a batch within the timeout",
    "trial_timeout": "the trial ran past study.trial_timeout; its processes were killed",
    "worker_crashed": "the process running the trial died (a crash or a signal)",
    "interrupted": "the study was stopped (Ctrl-C, SIGTERM, or its process was lost)",
    "error": "an unexpected exception, most likely a bug in the model or data code",
}

CONFIGURATION_FAULTS = frozenset(
    {
        "oom",
        "nonfinite_loss",
        "diverged",
        "compile_error",
        "invalid_config",
        "dataloader_worker_died",
        "dataloader_timeout",
        "trial_timeout",
        "worker_crashed",
    }
)


class TrialFault(Exception):
    """A trial cannot go on, for a reason of a named kind (see ``KINDS``).

    ``details`` carries a traceback when the fault came from another process.
    """

    def __init__(self, kind: str, message: str, details: str = "") -> None:
        assert kind in KINDS, kind
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.details = details


def _first_line(text: str, limit: int = 300) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _is_compile_error(error: BaseException) -> bool:
    module = type(error).__module__
    return module.startswith(("torch._dynamo", "torch._inductor")) or type(error).__name__ in {
        "BackendCompilerFailed",
        "InductorError",
    }


def classify(error: BaseException) -> tuple[str, str]:
    """(fail kind, one-line message) for an exception raised while training a trial."""
    if isinstance(error, TrialFault):
        return error.kind, error.message
    text = str(error)
    if isinstance(error, torch.OutOfMemoryError | MemoryError) or "out of memory" in text:
        return "oom", _first_line(text) or type(error).__name__
    if _is_compile_error(error):
        return "compile_error", f"{type(error).__name__}: {_first_line(text)}"
    if "DataLoader worker" in text and ("killed" in text or "exited unexpectedly" in text):
        return "dataloader_worker_died", _first_line(text)
    if "DataLoader timed out" in text:
        return "dataloader_timeout", _first_line(text)
    return "error", f"{type(error).__name__}: {_first_line(text)}"


def needs_fresh_process(error: BaseException) -> bool:
    """Whether the process that raised ``error`` should not run another trial.

    A CUDA error (an illegal memory access, a device-side assert) leaves the CUDA context
    unusable; only a new process gets a working device back.
    """
    text = str(error)
    return type(error).__name__ == "AcceleratorError" or "CUDA error" in text


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


def release_memory() -> None:
    """Free what a failed trial left behind: unreachable tensors, then the CUDA cache."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
