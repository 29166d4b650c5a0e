"""How stage 1 takes one measurement of one setting: claimed in the speed study so that the
processes of a study time it once (``_claims``), timed on this machine's turn (``turns``)
through the study's executor, charged with its graph's cold compile, stored in the speed study
(``_store``) and reported as a ``SpeedEvent``, within what the stage's rules (``_rules``) allow
it: whether it may start, how long it and its wait for the turn may take. The stage itself
(``_stage``) decides what to measure.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import optuna

from autotune.config import TrialConfig
from autotune.executor import TrialExecutor, attempt
from autotune.faults import FaultKind, TrialFault
from autotune.machine.interference import interfered
from autotune.machine.turns import DeviceLockTimeout, device_lock
from autotune.spacefile import Spec
from autotune.speed import BurstPlan, SpeedMeasurement
from autotune.stage1._budget import TimeLimit
from autotune.stage1._claims import Claims
from autotune.stage1._plan import Cell, Settings, SpeedPlan, config_key, context_key, describe
from autotune.stage1._rules import BUDGET, MEASUREMENT_SLACK_SECONDS, MEMORY_WALL, StageRules
from autotune.stage1._store import (
    TRANSIENT_FAULTS,
    Pool,
    SpeedEvent,
    SpeedRecord,
    context_facts,
    known_distributions,
    load_cache,
    open_speed_study,
    speed_trial,
)
from autotune.storage import adapter
from autotune.storage._walls import MemoryWalls
from autotune.training.context import graph_key
from autotune.training.trainer import cudnn_plans_differ

if TYPE_CHECKING:
    from autotune.machine.hardware import Hardware
    from autotune.workloads import Workload

_TIMEOUTS = (FaultKind.TRIAL_TIMEOUT, FaultKind.TIMEOUT_UNDER_LOAD)
CLAIM_POLL_SECONDS = 0.5  # how often a process waiting for another's measurement looks


@dataclass(frozen=True)
class StudyParts:
    """A study as it runs in this process: the study and its spec, the machine, the executor
    that trains its trials and times stage 1's settings, the workload loaded here (if any)."""

    study: optuna.Study
    spec: Spec
    hardware: Hardware
    executor: TrialExecutor
    workload: Workload | None = None


@dataclass(frozen=True)
class StageInputs(StudyParts):
    """The study's speed stage as it runs in this process, and who hears of it: ``on_event``
    each setting, ``on_wait`` that a measurement waits for another process of this machine
    (``turns``)."""

    on_event: Callable[[SpeedEvent], None] = lambda event: None
    on_wait: Callable[[str], None] | None = None


class SettingTimer:
    """Stage 1's measurements of one study in one process: what it has (``pools``, by cache
    key), and how it takes one more."""

    def __init__(self, inputs: StageInputs, since: datetime.datetime | None = None) -> None:
        """Stage 1 of ``inputs`` ready to measure: its plan, its budget from now, the
        measurements stored since ``since`` (all where None)."""
        spec, hardware, study = inputs.spec, inputs.hardware, inputs.study
        # what the timed cells rule out, and the budget (counted from here: reading the cache too)
        self.rules = StageRules(spec)
        self.plan = SpeedPlan.for_hardware(spec, hardware)
        self.context = context_key(context_facts(spec, hardware, inputs.workload))
        self.storage = adapter.storage_of(study)
        self.pools = load_cache(self.storage, self.context, since, study.study_name)
        self.speed_study = open_speed_study(self.storage, study.study_name)
        self.known = known_distributions(self.speed_study)  # its parameters' axes
        self.since = since  # measurements before this are not reused (--remeasure)
        self.inputs = inputs
        self.claims = Claims(self.speed_study)  # who times which setting, across machines
        self.last_measured: TrialConfig | None = None  # what the worker's process ran last
        self.burst_plan = BurstPlan(
            bursts=spec.study.speed.bursts,
            burst_seconds=spec.study.speed.burst_seconds,
            # a live graph reused by the settings after it (training.context.compile_state)
            keep_compiled=uuid.uuid4().hex,
        )
        # graph_key -> the cold compile's seconds, charged to every setting that reuses it
        self.cold_compiles: dict[str, float] = {}
        self.live_graph: tuple[str, int] | None = None  # the worker's: graph_key, its threads
        self.threads = 0  # the intra-op threads of the last measurement
        self.walls = MemoryWalls()  # larger micro-batches than one out of memory: not timed
        self.tried: dict[Cell, list[Settings]] = {}  # every setting of a cell, in order
        self.said: set[str] = set()  # keys this stage has reported (timed, reused, failed)
        self.quiet = False  # the last measurement this stage took was not under interference

    def key(self, cell: Cell, settings: Settings) -> str:
        return config_key(self.context, self.plan.config(cell, settings))

    def pool(self, cell: Cell, settings: Settings) -> Pool:
        return self.pools.setdefault(self.key(cell, settings), Pool())

    def measure(self, cell: Cell, settings: Settings, count: int) -> None:
        """Measure ``settings`` in ``cell`` until it has ``count`` measurements (or a fault),
        waiting for another process that holds its claim."""
        said = False
        while (other := self._claim_and_measure(cell, settings, count)) is not None:
            if not said and self.inputs.on_wait is not None:
                self.inputs.on_wait(
                    f"waiting for autotune process {other}, which times {describe(settings)}"
                )
                said = True
            time.sleep(CLAIM_POLL_SECONDS)

    def _claim_and_measure(self, cell: Cell, settings: Settings, count: int) -> str | None:
        """Measure ``settings`` once if it needs it and this process can claim it; None when
        it has what it needs, else who holds its claim (``host:pid``)."""
        if settings not in self.tried.setdefault(cell, []):
            self.tried[cell].append(settings)
        pool = self.pool(cell, settings)
        words = describe(settings)
        config = self.plan.config(cell, settings)
        blocked = self.walls.blocks(config)
        if pool.fault is None and not pool.results and blocked is not None:
            pool.fault = (FaultKind.OOM.value, blocked)
            self.said.add(self.key(cell, settings))
            walled = SpeedEvent.left_out(cell.label(), words, pool.fault[1], MEMORY_WALL)
            self.inputs.on_event(walled)
            return None
        if self._done(cell, settings, count):
            return None
        # each (setting, round) is timed once by whichever process of the study claims it
        # first, on this machine or another; the others take its measurement as it is
        self._refresh(cell, settings)
        if self._done(cell, settings, count):
            return None
        key, round_number = self.key(cell, settings), len(pool.results) + 1
        with self.claims.hold(key, round_number) as other:
            if other is not None:
                return other
            self._refresh(cell, settings)  # finished by another since the first look?
            if not self._done(cell, settings, count):
                self._take_on_turn(cell, settings, config)
        return None

    def _take_on_turn(self, cell: Cell, settings: Settings, config: TrialConfig) -> None:
        """Time ``settings`` on this machine's turn (no other process trains on these cores or
        GPU meanwhile), unless the stage refuses to start it (``refused``), before or after
        its wait for the turn, or its time runs out during that wait (``turn_patience``)."""
        asked = time.monotonic()
        why = self.refused()
        if why is None:
            try:
                with device_lock(
                    config.device, config.world_size, self.inputs.on_wait, self.turn_patience()
                ):
                    why = self.refused()
                    if why is None:
                        self._take(cell, settings, config, asked)
            except DeviceLockTimeout as not_taken:
                if not_taken.by_user:
                    raise
                why = "not tried: stage 1's time ran out while another process held its turn"
        key = self.key(cell, settings)
        if why is not None and key not in self.said:  # said once, however often refused
            self.said.add(key)
            self.inputs.on_event(
                SpeedEvent.left_out(cell.label(), describe(settings), why, BUDGET)
            )

    def graph_live(self, config: TrialConfig) -> bool:
        """Whether a measurement of ``config`` now reuses the graph the worker keeps live (no
        cold compile: ``CompiledGraph.warm``), at the last measurement's threads (it was quiet:
        threads follow the load), in the same process (no switch of cudnn.benchmark)."""
        last = self.last_measured
        if last is None or cudnn_plans_differ(last, config) or not self.quiet:
            return False
        return config.compile != "none" and self.live_graph == (graph_key(config), self.threads)

    def _measured(self) -> bool:
        """Whether the stage has a measurement (this run's or the cache's)."""
        return any(pool.results for pool in self.pools.values())

    def _timed(self, cell: Cell) -> bool:
        """Whether ``cell`` has a measurement (this run's, another process's or the cache's)."""
        return any(self.pool(cell, s).results for s in self.tried.get(cell, []))

    def _can_fall_back(self, cell: Cell) -> bool:
        """Whether ``cell`` has a measurement or an eager setting to time: only then may the
        budget leave its compiled settings out."""
        return self._timed(cell) or any(
            dict(s).get("compile", "none") == "none" for s in self.plan.first_round(cell)
        )

    def _eager_epoch(self, cell: Cell) -> float | None:
        """Seconds of an epoch at ``cell``'s fastest eager setting timed so far (None: none)."""
        epochs = [
            measurement.epoch_seconds()
            for settings in self.tried.get(cell, [])
            if dict(settings).get("compile", "none") == "none"
            for _, measurement, _, _ in self.pool(cell, settings).results
        ]
        return min(epochs, default=None)

    def refused(self) -> str | None:
        """Past the budget's end, nothing starts but a stage's first measurement: the one
        measurement a stage may run past its budget, without which no trial can train."""
        return self.rules.refused() if self._measured() else None

    def turn_patience(self) -> float | None:
        """Seconds a measurement may wait for this machine's turn: until the budget's end; the
        stage's first measurement as long as the user waits (None)."""
        return max(0.0, self.rules.time_left()) if self._measured() else None

    def time_limit(self, cell: Cell, config: TrialConfig) -> TimeLimit | None:
        """How long a measurement of ``config`` in ``cell`` may take before it is stopped;
        None: the study's trial_timeout alone."""
        if config.compile == "none":
            return self.rules.eager_limit()
        limit = self.rules.compile_limit(config.compile, self._eager_epoch(cell))
        if limit is None or not limit.budget or self._can_fall_back(cell):
            return limit
        # every setting of the cell compiles (a declared compile mode, or none eager in the
        # space) and none is timed: its one measurement may take its cold compile and then
        # some past the budget, or the cell would have no speed at all
        needs = self.rules.expected_compile(config.compile) + MEASUREMENT_SLACK_SECONDS
        return dataclasses.replace(limit, seconds=max(limit.seconds, needs))

    def _done(self, cell: Cell, settings: Settings, count: int) -> bool:
        """Whether ``settings`` has ``count`` measurements in ``cell`` already (or a fault);
        reported, at its first round, as reused."""
        pool = self.pool(cell, settings)
        if pool.fault is not None or len(pool.results) >= count:
            key = self.key(cell, settings)
            if count == 1 and key not in self.said:  # reported once, not at every look
                self.said.add(key)
                fault = pool.fault[1] if pool.fault else None
                best = pool.combined()
                self.inputs.on_event(
                    SpeedEvent(
                        cell=cell.label(),
                        settings=describe(settings),
                        samples_per_second=best.samples_per_second() if best else None,
                        spread=best.spread if best else None,
                        cached=True,
                        fault=fault,
                    )
                )
            return True
        return False

    def _refresh(self, cell: Cell, settings: Settings) -> None:
        """Read ``settings``' measurements in ``cell`` from the storage again: another process
        may have taken some since the stage started."""
        key = self.key(cell, settings)
        found = load_cache(
            self.storage, self.context, self.since, self.inputs.study.study_name, key
        )
        if key in found and len(found[key].results) > len(self.pool(cell, settings).results):
            self.pools[key] = found[key]

    def _take(self, cell: Cell, settings: Settings, config: TrialConfig, asked: float) -> None:
        """Time ``settings`` in ``cell`` once more (its turn asked for at ``asked``, a
        time.monotonic()), store it, and say so."""
        key = self.key(cell, settings)
        self.said.add(key)
        record = SpeedRecord(
            cache_key=key,
            context=self.context,
            cell=cell.label(),
            settings=describe(settings),
            round=len(self.pool(cell, settings).results) + 1,
        )
        limit = self.time_limit(cell, config)
        plan = dataclasses.replace(
            self.burst_plan, time_limit_seconds=limit.seconds if limit is not None else None
        )
        if self.last_measured is not None and cudnn_plans_differ(self.last_measured, config):
            self.live_graph = None  # a new worker process: nothing kept
        self.last_measured = config
        result = attempt(lambda: self.inputs.executor.measure(config, plan))
        if isinstance(result, TrialFault):
            self.live_graph = None
            self._failed(cell, settings, record, result, limit)
            return
        self.threads = result.intra_op_threads
        if config.compile != "none":
            self.live_graph = (graph_key(config), self.threads)
        # as measured, its wait for the turn included: what it cost the stage's budget
        self.rules.took(config.compile, time.monotonic() - asked, result.compile_seconds)
        result = self._charge_cold_compile(config, result)
        flagged = interfered(result.other_cpu_share)
        self.quiet = not flagged
        done = dataclasses.replace(
            record, measurement=dataclasses.asdict(result), interference=flagged
        )
        trial = speed_trial(cell, settings, done, result.samples_per_second(), self.known)
        number = adapter.add_finished_trial(self.speed_study, trial)
        self.pool(cell, settings).results.append((number, result, flagged, record.round))
        self.inputs.on_event(
            SpeedEvent(
                cell=record.cell,
                settings=record.settings,
                samples_per_second=result.samples_per_second(),
                spread=result.spread,
                fault="measured under interference" if flagged else None,
                round=record.round,
            )
        )

    def _failed(
        self,
        cell: Cell,
        settings: Settings,
        record: SpeedRecord,
        fault: TrialFault,
        limit: TimeLimit | None,
    ) -> None:
        """Store and say the ``fault`` of ``record``'s measurement: one stopped at ``limit`` is
        the limit's (the budget's: interrupted); out of memory a wall."""
        config = self.plan.config(cell, settings)
        kind, message = fault.kind, fault.message
        self.quiet = kind != FaultKind.TIMEOUT_UNDER_LOAD
        if limit is not None and kind in _TIMEOUTS:  # stopped at the stage's limit
            self.rules.stopped(config.compile, limit, cell)
            message = f"{limit.why} ({message})"
            if limit.budget:  # says nothing of the setting: a later stage times it
                kind = FaultKind.INTERRUPTED
        if kind == FaultKind.OOM:
            self.walls.add(config, "stage 1")
        details = (fault.details or None) if kind == FaultKind.ERROR else None
        failed = dataclasses.replace(
            record, fail_kind=kind.value, fail_msg=message, fail_traceback=details
        )
        adapter.add_finished_trial(
            self.speed_study, speed_trial(cell, settings, failed, None, self.known)
        )
        if kind.value not in TRANSIENT_FAULTS:  # measured again next time
            self.pool(cell, settings).fault = (kind.value, message)
        self.inputs.on_event(SpeedEvent(cell=record.cell, settings=record.settings, fault=message))

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
