"""The untuned configuration: what a study's baseline trains and the speed stage starts from.

PyTorch's own defaults where they exist (fp32, which is PyTorch's TF32 flags as a script that
sets none gets them, eager, no DataLoader workers, no accumulation),
the space file's pins (``study.baseline: {batch_size: 128}``), else the first listed value or
the middle of a range. It is drawn through ``space.sample`` with a stand-in for an Optuna
trial, so that conditional knobs stay right.
"""

from __future__ import annotations

import math
from typing import Any

from autotune.config import TrialConfig
from autotune.hardware import Hardware
from autotune.space import sample
from autotune.spec import KNOBS, Spec

__all__ = ["UNTUNED", "baseline_params", "untuned_config"]


# PyTorch's own defaults, where they exist: the configuration nobody tuned
UNTUNED = {
    "precision": "fp32",
    "compile": "none",
    "data_pipeline": "dataloader",
    "num_workers": 0,
    "pin_memory": False,
    "prefetch_factor": 2,
    "persistent_workers": False,
    "accumulation_steps": 1,
    "channels_last": False,
    "cudnn_benchmark": False,
    "weight_decay": 0.0,
    "schedule": "constant",
    "warmup_fraction": 0.0,
}


class _Untuned:
    """A stand-in for an Optuna trial whose every suggestion is the untuned value of a knob:
    PyTorch's default (or the space file's pin) when the space holds it, else the first listed
    value or the middle of the range. Run through ``sample`` so conditional knobs stay right."""

    number = 0

    def __init__(self, pins: dict[str, Any]) -> None:
        self.pins = pins
        self.params: dict[str, Any] = {}

    def _wanted(self, name: str) -> Any:
        if name in self.pins:
            return self.pins[name]
        if name in UNTUNED:
            return UNTUNED[name]
        return KNOBS[name].default

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        wanted = self._wanted(name)
        self.params[name] = wanted if wanted in choices else choices[0]
        return self.params[name]

    def _in_range(self, name: str, low: float, high: float, log: bool, middle: float) -> float:
        wanted = self._wanted(name)
        if (
            isinstance(wanted, int | float)
            and not isinstance(wanted, bool)
            and low <= wanted <= high
        ):
            return wanted
        return math.sqrt(low * high) if log else middle

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        value = round(self._in_range(name, low, high, log, (low + high) / 2))
        self.params[name] = min(high, low + (value - low) // step * step)
        return self.params[name]

    def suggest_float(
        self, name: str, low: float, high: float, step: float | None = None, log: bool = False
    ) -> float:
        value = self._in_range(name, low, high, log, (low + high) / 2)
        if step:
            value = low + round((value - low) / step) * step
        self.params[name] = float(value)
        return self.params[name]


def baseline_params(spec: Spec, hardware: Hardware) -> dict[str, Any]:
    """The searched knobs' values of the untuned configuration (see ``study.baseline``)."""
    pins = spec.study.baseline if isinstance(spec.study.baseline, dict) else {}
    untuned = _Untuned(dict(pins))
    sample(untuned, spec, hardware)  # type: ignore[arg-type]  # it answers the suggest_* calls
    return untuned.params


def untuned_config(spec: Spec, hardware: Hardware) -> TrialConfig:
    """The untuned configuration (see ``study.baseline``) as a whole TrialConfig."""
    pins = spec.study.baseline if isinstance(spec.study.baseline, dict) else {}
    return sample(_Untuned(dict(pins)), spec, hardware)  # type: ignore[arg-type]
