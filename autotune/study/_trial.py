"""One trial of the study: its configuration sampled, trained through an executor under a
heartbeat, scored, and told to Optuna with how it ended (a fault with its kind: ``faults``).
``StudyObserver`` is what the display hears of it."""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune import stops
from autotune.config import TrialConfig
from autotune.errors import ReportFailed, WorkerError
from autotune.executor import attempt
from autotune.faults import FaultKind, TrialFault
from autotune.machine.interference import interfered
from autotune.machine.turns import DeviceLockTimeout, device_lock
from autotune.results import TrialResult
from autotune.search import objective, references, space
from autotune.speed import SpeedTable
from autotune.stops import Terminated
from autotune.storage import adapter
from autotune.storage._liveness import heartbeat
from autotune.storage._outage import StorageOutage
from autotune.storage._queries import best_trial
from autotune.storage._records import TrialRecord
from autotune.storage._walls import MemoryWalls
from autotune.study._observer import StudyInputs
from autotune.study._reporter import TrialReporter
from autotune.study._sampling import TrialSeededSampler

if TYPE_CHECKING:
    pass

# a trial further off the speed stage's prediction than this, or than the spread stage 1
# measured where that is wider (a noisy CPU), is flagged
SPEED_MISMATCH = 0.10


class TakenOver(Exception):
    """Another process failed this process's running trial as stale (its heartbeat came late)
    and queued it again; ``result`` is what this process measured of it, if it got that far."""

    def __init__(self, result: TrialResult | None = None) -> None:
        super().__init__("the trial was failed as stale by another process")
        self.result = result


# a wait for the machine's turn shorter than this (seconds) is not recorded
TURN_WAIT_SAID = 0.05


def off_stage_one(result: TrialResult, record: TrialRecord) -> bool:
    """Whether a trial trained further off stage 1's prediction (``record``'s) than its
    tolerance; never one others' processes slowed (its pace was the machine's, not its own)."""
    predicted, tolerance = record.predicted_samples_per_second, record.speed_tolerance
    if not predicted or interfered(result.other_cpu_share):
        return False
    return abs(result.samples_per_second / predicted - 1) > (tolerance or 0.0)


def _fault(
    trial: optuna.Trial,
    kind: FaultKind,
    message: str,
    traceback_text: str | None = None,
    measured: bool = False,
) -> TrialState:
    """Record a fault on the trial; the state it ends in. ``measured``: stage 1 found this
    configuration cannot run, whatever the fault: the sampler learns it as a configuration's."""
    TrialRecord(fail_kind=kind, fail_msg=message, fail_traceback=traceback_text).store(trial)
    if measured or kind.is_configuration_fault:
        trial.set_constraint("fault", 1.0)  # the sampler learns from PRUNED + infeasible
        return TrialState.PRUNED
    return TrialState.FAIL


@dataclass
class TrialRunner:
    """One trial being run: what the loop needs to run it and say how it ended."""

    inputs: StudyInputs  # its spec as the trials run it (batch_size: auto resolved)
    walls: MemoryWalls
    speed: SpeedTable | None = None  # two-stage: the execution knobs come from here
    taken_over: bool = False  # the last trial run was failed as stale by another process
    unstarted: optuna.Trial | None = None  # asked, and not yet in ``run``, which records it

    def keep_sampler(self, study: optuna.Study) -> None:
        """Have the study's sampler draw no trial that cannot run (``keep_to``): what a memory
        wall of this run blocks (called again as walls are found), and in a two-stage study
        what stage 1 found no way to train."""
        if not isinstance(study.sampler, TrialSeededSampler):
            return
        if self.speed is None:
            study.sampler.keep_to(self.walls.runnable_points(self.inputs.spec))
            return
        points = space.runnable_points(
            self.inputs.spec,
            self.speed,
            lambda knobs: not self.walls.stands(SimpleNamespace(**knobs)),
        )
        study.sampler.keep_to(points)

    def _sample(self, trial: optuna.Trial) -> TrialConfig:
        """The trial's configuration; a two-stage trial's execution knobs from the speed
        stage (a reference, the untuned baseline or the tuning checklist, keeps its own)."""
        record = TrialRecord.from_attrs(trial.user_attrs)
        table = self.speed
        if record.reference is not None and table is not None and record.config:
            # on the study's axes, with its own execution knobs (references.as_two_stage)
            table = references.own_table(self.inputs.spec, record.config)
        elif table is None or record.reference is not None:  # (a reference queued as joint)
            return space.sample(trial, self.inputs.spec, self.inputs.hardware)
        pick = space.suggestions(trial)
        config, choice = space.draw_from_table(
            pick,
            self.inputs.spec,
            self.inputs.hardware,
            table,
            trial.number,
            lambda drawn: not self.walls.stands(drawn),
        )
        # the knobs the table chose among several values (fixed ones it only kept)
        chosen = sorted(k for k in choice.knobs() if k in self.inputs.spec.space.searched())
        if record.reference is not None:  # its own: nothing predicted
            TrialRecord(speed_knobs=chosen).store(trial)
            return config
        TrialRecord(
            speed_knobs=chosen,
            predicted_samples_per_second=choice.samples_per_second,
            speed_trials=list(choice.speed_trials),
            speed_tolerance=max(SPEED_MISMATCH, choice.spread),
        ).store(trial)
        return config

    def train(self, trial: optuna.Trial) -> tuple[TrialState, float | None]:
        """Sample, train and score ``trial``; its end state and value (None unless COMPLETE)."""
        goal = self.inputs.spec.objective
        try:
            config = self._sample(trial)
        except space.NothingFits as nothing:
            return _fault(trial, FaultKind(nothing.kind), str(nothing), measured=True), None
        TrialRecord(config=config, worker=self.inputs.worker).store(trial)
        self.inputs.observer.trial_started(trial.number, config)
        blocked = self.walls.blocks(config)
        if blocked is not None:
            TrialRecord(oom_skipped=True).store(trial)
            return _fault(trial, FaultKind.OOM, blocked), None
        reference = TrialRecord.from_attrs(trial.user_attrs).reference is not None
        # the best answer so far, which the trial is stopped for where it cannot beat it; never
        # without a pruner, nor a reference (the confirmation measures the answer against it)
        no_stop = reference or self.inputs.spec.study.pruner == "none"
        leader = None if no_stop else best_trial(trial.study)
        # another process of this machine training on the same cores or GPU: wait, off the clock
        asked_turn = time.monotonic()
        with device_lock(config.device, config.world_size, self.inputs.observer.turn_waiting):
            started = time.monotonic()
            if started - asked_turn > TURN_WAIT_SAID:
                TrialRecord(turn_wait_seconds=started - asked_turn).store(trial)
            reporter = TrialReporter(trial, config, goal, self.inputs.observer, leader, reference)
            try:
                result = attempt(lambda: self.inputs.executor.train(config, reporter.report))
            except ReportFailed as failed:
                raise failed.error from None  # as if raised here, where the study writes
        if reporter.taken_over:
            raise TakenOver(None if isinstance(result, TrialFault) else result)
        TrialRecord(wall_seconds=time.monotonic() - started).store(trial)
        if isinstance(result, TrialFault):
            if result.kind == FaultKind.OOM:
                self.walls.add(config, f"trial {trial.number}")
                self.keep_sampler(trial.study)
            details = (result.details or None) if result.kind == FaultKind.ERROR else None
            return _fault(trial, result.kind, result.message, details), None
        return self._scored(trial, config, result, reporter)

    def _scored(
        self,
        trial: optuna.Trial,
        config: TrialConfig,
        result: TrialResult,
        reporter: TrialReporter,
    ) -> tuple[TrialState, float | None]:
        """Record what a trial that trained measured, and how it ended: stopped where it could
        not beat the leader, pruned (as ``reporter`` decided), or scored (its state and value)."""
        goal, pruner = self.inputs.spec.objective, self.inputs.spec.study.pruner
        TrialRecord.from_result(result, config.precision).store(trial)
        if off_stage_one(result, TrialRecord.from_attrs(trial.user_attrs)):
            TrialRecord(speed_mismatch=True).store(trial)
        if reporter.lost_at is not None and reporter.leader is not None:
            (at, reachable), leader = reporter.lost_at, reporter.leader
            message = f"stopped at evaluation {at.index} (epoch {at.epoch:.2f}): " + (
                f"even at {goal.score_name} {objective.SCORE_CEILINGS[goal.score]:g} it would "
                f"end at {reachable:.4g} {goal.score_short}/s, and trial {leader.number} has "
                f"{float(leader.value or 0.0):.4g}"
                if goal.per_second
                else f"it has trained {reachable:.3g} s without reaching {goal.target_name} "
                f"{goal.target:g}, and trial {leader.number} reached it in "
                f"{float(leader.value or 0.0):.3g} s"
            )
            TrialRecord(
                fail_kind=FaultKind.CANNOT_WIN, fail_msg=message + reporter.pace.said
            ).store(trial)
            return TrialState.PRUNED, None
        if (pruned_at := reporter.pruned_at) is not None:
            message = (
                f"pruned at evaluation {pruned_at.index} (epoch {pruned_at.epoch:.2f}, "
                f"{goal.score_name} {pruned_at.score:.4g}) by the {pruner} pruner"
            )
            TrialRecord(fail_kind=FaultKind.PRUNED, fail_msg=message).store(trial)
            return TrialState.PRUNED, None
        score = objective.score(result, goal)
        if score.constraint is not None and score.constraint_name is not None:
            trial.set_constraint(score.constraint_name, score.constraint)
        # optuna-dashboard 0.21 does not show Optuna 5's named constraints: say it plainly
        TrialRecord(
            charged_seconds=score.charged_seconds,
            feasible=score.feasible,
            infeasible_reason=score.reason or None,
        ).store(trial)
        return TrialState.COMPLETE, score.value

    def ask(self, study: optuna.Study) -> optuna.Trial:
        """The next trial: a queued one (the baseline, a retry) first, else a new one. A stop
        asked while it is created is raised once it is held as ``unstarted``, which
        ``stopped_unstarted`` records (a RUNNING trial left behind is nobody's, for good)."""
        with warnings.catch_warnings(), stops.deferred():
            # Optuna beats only inside Study.optimize; this loop beats itself (heartbeat)
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
            self.unstarted = study.ask()
        return self.unstarted

    def stopped_unstarted(self, study: optuna.Study, stop: KeyboardInterrupt) -> None:
        """Record ``stop`` on the trial asked and not yet run, if there is one."""
        if self.unstarted is not None:
            self._stopped(study, self.unstarted, stop)
            self.unstarted = None

    def run(self, study: optuna.Study, trial: optuna.Trial) -> FrozenTrial:
        """Train an asked ``trial`` with a heartbeat, tell how it ended."""
        self.taken_over = False
        with heartbeat(study, adapter.trial_id(trial)):
            try:
                self.unstarted = None  # a stop from here on is recorded below
                state, value = self.train(trial)
            except TakenOver as over:
                return self._taken_over(study, trial, over.result)
            except optuna.exceptions.UpdateFinishedTrialError:  # between two of its writes
                return self._taken_over(study, trial, None)
            except (KeyboardInterrupt, Exception) as stop:
                self._stopped(study, trial, stop)
                raise
        try:
            if state == TrialState.COMPLETE:
                return study.tell(trial, value)
            return study.tell(trial, state=state)
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError):
            # "Cannot tell a FAIL trial", or failed between Optuna's read and its write:
            # another process failed it as stale a moment ago
            if not adapter.get_trial(study, adapter.trial_id(trial)).state.is_finished():
                raise
            return self._taken_over(study, trial, None)

    def _stopped(
        self, study: optuna.Study, trial: optuna.Trial, stop: KeyboardInterrupt | Exception
    ) -> None:
        """Record why ``stop`` ended ``trial`` and tell it as FAIL, so that no trial is left
        RUNNING: INTERRUPTED where it says nothing of the configuration (a stop, a database
        that did not answer, the machine held past --turn-wait), else ERROR (a worker that
        cannot start, a bug outside training: not shown as a finished trial)."""
        kind = FaultKind.INTERRUPTED
        if isinstance(stop, KeyboardInterrupt):
            how = "SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C (SIGINT)"
            message = f"the study was stopped by {how}"
        elif isinstance(stop, StorageOutage):
            message = "the study's database did not answer for longer than study.storage_outage"
        elif isinstance(stop, DeviceLockTimeout):
            message = f"the run stopped: {stop}"
        else:
            kind = FaultKind.ERROR
            message = (
                str(stop) if isinstance(stop, WorkerError) else f"{type(stop).__name__}: {stop}"
            )
        with contextlib.suppress(Exception):
            TrialRecord(fail_kind=kind, fail_msg=message).store(trial)
            told = study.tell(trial, state=TrialState.FAIL)
            if kind == FaultKind.INTERRUPTED:
                self.inputs.observer.trial_finished(told)

    def _taken_over(
        self, study: optuna.Study, trial: optuna.Trial, result: TrialResult | None
    ) -> FrozenTrial:
        """Trial ``trial`` was failed as stale by another process while this one trained it
        (and queued again): keep what this process measured where a reader finds it (on the
        retry as ``earlier_attempt``, else on the study), say so, and go on."""
        self.taken_over = True
        retried = next(
            (
                t
                for t in study.get_trials(deepcopy=False)
                if (t.system_attrs.get("retry_history") or [None])[-1] == trial.number
            ),
            None,
        )
        kept_on = None
        if result is not None:
            attempt = {
                "trial": trial.number,
                "score": result.score,
                "epochs": result.evaluations[-1].epoch,
                "train_seconds": result.train_seconds,
                "samples_per_second": result.samples_per_second,
            }
            try:
                if retried is None:
                    raise optuna.exceptions.UpdateFinishedTrialError("no retry to keep it on")
                adapter.set_trial_user_attr(
                    study, adapter.trial_id(retried), "earlier_attempt", attempt
                )
                kept_on = f"trial {retried.number}"
            except optuna.exceptions.UpdateFinishedTrialError:  # the retry ended already
                study.set_user_attr(f"earlier_attempt_of_trial_{trial.number}", attempt)
                kept_on = "the study"
        self.inputs.observer.taken_over(trial.number, kept_on)
        return adapter.get_trial(study, adapter.trial_id(trial))
