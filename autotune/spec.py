"""The space file: frozen pydantic models of ``space.yaml``, and ``load_spec`` with line numbers.

A space file has four sections::

    study:     name, storage, n_trials, timeout, sampler, pruner, seed
    workload:  model, data, epochs per trial, evaluation interval, device
    objective: metric, score, higher_is_better, min_score, target_score, full_run_epochs
    space:     the knobs; each is a fixed scalar, a list (categorical) or {low, high, log, step}

Everything is validated once, here. A problem the user made is reported as one line naming the
file, the line and the key path (``quick.yaml:7: space.lr: low (0.1) is greater than high
(0.001)``), with the closest valid key for a typo. Nothing in this module knows about Optuna.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import keyword
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from autotune.errors import UserError

__all__ = [
    "KNOBS",
    "Choice",
    "ConfirmSpec",
    "FloatRange",
    "IntRange",
    "Knob",
    "KnobInfo",
    "ObjectiveSpec",
    "SpaceSpec",
    "Spec",
    "SpecError",
    "StudySpec",
    "WorkloadSpec",
    "load_spec",
    "parse_spec",
]

DEFAULT_STORAGE = "sqlite:///studies/autotune.db"
# A space file is a page of settings. These bounds keep a hostile or broken one (a YAML "billion
# laughs" of nested aliases, a multi-gigabyte file) from taking the machine's memory and time.
MAX_SPACE_FILE_BYTES = 1_000_000
MAX_SPACE_VALUES = 20_000  # keys, values and items once every alias is expanded

Scalar = bool | int | float | str


class SpecError(UserError):
    """A space file the user has to fix: one formatted line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --------------------------------------------------------------------------------------------
# Knobs: what each searchable setting is, its default and its legal values
# --------------------------------------------------------------------------------------------

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
COMPILE_MODES = (
    "none",
    "default",
    "reduce-overhead",
    "max-autotune",
    "max-autotune-no-cudagraphs",
)
OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("constant", "cosine", "onecycle")
LR_SCALINGS = ("none", "linear", "sqrt")
DATA_PIPELINES = ("dataloader", "device")


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
        "fp32, tf32 (TF32 matmul/cuDNN), bf16 (autocast) or fp16 (autocast + GradScaler)",
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
}


class Choice(_Frozen):
    """A categorical knob; a single value means the knob is fixed and not searched."""

    values: tuple[Scalar, ...]

    @property
    def is_fixed(self) -> bool:
        return len(self.values) == 1


class IntRange(_Frozen):
    """Integers from low to high inclusive, uniformly or log-uniformly."""

    low: int
    high: int
    log: bool = False
    step: int = 1

    @property
    def is_fixed(self) -> bool:
        return self.low == self.high


class FloatRange(_Frozen):
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


def _close(word: str, options: list[str] | tuple[str, ...]) -> str:
    """ "; did you mean 'x'?" for the valid option closest to a misspelt ``word``, else ""."""
    candidates = {option: option for option in options}
    candidates.update({a: k for a, k in _ALIASES.items() if k in candidates})
    match = difflib.get_close_matches(word.lower(), list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{candidates[match[0]]}'?" if match else ""


def _check_scalar(name: str, info: KnobInfo, value: Any) -> Scalar:
    """Return ``value`` converted to the knob's type, or raise ValueError saying why not."""
    if info.kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{value!r} is not true or false")
        return value
    if info.kind == "choice":
        if value is False and "none" in info.choices:
            raise ValueError(f"false is not one of {', '.join(info.choices)} (use none)")
        if not isinstance(value, str) or value not in info.choices:
            hint = _close(str(value), info.choices)
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
                f"unknown key '{key}' in a range{_close(str(key), _RANGE_KEYS)} "
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


class SpaceSpec(_Frozen):
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


class ConfirmSpec(_Frozen):
    """The confirmation round at the end of a study: its leading configurations and the untuned
    baseline trained again side by side, interleaved, so that the answer is not a single noisy
    measurement (``confirm: false`` turns it off)."""

    enabled: bool = True
    top: int = Field(default=3, ge=1)  # the feasible trials with the best values
    repeats: int = Field(default=2, ge=1)  # more runs of each (the trial itself is one more)


class SpeedSpec(_Frozen):
    """Stage 1 of the two-stage search: how each execution configuration is timed."""

    repeats: int = Field(default=2, ge=1)  # measurements of each of a cell's leaders
    bursts: int = Field(default=3, ge=1)  # timed bursts per measurement
    burst_seconds: float = Field(default=0.25, gt=0)  # each burst's target length


STRATEGIES = ("two_stage", "joint")
# knobs that only say how batches are loaded: they never change what is learned
_LOADER_KNOBS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")


class StudySpec(_Frozen):
    """How the search runs: where trials are stored, how many, which sampler and pruner."""

    name: str | None = Field(default=None, min_length=1)  # default: the space file's stem
    storage: str = DEFAULT_STORAGE
    n_trials: int = Field(default=20, ge=1)  # the study's total, not "this many more"
    timeout: float | None = Field(default=None, gt=0)  # seconds for one `autotune run`
    sampler: Literal["tpe", "random"] = "tpe"
    n_startup_trials: int = Field(default=10, ge=0)  # random trials before TPE models the space
    pruner: Literal["hyperband", "median", "successive_halving", "none"] = "hyperband"
    seed: int = 0  # trial k trains with seed + k
    isolation: Literal["worker", "none"] = "worker"  # trials in a supervised worker process
    trial_timeout: float | None = Field(default=None, gt=0)  # seconds; the worker is killed after
    heartbeat_interval: int = Field(default=10, ge=1)  # seconds; a trial silent 3x this is stale
    # trial 0 trains the untuned configuration (PyTorch's defaults where the space allows), so
    # every study says how much faster its answer is; a mapping pins some of its knobs
    baseline: bool | dict[str, Scalar] = True
    confirm: ConfirmSpec = Field(default_factory=ConfirmSpec)
    # two_stage: execution knobs timed first (stage 1), trials only for what changes learning;
    # joint: every knob in one study of training trials
    strategy: Literal["two_stage", "joint"] = "two_stage"
    learning_knobs: tuple[str, ...] = ()  # execution knobs that change learning here: stage 2
    speed: SpeedSpec = Field(default_factory=SpeedSpec)

    @field_validator("learning_knobs")
    @classmethod
    def _learning_knobs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if name not in KNOBS:
                raise ValueError(f"unknown knob '{name}'{_close(name, list(KNOBS))}")
            if name in _LOADER_KNOBS:
                raise ValueError(
                    f"{name} only says how batches are loaded, never what is learned; "
                    f"declare data_pipeline to search the pipeline in stage 2"
                )
        return value

    @field_validator("confirm", mode="before")
    @classmethod
    def _confirm_switch(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value

    @field_validator("baseline")
    @classmethod
    def _baseline_knobs(cls, value: bool | dict[str, Scalar]) -> bool | dict[str, Scalar]:
        if isinstance(value, dict):
            for name in value:
                if name not in KNOBS:
                    raise ValueError(
                        f"unknown knob '{name}' in the baseline{_close(name, list(KNOBS))}"
                    )
        return value


# workload fields added after studies were labelled: left out of the label at their default
_ADDED_LATER: dict[str, dict[str, Any]] = {
    "workload": {"inputs": None, "target": None, "loss": "cross_entropy", "batch_fn": None},
    "objective": {
        "score": "accuracy",
        "higher_is_better": None,
        "min_score": None,
        "target_score": None,
    },
}
LOSSES = ("cross_entropy", "model")  # built-in losses; or the user's package.module:function
# built-in model families, written family:member (torchvision:resnet18); autotune.workloads
# registers one function for each
MODEL_FAMILY_NAMES = ("torchvision",)
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_ENTRY = re.compile(rf"{_DOTTED}(?::{_DOTTED})?", re.ASCII)  # fullmatch: no trailing newline


class WorkloadSpec(_Frozen):
    """What is trained: a model and data set by name or ``package.module:function``."""

    model: str = Field(min_length=1)
    # plain data only (a YAML date is not): written into exported scripts as literals
    model_args: dict[str, JsonValue] = Field(default_factory=dict)
    data: str = Field(min_length=1)
    data_args: dict[str, JsonValue] = Field(default_factory=dict)
    epochs: float = Field(default=2.0, gt=0)  # training epochs per trial
    eval_every: float = Field(default=1.0, gt=0)  # epochs between validation evaluations
    val_batch_size: int = Field(default=1024, ge=1)
    device: str = "auto"  # auto, cpu, cuda or cuda:N
    dataloader_timeout: float = Field(default=0.0, ge=0)  # seconds per batch from a worker; 0: off
    # Where a sample holds the model's inputs and the target (keys of a dict sample, indices of
    # a tuple); None: a pair's 0 and 1, a dict's "labels" (or "label") and its other keys.
    inputs: str | int | list[str | int] | None = None
    target: str | int | None = None
    loss: str = "cross_entropy"  # cross_entropy | model | package.module:function
    # the user's package.module:function(batch) -> (model_args, model_kwargs, target), in
    # place of inputs and target: for batches a key or an index cannot describe
    batch_fn: str | None = None

    @field_validator("model", "data")
    @classmethod
    def _entry(cls, value: str) -> str:
        # a name reaches exported scripts as an import line: only dotted identifiers can
        if not _ENTRY.fullmatch(value):
            raise ValueError(f"'{value}' is neither a built-in name nor 'package.module:function'")
        return value

    @field_validator("model_args", "data_args")
    @classmethod
    def _keyword_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        # passed as keyword arguments, in the study and in exported scripts
        for key in value:
            if not (isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key)):
                raise ValueError(f"{key!r} is not a Python argument name")
        return value

    @field_validator("inputs", "target")
    @classmethod
    def _places(cls, value: Any) -> Any:
        # a key becomes a keyword argument (in the study and in exported scripts)
        for place in value if isinstance(value, list) else [value]:
            if isinstance(place, int) and place < 0:
                raise ValueError(f"{place} is not an index of a sample: use 0, 1, ...")
            if isinstance(place, str) and not (
                place.isidentifier() and not keyword.iskeyword(place)
            ):
                raise ValueError(f"{place!r} is not a key a model can take as an argument")
        if isinstance(value, list) and len(set(map(repr, value))) != len(value):
            raise ValueError("lists a place twice")
        return value

    @field_validator("batch_fn")
    @classmethod
    def _batch_fn(cls, value: str | None) -> str | None:
        if value is not None and not (":" in value and _ENTRY.fullmatch(value)):
            raise ValueError(f"'{value}' is not 'package.module:function'")
        return value

    @model_validator(mode="after")
    def _one_way_to_split(self) -> WorkloadSpec:
        if self.batch_fn is not None and (self.inputs is not None or self.target is not None):
            raise ValueError(
                "batch_fn: it says where the inputs and the target are; leave workload.inputs "
                "and workload.target out"
            )
        return self

    @field_validator("loss")
    @classmethod
    def _loss(cls, value: str) -> str:
        if value not in LOSSES and not (":" in value and _ENTRY.fullmatch(value)):
            raise ValueError(
                f"'{value}' is not a loss: use {', '.join(LOSSES)} or 'package.module:function'"
            )
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not _DEVICE.fullmatch(value):
            raise ValueError(f"'{value}' is not a device: use auto, cpu, cuda or cuda:N")
        return value

    @model_validator(mode="after")
    def _eval_within_trial(self) -> WorkloadSpec:
        if self.eval_every > self.epochs:
            raise ValueError(
                f"eval_every: {self.eval_every:g} epochs is longer than the trial "
                f"(epochs = {self.epochs:g}): no evaluation would run"
            )
        return self

    def user_entry_points(self) -> list[str]:
        """The ``package.module:function`` entries that are the user's code (not autotune's
        built-ins): what building the workload, or running an exported script, imports."""
        family, _, member = self.model.partition(":")
        model_is_builtin = family in MODEL_FAMILY_NAMES and bool(member)
        entries = [self.model] if ":" in self.model and not model_is_builtin else []
        entries += [self.data] if ":" in self.data else []
        entries += [self.loss] if ":" in self.loss else []
        return entries + ([self.batch_fn] if self.batch_fn else [])


# built-in scores: whether higher is better, and the short name per-second values are shown in
SCORES: dict[str, tuple[bool, str]] = {
    "accuracy": (True, "acc"),  # share of target elements predicted right, 0..1
    "top5": (True, "top5"),  # share with the right class among the five highest logits
    "val_loss": (False, "loss"),  # mean validation cross-entropy per target element, nats
    "perplexity": (False, "ppl"),  # exp(val_loss)
}
_ACCURACY_SCORES = ("accuracy", "top5")  # scores in 0..1 that min_/target_accuracy may bound
_PER_SECOND = ("accuracy_per_second", "score_per_second")  # older name first: the same metric
_TIME_TO = ("time_to_accuracy", "time_to_score")


class ObjectiveSpec(_Frozen):
    """What the study optimizes and which trials count as acceptable answers.

    ``score`` is what a trained model is judged by on the validation split: a built-in (see
    ``SCORES``) or the user's ``package.module:function(model, val_loader, device) -> float``.
    ``score_per_second`` (its older name ``accuracy_per_second``) maximizes score / charged
    seconds, for a score where higher is better; ``time_to_score`` (``time_to_accuracy``)
    minimizes the seconds to reach ``target_score`` in the score's direction.
    ``min_accuracy`` and ``target_accuracy`` are the older names of ``min_score`` and
    ``target_score`` for the scores in 0..1 (accuracy, top5).
    """

    metric: Literal[
        "accuracy_per_second", "score_per_second", "time_to_accuracy", "time_to_score"
    ] = "accuracy_per_second"
    score: str = "accuracy"  # a built-in of SCORES, or package.module:function
    higher_is_better: bool | None = None  # None: the built-in's; True for a user's function
    min_score: float | None = None
    target_score: float | None = None
    min_accuracy: float | None = Field(default=None, ge=0, le=1)
    target_accuracy: float | None = Field(default=None, gt=0, le=1)
    full_run_epochs: float | None = Field(default=None, gt=0)

    @field_validator("score")
    @classmethod
    def _score(cls, value: str) -> str:
        if value not in SCORES and not (":" in value and _ENTRY.fullmatch(value)):
            raise ValueError(
                f"'{value}' is not a score: use {', '.join(SCORES)} or 'package.module:function'"
            )
        return value

    @model_validator(mode="after")
    def _metric_settings(self) -> ObjectiveSpec:
        for old, new in (("min_accuracy", "min_score"), ("target_accuracy", "target_score")):
            if getattr(self, old) is not None:
                if getattr(self, new) is not None:
                    raise ValueError(f"{old}: give {new} or {old} (its older name), not both")
                if self.score not in _ACCURACY_SCORES:
                    raise ValueError(
                        f"{old}: bounds an accuracy; for score {self.score} use {new}"
                    )
        builtin = SCORES.get(self.score)
        if builtin is not None and self.higher_is_better not in (None, builtin[0]):
            raise ValueError(
                f"higher_is_better: score {self.score} is "
                f"{'higher' if builtin[0] else 'lower'}-is-better; leave the setting out"
            )
        if not self.per_second:
            if self.target is None:
                needs = "target_accuracy" if self.metric == _TIME_TO[0] else "target_score"
                raise ValueError(f"{needs}: metric {self.metric} needs a target")
            if self.bar is not None:
                raise ValueError(
                    f"{self.bar_name}: does not apply to {self.metric} ({self.target_name} is "
                    f"the bar every answer must reach)"
                )
            if self.full_run_epochs is not None:
                raise ValueError(
                    f"full_run_epochs: applies only to {_PER_SECOND[self.metric == _TIME_TO[1]]} "
                    f"(a run to the target "
                    f"pays its one-time costs once, as the trial does)"
                )
            return self
        if self.target is not None:
            metric = _TIME_TO[0] if self.target_name == "target_accuracy" else _TIME_TO[1]
            raise ValueError(f"{self.target_name}: applies only to metric {metric}")
        if not self.score_higher_is_better:
            raise ValueError(
                f"metric: {self.metric} needs a score where higher is better, and "
                f"{self.score} is lower-is-better: use metric time_to_score with a target_score"
            )
        return self

    @property
    def per_second(self) -> bool:
        """Score per second (maximized), rather than time to a target score (minimized)."""
        return self.metric in _PER_SECOND

    @property
    def direction(self) -> Literal["maximize", "minimize"]:
        return "maximize" if self.per_second else "minimize"

    @property
    def score_higher_is_better(self) -> bool:
        """Whether a higher score is a better model."""
        builtin = SCORES.get(self.score)
        if builtin is not None:
            return builtin[0]
        return True if self.higher_is_better is None else self.higher_is_better

    @property
    def score_name(self) -> str:
        """The score's name in tables and messages: the built-in's, or the function's."""
        return self.score.rpartition(":")[2]

    @property
    def score_short(self) -> str:
        """The score's name in a unit: ``acc`` in ``acc/s``."""
        builtin = SCORES.get(self.score)
        return builtin[1] if builtin is not None else self.score_name

    @property
    def metric_name(self) -> str:
        """The metric named after the score: ``accuracy_per_second``, ``macro_f1_per_second``,
        ``time_to_val_loss``; what the study records and the dashboard shows."""
        if self.per_second:
            return f"{self.score_name}_per_second"
        return f"time_to_{self.score_name}"

    @property
    def bar(self) -> float | None:
        """The least score a per-second answer must reach (``min_score``), or None."""
        return self.min_score if self.min_score is not None else self.min_accuracy

    @property
    def bar_name(self) -> str:
        """The space file's name of ``bar``."""
        return "min_accuracy" if self.min_accuracy is not None else "min_score"

    @property
    def target(self) -> float | None:
        """The score a time-to-target trial must reach (``target_score``), or None."""
        return self.target_score if self.target_score is not None else self.target_accuracy

    @property
    def target_name(self) -> str:
        """The space file's name of ``target``."""
        return "target_accuracy" if self.target_accuracy is not None else "target_score"

    def reaches(self, score: float, bound: float) -> bool:
        """Whether ``score`` is at ``bound`` or better, in the score's direction."""
        return score >= bound if self.score_higher_is_better else score <= bound

    def better(self, score: float, other: float) -> bool:
        """Whether ``score`` is strictly better than ``other``, in the score's direction."""
        return score > other if self.score_higher_is_better else score < other


class Spec(_Frozen):
    """A whole space file, validated."""

    study: StudySpec = Field(default_factory=StudySpec)
    workload: WorkloadSpec
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    space: SpaceSpec = Field(default_factory=SpaceSpec)

    _path: Path | None = PrivateAttr(default=None)
    _text: str = PrivateAttr(default="")

    @model_validator(mode="before")
    @classmethod
    def _joint_for_size_ranges(cls, data: Any) -> Any:
        """A file that names no strategy and gives batch_size or accumulation_steps as a range
        is a joint search: two stages time listed micro-batches only (older files keep
        working, in every command)."""
        if not isinstance(data, dict):
            return data
        study, space = data.get("study") or {}, data.get("space") or {}
        if not isinstance(study, dict) or "strategy" in study or not isinstance(space, dict):
            return data
        for name in ("batch_size", "accumulation_steps"):
            knob = space.get(name)
            if isinstance(knob, dict) and knob.get("low") != knob.get("high", knob.get("low")):
                return {**data, "study": {**study, "strategy": "joint"}}
        return data

    @model_validator(mode="after")
    def _two_stage_sizes(self) -> Spec:
        if self.study.strategy != "two_stage":
            return self
        for name in ("batch_size", "accumulation_steps"):
            knob = getattr(self.space, name)
            if isinstance(knob, IntRange) and not knob.is_fixed:
                raise ValueError(
                    f"space.{name}: study.strategy two_stage times each micro-batch split, so "
                    f"it needs a list of values (e.g. [32, 64, 128]), not a range; or leave "
                    f"the strategy out (a range makes the search joint)"
                )
        return self

    @model_validator(mode="after")
    def _full_run_covers_trial(self) -> Spec:
        full = self.objective.full_run_epochs
        if full is not None and full < self.workload.epochs:
            raise ValueError(
                f"objective.full_run_epochs: {full:g} is shorter than a trial "
                f"(workload.epochs = {self.workload.epochs:g})"
            )
        return self

    @property
    def path(self) -> Path | None:
        """The file this spec was read from, if any."""
        return self._path

    @property
    def text(self) -> str:
        """The space file's text as read."""
        return self._text

    def user_entry_points(self) -> list[str]:
        """The ``package.module:function`` entries that are the user's code: the workload's
        (``WorkloadSpec.user_entry_points``), then the score's."""
        score = [self.objective.score] if ":" in self.objective.score else []
        return self.workload.user_entry_points() + score

    @property
    def study_name(self) -> str:
        """The study name: ``study.name``, else the space file's stem."""
        if self.study.name:
            return self.study.name
        return self._path.stem if self._path else "autotune"

    def search_payload(self, device: str | None = None) -> dict[str, Any]:
        """Everything that defines the search (workload, objective, space), as JSON values.

        ``study`` settings (trial count, timeout, storage, sampler) may change between runs of
        one study; anything here may not, because Optuna cannot mix two searches. The device
        counts by its kind only (cpu, cuda) unless ``device`` replaces it: another GPU index,
        or ``auto`` resolved to the same kind, continues the study.
        """
        payload = self.model_dump(mode="json", include={"workload", "objective", "space"})
        payload["workload"]["device"] = device or payload["workload"]["device"].split(":")[0]
        for section, added in _ADDED_LATER.items():  # studies labelled before they existed
            for key, default in added.items():
                if payload[section].get(key, default) == default:
                    payload[section].pop(key, None)
        return payload

    def search_definition(self) -> str:
        """``search_payload()`` as indented JSON, for the diff of a refused resume."""
        return json.dumps(self.search_payload(), sort_keys=True, indent=1)

    def search_fingerprint(self) -> str:
        """A short hash of ``search_payload()``: equal hashes, the same search."""
        canonical = json.dumps(self.search_payload(), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def with_overrides(self, **sections: dict[str, Any]) -> Spec:
        """A copy with some fields replaced, e.g. ``with_overrides(study={"n_trials": 5})``.

        ``None`` values are ignored. Changed sections are validated again, so an override is
        held to the same rules as the file.
        """
        updated: dict[str, Any] = {}
        try:
            for section, values in sections.items():
                current: BaseModel = getattr(self, section)
                changes = {k: v for k, v in values.items() if v is not None}
                # what the file set, and the overrides: the rest stays a default, so that
                # "was this set?" (model_fields_set) keeps its answer
                merged = {**current.model_dump(exclude_unset=True), **changes}
                updated[section] = type(current).model_validate(merged)
            spec = Spec.model_validate({**dict(self), **updated})
        except ValidationError as err:
            problems = []
            for error in err.errors():
                loc, message = _locate(error)
                where = ".".join(str(part) for part in (section, *loc) if part != "")
                problems.append(_describe(error, (where,), message))
            raise SpecError(problems) from None
        spec._path, spec._text = self._path, self._text
        return spec


# --------------------------------------------------------------------------------------------
# Loading: YAML -> Spec, with every problem reported against the file and line it came from
# --------------------------------------------------------------------------------------------


@dataclass
class _Lines:
    """Line numbers of YAML keys and values by key path, plus duplicate-key problems."""

    by_path: dict[tuple[Any, ...], int] = field(default_factory=dict)
    duplicates: list[tuple[tuple[Any, ...], int, int]] = field(default_factory=list)

    def find(self, loc: tuple[Any, ...]) -> int | None:
        while loc:
            if loc in self.by_path:
                return self.by_path[loc]
            loc = loc[:-1]
        return self.by_path.get((), None)


def _expanded_values(node: yaml.Node, limit: int) -> int:
    """How many nodes ``node`` stands for once aliases are expanded, counting only up to ``limit``.

    Shared (aliased) nodes are sized once and their size reused, so the work is linear in the
    file however far its aliases would expand; a node that contains itself counts as unbounded.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(current: yaml.Node) -> int:
        key = id(current)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:  # an alias to an ancestor: infinitely deep once expanded
            return limit + 1
        open_nodes.add(key)
        total = 1
        if isinstance(current, yaml.MappingNode):
            children = [child for pair in current.value for child in pair]
        elif isinstance(current, yaml.SequenceNode):
            children = list(current.value)
        else:
            children = []
        for child in children:
            total += size(child)
            if total > limit:
                break
        open_nodes.discard(key)
        sizes[key] = min(total, limit + 1)
        return sizes[key]

    return size(node)


def _index_lines(node: yaml.Node | None, path: tuple[Any, ...], lines: _Lines) -> None:
    if node is None:
        return
    lines.by_path.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                lines.duplicates.append(((*path, key), seen[key], line))
            seen[key] = line
            lines.by_path[(*path, key)] = line
            _index_lines(value_node, (*path, key), lines)
            lines.by_path[(*path, key)] = line
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _index_lines(item, (*path, index), lines)


def _dotted(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model found at key path ``loc`` inside ``Spec``, or None."""
    model: type[BaseModel] = Spec
    for part in loc:
        annotation = model.model_fields[part].annotation if part in model.model_fields else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    """The valid keys at ``loc``: a section's fields, or the knob names in ``space``."""
    model = _model_at(loc)
    return [] if model is None else list(model.model_fields)


_KEYED_MESSAGE = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*): (.+)$", re.DOTALL)


def _locate(error: Mapping[str, Any]) -> tuple[tuple[Any, ...], str]:
    """The key path and message of one pydantic error.

    Checks that span several fields (model validators) name their key at the start of the
    message (``"eval_every: ..."``); that key is moved into the path so the line is found.
    """
    loc = tuple(error["loc"])
    if error["type"] == "invalid-json-value":  # (workload, model_args, key, tag, key, tag, ...)
        loc = loc[:3] + loc[4::2]
    message = str(error.get("msg", "")).removeprefix("Value error, ")
    keyed = _KEYED_MESSAGE.match(message)
    if error["type"] == "value_error" and keyed and _model_at(loc) is not None:
        path = tuple(keyed.group(1).split("."))
        if path[0] in _keys_at(loc):
            return (*loc, *path), keyed.group(2)
    return loc, message


def _describe(error: Mapping[str, Any], loc: tuple[Any, ...], message: str) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        key, parent = str(loc[-1]), loc[:-1]
        where = _dotted(parent) if parent else "the space file"
        return f"unknown key '{key}' in {where}{_close(key, _keys_at(parent))}"
    if kind == "missing":
        return f"missing required key '{_dotted(loc)}'"
    if kind == "value_error":
        return f"{_dotted(loc)}: {message}" if loc else message
    if kind == "invalid-json-value":  # a YAML date or timestamp, say
        found = error["input"]
        return (
            f"{_dotted(loc)}: {found} is a {type(found).__name__}, not plain data (a string, "
            f"number, true/false, null, list or mapping); quote it to pass a string"
        )
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"{_dotted(loc)}: must be a mapping of keys to values, got {error['input']!r}"
    message = message.replace("Input should be", "must be").replace("String should", "must")
    return f"{_dotted(loc)}: {message}, got {error['input']!r}"


def _too_large(name: str) -> str:
    return (
        f"{name}: too large for a space file (more than {MAX_SPACE_FILE_BYTES:,} bytes); "
        f"is this the right file?"
    )


def parse_spec(text: str, path: Path | str = "<space>") -> Spec:
    """Parse and validate the text of a space file; raise SpecError listing every problem."""
    name = str(path)
    if len(text) > MAX_SPACE_FILE_BYTES:
        raise SpecError([_too_large(name)])
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None and _expanded_values(node, MAX_SPACE_VALUES) > MAX_SPACE_VALUES:
            raise SpecError(
                [
                    f"{name}: its aliases expand to more than {MAX_SPACE_VALUES:,} values (or to "
                    f"themselves); a space file needs a few dozen, so it was not read further"
                ]
            )
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError([f"{where}: invalid YAML: {problem}"]) from None
    if not isinstance(raw, dict):
        raise SpecError(
            [
                f"{name}: a space file is a mapping with the sections study, workload, "
                f"objective and space; this one is "
                f"{'empty' if raw is None else type(raw).__name__}"
            ]
        )
    lines = _Lines()
    _index_lines(node, (), lines)
    found: list[tuple[int, str]] = [
        (
            second,
            f"duplicate key '{loc[-1]}' in {_dotted(loc[:-1]) or 'the space file'}"
            f" (first at line {first})",
        )
        for loc, first, second in lines.duplicates
    ]
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as err:
        for error in err.errors():
            loc, message = _locate(error)
            found.append((lines.find(loc) or 0, _describe(error, loc, message)))
    else:
        if not found:
            spec._path = Path(path) if not name.startswith("<") else None
            spec._text = text
            return spec
    found.sort(key=lambda problem: problem[0])
    raise SpecError(
        [f"{name}:{line}: {text}" if line else f"{name}: {text}" for line, text in found]
    )


def load_spec(path: Path | str) -> Spec:
    """Read and validate a space file; raise SpecError (one line per problem) when it is bad."""
    file = Path(path)
    try:
        with file.open("rb") as stream:  # bounded: a device or pipe may never end
            data = stream.read(MAX_SPACE_FILE_BYTES + 1)
        if len(data) > MAX_SPACE_FILE_BYTES:
            raise SpecError([_too_large(str(file))])
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise SpecError([f"{file}: no such file"]) from None
    except IsADirectoryError:
        raise SpecError([f"{file}: is a directory, not a space file"]) from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError([f"{file}: cannot read: {err}"]) from None
    return parse_spec(text, file)
