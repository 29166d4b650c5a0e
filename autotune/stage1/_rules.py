"""What stage 1 leaves out, and why: the rules that keep it within what its answer is worth.

Each rule is said in stage 1's table where it leaves a setting out: a pipeline far behind at one
precision (``SLOW_PIPELINE_SHARE``), a compile mode that cannot pay back (``unpaid_compile``,
``compile_limit``) or failed, channels_last no faster under a compile mode, a precision far
behind (``DOMINATED_SHARE``), and the budget (``_budget``). Nothing here touches Optuna or
torch; the stage (``_stage``) asks and reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.faults import FaultKind
from autotune.knobs import COMPUTE_KNOBS
from autotune.spacefile import Spec
from autotune.speed import SpeedMeasurement
from autotune.stage1._budget import Budget, TimeLimit
from autotune.stage1._plan import Cell, Settings

# a pipeline below this share of its cell's fastest is not tried at the micro-batch's other
# precisions: what a pipeline costs a batch (loading, workers' start and hand-over) does not
# depend on the precision, so one this far behind is held back by its own overhead
SLOW_PIPELINE_SHARE = 0.5

# a precision whose first cell runs under this share of another precision's fastest at the
# same micro-batch times only its first cell's fastest settings in its other cells
DOMINATED_SHARE = 1 / 3


# each rule, as stage 1's closing line counts what it left out ("3 past the budget")
MEMORY_WALL, BUDGET = "over a memory wall", "past the budget"
SLOW_PIPELINE, SLOW_PRECISION = "with a pipeline far behind", "at a precision far behind"
UNPAID_COMPILE = "with a compile mode ruled out (it cannot pay back, or failed)"
SLOW_LAYOUT = "with channels_last no faster"


# what a compiled measurement takes beside its compile (the worker's warm-up steps, its bursts,
# a cuDNN or Triton autotuning pass at each new shape) before its compile can be judged unpaid
MEASUREMENT_SLACK_SECONDS = 30.0


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


@dataclass(frozen=True)
class CellResult:
    """One setting of a finished cell, as the rules read it."""

    settings: Settings
    first_round: float | None  # samples/s of its first measurement (None: none)
    measurement: SpeedMeasurement | None  # its measurements combined (None: it failed)
    fault_kind: str | None  # why it has none
    # every measurement taken while other processes took its cores: its speed is a lower
    # bound (interference only slows), so it may beat others but is never judged to lose
    busy: bool = False


# faults of a compiled setting that rule its compile mode out of the cells after it
_COMPILE_FAULTS = (FaultKind.COMPILE_ERROR.value, FaultKind.TRIAL_TIMEOUT.value)


def _pipeline(settings: Settings) -> Settings:
    return tuple((k, v) for k, v in settings if k not in COMPUTE_KNOBS)


def _mode(settings: Settings) -> str:
    return str(dict(settings).get("compile", "none"))


class StageRules(Budget):
    """The rules' state over one stage: what the cells timed so far rule out of the rest,
    within its budget."""

    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.spec = spec
        # (micro-batch, declared knobs) -> pipelines far behind at a precision timed before
        self.slow_pipelines: dict[tuple[Any, ...], dict[Settings, str]] = {}
        self.dropped_modes: dict[str, str] = {}  # compile modes not tried any more, and why
        # compile modes under which channels_last is not tried any more, and why
        self.dropped_layouts: dict[str, str] = {}
        self.slowest_eager_epoch = 0.0  # seconds: the most an epoch of any cell took eager
        self.best_speedup: dict[str, float] = {}  # compile mode -> best eager/compiled seen
        # (micro-batch, declared knobs) -> precision -> its cell's fastest first round
        self.fastest: dict[tuple[Any, ...], dict[str, float]] = {}
        # (precision, declared knobs) -> why it is far behind, and its first cell's fastest
        self.dominated: dict[tuple[Any, ...], tuple[str, Settings]] = {}

    def _too_short(self, mode: str) -> str | None:
        """Why compile ``mode`` is not started with the budget left, or None: its cold compile
        and then the measurement itself (about an eager one's seconds) must fit."""
        left, needs = self.budget_left(), self.expected_compile(mode)
        if left >= needs + (self.typical() or 0.0):
            return None
        return (
            f"not tried: {max(left, 0.0):.0f} s of stage 1's budget of {self.budget:g} s are "
            f"left, and compile {mode} takes about {needs:.0f} s (study.speed.max_seconds)"
        )

    def compile_limit(self, mode: str, eager_epoch_seconds: float | None) -> TimeLimit | None:
        """How long a measurement of compile ``mode`` may take (None for eager): the budget
        left, and, once an eager epoch is timed (``eager_epoch_seconds``: the cell's, else
        the slowest seen), what a compile could save over the full run at an infinite
        speed-up (every eager second of it) plus ``MEASUREMENT_SLACK_SECONDS``. A compile
        still running then cannot pay back, however fast its graph."""
        if mode == "none":
            return None
        left = max(1.0, self.budget_left())
        budget = TimeLimit(left, self.said(f"ran out while compile {mode} compiled"), budget=True)
        epoch = max(eager_epoch_seconds or 0.0, self.slowest_eager_epoch)
        if epoch <= 0.0:
            return budget
        horizon = self._horizon()
        saving = horizon * epoch
        payback = saving + MEASUREMENT_SLACK_SECONDS
        if payback >= left:
            return budget
        return TimeLimit(
            payback,
            f"compile {mode} was still compiling after {payback:.0f} s: it cannot pay back "
            f"(an eager run of {horizon:g} epochs trains {saving:.0f} s)",
            budget=False,
        )

    def stopped(self, mode: str, limit: TimeLimit, cell: Cell) -> None:
        """A measurement of compile ``mode`` in ``cell`` was stopped at ``limit``: the mode
        is not tried again in this stage (past the budget nothing compiles anyway), and its
        compile took longer than the limit (what the other modes' guesses are scaled by). An
        eager measurement stopped says nothing of eager: nothing is learned."""
        if mode == "none":
            return
        self.dropped_modes.setdefault(mode, f"not tried: {limit.why} at {cell.label()}")
        self.compiled_seconds[mode] = max(self.compiled_seconds.get(mode, 0.0), limit.seconds)

    def _horizon(self) -> float:
        """Epochs over which a compile pays back: the full run's (objective.full_run_epochs)
        where the objective charges it over that, else the trial's."""
        objective = self.spec.objective
        full = objective.full_run_epochs if objective.per_second else None
        return full or self.spec.workload.epochs

    def why(
        self,
        cell: Cell,
        settings: Settings,
        compute_pass: bool = False,
        timed: bool = False,
        fallback: bool = True,
        warm: bool = False,
    ) -> str | None:
        """Why ``settings`` is not tried in ``cell``, or None. The compute pass times its
        settings with a reference pipeline, which the pipeline rule does not judge; ``timed``:
        the cell has timed a setting already (past the budget it times no other);
        ``fallback``: the cell has timed a setting or has an eager one to time, so a compile
        the budget left cannot hold may be left out (a cell whose every setting compiles
        times one, bounded by ``compile_limit``); ``warm``: it reuses a live compiled graph (no
        cold compile to wait for)."""
        mode = _mode(settings)
        if (mode != "none" or timed) and fallback and self.over_budget():
            return self.budget_spent()
        if mode != "none" and mode not in self.dropped_modes and fallback and not warm:
            short = self._too_short(mode)
            if short is not None:
                return short
        if mode in self.dropped_modes:
            return self.dropped_modes[mode]
        if dict(settings).get("channels_last") and mode in self.dropped_layouts:
            return self.dropped_layouts[mode]
        if compute_pass:
            return None
        slow = self.slow_pipelines.get((cell.batch_size, cell.extras), {})
        return slow.get(_pipeline(settings))

    def reason(self, why: str) -> str:
        """The rule that said ``why`` (a text of ``why``, ``far_behind`` or the budget's)."""
        if why in self.dropped_modes.values():
            return UNPAID_COMPILE
        if why in self.dropped_layouts.values():
            return SLOW_LAYOUT
        if any(why in slow.values() for slow in self.slow_pipelines.values()):
            return SLOW_PIPELINE
        if any(why == text for text, _ in self.dominated.values()):
            return SLOW_PRECISION
        return BUDGET

    def far_behind(self, cell: Cell) -> tuple[str, Settings] | None:
        """Why ``cell``'s precision is far behind another, with the settings its cells time
        (its first cell's fastest); None when it is not."""
        return self.dominated.get((cell.precision, cell.extras))

    def learn(self, cell: Cell, results: list[CellResult]) -> None:
        """Take in a finished cell: its slow pipelines, the compile modes it rules out, and
        whether its precision is far behind. A ``busy`` result may rule others out, never
        itself: it lost perhaps to the load alone."""
        self._learn_pipelines(cell, results)
        self._learn_compile_modes(cell, results)
        self._learn_layouts(cell, results)
        self._learn_precision(cell, results)

    def _learn_layouts(self, cell: Cell, results: list[CellResult]) -> None:
        """Each compile mode under which channels_last was timed both ways in ``cell`` and was
        not faster with it (first rounds, each way's fastest)."""
        fastest: dict[tuple[str, bool], float] = {}
        busy: set[tuple[str, bool]] = set()  # a busy figure: that side is never judged slower
        for result in results:
            mode = _mode(result.settings)
            if mode == "none" or result.first_round is None:
                continue
            key = (mode, bool(dict(result.settings).get("channels_last")))
            fastest[key] = max(fastest.get(key, 0.0), result.first_round)
            if result.busy:
                busy.add(key)
        for (mode, layout), speed in fastest.items():
            plain = fastest.get((mode, False))
            if not layout or plain is None or mode in self.dropped_layouts or speed > plain:
                continue
            if (mode, layout) in busy:
                continue
            self.dropped_layouts[mode] = (
                f"not tried: channels_last under compile {mode} was no faster than without it "
                f"at {cell.label()} ({speed / plain - 1:+.0%})"
            )

    def _learn_precision(self, cell: Cell, results: list[CellResult]) -> None:
        timed = [(r.first_round, r.settings) for r in results if r.first_round is not None]
        if not timed:
            return
        top, settings = max(timed, key=lambda pair: pair[0])
        seen = [p for (_, extras), by in self.fastest.items() if extras == cell.extras for p in by]
        first_of_its_precision = cell.precision not in seen
        at_size = self.fastest.setdefault((cell.batch_size, cell.extras), {})
        at_size[cell.precision] = top
        others = {p: speed for p, speed in at_size.items() if p != cell.precision}
        if not first_of_its_precision or not others:
            return
        other, best = max(others.items(), key=lambda pair: pair[1])
        if top < DOMINATED_SHARE * best and not any(r.busy for r in results):
            why = (
                f"not tried: {cell.precision} runs at {top / best:.0%} of {other} at batch "
                f"{cell.batch_size}; its cells time its fastest settings there only"
            )
            self.dominated[(cell.precision, cell.extras)] = (why, settings)

    def _learn_pipelines(self, cell: Cell, results: list[CellResult]) -> None:
        top = max((r.first_round for r in results if r.first_round is not None), default=None)
        if top is None:
            return
        slow = self.slow_pipelines.setdefault((cell.batch_size, cell.extras), {})
        for result in results:
            speed = result.first_round
            if speed is not None and not result.busy and speed < SLOW_PIPELINE_SHARE * top:
                slow.setdefault(
                    _pipeline(result.settings),
                    f"not tried: under {SLOW_PIPELINE_SHARE:.0%} of the fastest at "
                    f"{cell.precision} ({speed / top:.0%})",
                )

    def _learn_compile_modes(self, cell: Cell, results: list[CellResult]) -> None:
        """Each compile mode whose cold compile cannot pay back over the full run
        (objective.full_run_epochs, as the objective charges it; the trial's epochs where it
        charges it all) even at the best speed-up over eager seen so far and at the slowest
        eager epoch seen, and each mode that failed to compile in every setting of ``cell``."""
        by_mode: dict[str, list[SpeedMeasurement]] = {}
        failed: dict[str, str] = {}  # mode -> its fault kind
        busy = {_mode(r.settings) for r in results if r.busy}  # its speed-up: a lower bound
        for result in results:
            if result.measurement is not None:
                by_mode.setdefault(_mode(result.settings), []).append(result.measurement)
            elif result.fault_kind in _COMPILE_FAULTS and _mode(result.settings) != "none":
                failed[_mode(result.settings)] = result.fault_kind
        for mode in sorted(set(failed) - set(by_mode)):
            if failed[mode] == FaultKind.TRIAL_TIMEOUT.value:  # stopped at compile_limit
                reason = (
                    f"not tried: compile {mode} was still compiling at {cell.label()} when it "
                    f"could no longer pay back over the full run"
                )
            else:
                reason = f"not tried: compile {mode} failed at {cell.label()}"
            self.dropped_modes.setdefault(mode, reason)
        if "none" not in by_mode:
            return
        eager = min(m.epoch_seconds() for m in by_mode["none"])
        self.slowest_eager_epoch = max(self.slowest_eager_epoch, eager)
        horizon = self._horizon()
        for mode, measured in by_mode.items():
            if mode == "none" or mode in self.dropped_modes or mode in busy:
                continue
            compiled = min(m.epoch_seconds() for m in measured)
            speedup = max(self.best_speedup.get(mode, 0.0), eager / compiled)
            self.best_speedup[mode] = speedup
            cost = max(m.compile_seconds or 0.0 for m in measured)
            why = unpaid_compile(mode, cost, self.slowest_eager_epoch, speedup, horizon)
            if why is not None:
                self.dropped_modes[mode] = why
