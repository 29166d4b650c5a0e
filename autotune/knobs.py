"""The knob registry: every setting a trial can be given, once (``KNOBS``). Everything that lists
knobs derives from it: the space file's ``space`` section (``spec``), sampling and the references
(``space``, ``references``: a loop over it), what stage 1 times (``speed``), what the compiled
graph depends on (``execution``), the speed study's axes, the exported script's constants and the
framework exports (``KnobInfo`` says what an entry holds). What a value means in training
lives in ``semantics``. Nothing here imports autotune or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

Scalar = bool | int | float | str

# the values of the knobs that name a choice: TrialConfig's field types
# fp32: PyTorch's defaults (TF32 convolutions on a GPU); fp32-strict: no TF32 at all; tf32:
# TF32 matmuls too; bf16 and fp16: autocast (fp16 with GradScaler); semantics says how
Precision = Literal["fp32", "fp32-strict", "tf32", "bf16", "fp16"]
CompileMode = Literal[
    "none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
]
OptimizerName = Literal["sgd", "adamw"]
Schedule = Literal["constant", "cosine", "onecycle"]
LrScaling = Literal["none", "linear", "sqrt"]  # how the learning rate follows the batch
DataPipeline = Literal["dataloader", "device"]  # per-sample DataLoader, or batched on the device

# which stage decides a knob in a two-stage study: "split" (the micro-batch split of an effective
# batch), "pipeline" and "compute" (how batches arrive and how the step computes: stage 1 times
# them) or "learning" (stage 2's trials sample it)
Stage = Literal["split", "pipeline", "compute", "learning"]
# a condition on the knobs drawn before: (knob, "==" or ">", value); "world" is the trial's
# processes (workload.gpus_per_trial)
Condition = tuple[str, str, Scalar]


@dataclass(frozen=True)
class KnobInfo:
    """One knob: its value type, default (the untuned value, used when the knob is omitted),
    bounds, stage, and how the rest of the package treats it."""

    kind: Literal["float", "int", "bool", "choice"]
    default: Scalar
    stage: Stage = "learning"
    graph: bool = False  # its value changes the compiled graph of a training step
    script: str = ""  # its constant in the exported script, or where else the script applies it
    choices: tuple[str, ...] = ()
    ge: float | None = None  # inclusive lower bound
    gt: float | None = None  # exclusive lower bound
    lt: float | None = None  # exclusive upper bound
    searchable: bool = True  # False: a setting that takes one value only
    only_when: tuple[Condition, ...] = ()  # sampled only then, else it takes its default
    none_when_off: bool = False  # ... or None, where it means nothing
    # (value, the Hardware flag it needs, why not without it; {device}: the device's name)
    needs: tuple[tuple[Scalar, str, str], ...] = ()
    aliases: tuple[str, ...] = ()  # its names in Lightning, Hugging Face and other tuners

    def applies(self, drawn: Mapping[str, Any]) -> bool:
        """Whether the knob means something, given the values ``drawn`` before it."""
        return all(_holds(drawn.get(name), op, value) for name, op, value in self.only_when)

    def value_off(self) -> Scalar | None:
        """Its value where it does not apply."""
        return None if self.none_when_off else self.default


def _holds(drawn: Any, op: str, value: Scalar) -> bool:
    if drawn is None:
        return False
    return bool(drawn == value if op == "==" else drawn > value)


_DDP: tuple[Condition, ...] = (("world", ">", 1),)  # DDP's settings: several processes
_LOADER: tuple[Condition, ...] = (("data_pipeline", "==", "dataloader"),)
_WORKERS: tuple[Condition, ...] = (("num_workers", ">", 0),)
_SGD: tuple[Condition, ...] = (("optimizer", "==", "sgd"),)
_CUDA = "is_cuda"

KNOBS: dict[str, KnobInfo] = {
    "lr": KnobInfo(
        "float",
        1e-3,
        gt=0,
        script="LEARNING_RATE",
        aliases=("learning_rate", "base_lr"),
    ),
    "lr_scaling": KnobInfo(
        "choice",
        "none",
        choices=get_args(LrScaling),
        searchable=False,
        script="LEARNING_RATE (applied; its comment says how it was scaled)",
    ),
    "base_batch_size": KnobInfo(
        "int",
        256,
        ge=1,
        searchable=False,
        script="LEARNING_RATE (applied; its comment says per how many examples)",
    ),
    "batch_size": KnobInfo(
        "int",
        64,
        ge=1,
        stage="split",
        graph=True,
        script="BATCH_SIZE",
        aliases=("batch", "bs", "micro_batch_size"),
    ),
    "accumulation_steps": KnobInfo(
        "int",
        1,
        ge=1,
        stage="split",
        script="ACCUMULATION_STEPS",
        aliases=("gradient_accumulation_steps", "grad_accum", "accumulate_grad_batches"),
    ),
    "data_pipeline": KnobInfo(
        "choice",
        "dataloader",
        choices=get_args(DataPipeline),
        stage="pipeline",
        script="execution summary; DataLoader or DeviceBatches",
    ),
    "num_workers": KnobInfo(
        "int",
        0,
        ge=0,
        stage="pipeline",
        only_when=_LOADER,
        script="NUM_WORKERS",
        aliases=("workers", "dataloader_num_workers"),
    ),
    "pin_memory": KnobInfo(
        "bool",
        False,
        stage="pipeline",
        only_when=_LOADER,
        needs=((True, _CUDA, "page-locked memory only speeds up copies to a GPU"),),
        script="PIN_MEMORY",
    ),
    "prefetch_factor": KnobInfo(
        "int",
        2,
        ge=1,
        stage="pipeline",
        only_when=_WORKERS,
        none_when_off=True,
        script="PREFETCH_FACTOR",
        aliases=("prefetch",),
    ),
    "persistent_workers": KnobInfo(
        "bool",
        False,
        stage="pipeline",
        only_when=_WORKERS,
        script="PERSISTENT_WORKERS",
    ),
    "precision": KnobInfo(
        "choice",
        "fp32",
        choices=get_args(Precision),
        graph=True,
        needs=(
            ("fp16", "fp16", "float16 training is for CUDA GPUs (on a CPU it is only emulated)"),
            ("tf32", "tf32", "TF32 needs an NVIDIA Ampere or newer GPU, not {device}"),
            ("fp32-strict", "tf32", "it is fp32 on {device}, which has no TF32 to turn off"),
            ("bf16", "bf16", "{device} has no bfloat16 support"),
        ),
        script="PRECISION",  # its TF32 flags; autocast and GradScaler
        aliases=("dtype", "amp", "mixed_precision"),
    ),
    "compile": KnobInfo(
        "choice",
        "none",
        choices=get_args(CompileMode),
        stage="compute",
        graph=True,
        # without CUDA graphs these modes are default and max-autotune-no-cudagraphs again
        needs=(
            ("reduce-overhead", "cuda_graphs", "CUDA graphs need a CUDA GPU"),
            ("max-autotune", "cuda_graphs", "CUDA graphs need a CUDA GPU"),
        ),
        script="execution summary; torch.compile(mode=...)",
        aliases=("torch_compile", "compile_mode"),
    ),
    "optimizer": KnobInfo(
        "choice",
        "adamw",
        choices=get_args(OptimizerName),
        graph=True,
        script="OPTIMIZER",
        aliases=("optim",),
    ),
    "weight_decay": KnobInfo(
        "float",
        0.0,
        ge=0,
        script="WEIGHT_DECAY",
        aliases=("wd",),
    ),
    "momentum": KnobInfo(
        "float",
        0.9,
        ge=0,
        lt=1,
        only_when=_SGD,
        none_when_off=True,
        script="MOMENTUM",
    ),
    "nesterov": KnobInfo(
        "bool",
        False,
        only_when=(*_SGD, ("momentum", ">", 0)),
        script="NESTEROV",
    ),
    "schedule": KnobInfo(
        "choice",
        "constant",
        choices=get_args(Schedule),
        script="SCHEDULE",
        aliases=("scheduler", "lr_schedule", "lr_scheduler"),
    ),
    "warmup_fraction": KnobInfo(
        "float",
        0.0,
        ge=0,
        lt=1,
        script="WARMUP_FRACTION",
        aliases=("warmup", "warmup_ratio"),
    ),
    "channels_last": KnobInfo(
        "bool",
        False,
        stage="compute",
        graph=True,
        script="execution summary; memory_format=torch.channels_last",
        aliases=("memory_format",),
    ),
    "cudnn_benchmark": KnobInfo(
        "bool",
        False,
        stage="compute",
        needs=((True, _CUDA, "cuDNN runs on CUDA GPUs only"),),
        script="CUDNN_BENCHMARK",
        aliases=("benchmark",),
    ),
    # DistributedDataParallel's own settings: a trial of workload.gpus_per_trial > 1 processes
    "ddp_bucket_cap_mb": KnobInfo(
        "int",
        25,
        ge=1,
        stage="compute",
        graph=True,
        only_when=_DDP,
        script="DDP_BUCKET_CAP_MB",
    ),
    "gradient_as_bucket_view": KnobInfo(
        "bool",
        False,
        stage="compute",
        graph=True,
        only_when=_DDP,
        script="GRADIENT_AS_BUCKET_VIEW",
    ),
    "static_graph": KnobInfo(
        "bool",
        False,
        stage="compute",
        graph=True,
        only_when=_DDP,
        script="STATIC_GRAPH",
    ),
}


def as_written(value: Any) -> str:
    """A knob's value as the space file writes it (YAML's ``true``, not Python's ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _named(stage: str) -> tuple[str, ...]:
    return tuple(name for name, info in KNOBS.items() if info.stage == stage)


# the split of an effective batch: speed only, at a fixed effective batch, unless declared
SPLIT_KNOBS = _named("split")
# how batches reach the model: the pipeline and the DataLoader's own knobs
PIPELINE_KNOBS = _named("pipeline")
LOADER_KNOBS = PIPELINE_KNOBS[1:]
# how the step computes (DistributedDataParallel's settings among them)
COMPUTE_KNOBS = _named("compute")
SPEED_KNOBS = (*PIPELINE_KNOBS, *COMPUTE_KNOBS)  # what stage 1 times
DDP_KNOBS = tuple(name for name, info in KNOBS.items() if info.only_when == _DDP)
GRAPH_KNOBS = tuple(name for name, info in KNOBS.items() if info.graph)
CHOICES = {name: info.choices for name, info in KNOBS.items() if info.kind == "choice"}
