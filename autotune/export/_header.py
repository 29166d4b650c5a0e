"""What every exported Python file is made of: lines of code with a comment saying where their
value came from (the study's search, stage 1, or the space file's one value): the script's
constants and the framework files' keywords (``Argument``); and PROVENANCE, where the
configuration comes from. Every value is written as a literal (``_bundle.literal``): study and
device names are the user's strings, data and never code."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from autotune._version import __version__
from autotune.config import TrialConfig
from autotune.display import fmt, lr_text
from autotune.export._api import BestConfig
from autotune.export._bundle import literal
from autotune.knobs import DDP_KNOBS, KNOBS, SPEED_KNOBS

LINE_LENGTH = 99  # what the generated files are linted to (ruff's E501, this project's width)
ARGUMENT_INDENT = 8  # the templates' indentation of a call's keywords


@dataclass(frozen=True)
class Argument:
    """One keyword of a generated call: ``name=value,  # comment``."""

    name: str  # a Python argument name, autotune's own
    value: str  # Python source of the value: a literal (or a call of literals)
    comment: str = ""  # autotune's words and numbers only

    @property
    def line(self) -> str:
        """The call's line(s) for it, the template indenting them by ARGUMENT_INDENT."""
        return commented(f"{self.name}={self.value},", self.comment, ARGUMENT_INDENT)


def commented(code: str, comment: str, indent: int = 0) -> str:
    """``code`` with ``comment`` after it, or above it when both would not fit in a line
    ``indent`` columns in (or the code has several lines)."""
    if not comment:
        return code
    note = f"# {comment_text(comment)}"
    if "\n" in code or indent + len(f"{code}  {note}") > LINE_LENGTH:
        return f"{note}\n{code}"
    return f"{code}  {note}"


def comment_text(text: str) -> str:
    """``text`` safe in a ``#`` comment: printable ASCII on one line (others escaped), even
    if a value that reached it was not what autotune wrote."""
    return literal(str(text))[1:-1]


def searched(best: BestConfig, knob: str, text: str = "") -> str:
    origin = best.origin(knob)
    return "; ".join(([origin] if origin else []) + ([text] if text else []))


def tuned(best: BestConfig, keyword: str, knob: str, text: str = "") -> Argument:
    """``keyword=`` the configuration's value of ``knob``, noting where it came from."""
    return Argument(keyword, literal(getattr(best.config, knob)), searched(best, knob, text))


def loader_arguments(best: BestConfig, prefix: str = "") -> list[Argument]:
    """The DataLoader's tuned settings (keywords of DataLoader, or TrainingArguments'
    ``dataloader_*`` fields with ``prefix``)."""
    config = best.config
    workers = config.num_workers if config.data_pipeline == "dataloader" else 0
    rows = [
        Argument(f"{prefix}num_workers", literal(workers), searched(best, "num_workers")),
        tuned(best, f"{prefix}pin_memory", "pin_memory"),
    ]
    if workers > 0:
        rows.append(
            Argument(
                f"{prefix}prefetch_factor",
                literal(config.prefetch_factor or 2),
                searched(best, "prefetch_factor", "batches each worker loads ahead"),
            )
        )
        rows.append(tuned(best, f"{prefix}persistent_workers", "persistent_workers"))
    return rows


# the script's constants: what changes learning first, then how it runs (stage 1's knobs)
_CONSTANTS = sorted(
    (name for name, info in KNOBS.items() if info.script.isidentifier()),
    key=lambda name: name in SPEED_KNOBS,
)


def has_schedule(config: TrialConfig) -> bool:
    """Whether the learning rate changes over the run (a schedule, a warm-up): a scheduler."""
    return config.schedule != "constant" or config.warmup_fraction > 0


def _shown(config: TrialConfig, name: str) -> bool:
    """Whether the script sets ``name``'s constant: where it means something (the registry's
    ``only_when``); NESTEROV for every SGD, the warm-up with a schedule that has one."""
    if name == "nesterov":
        return config.optimizer == "sgd"
    if name == "warmup_fraction":
        return has_schedule(config)
    return KNOBS[name].applies({**config.to_dict(), "world": config.world_size})


def knob_notes(best: BestConfig) -> list[str]:
    """The line of every constant the script sets, with its comment: where its value came
    from."""
    config = best.config
    epochs_text = "the full run; --epochs overrides"
    if best.full_run_epochs is None and best.epochs != config.epochs:
        epochs_text = f"the trials trained {config.epochs:g}; a script trains whole epochs"
    onecycle = config.schedule == "onecycle"
    values = {
        **config.to_dict(),
        "momentum": config.momentum or 0.0,
        "warmup_fraction": config.warmup_fraction or 0.3 if onecycle else config.warmup_fraction,
    }
    texts = {  # a knob's comment after where its value came from
        "lr": f"{lr_text(config)}; --lr overrides",
        "batch_size": "samples per micro-batch",
        "accumulation_steps": f"micro-batches per optimizer step (effective batch "
        f"{config.effective_batch_size})",
        "precision": "TF32 flags on CUDA",
        "warmup_fraction": "OneCycleLR's rising phase" if onecycle else "of the optimizer steps",
        "num_workers": "DataLoader processes",
        "cudnn_benchmark": "on CUDA",
    }
    rows: list[tuple[str, Any, str]] = [
        ("DEVICE", config.device, "where the study trained; --device overrides"),
        ("EPOCHS", best.epochs, epochs_text),
    ]
    for name in filter(lambda name: _shown(config, name), _CONSTANTS):
        if name == DDP_KNOBS[0]:
            command = f"torchrun --nproc-per-node {config.world_size}"
            rows.append(("PROCESSES", config.world_size, f"the trial's DDP processes: {command}"))
        rows.append((KNOBS[name].script, values[name], searched(best, name, texts.get(name, ""))))
    if _shown(config, "persistent_workers"):  # the knobs of workers: with workers only
        timeout = "seconds a worker may take for a batch; 0: no limit"
        rows.append(("DATALOADER_TIMEOUT", config.dataloader_timeout, timeout))
    sps, source = compared_speed(best)
    rows += [
        ("VAL_BATCH_SIZE", config.val_batch_size, ""),
        ("SEED", config.seed, "the trial's: weights and data order; --seed overrides"),
        ("TRIAL_SAMPLES_PER_SECOND", None if sps is None else round(sps, 1), "steady state"),
        ("TRIAL_SPEED_SOURCE", source, ""),
    ]
    # every digit: the script must train with the trial's values, not rounded neighbours (a
    # rounded warm-up fraction can lose a whole warm-up step; tests/test_export_parity.py)
    return [commented(f"{name} = {literal(value)}", comment) for name, value, comment in rows]


def compared_speed(best: BestConfig) -> tuple[float | None, str]:
    """The steady samples/s a run of the script is compared with, and whose it is: the
    confirmation round's median where the round timed the trial (the trial's own single
    measurement won the search partly by luck: it reads high), else the trial's."""
    found = best.confirmation
    if found is not None and found.median_samples_per_second is not None:
        runs = f"trial {best.trial}'s {found.runs} confirmation runs"
        return float(found.median_samples_per_second), f"the median of {runs}"
    sps = best.metrics.get("samples_per_second")
    return None if sps is None else float(sps), f"trial {best.trial}"


def _execution_summary(best: BestConfig) -> str:
    config = best.config

    def mark(knob: str, text: str) -> str:
        origin = best.origin(knob)
        return f"{text} ({origin})" if origin else text

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


_PROVENANCE_WIDTH = 84  # characters of a string literal per line: the script's lines stay < 99


def _wrapped_literal(text: str, room: int) -> str:
    """``text`` as Python source: one string literal, or several in parentheses (implicitly
    concatenated) when it is long. Every piece is a JSON string, a valid Python literal, so
    that nothing in ``text`` (quotes, newlines, backslashes) can end it early. ``room``: the
    characters left on the first line."""
    if len(literal(text)) <= room:
        return literal(text)
    # one piece where it fits on a line of its own, as ruff format joins the pieces
    width = len(literal(text)) if len(literal(text)) <= 99 - 8 else _PROVENANCE_WIDTH
    pieces: list[str] = []
    current = ""
    for char in text:
        if current and len(literal(current + char)) > width:
            cut = current.rfind(" ") + 1 or len(current)  # after a space where there is one
            pieces.append(current[:cut])
            current = current[cut:]
        current += char
    pieces.append(current)
    return "(\n" + "".join(f"        {literal(piece)}\n" for piece in pieces) + "    )"


def provenance_rows(best: BestConfig, model: str, data: str) -> list[tuple[str, str]]:
    """(key, Python source of its value) of the script's PROVENANCE: where the configuration
    comes from. Study names, device names and the like are the user's (or a shared study's)
    strings: they are data, written as literals, never pasted into code or the docstring."""
    config, metrics, found = best.config, best.metrics, best.confirmation
    # beside a confirmed median, the round's medians of the same runs; else the trial's own
    score = found.median_score if found else metrics.get("score")
    sps = found.median_samples_per_second if found else metrics.get("samples_per_second")
    result = (  # which measurement it is, the answer below says
        f"{best.metric} {fmt(best.headline_value)}"
        + (f", validation {best.score_name} {fmt(score)}" if score is not None else "")
        + (f", {fmt(sps)} samples/s steady state" if sps is not None else "")
    )
    device = str(metrics.get("device_name", config.device))
    items: list[tuple[str, Any]] = [
        ("study", best.study),
        ("trial", best.trial),
        ("model", model),
        ("data", data),
        ("result", result),
        ("measured_on", f"{device} with torch {metrics.get('torch_version', '?')}"),
        ("execution", _execution_summary(best)),
        ("answer", best.confirmation_text() if best.feasible else "not an answer: infeasible"),
        ("feasible", best.feasible),
        ("exported", f"{datetime.date.today().isoformat()} by autotune {__version__}"),
    ]
    # each item is a line '    "key": value,' of at most 99 characters
    return [
        (
            literal(key),
            _wrapped_literal(value, 99 - len(f'    "{key}": ,'))
            if isinstance(value, str)
            else literal(value),
        )
        for key, value in items
    ]
