"""TrialConfig: one complete, concrete training configuration, the only thing training sees."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from autotune.knobs import (
    CHOICES,
    CompileMode,
    DataPipeline,
    LrScaling,
    OptimizerName,
    Precision,
    Schedule,
)


def scaled_lr(base_lr: float, effective_batch_size: int, base_batch_size: int, rule: str) -> float:
    """The learning rate applied at ``effective_batch_size`` under a scaling rule: ``base_lr``
    is the rate for ``base_batch_size`` examples per optimizer step; ``linear`` scales it in
    proportion to the batch (Goyal et al., 2017), ``sqrt`` by the square root."""
    ratio = effective_batch_size / base_batch_size
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    if rule == "none":
        return base_lr
    raise ValueError(f"unknown lr_scaling rule {rule!r}")


@dataclass(frozen=True)
class TrialConfig:
    """Every setting of one trial, after sampling, scaling and hardware filtering."""

    # optimization
    lr: float  # applied learning rate, after lr_scaling
    base_lr: float  # learning rate per base_batch_size examples, as sampled
    lr_scaling: LrScaling
    base_batch_size: int
    batch_size: int  # samples per micro-batch
    accumulation_steps: int  # micro-batches per optimizer step
    optimizer: OptimizerName
    weight_decay: float
    momentum: float | None  # SGD only
    nesterov: bool  # SGD only
    schedule: Schedule
    warmup_fraction: float  # fraction of optimizer steps spent warming up
    # data loading
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None  # only with num_workers > 0
    persistent_workers: bool
    # execution
    precision: Precision
    compile: CompileMode
    channels_last: bool
    cudnn_benchmark: bool
    # the run
    device: str  # cpu | cuda:N
    epochs: float  # training epochs of this trial
    eval_every: float  # epochs between evaluations
    val_batch_size: int
    seed: int
    # settings added later keep a default, so that older exports still load
    dataloader_timeout: float = 0.0  # seconds to wait for a batch from a worker; 0: forever
    data_pipeline: DataPipeline = "dataloader"
    # a distributed trial: world_size processes (DDP ranks, a GPU each, or a share of the cores),
    # each training batch_size samples per micro-batch; DDP's settings below mean nothing at 1
    world_size: int = 1
    ddp_bucket_cap_mb: int = 25  # MiB of gradients all-reduced together (DDP's default)
    gradient_as_bucket_view: bool = False  # gradients are views into the buckets: no copy
    static_graph: bool = False  # the same parameters are used in every step

    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer step, over every process: batch_size x accumulation_steps x
        world_size (the global batch the learning rate is scaled for)."""
        return self.batch_size * self.accumulation_steps * self.world_size

    @property
    def distributed(self) -> bool:
        """Whether the trial trains as several processes under torch.distributed."""
        return self.world_size > 1

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able mapping of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialConfig:
        """Inverse of ``to_dict``; a missing or unknown key is a ValueError naming it."""
        fields = dataclasses.fields(cls)
        names = {f.name for f in fields}
        required = {f.name for f in fields if f.default is dataclasses.MISSING}
        unknown = sorted(set(data) - names)
        missing = sorted(required - set(data))
        if unknown or missing:
            parts = [f"unknown keys {', '.join(unknown)}"] if unknown else []
            parts += [f"missing keys {', '.join(missing)}"] if missing else []
            raise ValueError(f"not a trial configuration: {'; '.join(parts)}")
        for name, allowed in CHOICES.items():
            if name in data and data[name] not in allowed:
                raise ValueError(
                    f"not a trial configuration: {name} {data[name]!r} is none of "
                    f"{', '.join(allowed)}"
                )
        return cls(**data)

    def replace(self, **changes: Any) -> TrialConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)
