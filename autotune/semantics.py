"""What training under a configuration means, in plain torch: the optimizer, the learning-rate
schedule, the CUDA backend flags and the autocast of a precision, how micro-batches become
optimizer steps (GradScaler, accumulation, DDP's gradient averaging), and how a model is scored
on the validation split.

One source for the trials and the exported script: ``trainer`` and ``evaluation`` build on these
functions, and ``export`` pastes them into every training script (``export/_bundle``), where
they are called with the script's constants. So this module imports nothing of autotune, takes
plain values, and reads top to bottom as a script's own code would.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # compile modes that record CUDA graphs
IGNORE_INDEX = -100  # a target element of this value is padding: neither trained on nor scored
TOP_K = 5  # score top5: right when the target is among this many highest logits
MAX_LOG_PERPLEXITY = 700.0  # exp() of more overflows a float


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
        sgd = torch.optim.SGD(
            parameters,
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            weight_decay=weight_decay,
            fused=implementation,
        )
        # fused SGD gives a first step that GradScaler skips (an fp16 overflow, routine in the
        # first steps) momentum buffers it never writes, uninitialised, which the next step
        # applies: zeros instead make the first applied step's momentum its gradient, as unfused
        if fused and momentum:
            for parameter in sgd.param_groups[0]["params"]:
                sgd.state[parameter]["momentum_buffer"] = torch.zeros_like(parameter)
        return sgd
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


def cuda_flags(precision: str) -> tuple[str, bool]:
    """What a precision sets on CUDA: (``torch.set_float32_matmul_precision``'s value, whether
    cuDNN convolutions run in TF32). TF32 matmuls only under "tf32"; TF32 convolutions,
    PyTorch's default, unless "fp32-strict"."""
    return ("high" if precision == "tf32" else "highest"), precision != "fp32-strict"


def set_cuda_flags(precision: str, cudnn_benchmark: bool) -> None:
    """The process-wide CUDA settings of a precision (``cuda_flags``) and cuDNN autotuning as
    asked.

    "fp32" is what a script that sets no flag gets. TF32 goes through
    ``torch.set_float32_matmul_precision`` and ``cudnn.allow_tf32``, which torch 2.11 to 2.14
    read consistently (the per-backend ``fp32_precision`` attributes make
    ``torch.get_float32_matmul_precision()`` raise, and Inductor calls it while compiling).
    """
    matmul_precision, conv_tf32 = cuda_flags(precision)
    torch.set_float32_matmul_precision(matmul_precision)
    torch.backends.cudnn.allow_tf32 = conv_tf32
    torch.backends.cudnn.benchmark = cudnn_benchmark


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype the forward passes autocast to: bfloat16 under "bf16", float16 under "fp16";
    None under the fp32 precisions (fp32, fp32-strict, tf32), whose float32 math the CUDA
    flags set."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def scales_loss(precision: str) -> bool:
    """Whether training under ``precision`` scales the loss (GradScaler): float16's narrow
    range would flush small gradients to zero unless the loss is scaled up first."""
    return precision == "fp16"


def autocast(precision: str, device_type: str) -> contextlib.AbstractContextManager[Any]:
    """The forward passes' precision, in training and evaluation alike (``autocast_dtype``)."""
    dtype = autocast_dtype(precision)
    return torch.autocast(device_type, dtype=dtype) if dtype else contextlib.nullcontext()


def keep_grads_outside_graphs(model: nn.Module) -> None:
    """Allocate every trainable parameter's gradient now, zeroed. Under CUDA graphs (the
    compile modes "reduce-overhead" and "max-autotune" on a GPU) a gradient autograd takes as
    ``.grad`` without copying lives in the graph's memory pool, and the next replay (the next
    micro-batch of an accumulation) overwrites it; a gradient that exists before the first
    backward is accumulated into instead, outside the pool, and is then zeroed in place
    (``TrainingSteps(grads_in_place=True)``)."""
    for parameter in model.parameters():
        if parameter.requires_grad and parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)


class TrainingSteps:
    """Micro-batches into optimizer steps, as every trial and every exported script trains.

    ``train(loss_of, *args)`` trains one micro-batch: ``loss_of(*args)`` (the forward pass and
    the loss) under the precision's autocast, then the backward of the loss divided by
    ``accumulation_steps`` (scaled by GradScaler under fp16). Under DDP (``ddp``) the gradients
    are averaged over the processes at the last micro-batch of a step only, ``no_sync`` before
    it: the sum of the step's gradients is all the step needs. Under ``static_graph`` every
    micro-batch averages them (DDP's reducer cannot skip one in torch 2.11 to 2.14): the same
    gradients at more traffic. After a step's last micro-batch comes the optimizer step
    (GradScaler's under fp16: skipped when the gradients overflowed), the gradients are zeroed
    (in place with ``grads_in_place``, see ``keep_grads_outside_graphs``) and the schedule
    advances, for ``total_steps`` steps; then it has ended and the rate stays.

    Nothing here reads the device: ``train`` returns the micro-batch's loss, detached, where it
    was computed.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        precision: str,
        device_type: str,
        accumulation_steps: int = 1,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        total_steps: int = 0,
        ddp: nn.parallel.DistributedDataParallel | None = None,
        grads_in_place: bool = False,
    ) -> None:
        self.optimizer = optimizer
        self.precision = precision
        self.device_type = device_type
        self.accumulation_steps = accumulation_steps
        self.scheduler = scheduler
        self.total_steps = total_steps
        self.ddp = ddp
        self.grads_in_place = grads_in_place
        self.scaler = torch.amp.GradScaler(device_type, enabled=precision == "fp16")
        self.micro_batches = 0  # trained so far
        self.steps = 0  # optimizer steps so far (under fp16, skipped ones included)

    def train(self, loss_of: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
        """One micro-batch, and the optimizer step when it is its step's last; its loss."""
        loss = self.forward_backward(loss_of, *args)
        if self.micro_batches % self.accumulation_steps == 0:
            self.step()
        return loss

    def forward_backward(self, loss_of: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
        """One micro-batch's forward pass, loss and backward, without the optimizer step."""
        accumulation = self.accumulation_steps
        ddp = self.ddp
        last = (self.micro_batches + 1) % accumulation == 0
        deferred = ddp is not None and not last and not ddp.static_graph
        with ddp.no_sync() if deferred else contextlib.nullcontext():  # type: ignore[union-attr]
            with autocast(self.precision, self.device_type):
                loss = loss_of(*args)
            self.scaler.scale(loss / accumulation if accumulation > 1 else loss).backward()
        self.micro_batches += 1
        return loss.detach()

    def step(self) -> None:
        """Apply the accumulated gradients, zero them, advance the schedule."""
        self.scaler.step(self.optimizer)  # fp16 + fused: the overflow check stays on the device
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=not self.grads_in_place)
        if self.scheduler is not None and self.scheduler.last_epoch < self.total_steps:
            self.scheduler.step()
        self.steps += 1


def logits_of(output: Any) -> torch.Tensor:
    """The logits in a model's output: the output itself, its ``logits`` entry (a dict), or its
    ``.logits`` (a Hugging Face ``ModelOutput``); TypeError saying what the output is otherwise."""
    if isinstance(output, torch.Tensor):
        return output
    logits = (
        output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    )
    if not isinstance(logits, torch.Tensor):
        raise TypeError(
            f"the model returned {type(output).__name__} without a tensor of logits (a "
            f"tensor, or a 'logits' entry or attribute)"
        )
    return logits


def classification_sums(
    logits: torch.Tensor, targets: torch.Tensor, top_k: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(right predictions, summed cross-entropy in nats, scored target elements) of one batch,
    as device tensors: adding them up over batches reads nothing back from the device. A
    prediction is right when the target is among the ``top_k`` highest logits; the classes are
    in dimension 1 of ``logits``."""
    scored = targets != IGNORE_INDEX
    if top_k == 1:
        hits = logits.argmax(dim=1) == targets
    else:
        best = logits.topk(min(top_k, logits.shape[1]), dim=1).indices
        hits = (best == targets.unsqueeze(1)).any(dim=1)
    right = (hits & scored).sum()
    loss = nn.functional.cross_entropy(
        logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return right, loss, scored.sum()


@torch.no_grad()
def validation_sums(
    model: nn.Module,
    batches: Iterable[Any],
    forward: Callable[[nn.Module, Any, torch.device], tuple[Any, torch.Tensor]],
    precision: str,
    device: torch.device,
    top_k: int = 1,
    classes_last: bool = False,
) -> tuple[float, float, float]:
    """(right predictions, summed cross-entropy in nats, scored target elements) of ``model``
    over ``batches``, in eval mode and without gradients: ``forward(model, batch, device)``
    gives the model's output and the batch's target on the device, under the precision's
    autocast as in training. The logits are the output or its "logits"; ``classes_last``: their
    classes are in the last dimension (``[batch, *d, classes]``). Summed on the device and read
    back once, at the end."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    try:
        for batch in batches:
            with autocast(precision, device.type):
                output, targets = forward(model, batch, device)
            logits = logits_of(output)
            if classes_last:
                logits = logits.movedim(-1, 1)
            sums += torch.stack(classification_sums(logits, targets, top_k)).double()
    finally:
        model.train()
    right, loss_sum, scored = sums.tolist()
    return right, loss_sum, scored


def builtin_score(name: str, right: float, loss_sum: float, scored: float) -> float:
    """A built-in score from the sums of ``classification_sums`` over the validation split:
    accuracy or top5 (right / scored), val_loss (nats per target element), perplexity."""
    if name in ("accuracy", "top5"):
        return right / scored
    if name == "val_loss":
        return loss_sum / scored
    if name == "perplexity":
        return math.exp(min(loss_sum / scored, MAX_LOG_PERPLEXITY))
    raise ValueError(f"no built-in score {name!r}")
