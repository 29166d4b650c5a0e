"""How an exported script gets its data, model, loss and batches: autotune's built-ins pasted
into it, the user's ``package.module:function`` entries imported by name.

A study is read, not run: the user's entries are neither imported nor called here (a study
database someone else wrote could name any function) unless the user asks for the workload to
be rebuilt; what the script needs from them (the model's arguments) was recorded when the study
was created.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from pydantic import ValidationError

from autotune.export._api import ExportError, space_file_dir
from autotune.export._bundle import Import, bundle, call, entry_point, literal
from autotune.pipeline import (
    device_train_batches,
    device_val_batches,
    train_batches,
    val_batches,
)
from autotune.spacefile import Spec, WorkloadSpec, error_line
from autotune.study import StudyRecord
from autotune.workloads import WorkloadError, model_kwargs, resolve_data, resolve_model
from autotune.workloads import load as load_workload
from autotune.workloads.batches import BatchLayout


@dataclass
class _WorkloadCode:
    """How the script gets its data and model: pasted built-ins or imported entry points."""

    builtins: list[Any] = field(default_factory=list)  # functions and classes to paste
    # the user's top-level modules and the folders the study found them in, in the order placed
    modules: dict[str, str] = field(default_factory=dict)
    script_dir: Path | None = None  # where the script is written, when known
    search_dir: Path | None = None  # the space file's folder, where the study looked first

    def module_entries(self) -> list[tuple[str, str, str]]:
        """Python literals (module, its folder relative to the script or "", the folder where
        the study found it) of each module the script looks for: beside itself, then at the
        study's place relative to the script (when the script's folder is known), then there."""
        entries = []
        for module, folder in self.modules.items():
            relative = ""
            if self.script_dir is not None:
                relative = os.path.relpath(Path(folder).resolve(), self.script_dir.resolve())
            entries.append((literal(module), literal(relative), literal(folder)))
        return entries

    def imported(self, entry: str) -> tuple[str, str]:
        """(import line, the name it imports) of the user's ``entry``; the script looks for
        its module where the study found it (an installed one, by name)."""
        import_line, expression, directory = entry_point(entry, self.search_dir)
        module = entry.partition(":")[0].split(".")[0]
        if directory and module not in self.modules:
            self.modules[module] = directory
        return import_line, expression


def workload_code(
    study: optuna.Study, spec: Spec, device_pipeline: bool, rebuild: bool, script_dir: Path | None
) -> tuple[set[Import], dict[str, Any]]:
    """The imports the script's workload code needs, and the template fields that place it
    (the user's entries imported and called only when ``rebuild``: see the module's docstring)."""
    workload, score = spec.workload, spec.objective.score
    record = StudyRecord.of(study)
    search_dir = space_file_dir(record)
    base_dir = Path(search_dir) if search_dir else None
    user_code = workload.user_entry_points()
    by_name = bool(user_code) and not rebuild  # the user's entries placed, never imported
    recorded: dict[str, Any] = {}
    if by_name:
        if record.model_kwargs is None:
            raise ExportError(
                f"study '{study.study_name}' did not record its model's arguments (it is older, "
                f"or they are not plain data); exporting it means importing and running "
                f"{' and '.join(user_code)}: add --rebuild-workload if you trust this study"
            )
        recorded = _checked_model_kwargs(study.study_name, workload, record.model_kwargs)
    code = _WorkloadCode(script_dir=script_dir, search_dir=base_dir)
    fields: dict[str, Any] = {}
    for key, name, resolve in (
        ("data", workload.data, resolve_data),
        ("model", workload.model, resolve_model),
    ):
        kwargs = recorded if key == "model" else dict(workload.data_args)
        fn: Callable[..., Any] | None = None  # the user's entry by name: never imported
        placed: tuple[str | None, str | None]
        if not (by_name and name in user_code):
            try:
                fn = resolve(workload, base_dir)
                if key == "model" and not by_name:
                    kwargs = _model_kwargs(workload, fn, record, base_dir)
            except WorkloadError as err:
                raise ExportError(f"cannot export the workload: {err}") from None
        if fn is not None and (":" not in name or isinstance(fn, functools.partial)):
            builtin = fn.func if isinstance(fn, functools.partial) else fn  # pasted
            code.builtins.append(builtin)
            args = fn.args if isinstance(fn, functools.partial) else ()
            placed = None, call(builtin.__name__, kwargs, args)
        else:
            import_line, expression = code.imported(name)
            placed = import_line, call(expression, kwargs)
        fields[f"{key}_import"], fields[f"{key}_call"] = placed
    # the user's loss, score and batch_fn, each (import line, name); a built-in (None, None):
    # the template writes it
    for key, entry in (("loss", workload.loss), ("score", score), ("batch_fn", workload.batch_fn)):
        placed = code.imported(entry) if entry and ":" in entry else (None, None)
        fields[f"{key}_import"], fields[f"{key}_function"] = placed
    # the trials' own loaders, pasted in the bundle that may paste the pipeline's data sets
    # (each definition once)
    if device_pipeline:
        code.builtins += [device_train_batches, device_val_batches]
    else:
        code.builtins += [train_batches, val_batches]
    sources, imports = bundle(code.builtins)
    modules = code.module_entries()
    if modules:
        imports |= {Import("sys"), Import("importlib.util")}
    return imports, {**fields, "workload_modules": modules, "workload_sources": sources}


def _model_kwargs(
    workload: WorkloadSpec,
    model_fn: Callable[..., Any],
    record: StudyRecord,
    base_dir: Path | None,
) -> dict[str, Any]:
    """The model function's arguments, from the classes and input shape the study recorded
    (read off the data for studies made before these were stored)."""
    num_classes, input_shape = record.num_classes, record.input_shape
    if num_classes is None and input_shape is None:
        loaded = load_workload(workload, base_dir)
        num_classes, input_shape = loaded.num_classes, list(loaded.input_shape)
    args = dict(workload.model_args)
    return model_kwargs(model_fn, args, num_classes, tuple(input_shape or ()))


def recorded_layout(study: optuna.Study) -> BatchLayout:
    """Where the study's batches hold the inputs and the target, as it recorded them."""
    try:
        return BatchLayout.from_record(StudyRecord.of(study).batch_layout)
    except (KeyError, TypeError, ValueError):
        raise ExportError(
            f"study '{study.study_name}' records a batch layout no space file could give "
            f"(batch_layout); was its database edited?"
        ) from None


def split_return(layout: BatchLayout) -> str:
    """The expression ``split`` returns for ``layout``: (positional inputs, keyword inputs,
    target) of ``batch``, every key and index a literal."""

    def at(place: str | int) -> str:
        return f"batch[{literal(place)}]"

    target = layout.target
    if layout.is_dict:
        if layout.inputs is None:
            kwargs = (
                "dict(batch)"
                if layout.target_to_model
                else f"{{key: value for key, value in batch.items() if key != {literal(target)}}}"
            )
        else:
            keys = [*layout.inputs, *([target] if layout.target_to_model else [])]
            kwargs = "{" + ", ".join(f"{literal(k)}: {at(k)}" for k in keys) + "}"
        return f"(), {kwargs}, {at(target)}"
    places = [*(layout.inputs or ()), *([target] if layout.target_to_model else [])]
    args = ", ".join(at(i) for i in places) + ("," if len(places) == 1 else "")
    return f"({args}), {{}}, {at(target)}"


def _checked_model_kwargs(
    study_name: str, workload: WorkloadSpec, recorded: Any
) -> dict[str, Any]:
    """The model arguments a study recorded, if the space file's checks accept them as
    ``model_args`` (keyword names, plain values): a study database is data that anyone may have
    edited, and these are written into the script as code (``Model(name=value)``)."""
    try:
        checked = WorkloadSpec.model_validate({**workload.model_dump(), "model_args": recorded})
    except ValidationError as err:
        raise ExportError(
            f"study '{study_name}' records model arguments that no space file could hold "
            f"({error_line(err.errors()[0])}); was its database edited?"
        ) from None
    return dict(checked.model_args)
