"""Timed bursts of real training steps: the speed stage's measurement of one configuration.

``measure`` builds the trial's model, optimizer and data pipeline under ``config`` (accumulation
1), pays the one-time costs in a warm-up (workers start, data copied to the device, compile,
cuDNN autotuning), then times ``plan.bursts`` bursts of steady steps, each starting a new pass
over the data as an epoch does (so a pass's start is measured too). No evaluation: a few seconds
per configuration, in a trial's context (``context.guarded``) with a trial's clocks, the device
synchronized at burst boundaries only."""

from __future__ import annotations

import time

import torch

from autotune.config import TrialConfig
from autotune.faults import TrialFault
from autotune.machine import ranks
from autotune.machine.hardware import device_name
from autotune.speed import BurstPlan, SpeedMeasurement
from autotune.training.clocks import Epochs
from autotune.training.context import (
    compiled_graphs,
    guarded,
    peak_memory_bytes,
    reset_peak_memory,
)
from autotune.training.runner import Compiles, train_loader
from autotune.training.timing import PhaseProbe, TrainClock, synchronize
from autotune.training.trainer import Trainer
from autotune.workloads import Workload

CALIBRATION_MICRO_BATCHES = 4  # an untimed burst that sizes the timed ones
RECOMPILE_ATTEMPTS = 2  # timed measurements, while torch.compile compiles during them
MIN_BURST_MICRO_BATCHES = 4  # micro-batches a burst times, however slow a step is
MAX_BURST_MICRO_BATCHES = 400  # and however fast


def measure(config: TrialConfig, workload: Workload, plan: BurstPlan) -> SpeedMeasurement:
    """Time ``config``'s training steps (at accumulation 1); TrialFault when it cannot train."""
    config = config.replace(accumulation_steps=1)  # the optimizer's share is timed apart
    return guarded(
        config, lambda graph: _measure(config, workload, plan, graph.warm), plan.keep_compiled
    )


def _measure(
    config: TrialConfig, workload: Workload, plan: BurstPlan, warm: bool
) -> SpeedMeasurement:
    loader = train_loader(config, workload)
    compiles = Compiles(config)
    trainer = Trainer(workload.build_model(), config, 1_000_000, workload.loss_fn, workload.layout)
    device = trainer.device
    batches = Epochs(loader)
    reset_peak_memory(device)

    # -- warm-up: the first pass starts, the model compiles, kernels are chosen
    clock = TrainClock(device)
    clock.start()
    for _ in range(plan.warmup_micro_batches):
        trainer.train_step(next(batches))
    warmup_seconds = clock.pause()

    # -- an untimed burst that sizes the timed ones to about plan.burst_seconds each
    started = time.perf_counter()
    for _ in range(CALIBRATION_MICRO_BATCHES):
        trainer.train_step(next(batches))
    synchronize(device)
    per_batch = (time.perf_counter() - started) / CALIBRATION_MICRO_BATCHES
    length = round(plan.burst_seconds / max(per_batch, 1e-6))
    length = max(MIN_BURST_MICRO_BATCHES, min(MAX_BURST_MICRO_BATCHES, length, len(loader)))
    length = ranks.rank_zero_value(length, device)  # every process of a distributed run

    # -- the bursts: each a new pass, its start timed apart from its steady steps; bursts
    # during which torch.compile compiled a graph (a recompilation) are timed again
    for _attempt in range(RECOMPILE_ATTEMPTS):
        graphs_timed = compiled_graphs()
        steps, optimizer, epoch_starts = _bursts(trainer, batches, plan, length)
        if compiled_graphs() == graphs_timed:
            break
    else:
        raise TrialFault(
            "compile_error",
            f"torch.compile (mode {config.compile}) compiled again during each of "
            f"{RECOMPILE_ATTEMPTS} timed measurements: its speed cannot be measured",
        )

    steady = sorted(steps)[len(steps) // 2]
    epoch_start = sorted(epoch_starts)[len(epoch_starts) // 2]
    one_time = warmup_seconds - plan.warmup_micro_batches * steady - epoch_start
    if not warm:  # a warm run reuses the graph its cold run compiled, and checked
        compiles.graphs()
    return SpeedMeasurement(
        batch_size=config.batch_size,
        micro_batches_per_epoch=len(loader),
        step_seconds=tuple(steps),
        optimizer_seconds=tuple(optimizer),
        epoch_start_seconds=tuple(epoch_starts),
        one_time_seconds=max(0.0, one_time),
        compile_seconds=compiles.seconds(),
        peak_memory_bytes=peak_memory_bytes(device),
        device_name=device_name(config.device),
        torch_version=torch.__version__,
        world_size=config.world_size,
        compile_warm=warm,
    )


def _bursts(
    trainer: Trainer, batches: Epochs, plan: BurstPlan, length: int
) -> tuple[list[float], list[float], list[float]]:
    """Per burst of ``length`` micro-batches, each a new pass: the steady seconds per
    micro-batch, the optimizer step's share and the pass's start."""
    device = trainer.device
    steps: list[float] = []
    optimizer: list[float] = []
    epoch_starts: list[float] = []
    for _ in range(plan.bursts):
        probe = PhaseProbe(device, first_micro_batch=1, micro_batches=length - 1)
        synchronize(device)
        began = time.perf_counter()
        batches.end_pass()  # a non-persistent DataLoader's workers stop, as at an epoch's end
        first = next(batches)  # host work: worker start-up and the first batch's loading
        ready = time.perf_counter()
        trainer.train_step(first)
        for _ in range(length - 1):
            with probe.phase("data_wait"):
                batch = next(batches)
            with probe.phase("host_to_device"):
                inputs, targets = trainer.split(batch)
            with probe.phase("forward_backward"):
                trainer.forward_backward(inputs, targets)
            with probe.phase("optimizer"):
                trainer.optimizer_step()
        synchronize(device)
        ended = time.perf_counter()
        phases = probe.result(final=True) or {}
        epoch_starts.append(ready - began)
        steps.append((ended - ready) / length)
        optimizer.append(phases.get("optimizer", 0.0) / max(1, length - 1))
    return steps, optimizer, epoch_starts
