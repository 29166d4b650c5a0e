"""The training loop of one trial.

``train(config, workload, report)`` trains ``workload``'s model under ``config`` for
``config.epochs`` epochs, evaluates on the validation split every ``config.eval_every`` epochs and
hands each evaluation to ``report``, whose answer says whether to stop. It knows nothing of Optuna.

Measurement rules (README, "The objective, honestly measured"): the device is synchronized
only where a clock is read (warm-up end and evaluations), the loss is read back only at
evaluations, and evaluation time is not training time. The first optimizer steps are the warm-up
window: whatever they take beyond the steady-state step time is one-time overhead (compilation,
cuDNN autotuning, persistent DataLoader workers' start-up). An epoch's start recurs every epoch
(non-persistent workers start again): it is timed (``_Epochs``) and counted once per epoch, as a
full run pays it and as stage 1 predicts it (``speed.SpeedMeasurement.epoch_seconds``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from autotune.config import TrialConfig
from autotune.faults import TrialFault
from autotune.machine import ranks
from autotune.machine.hardware import device_name
from autotune.pipeline import DeviceBatches, make_train_loader, make_val_loader
from autotune.results import Evaluation, Plan, Reporter, TrialResult
from autotune.training.context import (
    compile_seconds,
    compiled_graphs,
    guarded,
    peak_memory_bytes,
    reset_peak_memory,
)
from autotune.training.evaluation import evaluate
from autotune.training.telemetry import GpuSampler, flops_per_sample
from autotune.training.timing import PhaseProbe, TrainClock
from autotune.training.trainer import Trainer, seed_everything
from autotune.workloads import Workload
from autotune.workloads.batches import ModelInputs, call_model, count_samples, count_tokens

MAX_WARMUP_STEPS = 5  # optimizer steps timed as warm-up (at most half the first evaluation span)
DIVERGENCE_FACTOR = 10.0  # a mean training loss this many times the lowest seen has diverged
DIVERGENCE_MIN_RISE = 1.0  # ... and risen by this much (nats): 0.001 -> 0.011 is still healthy
MAX_SKIPPED_IN_A_ROW = 25  # fp16 steps skipped for overflow in a row (scale / 2**25): a fault
MIN_SPAN_FOR_ALL_SKIPPED = 8  # ... or every step between two evaluations, if there were this many
PROBE_MICRO_BATCHES = 32  # the window of steady-state micro-batches whose phases are timed


def train_loader(config: TrialConfig, workload: Workload) -> DataLoader | DeviceBatches:
    """This process's training batches, everything seeded by ``config.seed`` (weights, data
    order, DataLoader workers); TrialFault when a batch is larger than its share of the data."""
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
        warmup_steps=min(MAX_WARMUP_STEPS, max(1, eval_steps[0] // 2)),
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
    """Train one trial; raise TrialFault (kind and one-line message, and the traceback as
    ``details`` for unexpected errors) when it cannot finish."""
    run = guarded(config, lambda: _train(config, workload, report))
    return dataclasses.replace(
        run.value, intra_op_threads=run.intra_op_threads, other_cpu_share=run.other_cpu_share
    )


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

    losses = _Losses(config, trainer.device, workload.counts_tokens)
    clocks = _Clocks(trainer.device, plan, config.accumulation_steps, loader)
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
    return _result(config, trainer, tuple(evaluations), plan, clocks, losses, compiles, flops)


def _evaluate_and_report(
    trainer: Trainer,
    val_loader: DataLoader | DeviceBatches,
    workload: Workload,
    plan: Plan,
    clocks: _Clocks,
    losses: _Losses,
    report: Reporter,
) -> tuple[Evaluation, bool]:
    """An evaluation after this optimizer step, and whether the trial stops here (its last
    evaluation, or the reporter says so). The clock stops (evaluation time is not training
    time), the training loss is read back and checked; rank 0 of a distributed trial evaluates
    (the whole validation split, on its replica: the same score as one process) and reports,
    and the others wait for its verdict, so that every rank stops at the same step."""
    steps, final = trainer.steps, trainer.steps == plan.optimizer_steps
    train_seconds = clocks.pause(final)
    epoch = trainer.micro_batches / plan.micro_batches_per_epoch
    train_loss = losses.since_last_evaluation(trainer, epoch)  # every rank's
    eval_started = time.perf_counter()
    leader = ranks.is_leader()
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


class _Epochs:
    """The training batches, epoch after epoch, each epoch's start timed on the host: from
    asking for its first batch to having it (the last epoch's non-persistent workers stopped
    and new ones started, the first batch loaded). No synchronization: a GPU may still run
    queued steps meanwhile, so a start is counted at most in full."""

    def __init__(self, loader: DataLoader | DeviceBatches) -> None:
        self.loader = loader
        self.start_seconds: list[float] = []  # per epoch begun, the first one's included
        self._epoch: Iterator[Any] = iter(())

    def __iter__(self) -> _Epochs:
        return self

    def __next__(self) -> Any:
        began = time.perf_counter()
        batch = next(self._epoch, _END)
        if batch is _END:
            self._epoch = iter(self.loader)
            batch = next(self._epoch)
            self.start_seconds.append(time.perf_counter() - began)
        return batch

    def recurring(self) -> float:
        """What starting an epoch costs each time: the median start after the first (whose
        one-time share never recurs); 0 until a second epoch has begun."""
        later = sorted(self.start_seconds[1:])
        return later[len(later) // 2] if later else 0.0


_END = object()


class _Clocks:
    """How a trial's training is timed: the training clock (evaluation excluded), the warm-up
    window's end, the phase probe over the first steady micro-batches, and NVML sampling of
    steady-state training only (after the warm-up, outside evaluations)."""

    def __init__(
        self,
        device: torch.device,
        plan: Plan,
        accumulation: int,
        loader: DataLoader | DeviceBatches,
    ) -> None:
        self.clock = TrainClock(device)
        self.warmup_steps = plan.warmup_steps
        self.probe = PhaseProbe(
            device,
            first_micro_batch=plan.warmup_steps * accumulation + 1,
            micro_batches=PROBE_MICRO_BATCHES,
        )
        self.sampler = GpuSampler(device)
        self.sampler.paused = True  # until the warm-up ends
        self.warmup_seconds: float | None = None
        self.warmup_micro_batches = 0
        self.epochs_in_warmup = 0  # epochs begun by the warm-up's end
        self.breakdown: dict[str, float] | None = None
        self.epochs = _Epochs(loader)

    def __enter__(self) -> _Clocks:
        self.sampler.__enter__()
        self.clock.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sampler.__exit__(*exc)

    def warmed_up(self, micro_batches: int) -> None:
        """The warm-up window ends here, after ``micro_batches``: its seconds are read, GPU
        sampling starts."""
        self.warmup_seconds = self.clock.read()
        self.warmup_micro_batches = micro_batches
        self.epochs_in_warmup = len(self.epochs.start_seconds)
        self.sampler.paused = False

    def pause(self, final: bool) -> float:
        """Stop the clock and the sampling for an evaluation; the training seconds so far."""
        train_seconds = self.clock.pause()
        self.sampler.paused = True
        self.breakdown = self.breakdown or self.probe.result(final=final)
        return train_seconds

    def resume(self) -> None:
        """Training goes on after an evaluation."""
        self.sampler.paused = False
        self.clock.resume()

    def overhead(self, train_seconds: float, steps: int) -> float:
        """Warm-up seconds beyond what the same steps take in steady state, the first epoch's
        start counted as the recurring cost it is (0 until known)."""
        steady_steps = steps - self.warmup_steps
        if self.warmup_seconds is None or steady_steps <= 0:
            return 0.0
        steady_step_seconds = (train_seconds - self.warmup_seconds) / steady_steps
        recurring = self.epochs.recurring()
        return max(0.0, self.warmup_seconds - self.warmup_steps * steady_step_seconds - recurring)

    def steady_seconds(self, train_seconds: float, micro_batches: int, per_epoch: int) -> float:
        """The seconds after the warm-up with one epoch start per epoch trained in it (a short
        window holds more or fewer: from the middle of epoch 1 to the end of epoch 3, two in 2.5
        epochs)."""
        assert self.warmup_seconds is not None
        epochs = (micro_batches - self.warmup_micro_batches) / per_epoch
        starts = len(self.epochs.start_seconds) - self.epochs_in_warmup
        recurring = self.epochs.recurring()
        return train_seconds - self.warmup_seconds + (epochs - starts) * recurring


class _Losses:
    """The training loss since the last evaluation and the tokens trained on, summed on the
    device and read back only at evaluations (no per-step host-device synchronization).

    Under fp16 a non-finite loss is an overflow GradScaler recovers from (it skips that step),
    so only finite losses are averaged; elsewhere a non-finite loss is a fault.
    """

    def __init__(self, config: TrialConfig, device: torch.device, counts_tokens: bool) -> None:
        self.config = config
        self.fp16 = config.precision == "fp16"
        self.sum = torch.zeros((), dtype=torch.float32, device=device)
        # the losses summed: counted on the device under fp16 (only finite ones), else an int
        self.count: torch.Tensor | int = torch.zeros_like(self.sum) if self.fp16 else 0
        # tokens in the batches trained on, for token inputs (a device tensor when masks count)
        self.tokens: torch.Tensor | int | None = 0 if counts_tokens else None
        self.lowest = math.inf
        self.evaluations = 0  # evaluations so far
        self.skipped_before = 0  # GradScaler's skipped steps at the previous evaluation
        self.steps_before = 0

    def count_tokens(self, inputs: Any) -> None:
        if self.tokens is not None and isinstance(inputs, ModelInputs):
            counted = count_tokens(inputs)  # a device tensor: added, never read here
            if counted is not None:  # (``counted or 0`` would wait for the device)
                self.tokens = self.tokens + counted

    def add(self, loss: torch.Tensor) -> None:
        if self.fp16:
            finite = torch.isfinite(loss)
            self.sum += torch.where(finite, loss, 0.0)
            self.count += finite
        else:
            self.sum += loss
            self.count += 1

    def since_last_evaluation(self, trainer: Trainer, epoch: float) -> float:
        """The mean training loss since the last evaluation, over every process of a
        distributed trial (reads the device once); TrialFault when training went astray."""
        if isinstance(self.count, torch.Tensor):  # fp16: only finite losses were summed
            counted = self.count.float()
        else:
            counted = torch.full((), float(self.count), device=self.sum.device)
        total, count = ranks.sum_over_ranks(torch.stack([self.sum, counted])).tolist()
        loss = self._checked(trainer, total, count, epoch)
        self.lowest = min(self.lowest, loss)
        self.evaluations += 1
        self.skipped_before, self.steps_before = trainer.skipped_steps, trainer.steps
        self.sum.zero_()
        self.count = self.count.zero_() if isinstance(self.count, torch.Tensor) else 0
        return loss

    def _checked(self, trainer: Trainer, total: float, count: float, epoch: float) -> float:
        """The mean loss ``total / count``; TrialFault when training went astray since the
        previous evaluation.

        Under fp16 GradScaler skips steps whose gradients overflow and lowers its scale; a few
        such steps are normal. A long run of them, or a whole span between evaluations without
        one applied step, means the model is no longer training. A loss far above its lowest
        (10x, and by more than one nat, so that a near-zero loss wobbling is not divergence)
        has diverged.
        """
        lr, precision = f"lr {self.config.lr:.3g}", self.config.precision
        if count == 0 or not math.isfinite(total):
            shown = "inf or nan at every step" if count == 0 else f"{total / count}"
            raise TrialFault(
                "nonfinite_loss",
                f"training loss is {shown} after {epoch:.2f} epochs ({lr}, {precision})",
            )
        skipped = trainer.skipped_steps - self.skipped_before
        attempted = trainer.steps - self.steps_before
        whole_span = attempted >= MIN_SPAN_FOR_ALL_SKIPPED and skipped == attempted
        if trainer.skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW or whole_span:
            raise TrialFault(
                "nonfinite_loss",
                f"fp16 gradients overflowed in {trainer.skipped_in_a_row} optimizer steps in a "
                f"row after {epoch:.2f} epochs: GradScaler cannot recover ({lr})",
            )
        loss, lowest = total / count, self.lowest
        if loss > DIVERGENCE_FACTOR * lowest and loss - lowest > DIVERGENCE_MIN_RISE:
            raise TrialFault(
                "diverged",
                f"training loss {loss:.4g} after {epoch:.2f} epochs is over "
                f"{DIVERGENCE_FACTOR:g}x its lowest, {lowest:.4g} ({lr})",
            )
        return loss


def _result(
    config: TrialConfig,
    trainer: Trainer,
    evaluations: tuple[Evaluation, ...],
    plan: Plan,
    clocks: _Clocks,
    losses: _Losses,
    compiles: Compiles,
    flops: float | None,
) -> TrialResult:
    """What the trial measured: steady-state speed after the warm-up window (the whole run's
    when it ended inside it), its one-time costs apart."""
    last = evaluations[-1]
    warmup = clocks.warmup_seconds if clocks.warmup_seconds is not None else last.train_seconds
    steady_steps = last.optimizer_steps - plan.warmup_steps
    steady_seconds = (
        clocks.steady_seconds(
            last.train_seconds, trainer.micro_batches, plan.micro_batches_per_epoch
        )
        if steady_steps > 0
        else 0.0
    )
    if steady_seconds > 0:
        samples_per_second = steady_steps * config.effective_batch_size / steady_seconds
    else:
        samples_per_second = last.samples_seen / last.train_seconds
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
