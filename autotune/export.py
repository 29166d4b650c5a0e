"""Export the winning configuration: a standalone training script, YAML/JSON, or Python objects.

autotune export --study quickstart -o train.py           # a script that imports no autotune
autotune export --study quickstart --format yaml -o best.yaml

import autotune
best = autotune.load_best("quickstart")                  # a BestConfig
loader = best.make_loader(train_set)
steps_per_epoch = len(loader) // best.config.accumulation_steps  # optimizer steps
trainer = best.make_trainer(model, total_steps=epochs * steps_per_epoch)
"""

from __future__ import annotations

import ast
import datetime
import functools
import inspect
import json
import os
import sys
import sysconfig
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState
from torch import nn
from torch.utils.data import DataLoader, Dataset

import autotune
from autotune.config import TrialConfig
from autotune.spec import DEFAULT_STORAGE, Spec, SpecError, WorkloadSpec, parse_spec
from autotune.study import StudyError, best_trial, load_study
from autotune.trainer import (
    LossFn,
    Trainer,
    _set_backend_flags,
    make_train_loader,
    make_val_loader,
)
from autotune.workloads import WorkloadError, model_kwargs, resolve_data, resolve_model
from autotune.workloads import load as load_workload
from autotune.workloads.vision import DeviceBatches

__all__ = [
    "FORMATS",
    "BestConfig",
    "ExportError",
    "best_config",
    "load_best",
    "load_config",
    "render",
    "render_script",
    "select_trial",
    "write_new_file",
]

FORMATS = ("script", "yaml", "json")
EXPORT_FORMAT_VERSION = 1
METRIC_KEYS = (
    "accuracy",
    "charged_seconds",
    "train_seconds",
    "overhead_seconds",
    "samples_per_second",
    "effective_batch_size",
    "peak_memory_bytes",
    "epochs_trained",
    "compile_seconds",
    "bottleneck",
    "data_wait_fraction",
    "achieved_flops",
    "mfu",
    "gpu_utilization",
    "device_name",
    "torch_version",
)


class ExportError(Exception):
    """A configuration that cannot be exported as asked (a user error): one line."""


# ---------------------------------------------------------------------------------------------
# The best configuration as data, and as building blocks for a user's own training loop
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BestConfig:
    """A study's chosen trial: its full configuration, where it came from, what it measured."""

    study: str
    trial: int
    metric: str
    value: float
    config: TrialConfig
    params: dict[str, Any] = field(default_factory=dict)  # the searched knobs' values
    metrics: dict[str, Any] = field(default_factory=dict)  # accuracy, samples_per_second, ...
    full_run_epochs: float | None = None  # objective.full_run_epochs, if the space file set it
    workload: dict[str, Any] = field(default_factory=dict)  # the space file's workload section

    @property
    def epochs(self) -> int:
        """Epochs of the full run: objective.full_run_epochs, else the trials' epochs."""
        return max(1, round(self.full_run_epochs or self.config.epochs))

    def to_dict(self) -> dict[str, Any]:
        """Plain data: what ``autotune best --json`` prints and the YAML/JSON export holds."""
        return {
            "autotune_export": EXPORT_FORMAT_VERSION,
            "study": self.study,
            "trial": self.trial,
            "metric": self.metric,
            "value": self.value,
            "params": dict(self.params),
            "config": self.config.to_dict(),
            "metrics": dict(self.metrics),
            "full_run_epochs": self.full_run_epochs,
            "workload": dict(self.workload),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BestConfig:
        """Inverse of ``to_dict``; ValueError saying what is wrong with ``data``."""
        if not isinstance(data, dict) or "config" not in data or "study" not in data:
            raise ValueError("not an autotune export (it has no study and config)")
        return cls(
            study=str(data["study"]),
            trial=int(data["trial"]),
            metric=str(data["metric"]),
            value=float(data["value"]),
            config=TrialConfig.from_dict(dict(data["config"])),
            params=dict(data.get("params") or {}),
            metrics=dict(data.get("metrics") or {}),
            full_run_epochs=data.get("full_run_epochs"),
            workload=dict(data.get("workload") or {}),
        )

    def make_loader(self, dataset: Dataset, seed: int | None = None) -> DataLoader:
        """A shuffled training DataLoader with the tuned batch size and loader knobs."""
        return make_train_loader(dataset, self.config, self.config.seed if seed is None else seed)

    def make_val_loader(self, dataset: Dataset) -> DataLoader:
        """An in-order validation DataLoader."""
        return make_val_loader(dataset, self.config)

    def make_trainer(
        self, model: nn.Module, total_steps: int, loss_fn: LossFn | None = None
    ) -> Trainer:
        """A Trainer applying precision, compile, channels_last, optimizer, schedule and
        accumulation to ``model``; ``total_steps`` optimizer steps set the schedule's length.

        On CUDA this also sets the process-wide TF32 and cudnn.benchmark flags as tuned.
        """
        if self.config.device.startswith("cuda"):
            _set_backend_flags(self.config)
        return Trainer(model, self.config, total_steps, loss_fn)


def select_trial(study: optuna.Study, number: int | None = None) -> FrozenTrial:
    """Trial ``number``, or the best feasible COMPLETE trial; ExportError when there is none."""
    if number is not None:
        matches = [t for t in study.get_trials(deepcopy=False) if t.number == number]
        if not matches:
            raise ExportError(f"study '{study.study_name}' has no trial {number}")
        trial = matches[0]
        if trial.state != TrialState.COMPLETE:
            raise ExportError(
                f"trial {number} of '{study.study_name}' is {trial.state.name}, not COMPLETE"
            )
    else:
        if len(study.directions) > 1:
            raise ExportError(
                f"study '{study.study_name}' has several objectives and no single best trial: "
                f"pick one with --trial N"
            )
        found = best_trial(study)
        if found is None:
            raise ExportError(f"study '{study.study_name}' has no COMPLETE feasible trial yet")
        trial = found
    if "config" not in trial.user_attrs:
        raise ExportError(
            f"trial {trial.number} of '{study.study_name}' has no autotune configuration "
            f"(was the study made by autotune?)"
        )
    return trial


def _study_spec(study: optuna.Study) -> Spec | None:
    text = study.user_attrs.get("space_file")
    if not text:
        return None
    try:
        return parse_spec(text, study.user_attrs.get("space_file_path") or "space file")
    except SpecError:
        return None


def best_config(study: optuna.Study, trial: FrozenTrial) -> BestConfig:
    """The BestConfig of one trial of an autotune study."""
    spec = _study_spec(study)
    # the (first) objective's value; a multi-objective trial has no single .value
    value = trial.values[0] if trial.values else float("nan")
    return BestConfig(
        study=study.study_name,
        trial=trial.number,
        metric=str(study.user_attrs.get("metric", "value")),
        value=float(value),
        config=TrialConfig.from_dict(trial.user_attrs["config"]),
        params=dict(trial.params),
        metrics={k: trial.user_attrs[k] for k in METRIC_KEYS if k in trial.user_attrs},
        full_run_epochs=spec.objective.full_run_epochs if spec else None,
        workload=spec.workload.model_dump(mode="json") if spec else {},
    )


def load_best(study: str, storage: str = DEFAULT_STORAGE, trial: int | None = None) -> BestConfig:
    """The best feasible configuration of a study (or trial ``trial``) as a BestConfig."""
    try:
        found = load_study(study, storage)
    except StudyError as err:
        raise ExportError(str(err)) from None
    return best_config(found, select_trial(found, trial))


def load_config(path: Path | str) -> BestConfig:
    """Read a configuration written by ``autotune export --format yaml|json``."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
        data = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
        return BestConfig.from_dict(data)
    except FileNotFoundError:
        raise ExportError(f"{file}: no such file") from None
    except (OSError, ValueError, TypeError, KeyError, yaml.YAMLError) as err:
        raise ExportError(f"{file}: not an autotune configuration: {err}") from None


# ---------------------------------------------------------------------------------------------
# Writing exports
# ---------------------------------------------------------------------------------------------


def render(
    best: BestConfig, fmt: str, study: optuna.Study | None = None, script_name: str = "train.py"
) -> str:
    """The text of an export in ``fmt`` (script, yaml or json)."""
    if fmt == "json":
        return json.dumps(best.to_dict(), indent=2) + "\n"
    if fmt == "yaml":
        header = (
            f"# autotune configuration: study '{best.study}', trial {best.trial}, "
            f"{best.metric} {best.value:.6g}\n"
        )
        return header + yaml.safe_dump(best.to_dict(), sort_keys=False)
    if fmt == "script":
        if study is None:
            raise ValueError("a script export needs the study")
        return render_script(study, best, script_name)
    raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")


def write_new_file(path: Path, text: str, force: bool = False) -> None:
    """Write ``text`` to ``path`` all at once (temporary file, then rename): never half-written.

    An existing file is kept unless ``force``. ExportError when the path cannot be written.
    """
    if path.is_dir():
        raise ExportError(f"cannot write {path}: it is a directory")
    if path.exists() and not force:
        raise ExportError(f"{path} exists; pass --force to replace it")
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise ExportError(f"cannot write {path}: there is no directory {directory}")
    try:
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", text=True)
    except OSError as err:
        raise ExportError(f"cannot write {path}: {err.strerror}") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # as a plain open() would have made it
        os.replace(temporary, path)
    except OSError as err:
        Path(temporary).unlink(missing_ok=True)
        raise ExportError(f"cannot write {path}: {err.strerror}") from None


# ---------------------------------------------------------------------------------------------
# The training script
# ---------------------------------------------------------------------------------------------

_STDLIB = sys.stdlib_module_names


@dataclass(frozen=True, order=True)
class _Import:
    module: str
    name: str | None = None  # None: ``import module``
    alias: str | None = None

    @property
    def bound(self) -> str:
        return self.alias or self.name or self.module.split(".")[0]


def _import_block(imports: set[_Import]) -> str:
    """Import statements grouped (standard library, then others) and ordered as isort does."""

    def name_key(name: str) -> tuple[int, str]:
        kind = 0 if name.isupper() and len(name) > 1 else 1 if name[0].isupper() else 2
        return kind, name

    def alias(name: str, alias_name: str | None) -> str:
        return f"{name} as {alias_name}" if alias_name else name

    groups = []
    for stdlib in (True, False):
        chosen = [i for i in imports if (i.module.split(".")[0] in _STDLIB) == stdlib]
        plain = sorted({alias(i.module, i.alias) for i in chosen if i.name is None})
        lines = [f"import {p}" for p in plain]
        modules = sorted({i.module for i in chosen if i.name is not None}, key=str.lower)
        for module in modules:
            names = sorted(
                {(i.name, i.alias) for i in chosen if i.module == module and i.name},
                key=lambda n: name_key(n[0]),
            )
            lines.append(f"from {module} import {', '.join(alias(n, a) for n, a in names)}")
        if lines:
            groups.append("\n".join(lines))
    return "\n\n".join(groups)


def _module_imports(tree: ast.Module) -> dict[str, _Import]:
    """Top-level imports of a module, by the name each binds."""
    bound: dict[str, _Import] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for item in node.names:
                found = _Import(item.name, None, item.asname)
                bound[found.bound] = found
        elif isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__":
            for item in node.names:
                found = _Import(node.module, item.name, item.asname)
                bound[found.bound] = found
    return bound


def _top_level_names(node: ast.stmt) -> list[str]:
    """The names a module-level statement defines (functions, classes, assignments)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _bundle(objects: list[Any]) -> tuple[list[str], set[_Import]]:
    """Sources of built-in functions and classes, with everything of their module they use.

    Each object's module is read once; the definitions the objects name (functions, classes,
    constants), and the ones those name in turn, are pasted in module order, with the imports
    they need. This is how an exported script carries built-in workloads without autotune.
    """
    by_module: dict[Any, list[str]] = {}
    for obj in objects:
        by_module.setdefault(inspect.getmodule(obj), []).append(obj.__name__)
    sources: list[str] = []
    imports: set[_Import] = set()
    for module, wanted in by_module.items():
        text = inspect.getsource(module)
        tree = ast.parse(text)
        definitions = {name: node for node in tree.body for name in _top_level_names(node)}
        available = _module_imports(tree)
        chosen: set[str] = set()
        pending = list(wanted)
        while pending:
            name = pending.pop()
            if name in chosen or name not in definitions:
                continue
            chosen.add(name)
            used = {n.id for n in ast.walk(definitions[name]) if isinstance(n, ast.Name)}
            imports |= {available[n] for n in used if n in available}
            pending.extend(used & definitions.keys())
        lines = text.splitlines()
        for node in tree.body:
            if set(_top_level_names(node)) & chosen:
                first = min(
                    [node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]
                )
                sources.append("\n".join(lines[first - 1 : node.end_lineno]))
    return sources, imports


def _installed(path: Path) -> bool:
    roots = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    return any(path.is_relative_to(root) for root in roots)


def _entry_point(entry: str) -> tuple[str, str, str | None]:
    """(import line, call expression, directory for sys.path or None) of an imported entry.

    A module that is not installed (a file next to the space file, say) gets its directory put
    on ``sys.path`` by the script, so the script runs from anywhere.
    """
    module, _, attribute = entry.partition(":")
    import_line = f"from {module} import {attribute.split('.')[0]}"
    top = sys.modules.get(module.split(".")[0])
    file = getattr(top, "__file__", None)
    if file is None:  # a namespace package: its first portion
        portions = list(getattr(top, "__path__", []))
        file = str(Path(portions[0]) / "__init__.py") if portions else None
    if file is None:
        return import_line, attribute, None
    origin = Path(file).resolve()
    if _installed(origin):
        return import_line, attribute, None
    directory = origin.parent.parent if origin.name == "__init__.py" else origin.parent
    return import_line, attribute, str(directory)


def _literal(value: Any) -> str:
    """Python source for a plain value, strings in double quotes as ruff format writes them."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        items = ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items())
        return f"{{{items}}}"
    if isinstance(value, list):
        return f"[{', '.join(_literal(v) for v in value)}]"
    if isinstance(value, tuple):
        inner = ", ".join(_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


def _call(expression: str, kwargs: dict[str, Any], args: tuple[Any, ...] = ()) -> str:
    arguments = [_literal(value) for value in args]
    arguments += [f"{key}={_literal(value)}" for key, value in kwargs.items()]
    return f"{expression}({', '.join(arguments)})"


@dataclass
class _WorkloadCode:
    """How the script gets its data and model: pasted built-ins or imported entry points."""

    builtins: list[Any] = field(default_factory=list)  # functions and classes to paste
    sys_path: str | None = None

    def place(
        self, name: str, fn: Callable[..., Any], kwargs: dict[str, Any]
    ) -> tuple[str | None, str]:
        """(function-local import line or None, call expression) for one workload function."""
        builtin = fn.func if isinstance(fn, functools.partial) else fn
        if ":" not in name or isinstance(fn, functools.partial):  # built-in: paste its source
            self.builtins.append(builtin)
            args = fn.args if isinstance(fn, functools.partial) else ()
            return None, _call(builtin.__name__, kwargs, args)
        import_line, expression, directory = _entry_point(name)
        if directory:
            self.sys_path = directory
        return import_line, _call(expression, kwargs)


def _workload_code(
    study: optuna.Study, workload: WorkloadSpec, device_pipeline: bool
) -> tuple[set[_Import], dict[str, Any]]:
    """The imports the script's workload code needs, and the template fields that place it."""
    search_dir = study.user_attrs.get("space_file_dir")
    if search_dir is None and study.user_attrs.get("space_file_path"):
        # older studies stored only the path, relative to where `autotune run` ran
        search_dir = str(Path(study.user_attrs["space_file_path"]).resolve().parent)
    base_dir = Path(search_dir) if search_dir else None
    num_classes = study.user_attrs.get("num_classes")
    input_shape = study.user_attrs.get("input_shape")
    try:
        data_fn = resolve_data(workload, base_dir)
        model_fn = resolve_model(workload, base_dir)
        if num_classes is None and input_shape is None:
            # studies made before these were stored: read them off the data
            loaded = load_workload(workload, base_dir)
            num_classes, input_shape = loaded.num_classes, list(loaded.input_shape)
        kwargs = model_kwargs(
            model_fn, dict(workload.model_args), num_classes, tuple(input_shape or ())
        )
    except WorkloadError as err:
        raise ExportError(f"cannot export the workload: {err}") from None
    code = _WorkloadCode()
    data_import, data_call = code.place(workload.data, data_fn, dict(workload.data_args))
    model_import, model_call = code.place(workload.model, model_fn, kwargs)
    if device_pipeline:
        code.builtins.append(DeviceBatches)
    sources, imports = _bundle(code.builtins)
    if code.sys_path:
        imports.add(_Import("sys"))
    fields = {
        "data_import": data_import,
        "data_call": data_call,
        "model_import": model_import,
        "model_call": model_call,
        "sys_path": code.sys_path,
        "workload_sources": sources,
    }
    return imports, fields


def _knob_notes(best: BestConfig) -> list[tuple[str, Any, str]]:
    """(CONSTANT, value, comment) for every knob the script sets as a constant."""
    config = best.config
    searched = set(best.params)

    def note(knob: str, text: str = "") -> str:
        parts = (["searched"] if knob in searched else []) + ([text] if text else [])
        return "; ".join(parts)

    lr_text = "per optimizer step"
    if config.lr_scaling != "none":
        lr_text = (
            f"{config.base_lr:.6g} per {config.base_batch_size} examples, scaled "
            f"{config.lr_scaling} to the effective batch of {config.effective_batch_size}"
        )
    rows: list[tuple[str, Any, str]] = [
        ("DEVICE", config.device, "where the study trained; --device overrides"),
        ("EPOCHS", best.epochs, "the full run; --epochs overrides"),
        ("LEARNING_RATE", config.lr, note("lr", lr_text)),
        ("BATCH_SIZE", config.batch_size, note("batch_size", "samples per micro-batch")),
    ]
    if config.accumulation_steps > 1:
        rows.append(
            (
                "ACCUMULATION_STEPS",
                config.accumulation_steps,
                note(
                    "accumulation_steps",
                    f"micro-batches per optimizer step (effective batch "
                    f"{config.effective_batch_size})",
                ),
            )
        )
    rows.append(("WEIGHT_DECAY", config.weight_decay, note("weight_decay")))
    if config.optimizer == "sgd":
        rows.append(("MOMENTUM", config.momentum or 0.0, note("momentum")))
        rows.append(("NESTEROV", config.nesterov, note("nesterov")))
    if config.schedule == "onecycle":
        rows.append(
            (
                "WARMUP_FRACTION",
                config.warmup_fraction or 0.3,
                note("warmup_fraction", "OneCycleLR's rising phase"),
            )
        )
    elif config.schedule == "cosine" or config.warmup_fraction > 0:
        rows.append(
            (
                "WARMUP_FRACTION",
                config.warmup_fraction,
                note("warmup_fraction", "of the optimizer steps"),
            )
        )
    if config.data_pipeline == "dataloader":
        rows.append(
            ("NUM_WORKERS", config.num_workers, note("num_workers", "DataLoader processes"))
        )
        rows.append(("PIN_MEMORY", config.pin_memory, note("pin_memory")))
    if config.num_workers > 0:
        rows.append(("PREFETCH_FACTOR", config.prefetch_factor, note("prefetch_factor")))
        rows.append(("PERSISTENT_WORKERS", config.persistent_workers, note("persistent_workers")))
    rows.append(("CUDNN_BENCHMARK", config.cudnn_benchmark, note("cudnn_benchmark", "on CUDA")))
    rows.append(("VAL_BATCH_SIZE", config.val_batch_size, ""))
    rows.append(("SEED", config.seed, "the trial's seed: weights and data order"))
    sps = best.metrics.get("samples_per_second")
    rows.append(
        (
            "TRIAL_SAMPLES_PER_SECOND",
            round(float(sps), 1) if sps is not None else None,
            f"steady state, measured in trial {best.trial}",
        )
    )

    def readable(value: Any) -> Any:  # six significant digits are plenty for a knob
        return float(f"{value:.6g}") if isinstance(value, float) else value

    return [(name, _literal(readable(value)), comment) for name, value, comment in rows]


def _execution_summary(best: BestConfig) -> str:
    config = best.config
    searched = set(best.params)

    def mark(knob: str, text: str) -> str:
        return f"{text} (searched)" if knob in searched else text

    compile_text = "eager" if config.compile == "none" else f"torch.compile mode {config.compile}"
    optimizer = "SGD" if config.optimizer == "sgd" else "AdamW"
    pipeline = (
        "training set on the device, batches augmented in bulk"
        if config.data_pipeline == "device"
        else "DataLoader"
    )
    parts = [
        mark("data_pipeline", pipeline),
        mark("precision", f"precision {config.precision}"),
        mark("compile", compile_text),
        mark("optimizer", optimizer),
        mark("schedule", f"{config.schedule} schedule"),
    ]
    if config.channels_last:
        parts.append(mark("channels_last", "channels_last"))
    return ", ".join(parts)


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("autotune", "templates"),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # Python source, not HTML
    )
    environment.filters["literal"] = _literal
    return environment


def render_script(study: optuna.Study, best: BestConfig, script_name: str = "train.py") -> str:
    """A standalone training script (imports no autotune) for ``best``'s configuration."""
    spec = _study_spec(study)
    if spec is None:
        raise ExportError(
            f"study '{study.study_name}' does not hold a readable space file; export it with "
            f"--format yaml or json instead"
        )
    config = best.config
    workload_imports, workload_fields = _workload_code(
        study, spec.workload, config.data_pipeline == "device"
    )
    imports = {
        _Import("argparse"),
        _Import("statistics"),
        _Import("time"),
        _Import("pathlib", "Path"),
        _Import("torch"),
        _Import("torch", "nn"),
        *workload_imports,
    }
    if config.data_pipeline == "dataloader":
        imports.add(_Import("torch.utils.data", "DataLoader"))
    if config.schedule == "cosine":
        imports.add(_Import("math"))
    metrics = best.metrics
    accuracy = metrics.get("accuracy")
    sps = metrics.get("samples_per_second")
    provenance = textwrap.wrap(
        f"Configuration from autotune study '{best.study}', trial {best.trial}: {best.metric} "
        f"{best.value:.4g}"
        + (f", validation accuracy {accuracy:.4f}" if accuracy is not None else "")
        + (f", {sps:,.0f} samples/s steady state" if sps is not None else "")
        + f" on {metrics.get('device_name', config.device)} with torch "
        f"{metrics.get('torch_version', '?')}. Exported {datetime.date.today().isoformat()} by "
        f"autotune {autotune.__version__}.",
        width=95,
    ) + textwrap.wrap(f"Execution: {_execution_summary(best)}.", width=95)
    compile_mode = None if config.compile == "none" else config.compile
    text = (
        _environment()
        .get_template("train.py.j2")
        .render(
            title=f"Train {spec.workload.model} on {spec.workload.data} with the configuration "
            f"autotune found.",
            provenance=provenance,
            script_name=script_name,
            epochs=best.epochs,
            import_block=_import_block(imports),
            constants=_knob_notes(best),
            sys_path_reason="the workload's module lives here (where the study found it)",
            **workload_fields,
            schedule=config.schedule,
            warmup=config.warmup_fraction > 0,
            has_scheduler=config.schedule != "constant" or config.warmup_fraction > 0,
            optimizer=config.optimizer,
            precision=config.precision,
            autocast_dtype={"bf16": "torch.bfloat16", "fp16": "torch.float16"}.get(
                config.precision
            ),
            fp16=config.precision == "fp16",
            compile_mode=compile_mode,
            train_model="train_model" if compile_mode else "model",
            channels_last=config.channels_last,
            accumulation=config.accumulation_steps,
            workers=config.num_workers > 0,
            device_pipeline=config.data_pipeline == "device",
        )
    )
    return text
