"""Stage 1 of the two-stage search: time the execution knobs, keep the fastest per cell.

For every cell of the plan (``_speed_plan``: a micro-batch size at a precision) the stage times
short bursts of real training steps of each setting of the execution knobs through the study's
executor (``bursts.measure`` in the worker), then measures the cell's leaders again in the
opposite order (A B C, then C B A) so that the choice between close settings rests on more
than one measurement taken at one moment. Out of memory marks a wall: larger micro-batches at
those settings are not tried. Measurements are stored in, and reused from, the speed study
(``_speed_store``); ``--remeasure`` ignores earlier ones.

The stage's answer is a ``SpeedTable``: for each micro-batch split (batch x accumulation) and
precision, the settings with which a trial finishes soonest, charged as the objective charges.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import optuna

from autotune import objective
from autotune.config import TrialConfig
from autotune.execution import graph_key
from autotune.executor import TrialExecutor, attempt
from autotune.faults import FaultKind, TrialFault
from autotune.interference import interfered
from autotune.spec import Spec
from autotune.speed import COMPUTE_KNOBS, BurstPlan, SpeedChoice, SpeedMeasurement, SpeedTable
from autotune.study import adapter
from autotune.study._speed_plan import Cell, Settings, SpeedPlan, config_key, context_key, describe
from autotune.study._speed_store import (
    Pool,
    SpeedEvent,
    SpeedRecord,
    context_facts,
    load_cache,
    open_speed_study,
    speed_trial,
)
from autotune.study._walls import MemoryWalls

if TYPE_CHECKING:
    from autotune.hardware import Hardware
    from autotune.workloads import Workload

__all__ = ["run_speed_stage", "unpaid_compile"]

CONTENDER_MARGIN = 0.10  # settings within this of a cell's fastest are measured again
MAX_CONTENDERS = 4  # ... at most this many per cell
# a pipeline below this share of its cell's fastest is not tried at the micro-batch's other
# precisions: what a pipeline costs a batch (loading, workers' start and hand-over) does not
# depend on the precision, so one this far behind is held back by its own overhead
SLOW_PIPELINE_SHARE = 0.5
# faults that say nothing about the configuration: not cached, measured again next time
_TRANSIENT = (FaultKind.TIMEOUT_UNDER_LOAD, FaultKind.INTERRUPTED)


class _Stage:
    def __init__(
        self,
        study: optuna.Study,
        spec: Spec,
        plan: SpeedPlan,
        executor: TrialExecutor,
        context: str,
        pools: dict[str, Pool],
        on_event: Callable[[SpeedEvent], None],
    ) -> None:
        self.speed_study = open_speed_study(adapter.storage_of(study), study.study_name)
        self.spec = spec
        self.plan = plan
        self.executor = executor
        self.context = context
        self.pools = pools
        self.on_event = on_event
        self.burst_plan = BurstPlan(
            bursts=spec.study.speed.bursts,
            burst_seconds=spec.study.speed.burst_seconds,
            # each distinct graph compiled once in this stage (execution.compile_state)
            keep_compiled=uuid.uuid4().hex,
        )
        # graph_key -> the cold compile's seconds, charged to every setting that reuses it
        self.cold_compiles: dict[str, float] = {}
        self.walls = MemoryWalls()  # larger micro-batches than one out of memory: not timed
        self.tried: dict[Cell, list[Settings]] = {}  # every setting of a cell, in order
        # (micro-batch, declared knobs) -> pipelines far behind at a precision measured before
        self.slow_pipelines: dict[tuple[Any, ...], dict[Settings, str]] = {}
        # compile modes not tried in later cells (they cannot pay back, or fail), and why
        self.dropped_modes: dict[str, str] = {}
        self.slowest_eager_epoch = 0.0  # seconds: the most an epoch of any cell took eager
        self.best_speedup: dict[str, float] = {}  # compile mode -> best eager/compiled seen

    def key(self, cell: Cell, settings: Settings) -> str:
        return config_key(self.context, self.plan.config(cell, settings))

    def pool(self, cell: Cell, settings: Settings) -> Pool:
        return self.pools.setdefault(self.key(cell, settings), Pool())

    def measure(self, cell: Cell, settings: Settings, count: int) -> None:
        """Measure ``settings`` in ``cell`` until it has ``count`` measurements (or a fault)."""
        if settings not in self.tried.setdefault(cell, []):
            self.tried[cell].append(settings)
        pool = self.pool(cell, settings)
        words = describe(settings)
        config = self.plan.config(cell, settings)
        blocked = self.walls.blocks(config)
        if pool.fault is None and not pool.results and blocked is not None:
            pool.fault = (FaultKind.OOM.value, blocked)
            self.on_event(
                SpeedEvent(cell.label(), words, None, None, False, pool.fault[1], 1, False)
            )
            return
        if pool.fault is not None or len(pool.results) >= count:
            if count == 1:  # reported once, not at every round
                fault = pool.fault[1] if pool.fault else None
                best = pool.combined()
                self.on_event(
                    SpeedEvent(
                        cell.label(),
                        words,
                        best.samples_per_second() if best else None,
                        best.spread if best else None,
                        True,
                        fault,
                        1,
                    )
                )
            return
        round_number = len(pool.results) + 1
        record = SpeedRecord(
            cache_key=self.key(cell, settings),
            context=self.context,
            cell=cell.label(),
            settings=words,
            round=round_number,
        )
        result = attempt(lambda: self.executor.measure(config, self.burst_plan))
        if isinstance(result, TrialFault):
            kind, message = result.kind, result.message
            if kind == FaultKind.OOM:
                self.walls.add(config, "stage 1")
            failed = dataclasses.replace(record, fail_kind=kind.value, fail_msg=message)
            self._store(speed_trial(cell, settings, failed, None))
            if kind not in _TRANSIENT:
                pool.fault = (kind.value, message)
            self.on_event(SpeedEvent(cell.label(), words, None, None, False, message, 1))
            return
        result = self._charge_cold_compile(config, result)
        flagged = interfered(result.other_cpu_share)
        by_accumulation = {str(a): result.samples_per_second(a) for a in self.plan.accumulations}
        done = dataclasses.replace(
            record,
            measurement=dataclasses.asdict(result),
            interference=flagged,
            samples_per_second_by_accumulation=by_accumulation,
        )
        number = self._store(speed_trial(cell, settings, done, result.samples_per_second()))
        pool.results.append((number, result, flagged, round_number))
        self.on_event(
            SpeedEvent(
                cell.label(),
                words,
                result.samples_per_second(),
                result.spread,
                False,
                "measured under interference" if flagged else None,
                round_number,
            )
        )

    def _charge_cold_compile(
        self, config: TrialConfig, result: SpeedMeasurement
    ) -> SpeedMeasurement:
        """A measurement charged with its graph's cold compile: a setting that reused a graph
        compiled earlier in the stage paid almost nothing for it, where a trial pays it all."""
        if config.compile == "none":
            return result
        key = graph_key(config)
        if not result.compile_warm:
            self.cold_compiles[key] = result.compile_seconds or 0.0
            return result
        cold = self.cold_compiles.get(key)
        if cold is None:  # its worker compiled it before this stage saw it: not known here
            return result
        warm = result.compile_seconds or 0.0
        return dataclasses.replace(
            result,
            one_time_seconds=result.one_time_seconds + max(0.0, cold - warm),
            compile_seconds=cold,
        )

    def _store(self, trial: optuna.trial.FrozenTrial) -> int:
        """Add a finished measurement to the speed study; its trial number."""
        return adapter.add_finished_trial(self.speed_study, trial)

    def speed(self, cell: Cell, settings: Settings) -> float | None:
        """Samples/s of the first round: the stage's decisions rest on it alone, so that a
        resumed stage decides as the interrupted one did."""
        return self.pool(cell, settings).first_round()

    def fastest(self, cell: Cell, candidates: list[Settings]) -> Settings | None:
        timed = [(self.speed(cell, s), s) for s in candidates]
        ranked = [(speed, s) for speed, s in timed if speed is not None]
        return max(ranked, key=lambda pair: pair[0])[1] if ranked else None

    def _pipeline(self, settings: Settings) -> Settings:
        return tuple((k, v) for k, v in settings if k not in COMPUTE_KNOBS)

    def skip_slow(self, cell: Cell, settings: Settings) -> bool:
        """Whether ``settings`` uses a pipeline that was far behind at another precision of
        this micro-batch (reported, not measured)."""
        slow = self.slow_pipelines.get((cell.batch_size, cell.extras), {})
        why = slow.get(self._pipeline(settings))
        if why is None or self.pool(cell, settings).results:
            return False
        words = describe(settings)
        self.on_event(SpeedEvent(cell.label(), words, None, None, False, why, 1, False))
        return True

    def skip_dropped_mode(self, cell: Cell, settings: Settings) -> bool:
        """Whether ``settings`` compiles with a mode dropped in an earlier cell (reported, not
        measured; a measurement already stored is still used)."""
        why = self.dropped_modes.get(dict(settings).get("compile", "none"))
        if why is None or self.pool(cell, settings).results:
            return False
        self.on_event(
            SpeedEvent(cell.label(), describe(settings), None, None, False, why, 1, False)
        )
        return True

    def skip(self, cell: Cell, settings: Settings) -> bool:
        """Whether ``settings`` is left out of ``cell`` (said in an event)."""
        return self.skip_dropped_mode(cell, settings) or self.skip_slow(cell, settings)

    def note_compile_payback(self, cell: Cell) -> None:
        """Drop, from the cells still to come, each compile mode whose cold compile cannot pay
        back over the full run (objective.full_run_epochs, as the objective charges it) even at
        the best speed-up over eager seen so far and at the slowest epoch seen, and each mode
        that failed to compile in every setting of ``cell``."""
        by_mode: dict[str, list[SpeedMeasurement]] = {}
        failed: set[str] = set()
        for settings in self.tried.get(cell, []):
            mode = dict(settings).get("compile", "none")
            pool = self.pool(cell, settings)
            combined = pool.combined()
            if combined is not None:
                by_mode.setdefault(mode, []).append(combined)
            elif pool.fault is not None and pool.fault[0] == FaultKind.COMPILE_ERROR.value:
                failed.add(mode)
        for mode in sorted(failed):
            if mode not in by_mode and mode not in self.dropped_modes:
                self.dropped_modes[mode] = f"not tried: compile {mode} failed at {cell.label()}"
        if "none" not in by_mode:
            return
        eager = min(m.epoch_seconds() for m in by_mode["none"])
        self.slowest_eager_epoch = max(self.slowest_eager_epoch, eager)
        spec = self.spec
        full = spec.objective.full_run_epochs if spec.objective.per_second else None
        horizon = full or spec.workload.epochs  # epochs over which a compile is paid back
        for mode, measured in by_mode.items():
            if mode == "none" or mode in self.dropped_modes:
                continue
            compiled = min(m.epoch_seconds() for m in measured)
            speedup = max(self.best_speedup.get(mode, 0.0), eager / compiled)
            self.best_speedup[mode] = speedup
            cost = max(m.compile_seconds or 0.0 for m in measured)
            why = unpaid_compile(mode, cost, self.slowest_eager_epoch, speedup, horizon)
            if why is not None:
                self.dropped_modes[mode] = why

    def note_slow_pipelines(self, cell: Cell) -> None:
        """Remember the pipelines of ``cell`` below SLOW_PIPELINE_SHARE of its fastest."""
        timed = [(self.speed(cell, s), s) for s in self.tried.get(cell, [])]
        top = max((speed for speed, _ in timed if speed is not None), default=None)
        if top is None:
            return
        slow = self.slow_pipelines.setdefault((cell.batch_size, cell.extras), {})
        for speed, settings in timed:
            if speed is not None and speed < SLOW_PIPELINE_SHARE * top:
                slow.setdefault(
                    self._pipeline(settings),
                    f"not tried: under {SLOW_PIPELINE_SHARE:.0%} of the fastest at "
                    f"{cell.precision} ({speed / top:.0%})",
                )

    def run_cell(self, cell: Cell) -> None:
        plan = self.plan
        if plan.exhaustive(cell):
            for settings in plan.all_settings(cell):
                if not self.skip(cell, settings):
                    self.measure(cell, settings, 1)
        else:
            reference = plan.reference_pipeline(cell)
            first = [plan.settings(reference, c) for c in plan.compute_settings(cell)]
            first = [s for s in first if not self.skip_dropped_mode(cell, s)]
            for settings in first:
                self.measure(cell, settings, 1)
            best = self.fastest(cell, first)
            if best is not None:
                compute = {k: v for k, v in best if k in COMPUTE_KNOBS}
                for pipeline in plan.pipeline_settings(cell):
                    settings = plan.settings(pipeline, compute)
                    if not self.skip(cell, settings):
                        self.measure(cell, settings, 1)
        self.note_slow_pipelines(cell)
        self.note_compile_payback(cell)
        # the leaders again, in alternating order: A B C, then C B A, ...
        tried = self.tried.get(cell, [])
        timed = [(self.speed(cell, s), s) for s in tried]
        top = max((speed for speed, _ in timed if speed is not None), default=None)
        if top is None:
            return
        leaders = [
            s for speed, s in timed if speed is not None and speed >= top * (1 - CONTENDER_MARGIN)
        ]
        leaders = sorted(leaders, key=lambda s: -(self.speed(cell, s) or 0))[:MAX_CONTENDERS]
        leaders = [s for s in tried if s in leaders]  # in the order first measured
        if len(leaders) < 2:
            return  # a clear winner needs no rematch
        for repeat in range(2, self.spec.study.speed.repeats + 1):
            order = leaders if repeat % 2 == 1 else list(reversed(leaders))
            for settings in order:
                self.measure(cell, settings, repeat)

    def table(self) -> SpeedTable:
        """The fastest settings of every micro-batch split, precision and declared value."""
        spec, plan = self.spec, self.plan
        epochs = spec.workload.epochs
        full = spec.objective.full_run_epochs if spec.objective.per_second else None
        choices: list[SpeedChoice] = []
        unrunnable: list[tuple[tuple[Any, ...], str, str]] = []
        for cell in plan.cells():
            runs: list[tuple[Settings, SpeedMeasurement, list[int]]] = []
            faults: list[tuple[str, str]] = []  # (kind, message)
            for settings in self.tried.get(cell, []):
                pool = self.pool(cell, settings)
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
                            ranked[1][1].samples_per_second(accumulation)
                            if len(ranked) > 1
                            else None
                        ),
                    )
                )
        return SpeedTable(choices=tuple(choices), unrunnable=tuple(unrunnable))


def unpaid_compile(
    mode: str, compile_seconds: float, eager_epoch_seconds: float, speedup: float, epochs: float
) -> str | None:
    """Why compile ``mode`` cannot pay back its cold compile (``compile_seconds``) over
    ``epochs`` epochs of ``eager_epoch_seconds`` each at ``speedup`` over eager, or None when
    it can: the objective charges a compile in full over the full run, so a mode is worth
    measuring only where the seconds it saves there exceed it."""
    saving = epochs * eager_epoch_seconds * max(0.0, 1.0 - 1.0 / speedup)
    if compile_seconds <= saving:
        return None
    return (
        f"not tried: compile {mode} cannot pay back its {compile_seconds:.3g} s compile "
        f"(at most {saving:.3g} s saved over {epochs:g} epochs at {speedup:.2f}x eager)"
    )


def _stage(
    study: optuna.Study,
    spec: Spec,
    hardware: Hardware,
    executor: TrialExecutor,
    workload: Workload | None,
    since: datetime.datetime | None,
    on_event: Callable[[SpeedEvent], None],
) -> _Stage:
    from autotune.baseline import untuned_config

    plan = SpeedPlan(spec, untuned_config(spec, hardware))
    context = context_key(context_facts(spec, hardware, workload))
    pools = load_cache(adapter.storage_of(study), context, since)
    return _Stage(study, spec, plan, executor, context, pools, on_event)


def run_speed_stage(
    study: optuna.Study,
    spec: Spec,
    hardware: Hardware,
    executor: TrialExecutor,
    workload: Workload | None = None,
    remeasure: bool = False,
    on_event: Callable[[SpeedEvent], None] | None = None,
) -> SpeedTable:
    """Time every cell's execution settings (reusing matching measurements unless
    ``remeasure``) and return the fastest of each micro-batch split and precision."""
    since = datetime.datetime.now() if remeasure else None
    stage = _stage(study, spec, hardware, executor, workload, since, on_event or (lambda e: None))
    for cell in stage.plan.cells():
        stage.run_cell(cell)
    return stage.table()
