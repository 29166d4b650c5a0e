"""The training loop of one trial.

``train(config, workload, report)`` trains ``workload``'s model under ``config`` for
``config.epochs`` epochs, evaluates on the validation split every ``config.eval_every`` epochs and
hands each evaluation to ``report``, whose answer says whether to stop. It knows nothing of Optuna.

Measurement rules (README, "The objective, honestly measured"): the device is synchronized
only where a clock is read (warm-up end and evaluations), the loss is read back only at
evaluations, and evaluation time is not training time. The first optimizer steps are the warm-up
window: whatever they take beyond the steady-state step time is one-time overhead (compilation,
cuDNN autotuning, persistent DataLoader workers' start-up). An epoch's start recurs every epoch
(non-persistent workers start again): it is timed (``clocks.Epochs``) and counted once per
epoch, as a full run pays it and as stage 1 predicts it (``speed.SpeedMeasurement.epoch_seconds``).
"""

from __future__ import annotations

import math
import time

import torch
from torch.utils.data import DataLoader

from autotune.config import TrialConfig
from autotune.faults import TrialFault
from autotune.machine import ranks
from autotune.machine.hardware import device_name
from autotune.pipeline import DeviceBatches, make_train_loader, make_val_loader
from autotune.results import Evaluation, Plan, Reporter, TrialResult
from autotune.training.clocks import TrialClocks, warmup_steps
from autotune.training.context import (
    compile_seconds,
    compiled_graphs,
    guarded,
    peak_memory_bytes,
    reset_peak_memory,
)
from autotune.training.evaluation import evaluate
from autotune.training.losses import TrainingLosses
from autotune.training.telemetry import flops_per_sample
from autotune.training.trainer import Trainer, seed_everything
from autotune.workloads import Workload
from autotune.workloads.batches import call_model, count_samples


def train_loader(config: TrialConfig, workload: Workload) -> DataLoader | DeviceBatches:
    """This process's training batches, everything seeded by ``config.seed``; TrialFault when a
    batch is larger than its share of the data."""
    seed_everything(config.seed)
    loader = make_train_loader(
        workload.train_set, config, config.seed, workload.collate_fn, ranks.rank()
    )
    if len(loader) == 0:
        train_size, world = len(workload.train_set), config.world_size  # type: ignore[arg-type]
        raise TrialFault(
            "invalid_config",
            f"batch_size {config.batch_size} is larger than the training set "
            f"({train_size} samples)"
            if world == 1
            else f"batch_size {config.batch_size} (per process) is larger than each of the "
            f"{world} processes' share of the training set ({train_size // world} of "
            f"{train_size} samples)",
        )
    return loader


class Compiles:
    """What torch.compile compiles from here on: its graphs and its seconds."""

    def __init__(self, config: TrialConfig) -> None:
        self.compiled = config.compile != "none"
        self.mode = config.compile
        self.graphs_before, self.seconds_before = compiled_graphs(), compile_seconds()

    def graphs(self) -> int:
        """Graphs compiled since; TrialFault when a compiled configuration compiled none."""
        graphs = compiled_graphs() - self.graphs_before
        if self.compiled and graphs == 0:
            raise TrialFault(
                "compile_error", f"torch.compile (mode {self.mode}) produced no graph"
            )
        return graphs

    def seconds(self) -> float | None:
        """Seconds spent compiling since (None for an eager configuration)."""
        return compile_seconds() - self.seconds_before if self.compiled else None


def make_plan(config: TrialConfig, micro_batches_per_epoch: int) -> Plan:
    """Lay out optimizer steps, evaluation points and the warm-up window of a trial."""
    accumulation = config.accumulation_steps
    micro_batches = math.floor(config.epochs * micro_batches_per_epoch + 1e-9)
    optimizer_steps = micro_batches // accumulation
    if optimizer_steps == 0:
        raise TrialFault(
            "invalid_config",
            f"effective batch {config.effective_batch_size} needs {accumulation} micro-batches "
            f"per step but the trial has only {micro_batches}",
        )
    steps_per_eval = config.eval_every * micro_batches_per_epoch / accumulation
    n_evals = math.ceil(config.epochs / config.eval_every - 1e-9)
    eval_steps = sorted(
        {min(optimizer_steps, max(1, round(k * steps_per_eval))) for k in range(1, n_evals)}
        | {optimizer_steps}
    )
    return Plan(
        micro_batches_per_epoch=micro_batches_per_epoch,
        optimizer_steps=optimizer_steps,
        eval_steps=tuple(eval_steps),
        warmup_steps=warmup_steps(eval_steps[0]),
    )


def _flops_per_sample(trainer: Trainer, workload: Workload) -> float | None:
    """FLOPs of a training step per sample, counted on the workload's first samples."""
    inputs, targets = trainer.to_device(*workload.example_batch())
    return flops_per_sample(
        trainer.model,
        lambda: trainer.loss_fn(call_model(trainer.model, inputs), targets),
        count_samples(targets),
    )


def train(config: TrialConfig, workload: Workload, report: Reporter) -> TrialResult:
    """Train one trial; TrialFault when it cannot finish."""
    return guarded(config, lambda _graph: _train(config, workload, report))


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


def _train(config: TrialConfig, workload: Workload, report: Reporter) -> TrialResult:
    # -- seeds and data (one process of a distributed trial draws its own share of every epoch)
    loader = train_loader(config, workload)
    val_loader = make_val_loader(workload.val_set, config, workload.collate_fn)
    plan = make_plan(config, len(loader))

    # -- model, optimizer, schedule, precision; compiled when asked, on a cold compiler (see
    # compile_state) so earlier trials' graphs neither help nor count (evaluation runs eager)
    compiles = Compiles(config)
    trainer = Trainer(
        workload.build_model(), config, plan.optimizer_steps, workload.loss_fn, workload.layout
    )
    flops = _flops_per_sample(trainer, workload)
    reset_peak_memory(trainer.device)

    losses = TrainingLosses(config, trainer.device, workload.counts_tokens)
    clocks = TrialClocks(trainer.device, plan, config, loader)
    probe = clocks.probe
    evaluations: list[Evaluation] = []
    # -- the clock starts: the first epoch's start (DataLoader workers starting, or the data
    # set copied to the device) is on the clock, inside the warm-up
    with clocks:
        batches = clocks.epochs  # epoch after epoch, each start timed
        while True:
            # one micro-batch: wait for data, copy it, forward and backward
            with probe.phase("data_wait"):
                batch = next(batches)
            with probe.phase("host_to_device"):
                inputs, targets = trainer.split(batch)
                losses.count_tokens(inputs)
            with probe.phase("forward_backward"):
                loss = trainer.forward_backward(inputs, targets)
            losses.add(loss)
            if trainer.micro_batches % config.accumulation_steps:
                continue  # within an accumulation group: no optimizer step yet

            # every accumulation_steps micro-batches an optimizer step
            with probe.phase("optimizer"):
                trainer.optimizer_step()
            if trainer.steps == plan.warmup_steps:
                clocks.warmed_up(trainer.micro_batches)
            if trainer.steps in plan.eval_steps:
                evaluation, stop = _evaluate_and_report(
                    trainer, val_loader, workload, plan, clocks, losses, report
                )
                evaluations.append(evaluation)
                if stop:
                    break  # every rank stops here
                clocks.resume()
    return _result(config, trainer, tuple(evaluations), clocks, losses, compiles, flops)


def _evaluate_and_report(
    trainer: Trainer,
    val_loader: DataLoader | DeviceBatches,
    workload: Workload,
    plan: Plan,
    clocks: TrialClocks,
    losses: TrainingLosses,
    report: Reporter,
) -> tuple[Evaluation, bool]:
    """An evaluation after this optimizer step, the clock stopped, and whether the trial stops
    here (its last evaluation, or the reporter says so). Rank 0 of a distributed trial evaluates
    (the whole split, on its replica) and reports; every rank stops at the step it says."""
    steps, final = trainer.steps, trainer.steps == plan.optimizer_steps
    train_seconds = clocks.pause(final)
    epoch = trainer.micro_batches / plan.micro_batches_per_epoch
    train_loss = losses.since_last_evaluation(trainer, epoch)  # every rank's
    eval_started = time.perf_counter()
    leader = ranks.rank() == 0
    score, val_loss = evaluate(trainer, val_loader, workload) if leader else (0.0, 0.0)
    config = trainer.config
    evaluation = Evaluation(
        index=losses.evaluations,
        epoch=epoch,
        optimizer_steps=steps,
        samples_seen=trainer.micro_batches * config.batch_size * config.world_size,
        score=score,
        val_loss=val_loss,
        train_loss=train_loss,
        train_seconds=train_seconds,
        overhead_seconds=clocks.overhead(train_seconds, steps),
        eval_seconds=time.perf_counter() - eval_started,
        final=final,
    )
    stop = (report(evaluation) if leader else False) or final
    return evaluation, ranks.agree(stop, trainer.device)


def _result(
    config: TrialConfig,
    trainer: Trainer,
    evaluations: tuple[Evaluation, ...],
    clocks: TrialClocks,
    losses: TrainingLosses,
    compiles: Compiles,
    flops: float | None,
) -> TrialResult:
    """What the trial measured: steady-state speed after the warm-up window (the whole run's
    when it ended inside it), one-time costs apart."""
    last = evaluations[-1]
    warmup = clocks.warmup_seconds if clocks.warmup_seconds is not None else last.train_seconds
    samples_per_second = clocks.pace.samples_per_second(
        last.train_seconds, trainer.micro_batches
    ) or (last.samples_seen / last.train_seconds)
    new_graphs = compiles.graphs()
    tokens = losses.tokens
    trained = trainer.micro_batches * config.batch_size
    return TrialResult(
        evaluations=evaluations,
        score=last.score,
        train_seconds=last.train_seconds,
        overhead_seconds=last.overhead_seconds,
        warmup_seconds=warmup,
        samples_per_second=samples_per_second,
        tokens_per_second=(
            samples_per_second * float(tokens) / trained if tokens is not None else None
        ),
        samples_seen=last.samples_seen,
        optimizer_steps=last.optimizer_steps,
        effective_batch_size=config.effective_batch_size,
        peak_memory_bytes=peak_memory_bytes(trainer.device),
        compiled_graphs=new_graphs,
        loss_scale=trainer.loss_scale,
        skipped_steps=trainer.skipped_steps,
        time_breakdown=clocks.breakdown or clocks.probe.result(final=True),
        compile_seconds=compiles.seconds(),
        flops_per_sample=flops,
        gpu=clocks.sampler.summary(),
        device_name=device_name(config.device),
        torch_version=torch.__version__,
        world_size=config.world_size,
    )
