"""A model under a TrialConfig: placed, compiled, wrapped in DDP, and trained as ``semantics``
says (the optimizer, its schedule, the backend flags, autocast, GradScaler, accumulation).
Trials use it (``runner``), and so can users, through ``autotune.load_best``.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from autotune import semantics
from autotune.config import TrialConfig
from autotune.machine.ranks import world_size
from autotune.semantics import CUDA_GRAPH_MODES
from autotune.workloads.batches import (
    BatchError,
    BatchLayout,
    LayoutError,
    ModelInputs,
    call_model,
    to_device,
)
from autotune.workloads.scoring import LossFn, cross_entropy_loss

if TYPE_CHECKING:
    from autotune.spacefile import WorkloadSpec


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), Python and NumPy."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def _matmul_precision() -> tuple[str, str]:
    """How fp32 matmuls are set now: ("legacy", highest|high|medium), or ("backend", ieee|tf32)
    where earlier code (the user's, Lightning) used the per-backend ``fp32_precision`` API,
    after which ``torch.get_float32_matmul_precision()`` raises."""
    try:
        return "legacy", torch.get_float32_matmul_precision()
    except RuntimeError:
        return "backend", torch.backends.cuda.matmul.fp32_precision


def set_backend_flags(config: TrialConfig) -> tuple[tuple[str, str], bool, bool]:
    """Set TF32 and cudnn.benchmark as ``config`` says (``semantics.set_cuda_flags``); return
    the previous values, to be put back afterwards."""
    cudnn = torch.backends.cudnn
    previous = (_matmul_precision(), cudnn.allow_tf32, cudnn.benchmark)
    semantics.set_cuda_flags(config.precision, config.cudnn_benchmark)
    return previous


def cudnn_plans_differ(previous: TrialConfig, config: TrialConfig) -> bool:
    """Whether ``config`` must run in a process that has not run ``previous`` to be timed
    honestly: cuDNN's plan cache outlives a run and its key leaves out ``cudnn.benchmark``, so
    a CUDA run with it on after one with it off would reuse the heuristic's plans (and off
    after on, the benchmarked ones)."""
    on_cuda = previous.device.startswith("cuda") and config.device.startswith("cuda")
    return on_cuda and previous.cudnn_benchmark != config.cudnn_benchmark


@contextlib.contextmanager
def backend_flags(config: TrialConfig) -> Iterator[None]:
    """TF32 and cudnn.benchmark as ``config`` says (CUDA only), restored afterwards."""
    if not config.device.startswith("cuda"):
        yield
        return
    (api, matmul_precision), conv_tf32, benchmark = set_backend_flags(config)
    try:
        yield
    finally:
        if api == "legacy":
            torch.set_float32_matmul_precision(matmul_precision)
        else:
            torch.backends.cuda.matmul.fp32_precision = matmul_precision
        torch.backends.cudnn.allow_tf32 = conv_tf32
        torch.backends.cudnn.benchmark = benchmark


Batch = torch.Tensor | ModelInputs  # what the model is called with
_WHOLE: Any = object()  # train_step's targets when the batch comes whole


def distributed_model(
    model: nn.Module, config: TrialConfig, device: torch.device
) -> DistributedDataParallel:
    """``model`` (on ``device``) as one replica of a distributed trial, with the trial's DDP
    settings; this process must have joined the trial's process group."""
    if world_size() != config.world_size:
        raise RuntimeError(
            f"the configuration trains as {config.world_size} processes (DDP), and this "
            f"process is in a group of {world_size()}: start them with torchrun "
            f"--nproc-per-node {config.world_size} and call "
            f"torch.distributed.init_process_group() first, or train as one process with "
            f"config.replace(world_size=1)"
        )
    return DistributedDataParallel(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        bucket_cap_mb=config.ddp_bucket_cap_mb,
        gradient_as_bucket_view=config.gradient_as_bucket_view,
        static_graph=config.static_graph,
    )


class Trainer:
    """One model trained under one configuration: ``train_step(batch)`` runs one micro-batch
    and, every ``accumulation_steps``, an optimizer step (``semantics.TrainingSteps``), never
    synchronizing the device. ``layout`` None: found from the first batch with what
    ``workload`` declares (a configuration from before layouts were recorded)."""

    def __init__(
        self,
        model: nn.Module,
        config: TrialConfig,
        total_steps: int,
        loss_fn: LossFn | None = None,
        layout: BatchLayout | None = None,
        workload: WorkloadSpec | None = None,
    ) -> None:
        self.config = config
        self.layout, self.workload = layout, workload
        self.device = torch.device(config.device)
        model = model.to(self.device)
        if config.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model  # the module itself: for evaluation and checkpoints
        # what training calls: DistributedDataParallel around the model in a distributed
        # trial (one process of several), compiled when asked (DDP inside: Dynamo splits the
        # graph at its gradient buckets)
        self.ddp = distributed_model(model, config, self.device) if config.distributed else None
        self.step_model: nn.Module = self.ddp or model
        if config.compile != "none":
            # a compile that fails must fail, not fall back to eager and be labelled compiled
            torch._dynamo.config.suppress_errors = False
            mode = None if config.compile == "default" else config.compile
            # torch.compile is typed as returning a callable; for a module it is a module
            self.step_model = torch.compile(self.step_model, mode=mode)  # type: ignore[assignment]
        # fused under fp16, so that GradScaler's overflow check stays on the device
        self.optimizer = semantics.make_optimizer(
            model,
            config.optimizer,
            config.lr,
            config.weight_decay,
            config.momentum or 0.0,
            config.nesterov,
            fused=config.precision == "fp16",
        )
        if config.compile in CUDA_GRAPH_MODES:
            semantics.keep_grads_outside_graphs(model)
        # micro-batches into optimizer steps: autocast, GradScaler, accumulation, no_sync
        self.training_steps = semantics.TrainingSteps(
            self.optimizer,
            config.precision,
            self.device.type,
            config.accumulation_steps,
            semantics.make_scheduler(
                self.optimizer, config.schedule, config.warmup_fraction, total_steps
            ),
            total_steps,
            self.ddp,
            grads_in_place=config.compile in CUDA_GRAPH_MODES,
        )
        # the optimizer, its schedule and GradScaler: a user's to checkpoint (load_best)
        self.scheduler = self.training_steps.scheduler
        self.scaler = self.training_steps.scaler
        self.loss_fn: LossFn = loss_fn or cross_entropy_loss
        # fp16: GradScaler skips the optimizer step when gradients overflow; count those, on
        # the device (read at evaluations, where it is synchronized anyway). Under fp16 the
        # optimizer is fused: GradScaler hands it the overflow flag and it skips on the device.
        assert not self.scaler.is_enabled() or self.optimizer.defaults.get("fused")
        self._skipped = torch.zeros((), device=self.device)
        self._skipped_in_a_row = torch.zeros((), device=self.device)
        self.optimizer.register_step_post_hook(self._count_step)

    def _count_step(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        """Count the step skipped when GradScaler's flag (1.0 or 0.0, on the device) says so."""
        skipped = getattr(optimizer, "found_inf", None)
        if skipped is not None:
            self._skipped.add_(skipped)
            self._skipped_in_a_row.mul_(skipped).add_(skipped)  # +1 if skipped, else back to 0

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps GradScaler skipped so far (reads the device)."""
        return int(self._skipped.item())

    @property
    def skipped_in_a_row(self) -> int:
        """The skipped steps since the last applied one (reads the device)."""
        return int(self._skipped_in_a_row.item())

    def to_device(self, inputs: Batch, targets: Any) -> tuple[Batch, Any]:
        """A split batch on the device, image inputs NHWC if asked."""
        channels_last = self.config.channels_last
        return to_device(inputs, self.device, channels_last), to_device(targets, self.device)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The precision context for forward passes (training and evaluation)."""
        return semantics.autocast(self.config.precision, self.device.type)

    @property
    def micro_batches(self) -> int:
        """Micro-batches trained so far."""
        return self.training_steps.micro_batches

    @property
    def steps(self) -> int:
        """Optimizer steps so far (the schedule follows these; skipped ones included)."""
        return self.training_steps.steps

    def split(self, batch: Any) -> tuple[Batch, Any]:
        """(model inputs, target) of a batch as the DataLoader gives it, on the device;
        ValueError naming what the batch holds when the layout does not fit it."""
        if self.layout is None:
            spec = self.workload
            try:
                self.layout = BatchLayout.of(
                    batch,
                    spec.inputs if spec else None,
                    spec.target if spec else None,
                    spec is not None and spec.loss == "model",
                )
            except LayoutError as error:
                raise ValueError(f"the batch does not fit the study's workload: {error}") from None
        try:
            inputs, targets = self.layout.split(batch)
        except BatchError:  # the user's batch_fn failed: its own message names it
            raise
        except (KeyError, IndexError, TypeError) as error:
            raise ValueError(
                f"the batch does not fit the study's batch layout (inputs {self.layout.inputs}, "
                f"target {self.layout.target!r}): {type(error).__name__}: {error}"
            ) from None
        return self.to_device(inputs, targets)

    def train_step(self, inputs: Any, targets: Any = _WHOLE) -> torch.Tensor:
        """One micro-batch (``train_step(batch)``, or split and on the device), an optimizer
        step when it completes an accumulation group; its detached, on-device loss."""
        if targets is _WHOLE:
            inputs, targets = self.split(inputs)
        return self.training_steps.train(self._loss, inputs, targets)

    def forward_backward(self, inputs: Batch, targets: Any) -> torch.Tensor:
        """Forward and backward of one micro-batch, no optimizer step."""
        return self.training_steps.forward_backward(self._loss, inputs, targets)

    def _loss(self, inputs: Batch, targets: Any) -> torch.Tensor:
        return self.loss_fn(call_model(self.step_model, inputs), targets)

    def optimizer_step(self) -> None:
        """Apply the accumulated gradients, zero them, advance the schedule."""
        self.training_steps.step()

    @property
    def loss_scale(self) -> float | None:
        """The GradScaler's current scale under fp16 (reads the device), else None."""
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else None
