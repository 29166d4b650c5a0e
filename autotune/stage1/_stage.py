"""Stage 1 of the two-stage search: time the execution knobs, keep the fastest per cell.

First every cell (``_plan``) times its reference setting, the cells predicted fastest
first (one timed only under interference again, while the machine is quiet); then, fastest
first by what that measured (clean figures before busy ones), each cell's other settings,
and its leaders again in alternating order (A B C, then C B A); a setting timed only under
interference that lost is timed again first, while the machine is quiet (``_retime_losers``),
or the cell's row is marked busy. Out of memory marks a wall;
what the timed cells rule out is ``_rules``'s, one measurement ``_take``'s, the cache
``_store``'s.
What a busy machine spoiled is timed again at the end while the budget lasts (``time_again``).
The answer is a ``SpeedTable``: per micro-batch split and precision, the settings with which a
trial finishes soonest, charged as the objective charges.
"""

from __future__ import annotations

import datetime

from autotune.knobs import COMPUTE_KNOBS
from autotune.speed import SpeedTable
from autotune.stage1._plan import Cell, Settings, describe
from autotune.stage1._rules import CellResult
from autotune.stage1._store import SpeedEvent
from autotune.stage1._table import speed_table
from autotune.stage1._take import SettingTimer, StageInputs
from autotune.storage._records import StudyRecord
from autotune.training.trainer import cudnn_plans_differ

CONTENDER_MARGIN = 0.10  # settings within this of a cell's fastest are measured again
MAX_CONTENDERS = 4  # ... at most this many per cell


class Stage(SettingTimer):
    """Stage 1 over the cells of its plan: what to measure, and what the cells rule out."""

    last_winner: Settings | None = None  # the fastest settings of the last cell

    def measure_all(
        self,
        cell: Cell,
        candidates: list[Settings],
        compute_pass: bool = False,
        count: int = 1,
    ) -> list[Settings]:
        """Measure each of ``candidates`` until it has ``count`` measurements, those another
        process of the study claimed last; a first round leaves out what ``skip`` rules out.
        The settings left in, in order."""
        kept, held = [], []
        if count == 1:
            candidates = self._same_process_first(cell, candidates)
        for settings in candidates:
            if count == 1 and self.skip(cell, settings, compute_pass):
                continue
            if count > 1 and self.rules.over_budget():
                break  # past the budget, leaders are not measured again
            kept.append(settings)
            if self._claim_and_measure(cell, settings, count) is not None:
                held.append(settings)
        for settings in held:
            self.measure(cell, settings, count)
        return kept

    def _same_process_first(self, cell: Cell, candidates: list[Settings]) -> list[Settings]:
        """``candidates``, those the worker can time in its current process first: a switch
        of cudnn.benchmark takes a new worker process (``cudnn_plans_differ``; 10-13 s on an
        H100), so a cell switches once, not twice."""
        last = self.last_measured
        if last is None:
            return candidates
        return sorted(
            candidates, key=lambda s: cudnn_plans_differ(last, self.plan.config(cell, s))
        )

    def speed(self, cell: Cell, settings: Settings) -> float | None:
        """Samples/s of the first round, which alone decides: a resumed stage decides alike."""
        return self.pool(cell, settings).first_round()

    def fastest(self, cell: Cell, candidates: list[Settings]) -> Settings | None:
        timed = [(self.speed(cell, s), s) for s in candidates]
        ranked = [(speed, s) for speed, s in timed if speed is not None]
        return max(ranked, key=lambda pair: pair[0])[1] if ranked else None

    def skip(self, cell: Cell, settings: Settings, compute_pass: bool = False) -> bool:
        """Whether ``settings`` is left out of ``cell`` (``_rules``; said in an event);
        never one measured before."""
        if self.pool(cell, settings).results:
            return False
        timed = self._timed(cell)
        warm = self.graph_live(self.plan.config(cell, settings))
        why = self.rules.why(cell, settings, compute_pass, timed, self._can_fall_back(cell), warm)
        if why is None:
            return False
        words = describe(settings)
        self.inputs.on_event(SpeedEvent.left_out(cell.label(), words, why, self.rules.reason(why)))
        return True

    def run_cell_over_budget(self, cell: Cell) -> None:
        """The budget is spent: ``cell`` keeps what it has measured (its reference, the
        cache), else times one eager setting (the last cell's fastest, or its reference)."""
        fallback = dict(self.last_winner or self.plan.reference(cell))
        if "compile" not in dict(cell.extras):  # (a declared compile value is the cell's)
            fallback["compile"] = "none"
        self.run_cell_reduced(cell, fallback, self.rules.budget_spent())

    def run_cell_reduced(self, cell: Cell, fallback: dict[str, object], why: str) -> None:
        """``cell`` keeps what it has measured before (the cache), else times ``fallback``
        once; its other settings are left out, ``why``."""
        measured = [s for s in self.plan.first_round(cell) if self.pool(cell, s).results]
        if not measured:
            measured = [self.plan.settings(fallback, {})]
        for settings in measured:
            self.measure(cell, settings, 1)
        others = SpeedEvent.left_out(
            cell.label(), "the other settings", why, self.rules.reason(why)
        )
        self.inputs.on_event(others)

    def _results(self, cell: Cell) -> list[CellResult]:
        results = []
        for settings in self.tried.get(cell, []):
            pool = self.pool(cell, settings)
            fault = pool.fault[0] if pool.fault is not None else None
            speed, busy = self.speed(cell, settings), pool.flagged_only()
            results.append(CellResult(settings, speed, pool.combined(), fault, busy))
        return results

    def time_references(self, cells: list[Cell]) -> None:
        """Time each cell's reference setting once (``SpeedPlan.reference``), in ``cells``'
        order, before any cell times its others: every cell the budget reaches gets a measured
        speed. Those another process of the study holds are waited for last."""
        held = []
        for index, cell in enumerate(cells):
            self.rules.cells_after = len(cells) - index - 1
            settings = self.plan.reference(cell)
            if self._claim_and_measure(cell, settings, 1) is not None:
                held.append((cell, settings))
        for cell, settings in held:
            self.measure(cell, settings, 1)

    def retime_references(self, cells: list[Cell]) -> None:
        """Time again, while the machine is quiet and the budget holds a typical measurement,
        each reference of ``cells`` timed only under interference (this run's, or a stopped
        run's of this study): the cells are ordered on clean figures (``ranked``)."""
        for cell in cells:
            reference = self.plan.reference(cell)
            busy = self.pool(cell, reference).flagged_only()
            if self.quiet and busy and not self._again(cell, reference):
                return

    def ranked(self, cells: list[Cell]) -> list[Cell]:
        """``cells`` by their reference setting's speed, fastest first: those timed only under
        interference after the clean ones (never ranked with them: ``retime_references``
        times them again first), those without one (out of memory, failed, not reached) last,
        the smaller micro-batches first (memory walls grow: a wall found there spares the
        larger ones)."""
        speeds = {cell: self.speed(cell, self.plan.reference(cell)) for cell in cells}

        def rank(cell: Cell) -> tuple[bool, bool, float, int]:
            speed, busy = speeds[cell], self.pool(cell, self.plan.reference(cell)).flagged_only()
            return speed is None, busy, -(speed or 0.0), cell.batch_size if speed is None else 0

        return sorted(cells, key=rank)

    def run_cell(self, cell: Cell) -> None:
        """Time ``cell``'s settings (every one, or the compute settings with the reference
        pipeline, then the pipelines with the fastest of them), then its leaders again."""
        plan = self.plan
        if plan.exhaustive(cell):
            self.measure_all(cell, plan.all_settings(cell))
        else:
            reference = plan.reference_pipeline(cell)
            computes = [plan.settings(reference, c) for c in plan.compute_settings(cell)]
            first = self.measure_all(cell, computes, compute_pass=True)
            self._retime_losers(cell, first)
            best = self.fastest(cell, first)
            if best is not None:
                compute = {k: v for k, v in best if k in COMPUTE_KNOBS}
                pipelines = [plan.settings(p, compute) for p in plan.pipeline_settings(cell)]
                self.measure_all(cell, pipelines)
        self._retime_losers(cell, self.tried.get(cell, []))
        self.rules.learn(cell, self._results(cell))
        self.last_winner = self.fastest(cell, self.tried.get(cell, []))
        self._rematch(cell)

    def _retime_losers(self, cell: Cell, candidates: list[Settings]) -> None:
        """Time again, while the machine is quiet and the budget holds a typical measurement,
        each of ``candidates`` timed only under interference that is not their fastest: such a
        figure may have lost to the load alone (one that wins is a win: interference only
        slows), each once (one that failed again is not retried). What stays so marks the
        cell's row busy (``_table``)."""
        retimed: set[Settings] = set()
        while self.quiet:
            best = self.fastest(cell, candidates)
            losers = [
                s
                for s in candidates
                if s != best and s not in retimed and self.pool(cell, s).flagged_only()
            ]
            if not losers or not self._again(cell, losers[0]):
                return
            retimed.add(losers[0])

    def _rematch(self, cell: Cell) -> None:
        """``cell``'s leaders (within ``CONTENDER_MARGIN`` of its fastest) measured again, in
        alternating order: A B C, then C B A, ..."""
        tried = self.tried.get(cell, [])
        speeds = {s: speed for s in tried if (speed := self.speed(cell, s)) is not None}
        top = max(speeds.values(), default=0.0) * (1 - CONTENDER_MARGIN)
        close = sorted((s for s in speeds if speeds[s] >= top), key=lambda s: -speeds[s])
        leaders = [s for s in tried if s in close[:MAX_CONTENDERS]]  # in the order first measured
        if len(leaders) < 2 or self.rules.over_budget():
            return  # a clear winner needs no rematch; a spent budget pays for none
        for repeat in range(2, self.inputs.spec.study.speed.repeats + 1):
            order = leaders if repeat % 2 == 1 else list(reversed(leaders))
            self.measure_all(cell, order, count=repeat)

    def time_again(self) -> None:
        """Time once more what the machine's load spoiled, while the budget lasts: each cell
        with no measurement, then, while the machine is quiet, each cell whose fastest was
        measured only under interference, then the settings that lost on such a figure."""
        cells = list(self.plan.cells())
        for cell in cells:
            tried = self.tried.get(cell, [])
            again = next((s for s in tried if self.pool(cell, s).fault is None), None)
            if not self._timed(cell) and again is not None and not self._again(cell, again):
                return
        for cell in cells:
            again = self.fastest(cell, self.tried.get(cell, []))
            if again is None or not self.quiet or not self.pool(cell, again).flagged_only():
                continue
            if not self._again(cell, again):
                return
        for cell in cells:
            self._retime_losers(cell, self.tried.get(cell, []))

    def _again(self, cell: Cell, settings: Settings) -> bool:
        """Measure ``settings`` once more if a typical measurement fits in the budget left
        (else False)."""
        if self.rules.time_left() <= (self.rules.typical() or 0.0):
            return False
        self.measure(cell, settings, len(self.pool(cell, settings).results) + 1)
        return True


def run_speed_stage(
    inputs: StageInputs, remeasure: bool = False, spent: float = 0.0
) -> SpeedTable:
    """Time every cell's execution settings (reusing matching measurements unless
    ``remeasure``) and return the fastest of each micro-batch split and precision.
    ``spent``: seconds of its budget gone before it (the probe of ``batch_size: auto``, whose
    measurements are its first rounds)."""
    stage = Stage(inputs, datetime.datetime.now() if remeasure else None)
    stage.rules.deadline -= spent
    cells = stage.plan.predicted()
    stage.time_references(cells)
    stage.retime_references(cells)
    ranked = stage.ranked(cells)
    for index, cell in enumerate(ranked):
        # the budget keeps back one setting for each cell to come that has none yet
        stage.rules.cells_after = sum(not stage._timed(c) for c in ranked[index + 1 :])
        far_behind = stage.rules.far_behind(cell)
        if stage.rules.over_budget():
            stage.run_cell_over_budget(cell)
        elif far_behind is not None:
            why, settings = far_behind  # its precision: its first cell's fastest settings
            stage.run_cell_reduced(cell, dict(settings), why)
        else:
            stage.run_cell(cell)
    stage.time_again()
    table = speed_table(inputs.spec, stage.plan, stage.tried, stage.pool)
    StudyRecord(speed_table=table).store(inputs.study)  # the report's, as printed
    return table
