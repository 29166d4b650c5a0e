"""The search space: hardware filtering of knob values, and trial -> TrialConfig.

This is the only module that calls ``trial.suggest_*``. Conditional knobs are sampled only where
they mean something: ``prefetch_factor`` and ``persistent_workers`` only with DataLoader workers,
``momentum`` only for SGD, ``nesterov`` only with momentum.

A joint study samples every knob. A two-stage study's trials sample what changes learning (the
learning rate, the effective batch, the optimizer and schedule, the precision, and any knob
declared in ``study.learning_knobs``) and take the execution knobs and the micro-batch split
from the speed stage's table (``autotune.speed.SpeedTable``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from torch.utils.data import TensorDataset

from autotune.config import TrialConfig, scaled_lr
from autotune.hardware import Hardware
from autotune.pipeline import ImageTensorDataset
from autotune.spec import DDP_KNOBS, Choice, FloatRange, IntRange, Knob, Spec, SpecError
from autotune.speed import SPEED_KNOBS, SPLIT_KNOBS, SpeedTable
from autotune.workloads import Workload

DEVICE_DATA_SHARE = (
    0.5  # the most of a GPU's memory a training set may take in the device pipeline
)
WORKERS_PER_CORE = 4  # DataLoader processes a core may be given (I/O-bound loading: several)

__all__ = [
    "Dropped",
    "NothingFits",
    "Restriction",
    "effective_batch_sizes",
    "restrict",
    "sample",
]


class NothingFits(Exception):
    """The speed stage found no way to train the sampled effective batch and precision:
    ``kind`` is the fault its measurements ended with (oom, compile_error, ...)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Dropped:
    """Values of one knob left out of the search: this device cannot run them, or they do
    nothing for this workload."""

    knob: str
    values: tuple[Any, ...]
    reason: str

    def describe(self) -> str:
        shown = ", ".join(_show(v) for v in self.values)
        return f"{self.knob} {shown}: {self.reason}"


@dataclass(frozen=True)
class Restriction:
    """A spec whose space holds only values this device can run, and what was removed."""

    spec: Spec
    dropped: tuple[Dropped, ...]


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _in_memory_bytes(dataset: Any) -> int | None:
    """Bytes an in-memory data set would occupy on the device; None if it is not in memory."""
    if isinstance(dataset, ImageTensorDataset):
        return dataset.images.nbytes + dataset.labels.nbytes
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        return sum(t.nbytes for t in dataset.tensors)
    return None


def _unsupported(  # noqa: C901
    hardware: Hardware, workload: Workload | None, processes: int = 1
) -> dict[str, Callable[[Any], str | None]]:
    """For each knob with device-dependent values: value -> why it cannot run here, or None.
    ``processes``: those of one trial (workload.gpus_per_trial), each with its DataLoader."""
    where = hardware.device_name

    def precision(value: Any) -> str | None:
        if value == "fp16" and not hardware.fp16:
            return "float16 training is for CUDA GPUs (on a CPU it is only emulated)"
        if value == "tf32" and not hardware.tf32:
            return f"TF32 needs an NVIDIA Ampere or newer GPU, not {where}"
        if value == "fp32-strict" and not hardware.tf32:
            return f"it is fp32 on {where}, which has no TF32 to turn off"
        if value == "bf16" and not hardware.bf16:
            return f"{where} has no bfloat16 support"
        return None

    def compile_mode(value: Any) -> str | None:
        if value == "none":
            return None
        if hardware.compile_problem:
            return hardware.compile_problem
        if value in ("reduce-overhead", "max-autotune") and not hardware.cuda_graphs:
            # without them these modes are default and max-autotune-no-cudagraphs again
            return "CUDA graphs need a CUDA GPU"
        return None

    def pin_memory(value: Any) -> str | None:
        if value and not hardware.is_cuda:
            return "page-locked memory only speeds up copies to a GPU"
        return None

    def cudnn_benchmark(value: Any) -> str | None:
        if value and not hardware.is_cuda:
            return "cuDNN runs on CUDA GPUs only"
        return None

    def data_pipeline(value: Any) -> str | None:
        if value != "device" or workload is None:
            return None
        if workload.collate_fn is not None:
            return "the data function's collate_fn batches samples in a DataLoader"
        size = _in_memory_bytes(workload.train_set)
        if size is None:
            return (
                f"the device pipeline needs the training set in memory as tensors; "
                f"{type(workload.train_set).__name__} loads sample by sample"
            )
        if hardware.memory_bytes is not None and size > DEVICE_DATA_SHARE * hardware.memory_bytes:
            return (
                f"the training set ({size / 2**30:.1f} GiB) would take over "
                f"{DEVICE_DATA_SHARE:.0%} of the GPU's memory"
            )
        return None

    def batch_size(value: Any) -> str | None:
        if workload is None:
            return None
        size = len(workload.train_set)  # type: ignore[arg-type]  # map-style: sized
        share = size // processes  # each process draws its own share of every epoch
        if value <= share:
            return None
        if processes == 1:
            return f"larger than the training set ({size} samples)"
        return (
            f"larger than each of the {processes} processes' share of the training set "
            f"({share} of {size} samples; batch_size is per process)"
        )

    def num_workers(value: Any) -> str | None:
        cores = f"{hardware.cpu_count} core{'' if hardware.cpu_count == 1 else 's'}"
        whose = "this worker's share" if hardware.cpu_share else "this machine"
        if value * processes > WORKERS_PER_CORE * hardware.cpu_count:  # a fork bomb, not a knob
            return f"over {WORKERS_PER_CORE} DataLoader processes a core ({cores}, {whose})"
        if (not hardware.cpu_share and processes == 1) or value * processes <= hardware.cpu_count:
            return None
        if processes > 1:
            return f"{processes} processes' DataLoaders would outnumber the {cores} of {whose}"
        return f"more DataLoader processes than the {cores} of {whose}"

    def channels_last(value: Any) -> str | None:
        if not value or workload is None or len(workload.input_shape) == 3:
            return None
        shape = list(workload.input_shape) if workload.input_shape else "not a tensor"
        return f"it reorders 4-D image batches only; one input here is {shape}"

    return {
        "batch_size": batch_size,
        "channels_last": channels_last,
        "num_workers": num_workers,
        "precision": precision,
        "compile": compile_mode,
        "pin_memory": pin_memory,
        "cudnn_benchmark": cudnn_benchmark,
        "data_pipeline": data_pipeline,
    }


def _room_for_processes(hardware: Hardware, processes: int) -> list[str]:
    """Why this machine cannot train a trial as ``processes`` processes (a GPU each, from the
    study's device on; on a CPU at least a core each), or nothing."""
    if processes == 1:
        return []
    if hardware.is_cuda:
        first = int(hardware.device.split(":")[1])
        visible = hardware.gpu_count - first
        if processes > visible:
            return [
                f"workload.gpus_per_trial: {processes} processes need a GPU each from "
                f"{hardware.device} on; this process sees {visible}"
            ]
        models = sorted(set(hardware.gpu_names[first : first + processes]))
        if len(models) > 1:  # the step waits for the slowest: a trial would time a mixture
            return [
                f"workload.gpus_per_trial: the {processes} GPUs from {hardware.device} on are of "
                f"{len(models)} models ({', '.join(models)}); give a trial GPUs of one model "
                f"(CUDA_VISIBLE_DEVICES, or --gpus)"
            ]
        return []
    if processes <= hardware.cpu_count:
        return []
    whose = "this worker's share of the machine" if hardware.cpu_share else "this machine"
    return [
        f"workload.gpus_per_trial: on a CPU, {processes} processes need a core each; {whose} "
        f"has {hardware.cpu_count}"
    ]


def restrict(spec: Spec, hardware: Hardware, workload: Workload | None = None) -> Restriction:
    """Remove the knob values ``hardware`` (and ``workload``) cannot run: no trial wasted on them.

    Raises SpecError when a knob is left with no value at all (e.g. ``precision: fp16`` on a
    CPU): the user asked for something this machine cannot do.
    """
    updates: dict[str, Choice] = {}
    dropped: list[Dropped] = []
    problems: list[str] = []
    processes = spec.workload.gpus_per_trial
    problems.extend(_room_for_processes(hardware, processes))
    for name, why_not in _unsupported(hardware, workload, processes).items():
        knob = getattr(spec.space, name)
        if not isinstance(knob, Choice):
            continue  # a batch_size range: trials past the data set end as invalid_config
        keep = [v for v in knob.values if why_not(v) is None]
        reasons: dict[str, list[Any]] = {}
        for value in knob.values:
            reason = why_not(value)
            if reason is not None:
                reasons.setdefault(reason, []).append(value)
        if not keep:
            listed = "; ".join(
                f"{', '.join(map(_show, vs))} ({reason})" for reason, vs in reasons.items()
            )
            problems.append(f"space.{name}: no value can run on {hardware.device}: {listed}")
            continue
        if reasons:
            updates[name] = Choice(values=tuple(keep))
            dropped.extend(Dropped(name, tuple(vs), reason) for reason, vs in reasons.items())
    if problems:
        where = str(spec.path) if spec.path else "space"
        raise SpecError([f"{where}: {problem}" for problem in problems])
    restricted = spec.model_copy(
        update={
            "space": spec.space.model_copy(update=updates),
            # the device as resolved ("auto" -> "cpu" or "cuda:0"): what trials will run on
            "workload": spec.workload.model_copy(update={"device": hardware.device}),
        }
    )
    restricted._path, restricted._text = spec.path, spec.text
    return Restriction(spec=restricted, dropped=tuple(dropped))


def _suggest(trial: optuna.Trial, name: str, knob: Knob) -> Any:
    """The value of one knob: fixed values directly, searched ones through Optuna."""
    if isinstance(knob, Choice):
        if knob.is_fixed:
            return knob.values[0]
        return trial.suggest_categorical(name, list(knob.values))
    if knob.is_fixed:
        return knob.low
    if isinstance(knob, IntRange):
        return trial.suggest_int(name, knob.low, knob.high, step=knob.step, log=knob.log)
    assert isinstance(knob, FloatRange)
    return trial.suggest_float(name, knob.low, knob.high, step=knob.step, log=knob.log)


def effective_batch_sizes(spec: Spec) -> list[int]:
    """Every batch_size x accumulation_steps the space offers, ascending (listed values)."""
    sizes = _listed(spec.space.batch_size)
    steps = _listed(spec.space.accumulation_steps)
    return sorted({size * step for size in sizes for step in steps})


def _listed(knob: Knob) -> tuple[Any, ...]:
    if isinstance(knob, Choice):
        return knob.values
    assert isinstance(knob, IntRange) and knob.is_fixed, "two_stage needs listed batch sizes"
    return (knob.low,)


def _execution_from_table(
    trial: optuna.Trial, spec: Spec, pick: Callable[[str], Any], table: SpeedTable
) -> dict[str, Any]:
    """The micro-batch split and execution knobs of a two-stage trial: the speed stage's
    fastest for the sampled effective batch, precision and declared learning knobs."""
    declared = spec.study.learning_knobs
    split_sampled = any(name in declared for name in SPLIT_KNOBS)
    if split_sampled:
        batch_size, accumulation_steps = pick("batch_size"), pick("accumulation_steps")
        effective = batch_size * accumulation_steps
    else:
        # the global batch of a distributed trial is each process's times the processes:
        # that is what the learning rate follows, and what is sampled
        world = spec.workload.gpus_per_trial
        sizes = [size * world for size in effective_batch_sizes(spec)]
        sampled = (
            trial.suggest_categorical("effective_batch_size", sizes)
            if len(sizes) > 1
            else sizes[0]
        )
        effective = sampled // world  # per process: what stage 1 timed
    precision = pick("precision")
    extras = tuple((name, pick(name)) for name in SPEED_KNOBS if name in declared)
    if split_sampled:
        choice = table.exact(batch_size, accumulation_steps, precision, extras)
    else:
        choice = table.fastest(effective, precision, extras)
    if choice is None:
        raise NothingFits(*table.why_not(effective, precision, extras))
    return {"precision": precision, **choice.knobs()}


def sample(
    trial: optuna.Trial, spec: Spec, hardware: Hardware, speed: SpeedTable | None = None
) -> TrialConfig:
    """Draw one configuration from ``spec.space`` (already restricted to ``hardware``); with
    the speed stage's ``speed`` table, only what changes learning is drawn (see the module).
    NothingFits when the table has no way to train what was drawn."""
    space = spec.space

    def pick(name: str) -> Any:
        return _suggest(trial, name, getattr(space, name))

    execution: dict[str, Any] = {}
    if speed is not None:
        execution = _execution_from_table(trial, spec, pick, speed)
        batch_size = execution["batch_size"]
        accumulation_steps = execution["accumulation_steps"]
    else:
        batch_size = pick("batch_size")
        accumulation_steps = pick("accumulation_steps")
    base_lr = pick("lr")
    lr_scaling, base_batch_size = pick("lr_scaling"), pick("base_batch_size")
    optimizer = pick("optimizer")
    momentum = pick("momentum") if optimizer == "sgd" else None
    nesterov = bool(pick("nesterov")) if momentum else False
    if speed is None:
        data_pipeline = pick("data_pipeline")
        dataloader = data_pipeline == "dataloader"  # the loader knobs mean nothing otherwise
        num_workers = pick("num_workers") if dataloader else 0
        execution = {
            "data_pipeline": data_pipeline,
            "num_workers": num_workers,
            "pin_memory": pick("pin_memory") if dataloader else False,
            "prefetch_factor": pick("prefetch_factor") if num_workers > 0 else None,
            "persistent_workers": pick("persistent_workers") if num_workers > 0 else False,
            "precision": pick("precision"),
            "compile": pick("compile"),
            "channels_last": pick("channels_last"),
            "cudnn_benchmark": pick("cudnn_benchmark"),
            **{name: pick(name) for name in DDP_KNOBS},  # one value each without DDP (spec)
        }
    weight_decay = pick("weight_decay")
    schedule, warmup_fraction = pick("schedule"), pick("warmup_fraction")
    world_size = spec.workload.gpus_per_trial  # the global batch is every process's
    return TrialConfig(
        lr=scaled_lr(
            base_lr, batch_size * accumulation_steps * world_size, base_batch_size, lr_scaling
        ),
        base_lr=base_lr,
        lr_scaling=lr_scaling,
        base_batch_size=base_batch_size,
        batch_size=batch_size,
        accumulation_steps=accumulation_steps,
        optimizer=optimizer,
        weight_decay=weight_decay,
        momentum=momentum,
        nesterov=nesterov,
        schedule=schedule,
        warmup_fraction=warmup_fraction,
        num_workers=execution["num_workers"],
        pin_memory=execution["pin_memory"],
        prefetch_factor=execution["prefetch_factor"],
        persistent_workers=execution["persistent_workers"],
        precision=execution["precision"],
        compile=execution["compile"],
        channels_last=execution["channels_last"],
        cudnn_benchmark=execution["cudnn_benchmark"],
        device=hardware.device,
        epochs=spec.workload.epochs,
        eval_every=spec.workload.eval_every,
        val_batch_size=spec.workload.val_batch_size,
        seed=spec.study.seed + trial.number,
        dataloader_timeout=spec.workload.dataloader_timeout,
        data_pipeline=execution["data_pipeline"],
        world_size=world_size,
        **{name: execution[name] for name in DDP_KNOBS},
    )
