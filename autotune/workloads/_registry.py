"""Name -> model and data-set functions, ``package.module:function`` entries, and the types a
loaded workload is made of."""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from autotune.errors import UserError
from autotune.pipeline import Collate
from autotune.spacefile import WorkloadSpec
from autotune.workloads.batches import BatchLayout, ModelInputs, count_tokens
from autotune.workloads.scoring import LossFn, ScoreFn, cross_entropy_loss

ModelFn = Callable[..., nn.Module]
DataFn = Callable[..., Any]

# The built-ins by name: their functions' "module:name", imported the first time a workload names
# one (digits needs scikit-learn, the image workloads torchvision: seconds of imports that a
# process training a user's model, every worker, need not pay).
DATASETS = {
    "digits": "autotune.workloads.digits:digits",
    "shapes": "autotune.workloads.vision:shapes",
    "cifar10": "autotune.workloads.vision:cifar10",
    "imagefolder": "autotune.workloads.vision:imagefolder",
}
MODELS = {
    "digits_cnn": "autotune.workloads.digits:digits_cnn",
    "mlp": "autotune.workloads.models:mlp",
}
# "family:name" models: the family's function gets the name as its first argument
MODEL_FAMILIES = {"torchvision": "autotune.workloads.vision:torchvision_model"}


class WorkloadError(UserError):
    """A model or data set that cannot be found, imported or built (a user error)."""


@dataclass(frozen=True)
class DataSplits:
    """What a data function returns: a training and a disjoint validation split."""

    train: Dataset
    val: Dataset
    num_classes: int | None = None  # inferred from the data when left out
    collate_fn: Collate | None = None  # how samples become a batch (DataLoader's collate_fn)

    def __iter__(self) -> Iterator[Dataset]:
        """Unpacks as (train, val)."""
        return iter((self.train, self.val))


@dataclass(frozen=True)
class Workload:
    """A resolved workload: the two splits and a factory for a freshly initialised model."""

    name: str  # e.g. "digits_cnn on digits"
    train_set: Dataset
    val_set: Dataset
    num_classes: int | None
    input_shape: tuple[int, ...]  # shape of one input sample, e.g. (1, 8, 8)
    model_fn: Callable[[], nn.Module]
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # what model_fn passes on
    warnings: tuple[str, ...] = ()  # what the check before the study found doubtful, one line each
    layout: BatchLayout = field(default_factory=BatchLayout)  # where inputs and target are
    collate_fn: Collate | None = None  # the data function's, if it gave one
    loss_fn: LossFn = cross_entropy_loss  # (model output, target) -> loss
    score: str = "accuracy"  # objective.score: a built-in's name, or the user's entry
    score_fn: ScoreFn | None = None  # the user's score function; None: the built-in ``score``
    classes_last: bool = False  # its logits hold the classes last ([batch, *d, classes])
    # the user's score of the fresh model on the first validation samples (None: a built-in)
    untrained_score: float | None = None

    def build_model(self) -> nn.Module:
        """A new model with fresh weights (seed torch first for reproducible weights)."""
        return self.model_fn()

    @property
    def counts_tokens(self) -> bool:
        """Whether its inputs are token sequences (throughput is counted in tokens too)."""
        return count_tokens(self.example_batch()[0]) is not None

    def example_batch(self, size: int = 2) -> tuple[ModelInputs, Any]:
        """The first ``size`` training samples as one split batch; torch's random state is left
        as it was (augmentations draw from it)."""
        count = min(size, len(self.train_set))  # type: ignore[arg-type]  # map-style: sized
        collate = self.collate_fn or default_collate
        with torch.random.fork_rng(devices=[]):
            batch = collate([self.train_set[index] for index in range(count)])
        return self.layout.split(batch)


def _import_entry_point(entry: str, what: str, search_dirs: list[Path]) -> Callable[..., Any]:
    module_name, _, attribute = entry.partition(":")
    if not module_name or not attribute:
        raise WorkloadError(f"{what} '{entry}' must look like 'package.module:function'")
    for directory in reversed(search_dirs):
        if str(directory) not in sys.path:
            sys.path.insert(0, str(directory))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            looked = ", ".join(str(d) for d in search_dirs)
            raise WorkloadError(
                f"{what} '{entry}': no module named '{err.name}' (looked in {looked} and the "
                f"installed packages)"
            ) from None
        raise WorkloadError(f"{what} '{entry}': importing {module_name} failed: {err}") from None
    except Exception as err:
        raise WorkloadError(
            f"{what} '{entry}': importing {module_name} raised {type(err).__name__}: {err}"
        ) from None
    fn = module
    for part in attribute.split("."):
        if not hasattr(fn, part):
            names = [name for name in dir(fn) if not name.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            # the file it imported: another module of that name (Python's own `signal` for a
            # user's `signals` mistyped) read as if the user's lacked the function
            where = f" ({module.__file__})" if getattr(module, "__file__", None) else ""
            raise WorkloadError(
                f"{what} '{entry}': {module_name}{where} has no attribute '{attribute}'{hint}"
            )
        fn = getattr(fn, part)
    if not callable(fn):
        raise WorkloadError(f"{what} '{entry}': {attribute} is not callable")
    return fn


def _builtin(entry: str) -> Callable[..., Any]:
    """A built-in's "module:function", imported."""
    return _import_entry_point(entry, "built-in", [])


def _resolve(
    name: str, registry: dict[str, str], what: str, search_dirs: list[Path]
) -> Callable[..., Any]:
    family, _, member = name.partition(":")
    if registry is MODELS and family in MODEL_FAMILIES and member:  # a built-in family:member
        return functools.partial(_builtin(MODEL_FAMILIES[family]), member)
    if ":" in name:
        return _import_entry_point(name, what, search_dirs)
    if name in registry:
        return _builtin(registry[name])
    close = difflib.get_close_matches(name, list(registry), n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    families = [f"{family}:<name>" for family in MODEL_FAMILIES] if registry is MODELS else []
    raise WorkloadError(
        f"unknown {what} '{name}'; {hint}built-in: {', '.join([*sorted(registry), *families])}, "
        f"or your own as 'package.module:function'"
    )


def is_builtin(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is one of autotune's own model or data functions (not the user's code)."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    where = f"{getattr(target, '__module__', '')}:{getattr(target, '__qualname__', '')}"
    return where in (*MODELS.values(), *DATASETS.values(), *MODEL_FAMILIES.values())


def _search_dirs(base_dir: Path | None) -> list[Path]:
    """Where a user's module is looked for: the working directory, then ``base_dir``."""
    here = Path.cwd().resolve()
    return [here] + ([base_dir.resolve()] if base_dir and base_dir.resolve() != here else [])


@contextlib.contextmanager
def set_at(spec: WorkloadSpec, key: str) -> Iterator[None]:
    """A WorkloadError inside led by the space file's line that sets ``key`` (where known)."""
    try:
        yield
    except WorkloadError as err:
        raise WorkloadError(f"{spec.at(key)}{err}") from None


def resolve_model(spec: WorkloadSpec, base_dir: Path | None = None) -> ModelFn:
    """The model function a spec names (imported when it is an entry point)."""
    with set_at(spec, "model"):
        return _resolve(spec.model, MODELS, "model", _search_dirs(base_dir))


def resolve_data(spec: WorkloadSpec, base_dir: Path | None = None) -> DataFn:
    """The data function a spec names (imported when it is an entry point)."""
    with set_at(spec, "data"):
        return _resolve(spec.data, DATASETS, "data set", _search_dirs(base_dir))


def resolve_entry_point(entry: str, what: str, base_dir: Path | None = None) -> Any:
    """The user's ``package.module:function`` (imported), searched as model and data are."""
    return _import_entry_point(entry, what, _search_dirs(base_dir))
