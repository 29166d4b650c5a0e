"""Stage 1's answer: for each micro-batch split (batch x accumulation), precision and declared
value, the measured settings with which a trial finishes soonest, charged as the objective
charges one-time costs; and the cells where nothing could run, with why. A cell the stage left
unmeasured (its budget ran out on a busy machine) trains with the settings of the nearest cell
measured, its speed unknown (``SpeedChoice.measured``): its trials measure it themselves."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from autotune.faults import FaultKind
from autotune.search import objective
from autotune.spacefile import Spec
from autotune.speed import SpeedChoice, SpeedMeasurement, SpeedTable, cell_key
from autotune.stage1._plan import Cell, Settings, SpeedPlan
from autotune.stage1._store import Pool

# a cell with neither a measurement nor a fault, and no cell measured to borrow settings from:
# interrupted, not an error, so that trials drawn there fail without counting as the same bug
_NOT_MEASURED = (
    "not measured in this run's stage 1 (its budget, a busy machine or its rules left it out)"
)


def speed_table(
    spec: Spec,
    plan: SpeedPlan,
    tried: dict[Cell, list[Settings]],
    pool_of: Callable[[Cell, Settings], Pool],
) -> SpeedTable:
    """The table of ``plan``'s cells from the settings ``tried`` in each and their pools."""
    epochs = spec.workload.epochs
    full = spec.objective.full_run_epochs if spec.objective.per_second else None
    choices: list[SpeedChoice] = []
    unrunnable: list[tuple[tuple[Any, ...], str, str]] = []
    unmeasured: list[Cell] = []
    for cell in plan.cells():
        runs: list[tuple[Settings, SpeedMeasurement, list[int], bool]] = []
        faults: list[tuple[str, str]] = []  # (kind, message)
        for settings in tried.get(cell, []):
            pool = pool_of(cell, settings)
            combined = pool.combined()
            if combined is not None:
                numbers = [n for n, _ in pool.clean()]
                runs.append((settings, combined, numbers, pool.flagged_only()))
            elif pool.fault is not None:
                faults.append(pool.fault)
        for accumulation in plan.accumulations:
            key = cell_key(cell.batch_size, accumulation, cell.precision, cell.extras)
            if not runs and not faults:
                unmeasured.append(cell)
                break
            if not runs:
                # out of memory when any setting ran out of it: the cell's wall
                kind, why = next((f for f in faults if f[0] == FaultKind.OOM.value), faults[0])
                unrunnable.append((key, kind, f"batch {cell.batch_size}: {why}"))
                continue

            def charged(m: SpeedMeasurement, a: int = accumulation) -> float:
                train = m.one_time_seconds + epochs * m.epoch_seconds(a)
                return objective.charged_seconds(train, m.one_time_seconds, epochs, full)

            ranked = sorted(runs, key=lambda run: charged(run[1]))
            settings, best, numbers, flagged = ranked[0]
            choices.append(
                SpeedChoice(
                    batch_size=cell.batch_size,
                    accumulation_steps=accumulation,
                    precision=cell.precision,
                    extras=cell.extras,
                    settings=settings,
                    samples_per_second=best.samples_per_second(accumulation),
                    charged_seconds=charged(best),
                    one_time_seconds=best.one_time_seconds,
                    spread=best.spread,
                    measurements=len(numbers),
                    speed_trials=tuple(numbers),
                    interference=flagged,
                    # as charged: the ranking's own terms (a compile's seconds included), so
                    # never faster than the choice it lost to
                    runner_up=(
                        best.samples_per_second(accumulation)
                        * charged(best)
                        / charged(ranked[1][1])
                        if len(ranked) > 1
                        else None
                    ),
                )
            )
    measured = list(choices)
    for cell in unmeasured:
        borrowed = _borrowed(cell, plan, measured)
        if not borrowed:
            why = f"batch {cell.batch_size}: {_NOT_MEASURED}"
            for a in plan.accumulations:
                key = cell_key(cell.batch_size, a, cell.precision, cell.extras)
                unrunnable.append((key, FaultKind.INTERRUPTED.value, why))
        choices += borrowed
    return SpeedTable(choices=tuple(choices), unrunnable=tuple(unrunnable))


def _borrowed(cell: Cell, plan: SpeedPlan, measured: list[SpeedChoice]) -> list[SpeedChoice]:
    """``cell``'s choices, left unmeasured, at each accumulation: the settings of the nearest
    micro-batch ``measured`` at its precision and declared values (else at any precision),
    its speed unknown; none where nothing was measured."""
    alike = [c for c in measured if (c.precision, c.extras) == (cell.precision, cell.extras)]
    nearest = min(
        alike or [c for c in measured if c.extras == cell.extras],
        key=lambda c: (abs(math.log2(c.batch_size / cell.batch_size)), c.accumulation_steps),
        default=None,
    )
    if nearest is None:
        return []
    return [
        SpeedChoice(
            batch_size=cell.batch_size,
            accumulation_steps=accumulation,
            precision=cell.precision,
            extras=cell.extras,
            settings=nearest.settings,
        )
        for accumulation in plan.accumulations
    ]
