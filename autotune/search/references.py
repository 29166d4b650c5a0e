"""The two configurations every answer is measured against, built from the space file.

- **The untuned baseline**: what a script that sets no flag gets. PyTorch's own defaults where
  they exist (fp32, which is PyTorch's TF32 flags as a script that sets none gets them, eager,
  no DataLoader workers, no accumulation), the space file's pins (``study.baseline:
  {batch_size: 128}``), else the first listed value or the middle of a range.
- **The tuning checklist**: what an engineer sets after five minutes with PyTorch's performance
  tuning guide (``checklist_rules``, one rule a knob, each citing where it comes from). Its
  learning knobs are the baseline's, the learning rate scaled to its batch by the space's
  ``lr_scaling`` rule.

Both are drawn through ``space.draw``, the loop a trial is sampled with, picking each knob's
reference value (``_reference``), so that conditional knobs stay right; a knob the space fixes
keeps its value, so a value the user pinned stays pinned.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from autotune.config import TrialConfig
from autotune.knobs import KNOBS, SPEED_KNOBS
from autotune.machine.hardware import Hardware
from autotune.search.space import Pick, draw, draw_from_table, fixed_value, offered
from autotune.spacefile import Choice, FloatRange, IntRange, Knob, Spec
from autotune.speed import SpeedChoice, SpeedTable

TUNING_GUIDE = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"
AMP_GUIDE = "https://pytorch.org/docs/stable/amp.html"
CHANNELS_LAST = "https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html"

# a rule's value, or which of the values the space offers (``max``: the largest)
Rule = Any | Callable[[Sequence[Any]], Any]


def _at_most(limit: int) -> Callable[[Sequence[Any]], Any]:
    """The largest offered value up to ``limit`` (the smallest when none is)."""
    return lambda values: max((v for v in values if v <= limit), default=min(values))


def checklist_rules(hardware: Hardware) -> dict[str, Rule]:
    """The tuning checklist on ``hardware``: each knob's value, or which offered value. A rule
    whose value the space does not offer (or cannot run here) leaves the baseline's."""
    return {
        # AMP_GUIDE: autocast to bfloat16 where the device computes in it natively, else
        # float16 with a GradScaler on a GPU; a CPU without native bfloat16 stays in fp32
        "precision": "bf16" if hardware.bf16_native else "fp16" if hardware.fp16 else "fp32",
        # CHANNELS_LAST: 4-D image batches in NHWC (space.restrict drops it for other inputs)
        "channels_last": True,
        # TUNING_GUIDE, "increase the batch size" (with the learning rate scaled): the largest
        # micro-batch the space offers, without accumulation
        "batch_size": max,
        "accumulation_steps": min,
        # TUNING_GUIDE, "enable asynchronous data loading and augmentation": the data set on
        # the device where it fits (the space offers "device" only then), else DataLoader
        # workers up to the cores, page-locked (GPU only) and kept between epochs
        "data_pipeline": "device",
        "num_workers": _at_most(hardware.cpu_count),
        "pin_memory": True,
        "persistent_workers": True,
        # TUNING_GUIDE, "enable cuDNN auto-tuner" (CUDA only: restrict drops it elsewhere)
        "cudnn_benchmark": True,
        # eager, as the guide's first steps are: torch.compile is the search's to weigh
        "compile": "none",
    }


def _in_range(knob: IntRange | FloatRange, wanted: Any) -> float:
    """``wanted`` where it is a number in ``knob``'s range, else the middle of the range (its
    geometric middle on a log scale)."""
    number = isinstance(wanted, int | float) and not isinstance(wanted, bool)
    if number and knob.low <= wanted <= knob.high:
        return float(wanted)
    return math.sqrt(knob.low * knob.high) if knob.log else (knob.low + knob.high) / 2


def _chosen(knob: Knob, rule: Rule | None, untuned: Any) -> Any:
    """The reference's value of a searched knob: its rule's where the space offers that value,
    else the untuned value where the space holds it, else the first listed value or the middle
    of the range."""
    values = offered(knob)
    wanted = rule(values) if callable(rule) else rule
    if rule is None or wanted not in values:
        wanted = untuned
    if isinstance(knob, Choice):
        return wanted if wanted in values else values[0]
    value = _in_range(knob, wanted)
    if isinstance(knob, IntRange):
        value = round(value)
        return min(knob.high, knob.low + (value - knob.low) // knob.step * knob.step)
    if knob.step:
        value = knob.low + round((value - knob.low) / knob.step) * knob.step
    return float(value)


def _reference(pins: dict[str, Any], rules: dict[str, Rule], params: dict[str, Any]) -> Pick:
    """A pick of the reference's values (``_chosen``), the untuned value of a knob being its pin
    (``pins``) or its default (the registry's: PyTorch's, where it has one); the searched knobs'
    values land in ``params``."""

    def pick(name: str, knob: Knob) -> Any:
        if knob.is_fixed:
            return fixed_value(knob)
        untuned = pins[name] if name in pins else KNOBS[name].default if name in KNOBS else None
        params[name] = _chosen(knob, rules.get(name), untuned)
        return params[name]

    return pick


def _drawn(
    spec: Spec, hardware: Hardware, rules: dict[str, Rule] | None
) -> tuple[dict[str, Any], TrialConfig]:
    """The searched knobs' values the rules choose (the untuned ones without), and the whole
    configuration they make."""
    pins = spec.study.baseline if isinstance(spec.study.baseline, dict) else {}
    params: dict[str, Any] = {}
    config = draw(_reference(dict(pins), rules or {}, params), spec, hardware)
    return params, config


def baseline_params(spec: Spec, hardware: Hardware) -> dict[str, Any]:
    """The searched knobs' values of the untuned configuration (see ``study.baseline``)."""
    return _drawn(spec, hardware, None)[0]


def untuned_config(spec: Spec, hardware: Hardware) -> TrialConfig:
    """The untuned configuration (see ``study.baseline``) as a whole TrialConfig."""
    return _drawn(spec, hardware, None)[1]


def checklist_params(
    spec: Spec, hardware: Hardware, fits: Callable[[TrialConfig], bool] | None = None
) -> dict[str, Any] | None:
    """The searched knobs' values of the tuning checklist on ``hardware``; None where they are
    the untuned baseline's (the space leaves the checklist nothing to set). ``fits``: whether a
    configuration is below the memory walls found so far; the checklist's batch is the largest
    that fits (TUNING_GUIDE: the largest batch the memory allows)."""
    rules = checklist_rules(hardware)
    params, config = _drawn(spec, hardware, rules)
    while fits is not None and "batch_size" in params and not fits(config):
        rules = {**rules, "batch_size": _at_most(params["batch_size"] - 1)}
        smaller, config = _drawn(spec, hardware, rules)
        if smaller["batch_size"] >= params["batch_size"]:
            break  # the smallest batch is over a wall too: trained, it says so
        params = smaller
    return None if params == baseline_params(spec, hardware) else params


def own_table(spec: Spec, config: TrialConfig) -> SpeedTable:
    """A speed table of one row, ``config``'s own micro-batch split and execution knobs: a
    reference drawn through it (``space.draw_from_table``) samples what a two-stage trial samples
    (effective_batch_size, precision, the learning knobs), and keeps its own settings."""
    declared = spec.study.learning_knobs
    return SpeedTable(
        choices=(
            SpeedChoice(
                batch_size=config.batch_size,
                accumulation_steps=config.accumulation_steps,
                precision=config.precision,
                extras=tuple((k, getattr(config, k)) for k in SPEED_KNOBS if k in declared),
                settings=tuple((k, getattr(config, k)) for k in SPEED_KNOBS),
            ),
        )
    )


def as_two_stage(
    spec: Spec, hardware: Hardware, params: dict[str, Any]
) -> tuple[dict[str, Any], TrialConfig]:
    """A reference's parameters (drawn over the whole space: ``baseline_params``,
    ``checklist_params``) on a two-stage study's axes, those its other trials sample, so that
    every trial of the study has the same parameters (the dashboard plots them against each
    other); and its whole configuration, whose execution knobs it keeps (``own_table``)."""
    config = draw(
        lambda n, knob: fixed_value(knob) if knob.is_fixed else params[n], spec, hardware
    )
    effective = config.batch_size * config.accumulation_steps * config.world_size
    pins = {**config.to_dict(), "lr": config.base_lr, "effective_batch_size": effective}
    own: dict[str, Any] = {}
    draw_from_table(_reference(pins, {}, own), spec, hardware, own_table(spec, config))
    return own, config
