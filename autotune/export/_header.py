"""The head of the exported script: the configuration as constants, each with a note of where
its value came from (searched, or fixed in the space file), and PROVENANCE, where the
configuration comes from. Every value is written as a literal (``_bundle.literal``): study and
device names are the user's strings, data and never code."""

from __future__ import annotations

import datetime
from typing import Any

from autotune._version import __version__
from autotune.config import TrialConfig
from autotune.display import fmt
from autotune.export._api import BestConfig
from autotune.export._arguments import lr_text, searched
from autotune.export._bundle import literal
from autotune.knobs import DDP_KNOBS, KNOBS, SPEED_KNOBS
from autotune.spacefile import WorkloadSpec

# the script's constants: what changes learning first, then how it runs (stage 1's knobs)
_CONSTANTS = sorted(
    (name for name, info in KNOBS.items() if info.script.isidentifier()),
    key=lambda name: name in SPEED_KNOBS,
)


def _shown(config: TrialConfig, name: str) -> bool:
    """Whether the script sets ``name``'s constant: where it means something (the registry's
    ``only_when``); NESTEROV for every SGD, the warm-up with a schedule that has one."""
    if name == "nesterov":
        return config.optimizer == "sgd"
    if name == "warmup_fraction":
        return config.schedule != "constant" or config.warmup_fraction > 0
    return KNOBS[name].applies({**config.to_dict(), "world": config.world_size})


def knob_notes(best: BestConfig) -> list[tuple[str, Any, str]]:
    """(CONSTANT, value, comment) for every knob the script sets as a constant."""
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
    rows.append(("VAL_BATCH_SIZE", config.val_batch_size, ""))
    rows.append(("SEED", config.seed, "the trial's: weights and data order; --seed overrides"))
    sps = best.metrics.get("samples_per_second")
    rows.append(
        (
            "TRIAL_SAMPLES_PER_SECOND",
            round(float(sps), 1) if sps is not None else None,
            f"steady state, measured in trial {best.trial}",
        )
    )

    # every digit: the script must train with the trial's values, not rounded neighbours (a
    # rounded warm-up fraction can lose a whole warm-up step; tests/test_export_parity.py)
    return [(name, literal(value), comment) for name, value, comment in rows]


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
    pieces: list[str] = []
    current = ""
    for char in text:
        if current and len(literal(current + char)) > _PROVENANCE_WIDTH:
            cut = current.rfind(" ") + 1 or len(current)  # after a space where there is one
            pieces.append(current[:cut])
            current = current[cut:]
        current += char
    pieces.append(current)
    return "(\n" + "".join(f"        {literal(piece)}\n" for piece in pieces) + "    )"


def provenance_rows(best: BestConfig, workload: WorkloadSpec) -> list[tuple[str, str]]:
    """(key, Python source of its value) of the script's PROVENANCE: where the configuration
    comes from. Study names, device names and the like are the user's (or a shared study's)
    strings: they are data, written as literals, never pasted into code or the docstring."""
    config, metrics = best.config, best.metrics
    score = metrics.get("score")
    sps = metrics.get("samples_per_second")
    result = (  # which measurement it is, the answer below says
        f"{best.metric} {fmt(best.headline_value)}"
        + (f", validation {best.score_name} {score:.4g}" if score is not None else "")
        + (f", {sps:,.0f} samples/s steady state" if sps is not None else "")
    )
    device = str(metrics.get("device_name", config.device))
    items: list[tuple[str, Any]] = [
        ("study", best.study),
        ("trial", best.trial),
        ("model", workload.model),
        ("data", workload.data),
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
