"""A space file's ``workload`` section (``WorkloadSpec``): the model, data, loss and batch
function by built-in name or ``package.module:function``, their arguments, and the names the
section accepts (``LOSSES``, ``MODEL_FAMILY_NAMES``)."""

from __future__ import annotations

import keyword
import re
from typing import Any, Literal

from pydantic import Field, JsonValue, PrivateAttr, field_validator, model_validator

from autotune.spacefile._knobs import Frozen

LOSSES = ("cross_entropy", "model")  # built-in losses; or the user's package.module:function
# built-in model families, written family:member (torchvision:resnet18); autotune.workloads
# registers one function for each
MODEL_FAMILY_NAMES = ("torchvision",)
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
ENTRY_POINT = re.compile(rf"{_DOTTED}(?::{_DOTTED})?", re.ASCII)  # fullmatch: no trailing newline


def _is_function(value: str) -> bool:  # package.module:function
    return ":" in value and ENTRY_POINT.fullmatch(value) is not None


def is_argument_name(key: object) -> bool:
    """Whether ``key`` can be written as ``key=`` in a call: an identifier, not a keyword."""
    return isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key)


def builtin_or_function(value: str, builtins: tuple[str, ...], what: str) -> str:
    if value not in builtins and not _is_function(value):
        raise ValueError(
            f"'{value}' is not a {what}: use {', '.join(builtins)} or 'package.module:function'"
        )
    return value


class WorkloadSpec(Frozen):
    """What is trained: a model and data set by name or ``package.module:function``."""

    model: str = Field(min_length=1)
    # plain data only (a YAML date is not): written into exported scripts as literals
    model_args: dict[str, JsonValue] = Field(default_factory=dict)
    data: str = Field(min_length=1)
    data_args: dict[str, JsonValue] = Field(default_factory=dict)
    epochs: float = Field(default=2.0, gt=0, le=100_000)  # training epochs per trial
    eval_every: float = Field(default=1.0, gt=0)  # epochs between validation evaluations
    val_batch_size: int = Field(default=1024, ge=1)
    device: str = "auto"  # auto, cpu, cuda or cuda:N
    dataloader_timeout: float = Field(default=0.0, ge=0)  # seconds per batch from a worker; 0: off
    # processes that train one trial together under DistributedDataParallel: a GPU each, or on
    # a CPU an equal share of the cores each (gloo); 1: no DDP
    gpus_per_trial: int = Field(default=1, ge=1, le=64)
    # Where a sample holds the model's inputs and the target (keys of a dict sample, indices of
    # a tuple); None: a pair's 0 and 1, a dict's "labels" (or "label") and its other keys.
    inputs: str | int | list[str | int] | None = None
    target: str | int | None = None
    loss: str = "cross_entropy"  # cross_entropy | model | package.module:function
    # where the model's logits hold the classes: 1 ([batch, classes, ...]) or -1 ([batch, ...,
    # classes]); None: read from the shapes, refused where both fit (a [B, n, n] language model)
    class_dim: Literal[1, -1] | None = None
    # the user's package.module:function(batch) -> (model_args, model_kwargs, target), in
    # place of inputs and target: for batches a key or an index cannot describe
    batch_fn: str | None = None
    _lines: dict[str, str] = PrivateAttr(default_factory=dict)  # key -> "space.yaml:2"

    @field_validator("model", "data")
    @classmethod
    def _entry(cls, value: str) -> str:
        # a name reaches exported scripts as an import line: only dotted identifiers can
        if not ENTRY_POINT.fullmatch(value):
            raise ValueError(f"'{value}' is neither a built-in name nor 'package.module:function'")
        return value

    @field_validator("model_args", "data_args")
    @classmethod
    def _keyword_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not is_argument_name(key):
                raise ValueError(f"{key!r} is not a Python argument name")
        return value

    @field_validator("inputs", "target")
    @classmethod
    def _places(cls, value: Any) -> Any:
        for place in value if isinstance(value, list) else [value]:
            if isinstance(place, int) and place < 0:
                raise ValueError(f"{place} is not an index of a sample: use 0, 1, ...")
            if isinstance(place, str) and not is_argument_name(place):
                raise ValueError(f"{place!r} is not a key a model can take as an argument")
        if isinstance(value, list) and len(set(map(repr, value))) != len(value):
            raise ValueError("lists a place twice")
        return value

    @field_validator("batch_fn")
    @classmethod
    def _batch_fn(cls, value: str | None) -> str | None:
        if value is not None and not _is_function(value):
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
        return builtin_or_function(value, LOSSES, "loss")

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

    def at(self, key: str) -> str:
        """``space.yaml:2: ``: where the space file this spec was read from sets ``key`` (empty
        when it was not read from a file, or does not set it)."""
        return f"{self._lines[key]}: " if key in self._lines else ""

    def user_entry_points(self) -> list[str]:
        """The ``package.module:function`` entries that are the user's code (not autotune's
        built-ins): what building the workload, or running an exported script, imports."""
        builtin = self.model.partition(":")[0] in MODEL_FAMILY_NAMES  # torchvision:resnet18
        entries = ([] if builtin else [self.model]) + [self.data, self.loss, self.batch_fn or ""]
        return [entry for entry in entries if ":" in entry]
