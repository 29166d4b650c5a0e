"""Stage 1's budget: the seconds it may take (``study.speed.max_seconds``, half of
``study.timeout`` at most), what its measurements took so far, what it keeps back for the cells
still to come (what one eager setting a cell costs), and how long a cold compile is expected
to take (measured in this stage, else ``COMPILE_SECONDS_GUESS`` scaled by how the compiles
this stage measured compare with their guesses). What the budget leaves out is
``_speed_rules``'s (``LeftOut`` is a ``Budget``). Nothing here touches Optuna or torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from autotune.spec import Spec
from autotune.study._speed_plan import COMPILE_SECONDS_GUESS

__all__ = ["Budget", "TimeLimit"]


@dataclass(frozen=True)
class TimeLimit:
    """How long one compiled measurement may take, and what to say when it is stopped there."""

    seconds: float
    why: str  # "compile max-autotune was still compiling after 161 s: ..."
    budget: bool  # the budget's end, not the payback (a later stage may try it again)


class Budget:
    """Stage 1's budget over one stage, from when it is made."""

    def __init__(self, spec: Spec) -> None:
        self.budget = spec.study.speed.budget_seconds(spec.study.timeout)
        self.deadline = time.monotonic() + self.budget
        self.cells_after = 0  # cells still to come after the one being timed
        self.eager_seconds: float | None = None  # the quickest eager measurement, wall seconds
        self.compiled_seconds: dict[str, float] = {}  # compile mode -> its longest cold compile

    def took(self, mode: str, seconds: float, compile_seconds: float | None) -> None:
        """A measurement of compile ``mode`` took ``seconds`` of wall time, ``compile_seconds``
        of them compiling (None or 0: it ran eager, or reused a graph compiled before)."""
        if mode == "none":
            self.eager_seconds = min(self.eager_seconds or seconds, seconds)
        elif compile_seconds:
            self.compiled_seconds[mode] = max(
                self.compiled_seconds.get(mode, 0.0), compile_seconds
            )

    def reserve(self) -> float:
        """Seconds of the budget kept for the cells still to come: one eager setting each, at
        the quickest eager measurement seen (0 until one is timed)."""
        return self.cells_after * (self.eager_seconds or 0.0)

    def budget_left(self) -> float:
        """Seconds of the budget this cell may still spend (the reserve kept back)."""
        return self.deadline - self.reserve() - time.monotonic()

    def over_budget(self) -> bool:
        """Whether the stage's budget is spent, but for what the cells still to come need."""
        return self.budget_left() <= 0.0

    def budget_spent(self) -> str:
        return (
            f"not tried: stage 1's budget of {self.budget:g} s is spent (study.speed.max_seconds)"
        )

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
