"""The search space: hardware filtering of knob values, and trial -> TrialConfig.

This is the only module that calls ``trial.suggest_*``, in one loop over the knob registry
(``draw``). Conditional knobs are sampled only where they mean something (the registry's
``only_when``): ``prefetch_factor`` and ``persistent_workers`` only with DataLoader workers,
``momentum`` only for SGD, ``nesterov`` only with momentum.

A joint study samples every knob. A two-stage study's trials sample what changes learning (the
learning rate, the effective batch, the optimizer and schedule, the precision, and any knob
declared in ``study.learning_knobs``) and take the execution knobs and the micro-batch split
from the speed stage's table (``autotune.speed.SpeedTable``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from torch.utils.data import TensorDataset

from autotune.config import TrialConfig, scaled_lr
from autotune.knobs import KNOBS, SPEED_KNOBS, SPLIT_KNOBS, as_written
from autotune.machine.hardware import Hardware
from autotune.pipeline import ImageTensorDataset
from autotune.spacefile import Choice, IntRange, Knob, Spec, SpecError
from autotune.speed import SpeedChoice, SpeedTable
from autotune.workloads import Workload

DEVICE_DATA_SHARE = 0.5  # the most of a GPU's memory the device pipeline's training set takes
WORKERS_PER_CORE = 4  # DataLoader processes a core may be given (I/O-bound loading: several)
# a knob's value, given its name and its values in the space: Optuna's suggestion in a trial
Pick = Callable[[str, Knob], Any]


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
        shown = ", ".join(as_written(v) for v in self.values)
        return f"{self.knob} {shown}: {self.reason}"


@dataclass(frozen=True)
class Restriction:
    """A spec whose space holds only values this device can run, and what was removed."""

    spec: Spec
    dropped: tuple[Dropped, ...]


@dataclass(frozen=True)
class _Limits:
    """Why a knob's value cannot run here, or None: the hardware it needs (the registry's
    ``needs``) and what the workload allows. ``processes``: those of one trial
    (workload.gpus_per_trial), each with its DataLoader."""

    hardware: Hardware
    workload: Workload | None
    processes: int = 1

    def why_not(self, name: str, value: Any) -> str | None:
        check = getattr(self, f"_{name}", None)
        reason = check(value) if check else None
        for needed, flag, lacking in KNOBS[name].needs:
            if reason is None and value == needed and not getattr(self.hardware, flag):
                reason = lacking.format(device=self.hardware.device_name)
        return reason

    def _compile(self, value: Any) -> str | None:
        return self.hardware.compile_problem if value != "none" else None

    def _data_pipeline(self, value: Any) -> str | None:
        if value != "device" or self.workload is None:
            return None
        if self.workload.collate_fn is not None:
            return "the data function's collate_fn batches samples in a DataLoader"
        data = self.workload.train_set  # its bytes on the device, where it is in memory
        if isinstance(data, ImageTensorDataset):
            size = data.images.nbytes + data.labels.nbytes
        elif isinstance(data, TensorDataset) and len(data.tensors) == 2:
            size = sum(t.nbytes for t in data.tensors)
        else:
            return (
                f"the device pipeline needs the training set in memory as tensors; "
                f"{type(data).__name__} loads sample by sample"
            )
        memory = self.hardware.memory_bytes
        if memory is not None and size > DEVICE_DATA_SHARE * memory:
            return (
                f"the training set ({size / 2**30:.1f} GiB) would take over "
                f"{DEVICE_DATA_SHARE:.0%} of the GPU's memory"
            )
        return None

    def _batch_size(self, value: Any) -> str | None:
        if self.workload is None:
            return None
        size = len(self.workload.train_set)  # type: ignore[arg-type]  # map-style: sized
        share = size // self.processes  # each process draws its own share of every epoch
        if value <= share:
            return None
        if self.processes == 1:
            return f"larger than the training set ({size} samples)"
        return (
            f"larger than each of the {self.processes} processes' share of the training set "
            f"({share} of {size} samples; batch_size is per process)"
        )

    def _num_workers(self, value: Any) -> str | None:
        hardware, processes = self.hardware, self.processes
        cores = f"{hardware.cpu_count} core{'' if hardware.cpu_count == 1 else 's'}"
        whose = "this worker's share" if hardware.cpu_share else "this machine"
        if value * processes > WORKERS_PER_CORE * hardware.cpu_count:  # a fork bomb, not a knob
            return f"over {WORKERS_PER_CORE} DataLoader processes a core ({cores}, {whose})"
        if (not hardware.cpu_share and processes == 1) or value * processes <= hardware.cpu_count:
            return None
        if processes > 1:
            return f"{processes} processes' DataLoaders would outnumber the {cores} of {whose}"
        return f"more DataLoader processes than the {cores} of {whose}"

    def _channels_last(self, value: Any) -> str | None:
        if not value or self.workload is None or len(self.workload.input_shape) == 3:
            return None
        shape = list(self.workload.input_shape) if self.workload.input_shape else "not a tensor"
        return f"it reorders 4-D image batches only; one input here is {shape}"


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
    limits = _Limits(hardware, workload, processes)
    for name, knob in spec.space.knobs():
        if not isinstance(knob, Choice):
            continue  # a batch_size range: trials past the data set end as invalid_config
        keep: list[Any] = []
        reasons: dict[str, list[Any]] = {}
        for value in knob.values:
            reason = limits.why_not(name, value)
            if reason is None:
                keep.append(value)
            else:
                reasons.setdefault(reason, []).append(value)
        if not keep:
            listed = "; ".join(
                f"{', '.join(map(as_written, vs))} ({reason})" for reason, vs in reasons.items()
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


def fixed_value(knob: Knob) -> Any:
    """The one value of a knob the space fixes."""
    return knob.values[0] if isinstance(knob, Choice) else knob.low


def offered(knob: Knob) -> Sequence[Any]:
    """The values a knob offers, in order: a float range's two ends."""
    if isinstance(knob, Choice):
        return knob.values
    if isinstance(knob, IntRange):
        return range(knob.low, knob.high + 1, knob.step)
    return (knob.low, knob.high)


def effective_batch_sizes(spec: Spec) -> list[int]:
    """Every batch_size x accumulation_steps the space offers, ascending."""
    sizes, steps = offered(spec.space.batch_size), offered(spec.space.accumulation_steps)
    return sorted({size * step for size in sizes for step in steps})


def suggestions(trial: optuna.trial.BaseTrial) -> Pick:
    """Each knob's value in ``trial``: a fixed one directly, Optuna's suggestion where the
    space searches it."""

    def pick(name: str, knob: Knob) -> Any:
        if knob.is_fixed:
            return fixed_value(knob)
        if isinstance(knob, Choice):
            return trial.suggest_categorical(name, list(knob.values))
        if isinstance(knob, IntRange):
            return trial.suggest_int(name, knob.low, knob.high, step=knob.step, log=knob.log)
        return trial.suggest_float(name, knob.low, knob.high, step=knob.step, log=knob.log)

    return pick


def sample(trial: optuna.trial.BaseTrial, spec: Spec, hardware: Hardware) -> TrialConfig:
    """Draw one configuration from the whole of ``spec.space`` (already restricted to
    ``hardware``): a joint study's trial."""
    return draw(suggestions(trial), spec, hardware, trial.number)


def runnable_points(
    spec: Spec, table: SpeedTable, fits: Callable[[dict[str, Any]], bool] = lambda knobs: True
) -> tuple[dict[str, Any], ...]:
    """Each split stage 1 found a way to train (``table``'s choices, measured or not) as the
    parameters a two-stage trial suggests for it (``draw_from_table``): the effective batch
    (every process's) or, where the split is a declared learning knob, the batch and its
    accumulation; the precision; the declared learning knobs among the speed knobs. A trial
    whose parameters match none of them ends in NothingFits. ``fits``: whether a split's
    knobs (TrialConfig's fields, with each optimizer the space offers) are below the memory
    walls trials found; a split that fits with some optimizers only names those, one that
    fits with none is left out."""
    split_sampled = any(name in spec.study.learning_knobs for name in SPLIT_KNOBS)
    world = spec.workload.gpus_per_trial
    fixed = {name: fixed_value(knob) for name, knob in spec.space.knobs()}
    optimizers = offered(spec.space.optimizer)

    def point(choice: SpeedChoice) -> dict[str, Any]:
        if split_sampled:
            batch = {
                "batch_size": choice.batch_size,
                "accumulation_steps": choice.accumulation_steps,
            }
        else:
            batch = {"effective_batch_size": choice.effective_batch_size * world}
        return {**batch, "precision": choice.precision, **dict(choice.extras)}

    points: list[dict[str, Any]] = []
    for choice in table:
        knobs = {**fixed, "precision": choice.precision, **dict(choice.extras)}
        knobs.update(choice.knobs(), world_size=world)
        kept = [o for o in optimizers if fits({**knobs, "optimizer": o})]
        if len(kept) == len(optimizers):
            points.append(point(choice))
        else:
            points.extend({**point(choice), "optimizer": o} for o in kept)
    return tuple(points)


def draw_from_table(
    pick: Pick,
    spec: Spec,
    hardware: Hardware,
    table: SpeedTable,
    number: int = 0,
    fits: Callable[[TrialConfig], bool] = lambda config: True,
) -> tuple[TrialConfig, SpeedChoice]:
    """A two-stage trial's configuration: ``pick`` chooses what changes learning (see the
    module); the micro-batch split and execution knobs are the table's choice for the picked
    effective batch, precision and declared learning knobs, returned with the configuration:
    its fastest split that ``fits`` (below the memory walls trials found), else its fastest.
    NothingFits when the table has no way to train what was picked."""
    declared = spec.study.learning_knobs
    split_sampled = any(name in declared for name in SPLIT_KNOBS)
    space = spec.space
    if split_sampled:
        batch_size = pick("batch_size", space.batch_size)
        accumulation_steps = pick("accumulation_steps", space.accumulation_steps)
        effective = batch_size * accumulation_steps
    else:
        # the global batch of a distributed trial is each process's times the processes:
        # that is what the learning rate follows, and what is sampled
        world = spec.workload.gpus_per_trial
        sizes = tuple(size * world for size in effective_batch_sizes(spec))
        effective = pick("effective_batch_size", Choice(values=sizes)) // world  # per process
    precision = pick("precision", space.precision)
    extras = tuple(
        (name, pick(name, getattr(space, name))) for name in SPEED_KNOBS if name in declared
    )
    if split_sampled:
        exact = table.exact(batch_size, accumulation_steps, precision, extras)
        choices = [exact] if exact is not None else []
    else:
        choices = table.ranked(effective, precision, extras)
    if not choices:
        raise NothingFits(*table.why_not(effective, precision, extras))
    # the learning knobs are picked once (a trial's suggestion stands): only the split varies
    drawn = (
        (draw(pick, spec, hardware, number, {"precision": precision, **c.knobs()}), c)
        for c in choices
    )
    fastest = next(drawn)
    return next((d for d in itertools.chain([fastest], drawn) if fits(d[0])), fastest)


def draw(
    pick: Pick,
    spec: Spec,
    hardware: Hardware,
    number: int = 0,
    execution: dict[str, Any] | None = None,
) -> TrialConfig:
    """The configuration ``pick`` chooses, knob by knob in the registry's order: a knob that
    means nothing given those before it (its ``only_when``) is not picked; ``execution``:
    knobs chosen already (``draw_from_table``). ``number``: the trial's, which its seed
    follows. What ``sample`` draws, and the references choose."""
    world = spec.workload.gpus_per_trial  # the global batch is every process's
    drawn: dict[str, Any] = {"world": world, **(execution or {})}
    for name, info in KNOBS.items():
        if name not in drawn:
            applies = info.applies(drawn)
            drawn[name] = pick(name, getattr(spec.space, name)) if applies else info.value_off()
    del drawn["world"]
    effective = drawn["batch_size"] * drawn["accumulation_steps"] * world
    lr = scaled_lr(drawn["lr"], effective, drawn["base_batch_size"], drawn["lr_scaling"])
    return TrialConfig(
        **{**drawn, "lr": lr},
        base_lr=drawn["lr"],
        device=hardware.device,
        epochs=spec.workload.epochs,
        eval_every=spec.workload.eval_every,
        val_batch_size=spec.workload.val_batch_size,
        seed=spec.study.seed + number,
        dataloader_timeout=spec.workload.dataloader_timeout,
        world_size=world,
    )
