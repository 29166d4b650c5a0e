"""Stage 1's answer: for each micro-batch split (batch x accumulation), precision and declared
value, the measured settings with which a trial finishes soonest, charged as the objective
charges one-time costs; and the cells where nothing could run, with why. A cell the stage left
unmeasured (its budget ran out on a busy machine) trains with the settings of the nearest cell
measured, its speed unknown (``SpeedChoice.measured``): its trials measure it themselves."""

from __future__ import annotations

import math
from collections.abc import Callable

from autotune.faults import FaultKind
from autotune.search import objective
from autotune.spacefile import Spec
from autotune.speed import SpeedChoice, SpeedMeasurement, SpeedTable, Unrunnable, cell_key
from autotune.stage1._plan import Cell, Settings, SpeedPlan
from autotune.stage1._store import Pool

# a cell with neither a measurement nor a fault, and no cell measured to borrow settings from:
# interrupted, not an error, so that trials drawn there fail without counting as the same bug
_NOT_MEASURED = (
    "not measured in this run's stage 1 (its budget, a busy machine or its rules left it out)"
)


# a measured setting of a cell: its settings, its measurements combined, the speed trials
# behind them, whether every one was taken under interference
Run = tuple[Settings, SpeedMeasurement, tuple[int, ...], bool]


def speed_table(
    spec: Spec,
    plan: SpeedPlan,
    tried: dict[Cell, list[Settings]],
    pool_of: Callable[[Cell, Settings], Pool],
) -> SpeedTable:
    """The table of ``plan``'s cells from the settings ``tried`` in each and their pools."""
    choices: list[SpeedChoice] = []
    unrunnable: list[Unrunnable] = []
    unmeasured: list[Cell] = []
    for cell in plan.cells():
        runs: list[Run] = []
        faults: list[tuple[str, str]] = []  # (kind, message)
        for settings in tried.get(cell, []):
            pool = pool_of(cell, settings)
            if (combined := pool.combined()) is not None:
                numbers = tuple(n for n, _ in pool.clean())
                runs.append((settings, combined, numbers, pool.flagged_only()))
            elif pool.fault is not None:
                faults.append(pool.fault)
        if runs:
            choices += (_fastest(spec, cell, a, runs) for a in plan.accumulations)
        elif faults:
            # out of memory when any setting ran out of it: the cell's wall
            kind, why = next((f for f in faults if f[0] == FaultKind.OOM.value), faults[0])
            unrunnable += _keyed(cell, plan, kind, f"batch {cell.batch_size}: {why}")
        else:
            unmeasured.append(cell)
    measured = list(choices)
    for cell in unmeasured:
        borrowed = _borrowed(cell, plan, measured)
        if not borrowed:
            why = f"batch {cell.batch_size}: {_NOT_MEASURED}"
            unrunnable += _keyed(cell, plan, FaultKind.INTERRUPTED.value, why)
        choices += borrowed
    return SpeedTable(choices=tuple(choices), unrunnable=tuple(unrunnable))


def _keyed(cell: Cell, plan: SpeedPlan, kind: str, why: str) -> list[Unrunnable]:
    """``cell``'s rows of the table's ``unrunnable``, one for each accumulation."""
    return [
        (cell_key(cell.batch_size, a, cell.precision, cell.extras), kind, why)
        for a in plan.accumulations
    ]


def _fastest(spec: Spec, cell: Cell, accumulation: int, runs: list[Run]) -> SpeedChoice:
    """``cell``'s choice at ``accumulation``: the run a trial finishes soonest with, charged
    as the objective charges one-time costs; marked ``interference`` where any run was timed
    only under interference (a busy loser may have lost to the load alone)."""
    epochs = spec.workload.epochs
    full = spec.objective.full_run_epochs if spec.objective.per_second else None

    def charged(m: SpeedMeasurement) -> float:
        train = m.one_time_seconds + epochs * m.epoch_seconds(accumulation)
        return objective.charged_seconds(train, m.one_time_seconds, epochs, full)

    ranked = sorted(runs, key=lambda run: charged(run[1]))
    settings, best, numbers, _ = ranked[0]
    speed = best.samples_per_second(accumulation)
    return SpeedChoice(
        batch_size=cell.batch_size,
        accumulation_steps=accumulation,
        precision=cell.precision,
        extras=cell.extras,
        settings=settings,
        samples_per_second=speed,
        charged_seconds=charged(best),
        one_time_seconds=best.one_time_seconds,
        spread=best.spread,
        measurements=len(numbers),
        speed_trials=numbers,
        # its choice rests on a figure taken under interference: its own, or a loser's
        interference=any(run[3] for run in runs),
        # as charged: the ranking's own terms (a compile's seconds included), so never faster
        # than the choice it lost to
        runner_up=speed * charged(best) / charged(ranked[1][1]) if len(ranked) > 1 else None,
    )


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
