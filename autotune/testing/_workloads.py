"""Tiny workloads and their fault hooks: data sets, models and a ready Workload that train in
a fraction of a second on a CPU, each hook reproducing a real failure the way it happens in real
training (the real exception type, a real signal, a real sleep, a real broken compiler)."""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset, get_worker_info

from autotune.machine import ranks
from autotune.workloads import DataSplits, Workload


def blobs(
    n_train: int = 256,
    n_val: int = 128,
    n_features: int = 16,
    n_classes: int = 4,
    spread: float = 1.0,
    seed: int = 0,
    image: bool = False,
    val_delay_seconds: float = 0.0,
    train_delay_seconds: float = 0.0,
    kill_worker_at_item: int | None = None,
) -> DataSplits:
    """Gaussian clusters, one per class: learnable in a few steps, deterministic from ``seed``.

    ``image`` shapes each sample as a (1, s, s) image (``n_features`` must be a square) so that
    channels_last applies. Fault hooks: every validation (``val_delay_seconds``) or training
    (``train_delay_seconds``) sample takes that long to load; ``kill_worker_at_item`` makes a
    DataLoader worker process SIGKILL itself when it loads its k-th training sample.
    """
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(n_classes, n_features, generator=generator) * 3.0

    def draw(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.arange(count) % n_classes
        points = centers[labels] + spread * torch.randn(count, n_features, generator=generator)
        if image:
            side = math.isqrt(n_features)
            if side * side != n_features:
                raise ValueError(f"image=True needs a square n_features, got {n_features}")
            points = points.reshape(count, 1, side, side)
        return points, labels

    train: Dataset = TensorDataset(*draw(n_train))
    val: Dataset = TensorDataset(*draw(n_val))
    if train_delay_seconds > 0 or kill_worker_at_item is not None:
        train = FaultyDataset(train, train_delay_seconds, kill_worker_at_item)
    if val_delay_seconds > 0:
        val = FaultyDataset(val, val_delay_seconds)
    return DataSplits(train=train, val=val, num_classes=n_classes)


class FaultyDataset(Dataset):
    """Wraps a data set so that every item takes ``delay_seconds`` to load and, with
    ``kill_at_item``, a DataLoader worker SIGKILLs itself at its k-th item (in the main process,
    ``num_workers: 0``, it does not: the fault is the worker's)."""

    def __init__(
        self, inner: Dataset, delay_seconds: float = 0.0, kill_at_item: int | None = None
    ) -> None:
        self.inner, self.delay_seconds, self.kill_at_item = inner, delay_seconds, kill_at_item
        self.loaded = 0

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]  # map-style: sized

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kill_at_item is not None and get_worker_info() is not None:
            self.loaded += 1
            if self.loaded >= self.kill_at_item:
                os.kill(os.getpid(), signal.SIGKILL)
        if self.delay_seconds > 0:
            time.sleep(self.delay_seconds)
        return self.inner[index]


class _BlowUpGradient(torch.autograd.Function):
    """Identity forward; an infinite gradient backward (what an fp16 overflow produces)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


@dataclass(frozen=True)
class _FaultPlan:
    """tiny_mlp's fault hooks, counted in training forward passes; none set: no faults."""

    nan_after_steps: int | None = None  # the logits become NaN
    oom_at_batch: int | None = None  # torch.OutOfMemoryError for batches this large
    overflow_at_steps: tuple[int, ...] = ()  # infinite gradients, as an fp16 overflow
    hang_at_step: int | None = None  # sleep forever
    crash_at_step: int | None = None  # SIGSEGV
    step_delay_seconds: float = 0.0  # every step that slow
    # confident constant logits: a finite loss far above its lowest
    diverge_after_steps: int | None = None
    # the RuntimeError a broken CUDA context raises, for batches this large
    cuda_error_at_batch: int | None = None
    fault_rank: int | None = None  # the faults happen in that process of a distributed trial only
    hang_after_fault: bool = False  # after its out of memory, the process hangs in its cleanup

    def __post_init__(self) -> None:  # a space file gives a list
        object.__setattr__(self, "overflow_at_steps", tuple(self.overflow_at_steps))


class _Faults(nn.Module):
    """Passes logits through, injecting faults at given training forward passes (1-based)."""

    def __init__(self, plan: _FaultPlan) -> None:
        super().__init__()
        self.plan = plan
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        if not self.training or plan.fault_rank not in (None, ranks.rank()):
            return x
        self.calls += 1
        if plan.step_delay_seconds:
            time.sleep(plan.step_delay_seconds)
        if plan.oom_at_batch is not None and x.shape[0] >= plan.oom_at_batch:
            if plan.hang_after_fault:
                _hang_in_teardown()
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {x.shape[0] * 4} MiB (injected at batch "
                f"{x.shape[0]} >= {plan.oom_at_batch})"
            )
        if plan.hang_at_step is not None and self.calls >= plan.hang_at_step:
            while True:  # a deadlock, as far as anyone outside can tell
                time.sleep(3600)
        if plan.crash_at_step is not None and self.calls >= plan.crash_at_step:
            os.kill(os.getpid(), signal.SIGSEGV)  # what a crash in native code looks like
        if plan.cuda_error_at_batch is not None and x.shape[0] >= plan.cuda_error_at_batch:
            # the text torch gives an asynchronous kernel fault; the context is then unusable
            raise RuntimeError("CUDA error: an illegal memory access was encountered (injected)")
        if plan.diverge_after_steps is not None and self.calls > plan.diverge_after_steps:
            # confidently class 0, whatever the input: a loss of ~50 for every other class
            return 0 * x + torch.zeros_like(x).index_fill(1, torch.tensor([0]), 50.0)
        if plan.nan_after_steps is not None and self.calls > plan.nan_after_steps:
            return x * float("nan")
        if self.calls in plan.overflow_at_steps:
            return _BlowUpGradient.apply(x)
        return x


class _HangsWhenCollected:
    """Cyclic garbage whose finalizer never returns."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        while True:
            time.sleep(3600)


def _hang_in_teardown() -> None:
    """Make this process hang in the cleanup after its fault (the next ``gc.collect()``, which
    a failing rank runs before leaving its process group), as NCCL's teardown can hang."""
    gc.disable()  # collected where the cleanup collects, not by chance earlier
    _HangsWhenCollected()


def _break_the_compiler() -> None:
    """Point Inductor at a C++ compiler that does not exist, with its caches off."""
    import torch._inductor.config as inductor

    # a search list of one compiler; Inductor annotates the field narrower than it reads it
    inductor.cpp.cxx = ("/nonexistent/c++",)  # type: ignore[assignment]
    inductor.fx_graph_cache = False


def _hang_the_compiler() -> None:
    """Make every torch.compile in this process compile forever: Inductor runs a pass over
    each graph it compiles that never returns (its caches bypassed: the pass has no uuid)."""
    import torch._inductor.config as inductor
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class _Forever(CustomGraphPass):
        def __call__(self, graph: torch.fx.graph.Graph) -> None:
            while True:
                time.sleep(3600)

        def uuid(self) -> None:
            return None

    inductor.post_grad_custom_post_pass = _Forever()


def tiny_mlp(
    num_classes: int,
    input_shape: tuple[int, ...],
    hidden: int = 32,
    broken_compiler: bool = False,
    endless_compile: bool = False,
    **faults: Any,
) -> nn.Module:
    """Flatten, one hidden ReLU layer, a linear classifier; plus optional injected faults:
    ``faults`` are ``_FaultPlan``'s, ``broken_compiler``: torch.compile's C++ compiler is
    missing in this process; ``endless_compile``: a torch.compile in a worker process never
    finishes (the process that starts workers, which builds the model to check the workload,
    compiles as ever).
    """
    unknown = sorted(set(faults) - set(_FaultPlan.__dataclass_fields__))
    if unknown:  # the space file's model_args, in one line
        raise ValueError(f"tiny_mlp has no fault hook {', '.join(unknown)}")
    plan = _FaultPlan(**faults)
    if broken_compiler:
        _break_the_compiler()
    # (the hook is process-wide: set in a test's own process it would hang every later
    # compile of the test run)
    if endless_compile and multiprocessing.parent_process() is not None:
        _hang_the_compiler()
    layers: list[nn.Module] = [
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    ]
    if plan != _FaultPlan(fault_rank=plan.fault_rank, hang_after_fault=plan.hang_after_fault):
        layers.append(_Faults(plan))
    return nn.Sequential(*layers)


def tiny_cnn(
    num_classes: int,
    input_shape: tuple[int, ...],
    width: int = 16,
    one_logit_at_batch: int | None = None,
) -> nn.Module:
    """Two 3x3 convolutions, global average pooling and a linear classifier: small images fast.

    ``one_logit_at_batch``: training batches of that size get one logit per sample instead of
    ``num_classes``, so that every label past 0 indexes past the logits: a real kernel fault
    in the loss (a device-side assert on a GPU, which leaves its CUDA context unusable; an
    IndexError on a CPU)."""
    channels = input_shape[0]
    model = nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, num_classes),
    )
    if one_logit_at_batch is not None:

        def narrow(module: nn.Module, args: object, logits: torch.Tensor) -> torch.Tensor:
            if module.training and logits.shape[0] == one_logit_at_batch:
                return logits[:, :1]
            return logits

        model.register_forward_hook(narrow)
    return model


_LEAKED: list[torch.Tensor] = []  # leaky_cnn's device memory, alive for the process's life


def leaky_cnn(num_classes: int, input_shape: tuple[int, ...], leak_mib: int = 512) -> nn.Module:
    """tiny_cnn whose first training forward keeps ``leak_mib`` MiB of the device's memory
    alive for good, as a cache held by a global does: a leak across trials, for the worker's
    check that its device memory comes back after each."""
    model = tiny_cnn(num_classes, input_shape)
    leaked: list[bool] = []

    def leak(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        if module.training and not leaked:
            leaked.append(True)
            _LEAKED.append(torch.empty(leak_mib * 2**20, dtype=torch.uint8, device=args[0].device))

    model.register_forward_pre_hook(leak)
    return model


class _Broken(nn.Module):
    def __init__(self, message: str, features: int, classes: int) -> None:
        super().__init__()
        self.message = message
        self.head = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            raise ValueError(self.message)
        return self.head(x.flatten(1))


def broken_model(
    num_classes: int, input_shape: tuple[int, ...], message: str = "a bug in forward"
) -> nn.Module:
    """A model whose forward raises ValueError(message) in training mode: a bug, not a
    configuration, and one the check before the study (an eval-mode forward) does not see, as a
    bug in a training-only branch (dropout, an auxiliary loss) would not be."""
    return _Broken(message, math.prod(input_shape), num_classes)


def blobs_workload(keep: list[nn.Module] | None = None, **data_args: Any) -> Workload:
    """The blobs data with tiny_mlp as a loaded Workload; every model built is appended to
    ``keep``, for tests that inspect them."""
    splits = blobs(**data_args)
    shape = tuple(splits.train[0][0].shape)
    num_classes = splits.num_classes
    assert num_classes is not None  # blobs says how many

    def build() -> nn.Module:
        model = tiny_mlp(num_classes=num_classes, input_shape=shape)
        if keep is not None:
            keep.append(model)
        return model

    return Workload("tiny_mlp on blobs", splits.train, splits.val, num_classes, shape, build)
