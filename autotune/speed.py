"""What the speed stage measures (``SpeedMeasurement``, timed by ``autotune.training.bursts``) and
what it hands the learning stage (``SpeedTable``: the fastest settings of the knobs that change how
fast a step runs, not what is learned), as plain frozen data. Nothing here imports torch or Optuna.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

Extras = tuple[tuple[str, Any], ...]  # declared learning knobs among SPEED_KNOBS, by name
Unrunnable = tuple[tuple[Any, ...], str, str]  # (cell_key, fault kind, why) of a split


@dataclass(frozen=True)
class BurstPlan:
    """How one configuration is timed: warm-up steps, then bursts of steady steps."""

    warmup_micro_batches: int = 3  # compile, cuDNN autotuning, worker start: one-time costs
    bursts: int = 3  # timed bursts, each starting a new pass over the data
    burst_seconds: float = 0.25  # each burst's target length (its micro-batches follow)
    # stage 1's id: a compiled graph is kept live for the next settings that share it at the
    # same thread count (``context.compile_state``; else compiled cold and charged as such);
    # "": a cold compile for every measurement
    keep_compiled: str = ""
    # seconds the whole measurement (compile included) may take before its worker is killed
    # and it fails as trial_timeout; None: the study's trial_timeout alone. Enforced by the
    # supervised worker (``WorkerExecutor``), not in the study process (``--isolation none``)
    time_limit_seconds: float | None = None


def no_evaluations(evaluation: object) -> bool:
    """The ``report`` of a speed measurement, which never evaluates."""
    raise TypeError("a speed measurement does not evaluate")


def _median(values: tuple[float, ...]) -> float:
    return statistics.median(values) if values else 0.0


@dataclass(frozen=True)
class SpeedMeasurement:
    """Short bursts of real training steps of one configuration (accumulation 1).

    Each burst starts a new pass over the training data, as an epoch does: ``epoch_start``
    is the time to its first batch (DataLoader workers started again unless persistent), and
    ``step`` the steady seconds per micro-batch after it (data wait, copy, forward, backward,
    optimizer step), of which ``optimizer`` the optimizer step's share. Predictions for any
    accumulation follow from these (one optimizer step per ``accumulation`` micro-batches).
    """

    batch_size: int
    micro_batches_per_epoch: int
    step_seconds: tuple[float, ...]  # per burst: seconds per micro-batch
    optimizer_seconds: tuple[float, ...]  # per burst: the optimizer step's seconds per step
    epoch_start_seconds: tuple[float, ...]  # per burst: seconds to a new pass's first batch
    one_time_seconds: float  # the warm-up beyond steady steps (compile, autotuning, start-up)
    compile_seconds: float | None  # torch.compile's own share (None when not compiling)
    peak_memory_bytes: int
    device_name: str
    torch_version: str
    intra_op_threads: int = 0
    other_cpu_share: float | None = None  # others' share of its cores while it ran
    world_size: int = 1  # processes of a distributed run, each this batch_size per micro-batch
    # its compiled graph was compiled earlier in the same process and reused: its one-time
    # and compile seconds are those of that graph's cold compile (charged by the stage)
    compile_warm: bool = False

    def epoch_seconds(self, accumulation_steps: int = 1) -> float:
        """Seconds of one pass over the training data, its start included, with one optimizer
        step per ``accumulation_steps`` micro-batches."""
        skipped = _median(self.optimizer_seconds) * (1.0 - 1.0 / accumulation_steps)
        per_batch = _median(self.step_seconds) - skipped  # steady seconds per micro-batch
        return _median(self.epoch_start_seconds) + self.micro_batches_per_epoch * per_batch

    def samples_per_second(self, accumulation_steps: int = 1) -> float:
        """Steady training samples per second, epoch starts included."""
        samples = self.micro_batches_per_epoch * self.batch_size * self.world_size
        return samples / self.epoch_seconds(accumulation_steps)

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median of the bursts' step times: the run-to-run noise."""
        steps = self.step_seconds
        return (max(steps) - min(steps)) / _median(steps) if len(steps) > 1 else 0.0


@dataclass(frozen=True)
class SpeedChoice:
    """The fastest measured way to train one micro-batch split at one precision."""

    batch_size: int
    accumulation_steps: int
    precision: str
    extras: Extras  # declared learning knobs among the speed knobs, fixed for this choice
    settings: tuple[tuple[str, Any], ...]  # the speed knobs stage 1 chose, by name
    # the defaults are a choice stage 1 left unmeasured (``measured``)
    samples_per_second: float = 0.0  # predicted, steady, epoch starts included
    charged_seconds: float = math.inf  # predicted charged seconds of one trial (see objective)
    one_time_seconds: float = 0.0
    spread: float = 0.0  # of the measurements behind it
    measurements: int = 0
    speed_trials: tuple[int, ...] = ()  # the speed study's trial numbers behind it
    # the next-best settings' samples/s in this cell, as charged (the ranking's terms: its
    # one-time costs spread over the trial), so never above the choice's own
    runner_up: float | None = None
    # its choice rests on a figure taken only while other processes took the cores: its own,
    # or that of a setting it beat (which may have lost to the load alone)
    interference: bool = False

    @property
    def measured(self) -> bool:
        """Whether stage 1 measured it; one it left out (its budget ran out, or a reference's
        own row) has settings from elsewhere, no speed, and comes after any measured split of
        its effective batch (``SpeedTable.fastest``)."""
        return self.measurements > 0

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size * self.accumulation_steps

    def knobs(self) -> dict[str, Any]:
        """The choice as TrialConfig fields."""
        return {
            "batch_size": self.batch_size,
            "accumulation_steps": self.accumulation_steps,
            **dict(self.settings),
        }


def cell_key(
    batch_size: int, accumulation: int, precision: str, extras: Extras
) -> tuple[Any, ...]:
    """A micro-batch split's key, in the table and in its ``unrunnable``."""
    return batch_size, accumulation, precision, tuple(sorted(extras))


@dataclass(frozen=True)
class SpeedTable:
    """Stage 1's answer: for each micro-batch split, precision and declared learning knob
    values, the fastest settings measured; and why a split has none (out of memory, ...)."""

    choices: tuple[SpeedChoice, ...] = ()
    unrunnable: tuple[Unrunnable, ...] = ()  # every split with no runnable setting
    batch_size_auto: str | None = None  # batch_size: auto, what its probe found, in one line
    _by_key: dict[tuple[Any, ...], SpeedChoice] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for c in self.choices:
            self._by_key[cell_key(c.batch_size, c.accumulation_steps, c.precision, c.extras)] = c

    def __iter__(self) -> Iterator[SpeedChoice]:
        return iter(self.choices)

    def to_attrs(self) -> dict[str, Any]:
        """JSON for the study's user attribute (``StudyRecord.speed_table``); the probe's line
        is the study's own (``StudyRecord.batch_size_auto``)."""
        return {
            "choices": [dataclasses.asdict(choice) for choice in self.choices],
            "unrunnable": [list(row) for row in self.unrunnable],
        }

    @classmethod
    def from_attrs(cls, data: dict[str, Any]) -> SpeedTable:
        """Inverse of ``to_attrs``: JSON's lists as the tuples they were."""

        def pairs(values: list[list[Any]]) -> Extras:
            return tuple((name, value) for name, value in values)

        choices = (
            SpeedChoice(
                **{
                    **choice,
                    "extras": pairs(choice["extras"]),
                    "settings": pairs(choice["settings"]),
                    "speed_trials": tuple(choice["speed_trials"]),
                }
            )
            for choice in data["choices"]
        )
        unrunnable = (
            (cell_key(batch, accumulation, precision, pairs(extras)), kind, why)
            for (batch, accumulation, precision, extras), kind, why in data["unrunnable"]
        )
        return cls(choices=tuple(choices), unrunnable=tuple(unrunnable))

    def exact(
        self, batch_size: int, accumulation_steps: int, precision: str, extras: Extras = ()
    ) -> SpeedChoice | None:
        """The choice for this micro-batch split, or None when none of it ran."""
        return self._by_key.get(cell_key(batch_size, accumulation_steps, precision, extras))

    def ranked(
        self, effective_batch_size: int, precision: str, extras: Extras = ()
    ) -> list[SpeedChoice]:
        """The splits of ``effective_batch_size`` that ran, those a trial finishes soonest with
        (fewest predicted charged seconds) first; unmeasured ones last."""
        wanted = tuple(sorted(extras))
        candidates = [
            c
            for c in self.choices
            if c.effective_batch_size == effective_batch_size
            and c.precision == precision
            and tuple(sorted(c.extras)) == wanted
        ]
        return sorted(candidates, key=lambda c: c.charged_seconds)

    def fastest(
        self, effective_batch_size: int, precision: str, extras: Extras = ()
    ) -> SpeedChoice | None:
        """The first of ``ranked``; None when no split of ``effective_batch_size`` ran."""
        return next(iter(self.ranked(effective_batch_size, precision, extras)), None)

    def why_not(
        self, effective_batch_size: int, precision: str, extras: Extras = ()
    ) -> tuple[str, str]:
        """(fault kind, why in words) no split of ``effective_batch_size`` can run at
        ``precision``; out of memory when any split ran out of it."""
        wanted = tuple(sorted(extras))
        found = sorted(
            {
                (kind, why)
                for (b, a, p, e), kind, why in self.unrunnable
                if b * a == effective_batch_size and p == precision and e == wanted
            }
        )
        where = f"effective batch {effective_batch_size} at {precision}"
        if not found:
            return "error", f"stage 1 measured no way to train {where}"
        kind = "oom" if any(k == "oom" for k, _ in found) else found[0][0]
        reasons = "; ".join(why for _, why in found)
        return kind, f"no micro-batch split of {where} ran in stage 1: {reasons}"

    def gain_at(self, batch_size: int, precision: str) -> tuple[int, float] | None:
        """(the next smaller micro-batch stage 1 timed at ``precision``, how much faster
        ``batch_size`` ran than it: 0.23 for 23%), unaccumulated; None without both, or where
        either figure was taken while other processes took the cores (a busy 7,233 beside a
        quiet 9,775 made a "83% faster" that was the load's)."""
        rows = {
            c.batch_size: c
            for c in self.choices
            if c.precision == precision
            and c.accumulation_steps == 1
            and not c.extras
            and c.measured
        }
        smaller = max((b for b in rows if b < batch_size), default=None)
        if smaller is None or batch_size not in rows or not rows[smaller].samples_per_second:
            return None
        low, high = rows[smaller], rows[batch_size]
        if low.interference or high.interference:
            return None
        return smaller, high.samples_per_second / low.samples_per_second - 1

    def runs_out_of_memory(self, batch_size: int, precision: str) -> bool:
        """Whether stage 1 ran out of memory at ``precision`` with a micro-batch of
        ``batch_size`` or smaller (a memory wall at or below it)."""
        return any(
            kind == "oom" and b <= batch_size and p == precision
            for (b, _, p, _), kind, _ in self.unrunnable
        )

    def failure(self) -> tuple[str, str] | None:
        """When nothing at all could run: the most frequent (fault kind, reason in words);
        else None."""
        if self.choices or not self.unrunnable:
            return None
        reasons = [(kind, why.partition(": ")[2] or why) for _, kind, why in self.unrunnable]
        return max(set(reasons), key=reasons.count)
