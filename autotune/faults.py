"""Why a trial did not complete: exceptions classified into named fault kinds.

Every trial that does not complete is stored with ``fail_kind`` (one of ``KINDS``) and a one-line
``fail_msg``. Configuration faults (the configuration cannot train here: out of memory, a loss that
is not finite, a compile that fails) are recorded so the sampler learns to avoid them; ``error`` is
anything unrecognised, most likely a bug in the workload's code.
"""

from __future__ import annotations

import gc

import torch

__all__ = ["CONFIGURATION_FAULTS", "KINDS", "TrialFault", "classify", "release_memory"]

KINDS = {
    "pruned": "stopped early by the pruner: it was behind other trials at the same point",
    "oom": "ran out of memory at this batch size, precision and compile mode",
    "nonfinite_loss": "the training loss became NaN or infinite (learning rate too high?)",
    "compile_error": "torch.compile failed for this model and mode",
    "invalid_config": "the configuration cannot run on this workload (e.g. batch > data set)",
    "dataloader_worker_died": "a DataLoader worker process died",
    "dataloader_timeout": "a DataLoader worker did not deliver a batch in time",
    "error": "an unexpected exception, most likely a bug in the model or data code",
}

# Faults caused by the configuration, not by a bug: the trial is PRUNED with a violated
# constraint, which the sampler learns from; a bare FAIL would be ignored by TPE.
CONFIGURATION_FAULTS = frozenset(
    {"oom", "nonfinite_loss", "compile_error", "invalid_config", "dataloader_timeout"}
)


class TrialFault(Exception):
    """A trial cannot go on, for a reason of a named kind (see ``KINDS``)."""

    def __init__(self, kind: str, message: str) -> None:
        assert kind in KINDS, kind
        super().__init__(message)
        self.kind = kind
        self.message = message


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


def release_memory() -> None:
    """Free what a failed trial left behind: unreachable tensors, then the CUDA cache."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
