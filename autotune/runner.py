"""The training loop of one trial.

``train(config, workload, report)`` trains ``workload``'s model under ``config`` for
``config.epochs`` epochs, evaluates on the validation split every ``config.eval_every`` epochs and
hands each evaluation to ``report``, whose answer says whether to stop. It knows nothing of Optuna.

Measurement rules (README, "The objective, honestly measured"): the device is synchronized
only where a clock is read (warm-up end and evaluations), the loss is read back only at
evaluations, and evaluation time is not training time. The first optimizer steps are the warm-up
window: whatever they take beyond the steady-state step time is one-time overhead (compilation,
cuDNN autotuning, DataLoader worker start-up).
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from autotune import ranks
from autotune.config import TrialConfig
from autotune.evaluation import evaluate
from autotune.execution import (
    compile_seconds,
    compiled_graphs,
    guarded,
    peak_memory_bytes,
    reset_peak_memory,
)
from autotune.faults import TrialFault
from autotune.hardware import device_name
from autotune.pipeline import make_train_loader, make_val_loader
from autotune.results import Evaluation, Plan, Reporter, TrialResult
from autotune.telemetry import GpuSampler, flops_per_sample
from autotune.timing import PhaseProbe, TrainClock
from autotune.trainer import (
    Trainer,
    seed_everything,
)
from autotune.workloads import Workload
from autotune.workloads.batches import (
    ModelInputs,
    call_model,
    count_samples,
    count_tokens,
)

__all__ = ["make_plan", "train"]

MAX_WARMUP_STEPS = 5  # optimizer steps timed as warm-up (at most half the first evaluation span)
DIVERGENCE_FACTOR = 10.0  # a mean training loss this many times the lowest seen has diverged
DIVERGENCE_MIN_RISE = 1.0  # ... and risen by this much (nats): 0.001 -> 0.011 is still healthy
MAX_SKIPPED_IN_A_ROW = 25  # fp16 steps skipped for overflow in a row (scale / 2**25): a fault
MIN_SPAN_FOR_ALL_SKIPPED = 8  # ... or every step between two evaluations, if there were this many
PROBE_MICRO_BATCHES = 32  # the window of steady-state micro-batches whose phases are timed


def make_plan(config: TrialConfig, micro_batches_per_epoch: int, train_size: int) -> Plan:
    """Lay out optimizer steps, evaluation points and the warm-up window of a trial."""
    if micro_batches_per_epoch == 0:
        world = config.world_size
        raise TrialFault(
            "invalid_config",
            f"batch_size {config.batch_size} is larger than the training set "
            f"({train_size} samples)"
            if world == 1
            else f"batch_size {config.batch_size} (per process) is larger than each of the "
            f"{world} processes' share of the training set ({train_size // world} of "
            f"{train_size} samples)",
        )
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


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


def train(config: TrialConfig, workload: Workload, report: Reporter) -> TrialResult:
    """Train one trial; raise TrialFault (kind and one-line message, and the traceback as
    ``details`` for unexpected errors) when it cannot finish."""
    run = guarded(config, lambda: _train(config, workload, report))
    return dataclasses.replace(
        run.value, intra_op_threads=run.intra_op_threads, other_cpu_share=run.other_cpu_share
    )


def _train(config: TrialConfig, workload: Workload, report: Reporter) -> TrialResult:  # noqa: PLR0915
    # -- seeds: weights, data order and DataLoader workers all follow config.seed
    seed_everything(config.seed)

    # -- data
    # (one process of a distributed trial draws its own share of every epoch)
    train_loader = make_train_loader(
        workload.train_set, config, config.seed, workload.collate_fn, ranks.rank()
    )
    val_loader = make_val_loader(workload.val_set, config, workload.collate_fn)
    train_size = len(workload.train_set)  # type: ignore[arg-type]  # map-style: sized
    plan = make_plan(config, len(train_loader), train_size)

    # -- model, optimizer, schedule, precision; compiled when asked, on a cold compiler (see
    # compile_state) so earlier trials' graphs neither help nor count (evaluation runs eager)
    graphs_before, compile_before = compiled_graphs(), compile_seconds()
    trainer = Trainer(
        workload.build_model(), config, plan.optimizer_steps, workload.loss_fn, workload.layout
    )
    device = trainer.device
    flops = _flops_per_sample(trainer, workload)
    reset_peak_memory(device)

    # -- bookkeeping read only at evaluations (no per-step host-device synchronization).
    # Under fp16 a non-finite loss is an overflow GradScaler recovers from (it skips that step),
    # so only finite losses are averaged; elsewhere a non-finite loss is a fault.
    fp16 = config.precision == "fp16"
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    # tokens in the batches trained on, for token inputs (a device tensor when masks count them)
    tokens: torch.Tensor | int | None = 0 if workload.counts_tokens else None
    losses_summed = torch.zeros((), dtype=torch.float32, device=device) if fp16 else 0
    lowest_train_loss = math.inf
    skipped_before = 0  # GradScaler's skipped steps at the previous evaluation
    steps_before = 0
    warmup_seconds: float | None = None
    evaluations: list[Evaluation] = []
    pending_evals = iter(plan.eval_steps)
    next_eval = next(pending_evals)

    accumulation = config.accumulation_steps
    probe = PhaseProbe(
        device,
        first_micro_batch=plan.warmup_steps * accumulation + 1,
        micro_batches=PROBE_MICRO_BATCHES,
    )
    breakdown: dict[str, float] | None = None
    sampler = GpuSampler(device)
    sampler.paused = True  # GPU utilization is a steady-state figure: sampled after warm-up
    clock = TrainClock(device)
    with sampler:
        clock.start()
        # starting DataLoader workers, or copying the data set to the device, is a one-time
        # cost of the trial's pipeline: on the clock, inside the warm-up
        batches = iter(train_loader)
        while True:
            # one micro-batch: wait for data (a new epoch starts a new pass), copy, forward and
            # backward; every accumulation_steps micro-batches an optimizer step
            probe.begin(trainer.micro_batches + 1)
            batch = next(batches, None)
            if batch is None:
                batches = iter(train_loader)
                batch = next(batches)
            probe.mark("data_wait")
            inputs, targets = trainer.split(batch)
            if tokens is not None and isinstance(inputs, ModelInputs):
                counted = count_tokens(inputs)  # a device tensor: added, never read here
                if counted is not None:  # (``counted or 0`` would wait for the device)
                    tokens = tokens + counted
            probe.mark("host_to_device")
            loss = trainer.forward_backward(inputs, targets)
            probe.mark("forward_backward")
            if fp16:
                finite = torch.isfinite(loss)
                loss_sum += torch.where(finite, loss, 0.0)
                losses_summed += finite
            else:
                loss_sum += loss
                losses_summed += 1
            if trainer.micro_batches % accumulation:
                continue  # within an accumulation group: no optimizer step yet
            trainer.optimizer_step()
            probe.mark("optimizer")
            steps = trainer.steps
            if steps == plan.warmup_steps:
                warmup_seconds = clock.read()
                sampler.paused = False
            if steps != next_eval:
                continue

            # evaluation: the clock stops, the loss is read back, the reporter decides
            train_seconds = clock.pause()
            sampler.paused = True
            breakdown = breakdown or probe.result(final=steps == plan.optimizer_steps)
            epoch = trainer.micro_batches / plan.micro_batches_per_epoch
            train_loss = _segment_loss(loss_sum, losses_summed, epoch, config)  # every rank's
            _check_training_health(
                trainer,
                train_loss,
                lowest_train_loss,
                skipped=trainer.skipped_steps - skipped_before,
                attempted=steps - steps_before,
                epoch=epoch,
                config=config,
            )
            lowest_train_loss = min(lowest_train_loss, train_loss)
            skipped_before, steps_before = trainer.skipped_steps, steps
            loss_sum.zero_()
            # a tensor under fp16 (finite losses are counted on the device), else an int
            losses_summed = losses_summed.zero_() if fp16 else 0  # type: ignore[union-attr]
            # rank 0 of a distributed trial evaluates (the whole validation split, on its
            # replica: the same score as one process) and reports; the others wait for its
            # verdict, so that every rank stops at the same step
            eval_started = time.perf_counter()
            leader = ranks.is_leader()
            score, val_loss = evaluate(trainer, val_loader, workload) if leader else (0.0, 0.0)
            evaluation = Evaluation(
                index=len(evaluations) + 1,
                epoch=epoch,
                optimizer_steps=steps,
                samples_seen=trainer.micro_batches * config.batch_size * config.world_size,
                score=score,
                val_loss=val_loss,
                train_loss=train_loss,
                train_seconds=train_seconds,
                overhead_seconds=_overhead(plan, warmup_seconds, train_seconds, steps),
                eval_seconds=time.perf_counter() - eval_started,
                final=steps == plan.optimizer_steps,
            )
            evaluations.append(evaluation)
            stop = (report(evaluation) if leader else False) or evaluation.final
            if ranks.agree(stop, device):
                break
            next_eval = next(pending_evals)
            sampler.paused = False
            clock.resume()

    last = evaluations[-1]
    warmup = warmup_seconds if warmup_seconds is not None else last.train_seconds
    steady_steps = last.optimizer_steps - plan.warmup_steps
    steady_seconds = last.train_seconds - warmup
    if steady_steps > 0 and steady_seconds > 0:
        samples_per_second = steady_steps * config.effective_batch_size / steady_seconds
    else:
        samples_per_second = last.samples_seen / last.train_seconds
    new_graphs = compiled_graphs() - graphs_before
    if config.compile != "none" and new_graphs == 0:
        raise TrialFault(
            "compile_error", f"torch.compile (mode {config.compile}) produced no graph"
        )
    return TrialResult(
        evaluations=tuple(evaluations),
        score=last.score,
        train_seconds=last.train_seconds,
        overhead_seconds=last.overhead_seconds,
        warmup_seconds=warmup,
        samples_per_second=samples_per_second,
        tokens_per_second=(
            samples_per_second * float(tokens) / (trainer.micro_batches * config.batch_size)
            if tokens is not None
            else None
        ),
        samples_seen=last.samples_seen,
        optimizer_steps=last.optimizer_steps,
        effective_batch_size=config.effective_batch_size,
        peak_memory_bytes=peak_memory_bytes(device),
        compiled_graphs=new_graphs,
        loss_scale=trainer.loss_scale,
        skipped_steps=trainer.skipped_steps,
        time_breakdown=breakdown or probe.result(final=True),
        compile_seconds=compile_seconds() - compile_before if config.compile != "none" else None,
        flops_per_sample=flops,
        gpu=sampler.summary(),
        device_name=device_name(config.device),
        torch_version=torch.__version__,
        world_size=config.world_size,
    )


def _segment_loss(
    loss_sum: torch.Tensor, losses_summed: torch.Tensor | int, epoch: float, config: TrialConfig
) -> float:
    """Mean training loss since the last evaluation, over every process of a distributed
    trial (reads the device once)."""
    if isinstance(losses_summed, torch.Tensor):  # fp16: only finite losses were summed
        counted = losses_summed.float()
    else:
        counted = torch.full((), float(losses_summed), device=loss_sum.device)
    total, count = ranks.sum_over_ranks(torch.stack([loss_sum, counted])).tolist()
    if count == 0 or not math.isfinite(total):
        shown = "inf or nan at every step" if count == 0 else f"{total / count}"
        raise TrialFault(
            "nonfinite_loss",
            f"training loss is {shown} after {epoch:.2f} epochs "
            f"(lr {config.lr:.3g}, {config.precision})",
        )
    return total / count


def _check_training_health(
    trainer: Trainer,
    train_loss: float,
    lowest: float,
    skipped: int,
    attempted: int,
    epoch: float,
    config: TrialConfig,
) -> None:
    """Raise TrialFault when training went astray since the previous evaluation.

    Under fp16 GradScaler skips steps whose gradients overflow and lowers its scale; a few such
    steps are normal. A long run of them, or a whole span between evaluations without one
    applied step, means the model is no longer training. A loss far above its lowest (10x,
    and by more than one nat, so that a near-zero loss wobbling is not divergence) has diverged.
    """
    whole_span = attempted >= MIN_SPAN_FOR_ALL_SKIPPED and skipped == attempted
    if trainer.skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW or whole_span:
        raise TrialFault(
            "nonfinite_loss",
            f"fp16 gradients overflowed in {trainer.skipped_in_a_row} optimizer steps in a row "
            f"after {epoch:.2f} epochs: GradScaler cannot recover (lr {config.lr:.3g})",
        )
    if train_loss > DIVERGENCE_FACTOR * lowest and train_loss - lowest > DIVERGENCE_MIN_RISE:
        raise TrialFault(
            "diverged",
            f"training loss {train_loss:.4g} after {epoch:.2f} epochs is over "
            f"{DIVERGENCE_FACTOR:g}x its lowest, {lowest:.4g} (lr {config.lr:.3g})",
        )


def _overhead(plan: Plan, warmup_seconds: float | None, train_seconds: float, steps: int) -> float:
    """Warm-up seconds beyond what the same steps take in steady state (0 until known)."""
    steady_steps = steps - plan.warmup_steps
    if warmup_seconds is None or steady_steps <= 0:
        return 0.0
    steady_step_seconds = (train_seconds - warmup_seconds) / steady_steps
    return max(0.0, warmup_seconds - plan.warmup_steps * steady_step_seconds)
