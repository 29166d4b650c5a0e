"""What a trial measures, as plain frozen data that crosses module and process boundaries.

The training loop (``runner``) produces these; the worker process pickles them to the study
process; the objective scores them and the study records them. Nothing here imports torch or
Optuna.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# the phases of a training step, in order: the keys of TrialResult.time_breakdown (timing.py
# measures them; the note and the report read them without importing torch)
PHASES = ("data_wait", "host_to_device", "forward_backward", "optimizer")


@dataclass(frozen=True)
class Evaluation:
    """One validation pass during a trial, with the training measured up to it."""

    index: int  # 1-based; the pruner's step
    epoch: float  # epochs of training data consumed
    optimizer_steps: int
    samples_seen: int
    score: float  # the validation score (objective.score: accuracy, 0..1, by default)
    val_loss: float | None  # mean validation cross-entropy; None when the user's score is kept
    train_loss: float  # mean training loss since the previous evaluation
    train_seconds: float  # training wall-clock so far, evaluation excluded
    overhead_seconds: float  # one-time costs within train_seconds (0 until steady state is seen)
    eval_seconds: float  # this evaluation's own wall-clock (not training time)
    final: bool  # the trial's last planned evaluation: its budget is spent


Reporter = Callable[[Evaluation], bool]  # returns True to stop the trial after this evaluation


@dataclass(frozen=True)
class TrialResult:
    """What one trial measured."""

    evaluations: tuple[Evaluation, ...]
    score: float  # the validation score at the last evaluation
    train_seconds: float  # all training wall-clock, evaluation excluded
    overhead_seconds: float  # one-time share of train_seconds (warm-up beyond steady state)
    warmup_seconds: float  # wall-clock of the warm-up window
    samples_per_second: float  # steady state (after the warm-up window)
    samples_seen: int
    optimizer_steps: int
    effective_batch_size: int
    peak_memory_bytes: int  # CUDA: max allocated on the device; CPU: the trial's peak RSS
    compiled_graphs: int  # graphs torch.compile produced (0 for eager)
    loss_scale: float | None  # final GradScaler scale under fp16, else None
    skipped_steps: int  # optimizer steps GradScaler skipped for overflowing fp16 gradients
    time_breakdown: dict[str, float] | None  # seconds per phase over a sampled window of steps
    compile_seconds: float | None  # torch.compile's own time (None when not compiling)
    flops_per_sample: float | None  # FLOPs of a training step per sample (flop_counter)
    gpu: dict[str, float]  # NVML: gpu_utilization (0..1), gpu_memory_used_bytes; {} on CPU
    device_name: str
    torch_version: str
    intra_op_threads: int = 0  # torch's intra-op threads while it trained (0: not recorded)
    # token inputs: samples_per_second times the tokens per sample trained on (padding excluded)
    tokens_per_second: float | None = None
    # the share of its cores' time other processes took while it trained (see interference);
    # None where it cannot be read
    other_cpu_share: float | None = None
    # processes that trained it together (DDP ranks); its rates are theirs together, its
    # memory peak and FLOPs per sample those of rank 0
    world_size: int = 1
    # device memory (bytes) still allocated in its worker after it ended and its memory was
    # released, beyond what the worker held after its first trial: a leak, which the worker
    # does not carry into the next trial (it exits; a fresh one trains next). None: none
    memory_left_bytes: int | None = None
    # lines the user's code printed while it trained, not shown (``--verbose`` shows them);
    # the first of them
    printed_lines: int = 0
    first_printed: str | None = None


@dataclass(frozen=True)
class Plan:
    """How a trial's steps are laid out."""

    micro_batches_per_epoch: int
    optimizer_steps: int  # in the whole trial
    eval_steps: tuple[int, ...]  # evaluate after these optimizer steps (the last is the end)
    warmup_steps: int  # optimizer steps in the warm-up window
