"""The head of the exported script: the configuration as constants, each with a note of where
its value came from (searched, or fixed in the space file), and PROVENANCE, where the
configuration comes from. Every value is written as a literal (``_bundle.literal``): study and
device names are the user's strings, data and never code."""

from __future__ import annotations

import datetime
from typing import Any

from autotune._version import __version__
from autotune.export._api import BestConfig
from autotune.export._bundle import literal
from autotune.knobs import KNOBS
from autotune.spec import WorkloadSpec

__all__ = ["SCRIPT_KNOBS", "knob_notes", "provenance_rows"]

# Where the script applies each knob (the registry's ``script``): a constant at the top of the
# script, or the execution summary line and the template code that follows it
SCRIPT_KNOBS: dict[str, str] = {name: info.script for name, info in KNOBS.items()}


def knob_notes(best: BestConfig) -> list[tuple[str, Any, str]]:
    """(CONSTANT, value, comment) for every knob the script sets as a constant."""
    config = best.config

    def note(knob: str, text: str = "") -> str:
        origin = best.origin(knob)
        return "; ".join(([origin] if origin else []) + ([text] if text else []))

    lr_text = "per optimizer step"
    if config.lr_scaling != "none":
        lr_text = (
            f"{config.base_lr:.6g} per {config.base_batch_size} examples, scaled "
            f"{config.lr_scaling} to the effective batch of {config.effective_batch_size}"
        )
    epochs_text = "the full run; --epochs overrides"
    if best.full_run_epochs is None and best.epochs != config.epochs:
        epochs_text = f"the trials trained {config.epochs:g}; a script trains whole epochs"
    rows: list[tuple[str, Any, str]] = [
        ("DEVICE", config.device, "where the study trained; --device overrides"),
        ("EPOCHS", best.epochs, epochs_text),
        ("LEARNING_RATE", config.lr, note("lr", lr_text) + "; --lr overrides"),
        ("BATCH_SIZE", config.batch_size, note("batch_size", "samples per micro-batch")),
    ]
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
    rows.append(("PRECISION", config.precision, note("precision", "TF32 flags on CUDA")))
    rows.append(("OPTIMIZER", config.optimizer, note("optimizer")))
    rows.append(("WEIGHT_DECAY", config.weight_decay, note("weight_decay")))
    if config.optimizer == "sgd":
        rows.append(("MOMENTUM", config.momentum or 0.0, note("momentum")))
        rows.append(("NESTEROV", config.nesterov, note("nesterov")))
    rows.append(("SCHEDULE", config.schedule, note("schedule")))
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
    if config.distributed:
        rows.append(
            (
                "PROCESSES",
                config.world_size,
                f"the trial's DDP processes: torchrun --nproc-per-node {config.world_size}",
            )
        )
        rows.append(("DDP_BUCKET_CAP_MB", config.ddp_bucket_cap_mb, note("ddp_bucket_cap_mb")))
        rows.append(
            (
                "GRADIENT_AS_BUCKET_VIEW",
                config.gradient_as_bucket_view,
                note("gradient_as_bucket_view"),
            )
        )
        rows.append(("STATIC_GRAPH", config.static_graph, note("static_graph")))
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
    result = (
        best.headline
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
