"""How values, units and commands are written for people: numbers, metrics, copyable commands."""

from __future__ import annotations

import shlex
from typing import Any

from optuna.trial import FrozenTrial
from rich.markup import escape

from autotune import study as studies
from autotune.spec import DEFAULT_STORAGE

METRIC_UNITS = {"accuracy_per_second": "acc/s", "time_to_accuracy": "s to target"}


def fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) < 1e-2 or abs(value) >= 1e5:
            return f"{value:.2e}"
        return f"{value:.4g}"
    return "-" if value is None else str(value)


_METRIC_FORMATS: dict[str, Any] = {
    "charged_seconds": lambda v: f"{v:.3g} s",
    "train_seconds": lambda v: f"{v:.3g} s",
    "overhead_seconds": lambda v: f"{v:.3g} s",
    "compile_seconds": lambda v: f"{v:.1f} s",
    "samples_per_second": lambda v: f"{v:,.0f}",
    "tokens_per_second": lambda v: f"{v:,.0f}",
    "achieved_flops": lambda v: f"{v / 1e9:,.1f} GFLOP/s",
    "mfu": lambda v: f"{v:.1%}",
    "gpu_utilization": lambda v: f"{v:.0%}",
    "data_wait_fraction": lambda v: f"{v:.1%}",
    "gpu_memory_used_bytes": lambda v: f"{v / 2**30:.2f} GiB",
    "peak_memory_bytes": lambda v: f"{v / 2**20:,.0f} MiB",
}


def fmt_metric(key: str, value: Any) -> str:
    """A trial measurement in its unit (seconds, GFLOP/s, %, MiB) where it has one."""
    if isinstance(value, int | float) and not isinstance(value, bool) and key in _METRIC_FORMATS:
        return _METRIC_FORMATS[key](value)
    return fmt(value)


def command(*words: str) -> str:
    """A command line for the user to copy, as rich markup: each word quoted for the shell and
    the whole escaped, so that a study name such as ``run[fast]`` or ``a b`` survives both."""
    return escape(shlex.join(words))


def study_options(study_name: str, storage: str) -> list[str]:
    """``--study NAME`` and ``--storage URL`` (password ``***``) unless it is the default."""
    shown = studies.display_url(storage)
    return ["--study", study_name, *([] if storage == DEFAULT_STORAGE else ["--storage", shown])]


def si(value: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def params(trial: FrozenTrial) -> str:
    return " ".join(f"{k}={fmt(v)}" for k, v in trial.params.items())
