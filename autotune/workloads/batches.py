"""Where a batch holds the model's inputs and the target (``BatchLayout``: a pair, a longer tuple,
a dict such as a Hugging Face tokenizer's, or the user's ``batch_fn``), and how the model is
called with them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.utils._pytree import tree_leaves, tree_map_only

DICT_TARGETS = ("labels", "label")  # a dict sample's target when none is declared


class ModelInputs(NamedTuple):
    """What the model is called with: ``model(*args, **kwargs)``. A named tuple, so that torch's
    tree utilities (device copies, pinning) reach every tensor inside."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def call_model(model: torch.nn.Module, inputs: ModelInputs | torch.Tensor) -> Any:
    """The model's output for ``inputs`` (a lone tensor is the one positional argument)."""
    if isinstance(inputs, ModelInputs):
        return model(*inputs.args, **inputs.kwargs)
    return model(inputs)


def to_device(tree: Any, device: torch.device, channels_last: bool = False) -> Any:
    """Every tensor in ``tree`` (tuples, lists, dicts, named tuples of them) on ``device``,
    asynchronously from pinned memory; with ``channels_last``, 4-D floating-point tensors (image
    batches) in NHWC memory format."""

    def move(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.to(device, non_blocking=True)
        if channels_last and tensor.dim() == 4 and tensor.is_floating_point():
            tensor = tensor.contiguous(memory_format=torch.channels_last)
        return tensor

    # the common batches, tensors and model inputs of tensors: no tree walked at every step
    if isinstance(tree, torch.Tensor):
        return move(tree)
    if isinstance(tree, ModelInputs) and _flat(tree):
        return ModelInputs(
            tuple(move(arg) for arg in tree.args),
            {key: move(value) for key, value in tree.kwargs.items()},
        )
    return tree_map_only(torch.Tensor, move, tree)


def _flat(inputs: ModelInputs) -> bool:
    """Whether every argument of ``inputs`` is a tensor (none a container of them)."""
    return all(isinstance(arg, torch.Tensor) for arg in inputs.args) and all(
        isinstance(value, torch.Tensor) for value in inputs.kwargs.values()
    )


def count_samples(target: Any) -> int:
    """Samples in a batch: the first dimension of its target's first tensor."""
    leaves = [leaf for leaf in tree_leaves(target) if isinstance(leaf, torch.Tensor)]
    return int(leaves[0].shape[0]) if leaves and leaves[0].dim() else 1


def count_tokens(inputs: ModelInputs) -> torch.Tensor | int | None:
    """The tokens a batch of token sequences holds, nothing read back from the device: the ones
    of its ``attention_mask`` (a device tensor), else every id of its ``input_ids`` or of a lone
    2-D integer input (an int); None for inputs that are not token sequences."""
    mask = inputs.kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        return mask.sum()
    ids = inputs.kwargs.get("input_ids")
    if ids is None and len(inputs.args) == 1 and not inputs.kwargs:
        ids = inputs.args[0]
    if isinstance(ids, torch.Tensor) and ids.dim() == 2 and is_integer(ids):
        return ids.numel()
    return None


def is_integer(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds integers (class indices, token ids): not float, complex or bool."""
    return (
        not tensor.is_floating_point() and not tensor.is_complex() and tensor.dtype != torch.bool
    )


Place = str | int
# the user's batch_fn: batch -> (positional model inputs, keyword model inputs, target)
BatchFn = Callable[[Any], Any]


class LayoutError(ValueError):
    """A sample that does not hold what the layout names (the message says what it holds)."""


class BatchError(TypeError):
    """The user's batch_fn raised (``__cause__``) or returned no (args, kwargs, target)."""


def _user_split(fn: BatchFn, name: str, batch: Any) -> tuple[ModelInputs, Any]:
    try:
        split = fn(batch)
    except Exception as error:
        raise BatchError(f"batch_fn '{name}' raised {type(error).__name__}: {error}") from error
    if not (isinstance(split, tuple | list) and len(split) == 3):
        raise BatchError(
            f"batch_fn '{name}' returned {type(split).__name__}"
            + (f" of {len(split)}" if isinstance(split, tuple | list) else "")
            + "; it must return (model_args, model_kwargs, target)"
        )
    args, kwargs, target = split
    if not isinstance(args, tuple | list) or not isinstance(kwargs, Mapping):
        raise BatchError(
            f"batch_fn '{name}' returned ({type(args).__name__}, {type(kwargs).__name__}, "
            f"...); model_args must be a tuple or list, model_kwargs a dict"
        )
    return ModelInputs(tuple(args), {str(k): v for k, v in kwargs.items()}), target


@dataclass(frozen=True)
class BatchLayout:
    """Where the inputs and the target are in a sample, and so in a batch: ``inputs`` are
    indices of a tuple sample (passed positionally) or keys of a dict sample (as keywords;
    ``None``: every key but the target's); ``target`` is one index or key; with
    ``target_to_model`` the target is passed to the model too (as Hugging Face models take
    their labels). A ``batch_fn`` (the user's) replaces all three: it splits a batch itself."""

    inputs: tuple[Place, ...] | None = (0,)
    target: Place = 1
    target_to_model: bool = False
    batch_fn: BatchFn | None = None
    batch_fn_name: str | None = None  # its package.module:function

    @property
    def is_pair(self) -> bool:
        """The plain ``(input, label)`` layout: the model gets the input alone."""
        return (
            self.inputs == (0,)
            and self.target == 1
            and not self.target_to_model
            and self.batch_fn_name is None
        )

    @property
    def is_dict(self) -> bool:
        """Whether the samples are dicts (their inputs and target found by key)."""
        return self.inputs is None or any(isinstance(p, str) for p in (*self.inputs, self.target))

    def to_record(self) -> dict[str, Any]:
        """The layout as JSON values, for a study to record."""
        inputs = None if self.inputs is None else list(self.inputs)
        record = {"inputs": inputs, "target": self.target, "target_to_model": self.target_to_model}
        return record | ({"batch_fn": self.batch_fn_name} if self.batch_fn_name else {})

    @classmethod
    def from_record(cls, record: dict[str, Any] | None) -> BatchLayout:
        """The layout a study recorded (a pair's when it predates layouts); ValueError or
        KeyError for a record that is not one."""
        if record is None:
            return cls()
        inputs, target, to_model = record["inputs"], record["target"], record["target_to_model"]
        places = [target, *(inputs if isinstance(inputs, list) else [])]
        name = record.get("batch_fn")
        if (
            not (inputs is None or isinstance(inputs, list))
            or not all(isinstance(p, str | int) and not isinstance(p, bool) for p in places)
            or not isinstance(to_model, bool)
            or not (name is None or isinstance(name, str))
        ):
            raise ValueError(f"not a batch layout: {record!r}")
        return cls(None if inputs is None else tuple(inputs), target, to_model, None, name)

    def split(self, batch: Any) -> tuple[ModelInputs, Any]:
        """(model inputs, target) of a sample or batch (a batch only, with a batch_fn)."""
        if self.batch_fn is not None:
            return _user_split(self.batch_fn, self.batch_fn_name or "batch_fn", batch)
        if isinstance(batch, Mapping):
            keys = self.inputs if self.inputs is not None else tuple(batch)
            kwargs = {str(k): batch[k] for k in keys if k != self.target}
            if self.target_to_model:
                kwargs[str(self.target)] = batch[self.target]
            return ModelInputs((), kwargs), batch[self.target]
        args = tuple(batch[i] for i in self.inputs or ())
        if self.target_to_model:
            args += (batch[self.target],)
        return ModelInputs(args, {}), batch[self.target]

    @classmethod
    def of(
        cls,
        sample: Any,
        inputs: Place | list[Place] | None,
        target: Place | None,
        target_to_model: bool,
    ) -> BatchLayout:
        """The layout of ``sample`` given what the space file declares (defaults: a pair's, or a
        dict's ``labels``); LayoutError naming what the sample holds when it has no such place."""
        listed = (
            None if inputs is None else tuple(inputs if isinstance(inputs, list) else [inputs])
        )
        if isinstance(sample, Mapping):
            keys = list(sample)
            if target is None:
                target = next((key for key in DICT_TARGETS if key in sample), None)
                if target is None:
                    raise LayoutError(
                        f"a sample is a dict of {_listed(keys)} with no 'labels' or 'label': "
                        f"set workload.target to the key of the target"
                    )
            wanted = [target, *(listed or ())]
            missing = [place for place in wanted if place not in sample]
            if missing:
                raise LayoutError(
                    f"a sample has no key {_listed(missing)}; it has {_listed(keys)}"
                )
            return cls(listed, target, target_to_model)
        if isinstance(sample, Sequence) and not isinstance(sample, str | bytes):
            size = len(sample)
            if size < 2:
                raise LayoutError(
                    f"a sample is a {type(sample).__name__} of {size}: it holds no target; it "
                    f"must be an (input, label) pair, a longer tuple, or a dict"
                )
            if target is None and listed is None and size != 2:
                raise LayoutError(
                    f"a sample is a {type(sample).__name__} of {size}: set workload.target (and "
                    f"workload.inputs) to the indices of the target and the inputs"
                )
            target = 1 if target is None else target
            listed = listed if listed is not None else tuple(i for i in range(size) if i != target)
            wanted = [target, *listed]
            bad = [place for place in wanted if not isinstance(place, int) or place >= size]
            if bad:
                raise LayoutError(
                    f"a sample is a {type(sample).__name__} of {size}: {_listed(bad)} is not "
                    f"an index of it (0 to {size - 1})"
                )
            return cls(listed, target, target_to_model)
        tensor = isinstance(sample, torch.Tensor)
        pairs = "; wrap inputs and labels in TensorDataset(x, y)" if tensor else ""
        raise LayoutError(
            f"a sample is a {type(sample).__name__}; it must be a tuple (such as (input, label)) "
            f"or a dict (such as {{'input_ids': ..., 'labels': ...}}){pairs}"
        )


def _listed(places: Sequence[Any]) -> str:
    return ", ".join(repr(place) for place in places)
