"""Stage 1's answer: for each micro-batch split (batch x accumulation), precision and declared
value, the measured settings with which a trial finishes soonest, charged as the objective
charges one-time costs; and the cells where nothing could run, with why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune import objective
from autotune.faults import FaultKind
from autotune.spec import Spec
from autotune.speed import SpeedChoice, SpeedMeasurement, SpeedTable
from autotune.study._speed_plan import Cell, Settings, SpeedPlan
from autotune.study._speed_store import Pool

__all__ = ["speed_table"]


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
    for cell in plan.cells():
        runs: list[tuple[Settings, SpeedMeasurement, list[int]]] = []
        faults: list[tuple[str, str]] = []  # (kind, message)
        for settings in tried.get(cell, []):
            pool = pool_of(cell, settings)
            combined = pool.combined()
            if combined is not None:
                runs.append((settings, combined, [n for n, _ in pool.clean()]))
            elif pool.fault is not None:
                faults.append(pool.fault)
        extras = tuple(sorted(cell.extras))
        for accumulation in plan.accumulations:
            key = (cell.batch_size, accumulation, cell.precision, extras)
            if not runs:
                # out of memory when any setting ran out of it: the cell's wall
                kind, why = next(
                    (f for f in faults if f[0] == FaultKind.OOM.value),
                    faults[0] if faults else (FaultKind.ERROR.value, "nothing measured"),
                )
                unrunnable.append((key, kind, f"batch {cell.batch_size}: {why}"))
                continue

            def charged(m: SpeedMeasurement, a: int = accumulation) -> float:
                train = m.one_time_seconds + epochs * m.epoch_seconds(a)
                return objective.charged_seconds(train, m.one_time_seconds, epochs, full)

            ranked = sorted(runs, key=lambda run: charged(run[1]))
            settings, best, numbers = ranked[0]
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
                    runner_up=(
                        ranked[1][1].samples_per_second(accumulation) if len(ranked) > 1 else None
                    ),
                )
            )
    return SpeedTable(choices=tuple(choices), unrunnable=tuple(unrunnable))
