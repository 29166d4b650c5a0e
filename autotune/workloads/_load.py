"""Building the workload a space file names: data loaded, model built and run once on real
batches; what goes wrong is the user's to fix, one WorkloadError line naming the entry."""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from autotune.spacefile import SCORES, WorkloadSpec
from autotune.workloads._check import (
    WorkloadNames,
    batch_of,
    check,
    check_labels,
    read_sample,
    split_batch,
    user_frame,
)
from autotune.workloads._classes import count_classes
from autotune.workloads._registry import (
    DataSplits,
    ModelFn,
    Workload,
    WorkloadError,
    is_builtin,
    resolve_data,
    resolve_entry_point,
    resolve_model,
    set_at,
)
from autotune.workloads.batches import BatchLayout, LayoutError, ModelInputs
from autotune.workloads.scoring import (
    LossFn,
    cross_entropy_classes_last,
    cross_entropy_loss,
    model_loss,
)


def call_entry(
    fn: Callable[..., Any], kwargs: dict[str, Any], what: str, entry: str, where: str = ""
) -> Any:
    """``fn(**kwargs)``, the workload's ``what`` named ``entry``; WorkloadError when it cannot
    be called (led by ``where``, the space file's line of the arguments, and naming the
    parameter a misspelt argument meant) or raises."""
    try:
        signature = inspect.signature(fn)
        signature.bind(**kwargs)
    except ValueError:  # no signature (a builtin): just call it
        pass
    except TypeError as err:
        given = ", ".join(kwargs) or "no arguments"
        raise WorkloadError(
            f"{where}{what} '{entry}' cannot be called with {given}: {err}"
            f"{_meant(signature, kwargs)}"
        ) from None
    try:
        return fn(**kwargs)
    except WorkloadError:
        raise
    except Exception as err:
        if not is_builtin(fn):  # the user's code: the error as it is, and where it was raised
            raise WorkloadError(
                f"{what} '{entry}' raised {type(err).__name__}: {err}{user_frame(err)}"
            ) from None
        if isinstance(err, FileNotFoundError | NotADirectoryError | ValueError):
            raise WorkloadError(f"{what} '{entry}': {err}") from None  # a data set not there
        raise  # autotune's own function failing: a bug, its traceback helps


def _meant(signature: inspect.Signature, kwargs: dict[str, Any]) -> str:
    """ "; did you mean 'layers'?" for a keyword ``kwargs`` gives that no parameter takes, where
    one is close, else ""."""
    takes = [name for name, p in signature.parameters.items() if p.kind != p.VAR_POSITIONAL]
    for name in kwargs:
        if name not in takes:
            close = difflib.get_close_matches(name, takes, n=1, cutoff=0.6)
            if close:
                return f"; did you mean '{close[0]}'?"
    return ""


def model_kwargs(
    fn: ModelFn, args: dict[str, Any], num_classes: int | None, input_shape: tuple[int, ...]
) -> dict[str, Any]:
    """``args`` (model_args), plus ``num_classes`` and ``input_shape`` where the model function
    declares them (``num_classes`` None: the function's default stands)."""
    try:
        parameters = inspect.signature(fn).parameters
    except ValueError:
        return dict(args)
    kwargs = dict(args)
    declared = parameters.get("num_classes")
    if declared is not None and "num_classes" not in kwargs:
        if num_classes is not None:
            kwargs["num_classes"] = num_classes
        elif declared.default is inspect.Parameter.empty:
            raise WorkloadError(
                "the model needs num_classes and the data set does not say how many classes "
                "it has: set workload.model_args.num_classes (or give the model function's "
                "num_classes a default)"
            )
        # else the data set does not say, and the function's own default stands
    if "input_shape" in parameters and "input_shape" not in kwargs:
        kwargs["input_shape"] = input_shape
    return kwargs


def _defined_at(fn: Callable[..., Any]) -> str:
    """`` (defined at path:line)`` for the user's function, as a raised error's line is said;
    empty for autotune's own, or where Python cannot tell."""
    try:
        path, line = inspect.getsourcefile(fn), inspect.getsourcelines(fn)[1]
    except (TypeError, OSError):
        return ""
    return f" (defined at {path}:{line})" if path and not is_builtin(fn) else ""


def _splits(spec: WorkloadSpec, data_fn: Callable[..., Any]) -> DataSplits:
    """The training and validation splits the spec's data function returns, checked map-style
    and not empty."""
    where = spec.at("data_args")
    splits = call_entry(data_fn, dict(spec.data_args), "data set", spec.data, where)
    if isinstance(splits, tuple | list) and len(splits) == 2:
        splits = DataSplits(train=splits[0], val=splits[1])
    if not isinstance(splits, DataSplits):
        raise WorkloadError(
            f"data set '{spec.data}'{_defined_at(data_fn)} returned {type(splits).__name__}; it "
            f"must return (train_dataset, val_dataset) or autotune.workloads.DataSplits"
        )
    for split_name, split in (("training", splits.train), ("validation", splits.val)):
        columns: Sequence[Any] = split if isinstance(split, tuple | list) else ()
        kinds: set[str | None] = {_array_kind(column) for column in columns}
        if len(kinds) == 1 and None not in kinds:  # (x, y): arrays, not samples
            kind = kinds.pop()
            wrapped = "x, y" if kind == "tensors" else "torch.as_tensor(x), torch.as_tensor(y)"
            raise WorkloadError(
                f"data set '{spec.data}'{_defined_at(data_fn)}: the {split_name} split is a "
                f"{type(split).__name__} of {len(columns)} {kind}, not a Dataset of samples: wrap "
                f"them in TensorDataset({wrapped}) (torch.utils.data), whose samples are "
                f"(input, label) pairs"
            )
        if not hasattr(split, "__getitem__") or not hasattr(split, "__len__"):
            raise WorkloadError(
                f"data set '{spec.data}': the {split_name} split is not a map-style Dataset "
                f"(it needs __getitem__ and __len__)"
            )
        if len(split) == 0:
            raise WorkloadError(f"data set '{spec.data}': the {split_name} split is empty")
    return splits


def _array_kind(value: Any) -> str | None:
    """ "tensors" or "numpy arrays" for a whole column of a data set, else None."""
    if isinstance(value, torch.Tensor):
        return "tensors"
    return (
        "numpy arrays" if type(value).__module__ == "numpy" and hasattr(value, "shape") else None
    )


def _first_sample(
    spec: WorkloadSpec, splits: DataSplits, base_dir: Path | None
) -> tuple[BatchLayout, ModelInputs, Any]:
    """How a batch splits into inputs and target, and the first training sample's (inputs,
    label) as the trials' DataLoaders see them: collated into a batch of one (numpy values
    become tensors), each tensor's batch dimension dropped."""
    sample = read_sample(splits.train, "training", spec.data)
    if spec.batch_fn is not None:  # the user's function splits batches
        with set_at(spec, "batch_fn"):
            batch_fn = resolve_entry_point(spec.batch_fn, "batch_fn", base_dir)
        layout = BatchLayout(batch_fn=batch_fn, batch_fn_name=spec.batch_fn)
    else:
        try:
            layout = BatchLayout.of(sample, spec.inputs, spec.target, spec.loss == "model")
        except LayoutError as error:
            raise WorkloadError(f"data set '{spec.data}': {error}") from None
    inputs, label = split_batch(layout, batch_of([sample], splits.collate_fn, spec.data))
    return layout, *tree_map_only(torch.Tensor, lambda tensor: tensor[0], (inputs, label))


def load(spec: WorkloadSpec, base_dir: Path | None = None, score: str = "accuracy") -> Workload:
    """Build the workload a spec names, judged by ``score`` (objective.score), checked on real
    batches; entries imported from the working directory, then ``base_dir`` (the space file's)."""
    data_fn = resolve_data(spec, base_dir)
    model_fn = resolve_model(spec, base_dir)
    splits = _splits(spec, data_fn)
    layout, inputs, label = _first_sample(spec, splits, base_dir)
    with set_at(spec, "loss"):
        loss_fn = loss_function(spec.loss, base_dir)
    score_fn = None if score in SCORES else resolve_entry_point(score, "score", base_dir)
    classifies = score_fn is None or loss_fn is cross_entropy_loss
    if classifies:  # before num_classes is looked for: say what is wrong
        check_labels(label, spec.data, spec.loss, score)
    only = inputs.args[0] if len(inputs.args) == 1 and not inputs.kwargs else None
    input_shape = tuple(only.shape) if isinstance(only, torch.Tensor) else ()
    given = spec.model_args.get("num_classes")
    num_classes = count_classes(splits, layout, spec.data, given)

    kwargs = model_kwargs(model_fn, dict(spec.model_args), num_classes, input_shape)
    model = call_entry(model_fn, kwargs, "model", spec.model, spec.at("model_args"))
    if not isinstance(model, nn.Module):
        raise WorkloadError(
            f"model '{spec.model}' returned {type(model).__name__}, not a torch.nn.Module"
        )
    names = WorkloadNames(spec.model, spec.data, spec.loss, score, spec.class_dim)
    checked = check(model, splits, layout, loss_fn, score_fn, num_classes, names)
    if checked.classes_last and loss_fn is cross_entropy_loss:
        loss_fn = cross_entropy_classes_last
    del model
    return Workload(
        name=f"{spec.model} on {spec.data}",
        train_set=splits.train,
        val_set=splits.val,
        num_classes=num_classes,
        input_shape=input_shape,
        model_fn=functools.partial(model_fn, **kwargs),
        model_kwargs=kwargs,
        warnings=checked.warnings,
        layout=layout,
        loss_fn=loss_fn,
        collate_fn=splits.collate_fn,
        score=score,
        score_fn=score_fn,
        classes_last=checked.classes_last,
        untrained_score=checked.untrained_score,
    )


def loss_function(name: str, base_dir: Path | None = None, classes_last: bool = False) -> LossFn:
    """The loss ``workload.loss`` names: cross-entropy (classes last when ``classes_last``), the
    model's own, or the user's ``package.module:function``."""
    if name == "cross_entropy":
        return cross_entropy_classes_last if classes_last else cross_entropy_loss
    if name == "model":
        return model_loss
    return resolve_entry_point(name, "loss", base_dir)
