"""Stage 1's budget: the seconds it may take (``study.speed.max_seconds``, half of
``study.timeout`` at most), what its measurements took, what it keeps back for the cells still
to come, and how long a cold compile is expected to take. Wall-clock time from the stage's
start, waits for this machine's turn included; what it keeps back is a *typical* measurement
(the median of the last ``RECENT``), so a busier machine keeps back more. Past its end no
measurement starts but the stage's first, and the running one is stopped a typical measurement
later at most. What the budget leaves out is ``_rules``'s. No Optuna or torch here.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from autotune.spacefile import Spec
from autotune.stage1._plan import COMPILE_SECONDS_GUESS

# an eager measurement still running after this many typical ones of the stage is stopped (a
# busy machine: what it would measure is spoiled), but never before MIN_LIMIT_SECONDS: a
# pipeline whose workers start at every pass takes seconds more than the others
OVERRUN = 3.0
MIN_LIMIT_SECONDS = 15.0
RECENT = 3  # eager measurements a typical one is the median of: the machine as it is now


@dataclass(frozen=True)
class TimeLimit:
    """How long one measurement may take, and what to say when it is stopped there."""

    seconds: float
    why: str  # "compile max-autotune was still compiling after 161 s: ..."
    budget: bool  # the budget's end or a busy machine, which say nothing of the setting


class Budget:
    """Stage 1's budget over one stage, from when it is made."""

    def __init__(self, spec: Spec) -> None:
        self.budget = spec.study.speed.budget_seconds(spec.study.timeout)
        self.deadline = time.monotonic() + self.budget  # wall-clock: waits for turns count
        self.cells_after = 0  # cells still to come after the one being timed
        self.eager_walls: list[float] = []  # each eager measurement's seconds, its turn's wait in
        self.compiled_seconds: dict[str, float] = {}  # compile mode -> its longest cold compile

    def took(self, mode: str, seconds: float, compile_seconds: float | None) -> None:
        """A measurement of compile ``mode`` took ``seconds`` of wall time, ``compile_seconds``
        of them compiling (None or 0: it ran eager, or reused a graph compiled before)."""
        if mode == "none":
            self.eager_walls.append(seconds)
        elif compile_seconds:
            self.compiled_seconds[mode] = max(
                self.compiled_seconds.get(mode, 0.0), compile_seconds
            )

    def typical(self) -> float | None:
        """Wall seconds of a typical eager measurement of the stage (the median of the last
        ``RECENT``), its wait for the turn included: what one more costs on the machine as it
        is now; None before one."""
        recent = self.eager_walls[-RECENT:]
        return statistics.median(recent) if recent else None

    def reserve(self) -> float:
        """Seconds of the budget kept back: one eager setting for each cell still to come, and
        one more for the measurement running when the budget ends, each a typical measurement
        (0 until one is timed)."""
        return (self.cells_after + 1) * (self.typical() or 0.0)

    def time_left(self) -> float:
        """Wall seconds to the budget's end, nothing kept back."""
        return self.deadline - time.monotonic()

    def refused(self) -> str | None:
        """Why no measurement may start now (the budget's end has passed), or None."""
        if self.time_left() > 0.0:
            return None
        return f"not tried: {self.said('ran out before it')}"

    def eager_limit(self) -> TimeLimit:
        """How long an eager measurement may take: past the budget's end by a typical
        measurement at most, and no longer than ``OVERRUN`` typical ones (``MIN_LIMIT_SECONDS``
        at least); before one is timed, until the budget's end (``MIN_LIMIT_SECONDS`` at
        least: the stage's first measurement is taken whatever its budget)."""
        typical = self.typical()
        ran_out = self.said("ran out")
        if typical is None:
            return TimeLimit(max(MIN_LIMIT_SECONDS, self.time_left()), ran_out, budget=True)
        past = max(1.0, self.time_left()) + typical
        overrun = max(OVERRUN * typical, MIN_LIMIT_SECONDS)
        if past <= overrun:
            return TimeLimit(past, ran_out, budget=True)
        return TimeLimit(
            overrun,
            f"stopped after {overrun:.0f} s, {OVERRUN:g} times a typical measurement of stage 1",
            budget=True,
        )

    def budget_left(self) -> float:
        """Seconds of the budget this cell may still spend (the reserve kept back)."""
        return self.deadline - self.reserve() - time.monotonic()

    def over_budget(self) -> bool:
        """Whether the stage's budget is spent, but for what the cells still to come need."""
        return self.budget_left() <= 0.0

    def budget_spent(self) -> str:
        return f"not tried: {self.said('is spent')}"

    def said(self, what: str) -> str:
        """ "stage 1's budget of 600 s ``what`` (study.speed.max_seconds)": where it is set."""
        return f"stage 1's budget of {self.budget:g} s {what} (study.speed.max_seconds)"

    def expected_compile(self, mode: str) -> float:
        """Seconds a cold compile of ``mode`` is expected to take: the longest this stage
        measured, else its guess (``COMPILE_SECONDS_GUESS``) scaled by how the compiles this
        stage measured compare with their own guesses (unscaled before any)."""
        if mode in self.compiled_seconds:
            return self.compiled_seconds[mode]
        guess = COMPILE_SECONDS_GUESS.get(mode, 60.0)
        ratios = [
            seconds / COMPILE_SECONDS_GUESS[measured]
            for measured, seconds in self.compiled_seconds.items()
            if measured in COMPILE_SECONDS_GUESS
        ]
        return guess * max(ratios) if ratios else guess
