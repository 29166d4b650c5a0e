"""What training under a configuration means, in plain torch: the optimizer, the learning-rate
schedule, and the CUDA backend flags of a precision.

One source for the trials and the exported script: ``trainer`` builds on these functions, and
``export`` pastes them into every training script (``export/_bundle``), where they are called
with the script's constants. So this module imports nothing of autotune, takes plain values,
and reads top to bottom as a script's own code would.
"""

from __future__ import annotations

import math

import torch

__all__ = ["lr_factor", "make_optimizer", "make_scheduler", "set_cuda_flags"]


def make_optimizer(
    model: torch.nn.Module,
    optimizer: str,
    lr: float,
    weight_decay: float,
    momentum: float = 0.0,
    nesterov: bool = False,
    fused: bool = False,
) -> torch.optim.Optimizer:
    """``model``'s optimizer: SGD with momentum (Nesterov if set) and L2 weight decay for
    ``optimizer`` "sgd"; AdamW (decoupled weight decay; ``momentum`` and ``nesterov`` unused)
    for "adamw". ``fused``: PyTorch's fused implementation (one kernel for every parameter),
    which under fp16 takes GradScaler's overflow check on the device: its steps then never
    wait for the GPU (the unfused step reads the check back, a synchronization each step)."""
    parameters = model.parameters()
    implementation = True if fused else None  # None: PyTorch's default, foreach on a GPU
    if optimizer == "sgd":
        return torch.optim.SGD(
            parameters,
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            weight_decay=weight_decay,
            fused=implementation,
        )
    if optimizer == "adamw":
        return torch.optim.AdamW(
            parameters, lr=lr, weight_decay=weight_decay, fused=implementation
        )
    raise ValueError(f"unknown optimizer {optimizer!r}")


def lr_factor(step: int, total_steps: int, schedule: str, warmup_fraction: float) -> float:
    """The learning rate at optimizer step ``step`` (from 0) as a fraction of the full rate:
    a linear warm-up over ``warmup_fraction`` of the ``total_steps``, then "constant" holds the
    full rate and "cosine" decays it to zero."""
    warmup_steps = round(warmup_fraction * total_steps)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "cosine":
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return 1.0


def make_scheduler(
    optimizer: torch.optim.Optimizer, schedule: str, warmup_fraction: float, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The learning-rate schedule over ``total_steps`` optimizer steps, stepped once after
    each; None for a constant rate without warm-up.

    "onecycle" is PyTorch's OneCycleLR up to the optimizer's learning rate, rising for
    ``warmup_fraction`` of the steps (0.3 if zero); momentum is not cycled, so the optimizer's
    holds. "constant" and "cosine" follow ``lr_factor``.
    """
    if schedule == "onecycle" and total_steps >= 2:
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=optimizer.param_groups[0]["lr"],
            total_steps=total_steps,
            pct_start=warmup_fraction or 0.3,
            cycle_momentum=False,
        )
    if schedule == "constant" and warmup_fraction == 0:
        return None
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, schedule, warmup_fraction)
    )


def set_cuda_flags(precision: str, cudnn_benchmark: bool) -> None:
    """The process-wide CUDA settings of a precision: TF32 matmuls only under "tf32"; TF32
    convolutions, PyTorch's default, unless "fp32-strict"; cuDNN autotuning as asked.

    "fp32" is what a script that sets no flag gets. TF32 goes through
    ``torch.set_float32_matmul_precision`` and ``cudnn.allow_tf32``, which torch 2.11 to 2.14
    read consistently (the per-backend ``fp32_precision`` attributes make
    ``torch.get_float32_matmul_precision()`` raise, and Inductor calls it while compiling).
    """
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    torch.backends.cudnn.allow_tf32 = precision != "fp32-strict"
    torch.backends.cudnn.benchmark = cudnn_benchmark
