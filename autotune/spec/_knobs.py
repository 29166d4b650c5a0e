"""The knobs of a space file: the registry (``KNOBS``) of every searchable setting, its
default and legal values; the shapes a knob takes (``Choice``, ``IntRange``, ``FloatRange``) and
how its YAML value is read into one; the ``space`` section (``SpaceSpec``); and the base the
package's models share (``Frozen``, ``SpecError``, ``Scalar``)."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, field_validator

from autotune.config import (
    CompileMode,
    DataPipeline,
    LrScaling,
    OptimizerName,
    Precision,
    Schedule,
)
from autotune.errors import UserError

Scalar = bool | int | float | str


class SpecError(UserError):
    """A space file the user has to fix: one formatted line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --------------------------------------------------------------------------------------------
# Knobs: what each searchable setting is, its default and its legal values
# --------------------------------------------------------------------------------------------

# the legal values of the knobs that name a choice: TrialConfig's Literal types
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
COMPILE_MODES: tuple[CompileMode, ...] = get_args(CompileMode)
OPTIMIZERS: tuple[OptimizerName, ...] = get_args(OptimizerName)
SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)
LR_SCALINGS: tuple[LrScaling, ...] = get_args(LrScaling)
DATA_PIPELINES: tuple[DataPipeline, ...] = get_args(DataPipeline)


@dataclass(frozen=True)
class KnobInfo:
    """What one knob is: its value type, default (used when the knob is omitted) and bounds."""

    kind: Literal["float", "int", "bool", "choice"]
    default: Scalar
    doc: str
    choices: tuple[str, ...] = ()
    ge: float | None = None  # inclusive lower bound
    gt: float | None = None  # exclusive lower bound
    lt: float | None = None  # exclusive upper bound
    searchable: bool = True  # False: a setting that takes one value only
    only_when: str = ""  # the condition under which it is sampled, for the reference


_DDP = "gpus_per_trial > 1"  # when DDP's settings are sampled

KNOBS: dict[str, KnobInfo] = {
    "lr": KnobInfo(
        "float", 1e-3, "learning rate per base_batch_size examples (see lr_scaling)", gt=0
    ),
    "lr_scaling": KnobInfo(
        "choice",
        "none",
        "how lr grows with the effective batch: none, linear (Goyal et al.) or sqrt",
        choices=LR_SCALINGS,
        searchable=False,
    ),
    "base_batch_size": KnobInfo(
        "int", 256, "the effective batch size at which lr applies unscaled", ge=1, searchable=False
    ),
    "batch_size": KnobInfo("int", 64, "samples per micro-batch (per forward pass)", ge=1),
    "accumulation_steps": KnobInfo(
        "int", 1, "micro-batches per optimizer step; effective batch = batch_size x this", ge=1
    ),
    "data_pipeline": KnobInfo(
        "choice",
        "dataloader",
        "dataloader: per-sample loading in DataLoader workers; device: the training set in "
        "device memory, batches augmented in bulk",
        choices=DATA_PIPELINES,
    ),
    "num_workers": KnobInfo(
        "int",
        0,
        "DataLoader worker processes (0: load in-process)",
        ge=0,
        only_when="data_pipeline == dataloader",
    ),
    "pin_memory": KnobInfo(
        "bool",
        False,
        "page-locked host batches for faster GPU copies",
        only_when="data_pipeline == dataloader",
    ),
    "prefetch_factor": KnobInfo(
        "int", 2, "batches each worker loads ahead", ge=1, only_when="num_workers > 0"
    ),
    "persistent_workers": KnobInfo(
        "bool", False, "keep workers alive between epochs", only_when="num_workers > 0"
    ),
    "precision": KnobInfo(
        "choice",
        "fp32",
        "fp32 (PyTorch's defaults: TF32 cuDNN convolutions on Ampere+), fp32-strict (no "
        "TF32), tf32 (TF32 matmul/cuDNN), bf16 (autocast) or fp16 (autocast + GradScaler)",
        choices=PRECISIONS,
    ),
    "compile": KnobInfo(
        "choice", "none", "torch.compile mode, or none for eager", choices=COMPILE_MODES
    ),
    "optimizer": KnobInfo("choice", "adamw", "sgd or adamw", choices=OPTIMIZERS),
    "weight_decay": KnobInfo("float", 0.0, "decoupled (adamw) or L2 (sgd) weight decay", ge=0),
    "momentum": KnobInfo("float", 0.9, "SGD momentum", ge=0, lt=1, only_when="optimizer == sgd"),
    "nesterov": KnobInfo(
        "bool", False, "Nesterov momentum", only_when="optimizer == sgd and momentum > 0"
    ),
    "schedule": KnobInfo(
        "choice",
        "constant",
        "learning-rate schedule over the trial's optimizer steps",
        choices=SCHEDULES,
    ),
    "warmup_fraction": KnobInfo(
        "float",
        0.0,
        "fraction of optimizer steps with linear warm-up (onecycle: its rising phase, 0.3 if 0)",
        ge=0,
        lt=1,
    ),
    "channels_last": KnobInfo("bool", False, "NHWC memory format for 4-D inputs and the model"),
    "cudnn_benchmark": KnobInfo("bool", False, "let cuDNN time its algorithms per input shape"),
    # DistributedDataParallel's own settings: a trial of workload.gpus_per_trial > 1 processes
    "ddp_bucket_cap_mb": KnobInfo(
        "int", 25, "MiB of gradients DDP all-reduces at once", ge=1, only_when=_DDP
    ),
    "gradient_as_bucket_view": KnobInfo(
        "bool", False, "DDP gradients as views into its buckets (no copy)", only_when=_DDP
    ),
    "static_graph": KnobInfo(
        "bool", False, "tell DDP every step uses the same parameters", only_when=_DDP
    ),
}
DDP_KNOBS = ("ddp_bucket_cap_mb", "gradient_as_bucket_view", "static_graph")


def knobs_for(world_size: int) -> list[str]:
    """The knobs that mean something to a trial of ``world_size`` processes, in ``KNOBS`` order
    (DDP's settings only to several): what a configuration is shown with."""
    return [name for name in KNOBS if world_size > 1 or name not in DDP_KNOBS]


class Choice(Frozen):
    """A categorical knob; a single value means the knob is fixed and not searched."""

    values: tuple[Scalar, ...]

    @property
    def is_fixed(self) -> bool:
        return len(self.values) == 1


class IntRange(Frozen):
    """Integers from low to high inclusive, uniformly or log-uniformly."""

    low: int
    high: int
    log: bool = False
    step: int = 1

    @property
    def is_fixed(self) -> bool:
        return self.low == self.high


class FloatRange(Frozen):
    """Reals from low to high, uniformly, log-uniformly, or on a grid of ``step``."""

    low: float
    high: float
    log: bool = False
    step: float | None = None

    @property
    def is_fixed(self) -> bool:
        return self.low == self.high


Knob = Choice | IntRange | FloatRange


# Names people use for a knob elsewhere (other tuners, Lightning, Hugging Face), for did-you-mean.
_ALIASES = {
    "learning_rate": "lr",
    "base_lr": "lr",
    "batch": "batch_size",
    "bs": "batch_size",
    "micro_batch_size": "batch_size",
    "gradient_accumulation_steps": "accumulation_steps",
    "grad_accum": "accumulation_steps",
    "accumulate_grad_batches": "accumulation_steps",
    "workers": "num_workers",
    "dataloader_num_workers": "num_workers",
    "prefetch": "prefetch_factor",
    "dtype": "precision",
    "amp": "precision",
    "mixed_precision": "precision",
    "torch_compile": "compile",
    "compile_mode": "compile",
    "optim": "optimizer",
    "wd": "weight_decay",
    "scheduler": "schedule",
    "lr_schedule": "schedule",
    "lr_scheduler": "schedule",
    "warmup": "warmup_fraction",
    "warmup_ratio": "warmup_fraction",
    "memory_format": "channels_last",
    "benchmark": "cudnn_benchmark",
    "epochs_per_trial": "epochs",
    "trials": "n_trials",
}


def did_you_mean(word: str, options: list[str] | tuple[str, ...]) -> str:
    """ "; did you mean 'x'?" for the valid option closest to a misspelt ``word``, else ""."""
    candidates = {option: option for option in options}
    candidates.update({a: k for a, k in _ALIASES.items() if k in candidates})
    match = difflib.get_close_matches(word.lower(), list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{candidates[match[0]]}'?" if match else ""


def _check_scalar(name: str, info: KnobInfo, value: Any) -> Scalar:  # noqa: C901, PLR0912
    """Return ``value`` converted to the knob's type, or raise ValueError saying why not."""
    if info.kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{value!r} is not true or false")
        return value
    if info.kind == "choice":
        if value is False and "none" in info.choices:
            raise ValueError(f"false is not one of {', '.join(info.choices)} (use none)")
        if not isinstance(value, str) or value not in info.choices:
            hint = did_you_mean(str(value), info.choices)
            raise ValueError(f"{value!r} is not one of {', '.join(info.choices)}{hint}")
        return value
    number: int | float
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    if info.kind == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise ValueError(f"{value!r} is not an integer")
        number = value
    else:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a number") from None
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite number")
        number = float(value)
    if info.ge is not None and number < info.ge:
        raise ValueError(f"{number!r} is too small: must be >= {info.ge:g}")
    if info.gt is not None and number <= info.gt:
        raise ValueError(f"{number!r} is too small: must be > {info.gt:g}")
    if info.lt is not None and number >= info.lt:
        raise ValueError(f"{number!r} is too large: must be < {info.lt:g}")
    return number


_RANGE_KEYS = ("low", "high", "log", "step")


def _parse_range(name: str, info: KnobInfo, raw: dict[str, Any]) -> IntRange | FloatRange:
    if info.kind not in ("int", "float"):
        raise ValueError(
            f"a range {{low, high}} only works for numeric knobs; list the values instead "
            f"(e.g. [{', '.join(map(str, info.choices or ('false', 'true')))}])"
        )
    for key in raw:
        if key not in _RANGE_KEYS:
            raise ValueError(
                f"unknown key '{key}' in a range{did_you_mean(str(key), _RANGE_KEYS)} "
                f"(a range has low, high, log, step)"
            )
    missing = [k for k in ("low", "high") if k not in raw]
    if missing:
        raise ValueError(f"a range needs both low and high (missing {' and '.join(missing)})")
    low = _check_scalar(name, info, raw["low"])
    high = _check_scalar(name, info, raw["high"])
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise ValueError(f"log must be true or false, not {log!r}")
    if low > high:  # type: ignore[operator]  # both numbers: _check_scalar checked the kind
        raise ValueError(f"low ({low}) is greater than high ({high})")
    if log and low <= 0:  # type: ignore[operator]  # a number, as above
        raise ValueError(f"a log range needs low > 0, got low = {low}")
    step = raw.get("step")
    if step is not None:
        if log and (info.kind != "int" or step != 1):  # an int log range steps by 1 anyway
            raise ValueError("a range cannot have both log and step")
        if isinstance(step, bool) or not isinstance(step, int | float) or step <= 0:
            raise ValueError(f"step must be a positive number, not {step!r}")
        if info.kind == "int" and not float(step).is_integer():
            raise ValueError(f"step of an integer knob must be an integer, not {step!r}")
    if info.kind == "int":
        return IntRange(low=int(low), high=int(high), log=log, step=int(step or 1))
    return FloatRange(low=float(low), high=float(high), log=log, step=step)


def _parse_knob(name: str, raw: Any) -> Knob:
    """Turn the YAML value of one knob (scalar, list or range mapping) into a Knob."""
    if isinstance(raw, Choice | IntRange | FloatRange):
        return raw
    info = KNOBS[name]
    if isinstance(raw, dict):
        if not info.searchable:
            raise ValueError("this is a setting, not a searchable knob: give one value")
        return _parse_range(name, info, raw)
    if isinstance(raw, list | tuple):
        if not raw:
            raise ValueError("empty list: give at least one value")
        if not info.searchable and len(raw) > 1:
            raise ValueError("this is a setting, not a searchable knob: give one value")
        values = []
        for position, item in enumerate(raw):
            try:
                values.append(_check_scalar(name, info, item))
            except ValueError as err:
                raise ValueError(f"item {position + 1}: {err}") from None
        duplicates = sorted({str(v) for v in values if values.count(v) > 1})
        if duplicates:
            raise ValueError(f"{', '.join(duplicates)} listed more than once")
        return Choice(values=tuple(values))
    if raw is None:
        raise ValueError("no value given (leave the key out to use the default)")
    return Choice(values=(_check_scalar(name, info, raw),))


def _default(name: str) -> Choice:
    return Choice(values=(KNOBS[name].default,))


class SpaceSpec(Frozen):
    """The knobs. Omitted knobs are fixed at their documented default (``KNOBS``)."""

    lr: Knob = _default("lr")
    lr_scaling: Knob = _default("lr_scaling")
    base_batch_size: Knob = _default("base_batch_size")
    batch_size: Knob = _default("batch_size")
    accumulation_steps: Knob = _default("accumulation_steps")
    data_pipeline: Knob = _default("data_pipeline")
    num_workers: Knob = _default("num_workers")
    pin_memory: Knob = _default("pin_memory")
    prefetch_factor: Knob = _default("prefetch_factor")
    persistent_workers: Knob = _default("persistent_workers")
    precision: Knob = _default("precision")
    compile: Knob = _default("compile")
    optimizer: Knob = _default("optimizer")
    weight_decay: Knob = _default("weight_decay")
    momentum: Knob = _default("momentum")
    nesterov: Knob = _default("nesterov")
    schedule: Knob = _default("schedule")
    warmup_fraction: Knob = _default("warmup_fraction")
    channels_last: Knob = _default("channels_last")
    cudnn_benchmark: Knob = _default("cudnn_benchmark")
    ddp_bucket_cap_mb: Knob = _default("ddp_bucket_cap_mb")
    gradient_as_bucket_view: Knob = _default("gradient_as_bucket_view")
    static_graph: Knob = _default("static_graph")

    @field_validator("*", mode="before")
    @classmethod
    def _knob(cls, raw: Any, info: Any) -> Knob:
        return _parse_knob(info.field_name, raw)

    def knobs(self) -> Iterator[tuple[str, Knob]]:
        """(name, knob) for every knob, in the order of ``KNOBS``."""
        for name in KNOBS:
            yield name, getattr(self, name)

    def searched(self) -> list[str]:
        """Names of the knobs that take more than one value."""
        return [name for name, knob in self.knobs() if not knob.is_fixed]


assert set(SpaceSpec.model_fields) == set(KNOBS), "SpaceSpec and KNOBS must list the same knobs"
