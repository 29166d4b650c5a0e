"""The run loop: ask Optuna for a trial, train it through an executor, tell how it ended.

Several processes may run one study; each starts a trial only while the study is short of its
total. Every trial that does not complete is recorded with its fault kind (``autotune.faults``);
configuration faults are PRUNED with a violated constraint so that the sampler learns from them.
"""

from __future__ import annotations

import contextlib
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune import faults, objective, space
from autotune.config import TrialConfig
from autotune.executor import TrialExecutor, WorkerError
from autotune.faults import FaultKind
from autotune.hardware import Hardware
from autotune.results import Evaluation
from autotune.spec import Spec
from autotune.speed import SPEED_KNOBS, SpeedTable
from autotune.study._open import queue_baseline
from autotune.study._queries import COUNTED_STATES
from autotune.study._records import TrialRecord
from autotune.study._storage import heartbeat, recover_stale_trials

if TYPE_CHECKING:
    from autotune.study._speed_store import SpeedEvent
    from autotune.workloads import Workload

__all__ = ["MemoryWalls", "RunOutcome", "StudyObserver", "Terminated", "run_study"]

SAME_ERROR_LIMIT = 3  # identical unexpected errors in a row, with no trial completed: stop
# a trial further off the speed stage's prediction than this, or than the spread stage 1
# measured where that is wider (a noisy CPU), is flagged
SPEED_MISMATCH = 0.10


class Terminated(KeyboardInterrupt):
    """The study process got SIGTERM: stop like Ctrl-C, recording the running trial."""


class StudyObserver:
    """Hooks for showing a study's progress; the default does nothing."""

    def speed_measured(self, event: SpeedEvent) -> None:
        """Stage 1 (two-stage studies) measured, reused or skipped one setting."""

    def speed_finished(self, table: SpeedTable) -> None:
        """Stage 1 is done: ``table`` holds the fastest settings; stage 2 starts."""

    def trial_started(self, number: int, config: TrialConfig) -> None:
        """A trial is about to train with ``config``."""

    def evaluated(self, number: int, evaluation: Evaluation, value: float) -> None:
        """A trial evaluated; ``value`` is what the pruner sees."""

    def trial_finished(self, trial: FrozenTrial) -> None:
        """A trial ended (any state); its attributes are final."""

    def waiting(self, running: int) -> None:
        """The study's last trials are running elsewhere (or are stale); this run waits."""


@dataclass
class RunOutcome:
    """What one ``run_study`` call did."""

    study_name: str
    trials_run: int = 0
    stopped_reason: str = ""  # why the run ended before n_trials, if it did
    interrupted: bool = False
    terminated: bool = False  # interrupted by SIGTERM rather than Ctrl-C
    repeated_error: str | None = None
    states: dict[str, int] = field(default_factory=dict)
    speed_table: SpeedTable | None = None  # two-stage studies: stage 1's answer
    stage_failed: str | None = None  # stage 1 could run no setting at all: why


@dataclass
class MemoryWalls:
    """Micro-batch sizes that ran out of memory, by (precision, compile, channels_last,
    data_pipeline): the device pipeline holds the whole training set in device memory too.

    A configuration at or above a wall is not trained again: it is recorded as ``oom``
    straight away, so the study does not pay for the same out-of-memory twice.
    """

    walls: dict[tuple[str, str, bool, str], tuple[int, int]] = field(default_factory=dict)

    @staticmethod
    def _key(config: TrialConfig) -> tuple[str, str, bool, str]:
        return config.precision, config.compile, config.channels_last, config.data_pipeline

    def add(self, config: TrialConfig, trial_number: int) -> None:
        key = self._key(config)
        if key not in self.walls or config.batch_size < self.walls[key][0]:
            self.walls[key] = (config.batch_size, trial_number)

    def blocks(self, config: TrialConfig) -> str | None:
        """Why ``config`` would run out of memory, or None."""
        wall = self.walls.get(self._key(config))
        if wall is None or config.batch_size < wall[0]:
            return None
        return (
            f"not run: batch {config.batch_size} >= {wall[0]}, which ran out of memory in trial "
            f"{wall[1]} at {config.precision}, compile {config.compile}, "
            f"{config.data_pipeline} pipeline"
        )

    @classmethod
    def from_study(cls, study: optuna.Study) -> MemoryWalls:
        walls = cls()
        for trial in study.get_trials(deepcopy=False):
            record = TrialRecord.of(trial)
            if (
                record.fail_kind == FaultKind.OOM
                and not record.oom_skipped
                and record.config is not None
            ):
                walls.add(record.config, trial.number)
        return walls


def _fault(
    trial: optuna.Trial, kind: FaultKind, message: str, traceback_text: str | None = None
) -> TrialState:
    """Record a fault on the trial; the state it ends in."""
    TrialRecord(fail_kind=kind, fail_msg=message, fail_traceback=traceback_text).store(trial)
    if kind.is_configuration_fault:
        trial.set_constraint("fault", 1.0)  # the sampler learns from PRUNED + infeasible
        return TrialState.PRUNED
    return TrialState.FAIL


@dataclass
class TrialRunner:
    """One trial being run: what the loop needs to run it and say how it ended."""

    spec: Spec
    hardware: Hardware
    executor: TrialExecutor
    observer: StudyObserver
    walls: MemoryWalls
    speed: SpeedTable | None = None  # two-stage: the execution knobs come from here

    def _sample(self, trial: optuna.Trial) -> TrialConfig:
        """The trial's configuration; a two-stage trial's execution knobs from the speed
        stage (the untuned baseline keeps its own)."""
        baseline = TrialRecord.from_attrs(trial.user_attrs).baseline
        if self.speed is None or baseline:
            return space.sample(trial, self.spec, self.hardware)
        config = space.sample(trial, self.spec, self.hardware, self.speed)
        declared = self.spec.study.learning_knobs
        extras = tuple((k, getattr(config, k)) for k in SPEED_KNOBS if k in declared)
        choice = self.speed.exact(
            config.batch_size, config.accumulation_steps, config.precision, extras
        )
        assert choice is not None  # sample took it from the table
        TrialRecord(
            # the knobs stage 1 chose among several values (fixed ones it only kept)
            speed_knobs=sorted(k for k in choice.knobs() if k in self.spec.space.searched()),
            predicted_samples_per_second=choice.samples_per_second,
            speed_trials=list(choice.speed_trials),
            speed_tolerance=max(SPEED_MISMATCH, choice.spread),
        ).store(trial)
        return config

    def train(self, trial: optuna.Trial) -> tuple[TrialState, float | None]:
        """Sample, train and score ``trial``; its end state and value (None unless COMPLETE)."""
        spec, goal = self.spec, self.spec.objective
        try:
            config = self._sample(trial)
        except space.NothingFits as nothing:
            return _fault(trial, FaultKind(nothing.kind), str(nothing)), None
        TrialRecord(config=config).store(trial)
        self.observer.trial_started(trial.number, config)
        blocked = self.walls.blocks(config)
        if blocked is not None:
            TrialRecord(oom_skipped=True).store(trial)
            return _fault(trial, FaultKind.OOM, blocked), None
        pruned_at: list[Evaluation] = []

        def report(evaluation: Evaluation) -> bool:
            value = objective.intermediate_value(evaluation, goal)
            trial.report(value, evaluation.index)
            self.observer.evaluated(trial.number, evaluation, value)
            if objective.target_reached(evaluation, goal):
                return True
            if not evaluation.final and trial.should_prune():
                pruned_at.append(evaluation)
                return True
            return False

        started = time.monotonic()
        try:
            result = self.executor.run(config, report)
        except (KeyboardInterrupt, WorkerError):
            raise
        except Exception as error:
            TrialRecord(wall_seconds=time.monotonic() - started).store(trial)
            kind, message = faults.classify(error)
            faults.release_memory()
            if kind == FaultKind.OOM:
                self.walls.add(config, trial.number)
            details = None
            if kind == FaultKind.ERROR:
                details = (getattr(error, "details", "") or traceback.format_exc())[-4000:]
            return _fault(trial, kind, message, details), None
        TrialRecord(wall_seconds=time.monotonic() - started).store(trial)

        TrialRecord.from_result(result, config.precision).store(trial)
        stored = TrialRecord.from_attrs(trial.user_attrs)
        predicted, tolerance = stored.predicted_samples_per_second, stored.speed_tolerance
        if predicted and abs(result.samples_per_second / predicted - 1) > (tolerance or 0):
            TrialRecord(speed_mismatch=True).store(trial)  # interference, or a stale cache
        if pruned_at:
            at = pruned_at[0]
            message = (
                f"pruned at evaluation {at.index} (epoch {at.epoch:.2f}, "
                f"{goal.score_name} {at.score:.4g}) by the {spec.study.pruner} pruner"
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

    def run(self, study: optuna.Study) -> FrozenTrial:
        """Ask for a trial, train it with a heartbeat, tell how it ended."""
        with warnings.catch_warnings():
            # Optuna beats only inside Study.optimize; this loop beats itself (heartbeat)
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
            trial = study.ask()
        with heartbeat(study, trial._trial_id):
            try:
                state, value = self.train(trial)
            except KeyboardInterrupt as stop:
                how = "SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C (SIGINT)"
                TrialRecord(
                    fail_kind=FaultKind.INTERRUPTED, fail_msg=f"the study was stopped by {how}"
                ).store(trial)
                self.observer.trial_finished(study.tell(trial, state=TrialState.FAIL))
                raise
            except Exception as error:
                # a worker that cannot start (the study stops and says why), or a bug outside
                # training: either way no trial is left RUNNING
                message = (
                    str(error)
                    if isinstance(error, WorkerError)
                    else (f"{type(error).__name__}: {error}")
                )
                with contextlib.suppress(Exception):
                    _fault(trial, FaultKind.ERROR, message)
                    study.tell(trial, state=TrialState.FAIL)
                raise
        if state == TrialState.COMPLETE:
            return study.tell(trial, value)
        return study.tell(trial, state=state)


def requeue_lost_baseline(study: optuna.Study, spec: Spec, hardware: Hardware) -> bool:
    """Queue the untuned baseline again when the study wants one and none is counted, waiting or
    running (it was interrupted, timed out under load, or crashed); True when it was queued.

    A study keeps exactly one baseline until one finishes: every speed-up is quoted against it.
    """
    if spec.study.baseline is False:
        return False
    present = (*COUNTED_STATES, TrialState.WAITING, TrialState.RUNNING)
    if any(TrialRecord.of(t).baseline for t in study.get_trials(deepcopy=False, states=present)):
        return False
    queue_baseline(study, spec, hardware)
    return True


def run_study(
    study: optuna.Study,
    spec: Spec,
    hardware: Hardware,
    executor: TrialExecutor,
    observer: StudyObserver | None = None,
    workload: Workload | None = None,
    remeasure: bool = False,
) -> RunOutcome:
    """Run the study's stages: for ``study.strategy: two_stage`` the speed stage first (its
    measurements reused from the storage unless ``remeasure``), then trials until the study
    holds ``spec.study.n_trials`` COMPLETE or PRUNED trials.

    Several processes may run one study: each starts a trial only while the study's counted and
    running trials are short of the total, and waits for the last ones to finish. Stops early
    at ``spec.study.timeout`` seconds (a running trial finishes first), when as many trials
    failed as were wanted, or when the same unexpected error ends ``SAME_ERROR_LIMIT`` trials in
    a row before any completes in this run (a bug in the workload, not a bad configuration). An
    interruption records the running trial as ``interrupted`` and sets ``outcome.interrupted``;
    WorkerError (a worker that cannot start) propagates after the trial is recorded. A baseline
    that an earlier run lost is queued again first (``requeue_lost_baseline``).
    """
    observer = observer or StudyObserver()
    outcome = RunOutcome(study_name=study.study_name)
    target = spec.study.n_trials
    deadline = time.monotonic() + spec.study.timeout if spec.study.timeout else None
    walls = MemoryWalls.from_study(study)
    trial_runner = TrialRunner(spec, hardware, executor, observer, walls)
    if spec.study.strategy == "two_stage":
        from autotune.study._speed import run_speed_stage

        try:
            table = run_speed_stage(
                study, spec, hardware, executor, workload, remeasure, observer.speed_measured
            )
        except KeyboardInterrupt as stop:
            outcome.interrupted = True
            outcome.terminated = isinstance(stop, Terminated)
            return outcome
        observer.speed_finished(table)
        outcome.speed_table = trial_runner.speed = table
        failure = table.failure()
        if failure is not None:  # no trial could train: say why, run none
            kind, why = failure
            if kind == FaultKind.ERROR:  # the same bug everywhere, as trials would show it
                outcome.repeated_error = why
            else:
                outcome.stage_failed = why
            return outcome
    errors: list[str] = []  # messages of unexpected errors since the last counted trial
    completed_here = False  # whether a trial of this run completed
    failures = 0
    wait_seconds = min(1.0, float(spec.study.heartbeat_interval))
    recover_stale_trials(study)  # a stale baseline is retried with its mark, not queued anew
    if len(study.get_trials(deepcopy=False, states=COUNTED_STATES)) < target:
        requeue_lost_baseline(study, spec, hardware)  # not into a study that runs no more
    try:
        while True:
            recover_stale_trials(study)
            trials = study.get_trials(deepcopy=False)
            counted = sum(1 for t in trials if t.state in COUNTED_STATES)
            running = sum(1 for t in trials if t.state == TrialState.RUNNING)
            if counted >= target:
                if outcome.trials_run == 0:
                    outcome.stopped_reason = (
                        f"nothing to run: the study already has {counted} trials; --n-trials "
                        f"(study.n_trials, now {target}) is the study's total, not this many more"
                    )
                break
            if deadline is not None and time.monotonic() >= deadline:
                outcome.stopped_reason = f"the timeout of {spec.study.timeout:g} s was reached"
                break
            if counted + running >= target:
                observer.waiting(running)
                time.sleep(wait_seconds)
                continue
            trial = trial_runner.run(study)
            outcome.trials_run += 1
            observer.trial_finished(trial)
            if trial.state == TrialState.FAIL:
                failures += 1
                record = TrialRecord.of(trial)
                if record.fail_kind == FaultKind.ERROR:
                    errors.append(str(record.fail_msg))
            elif trial.state in COUNTED_STATES:
                errors.clear()
                completed_here = completed_here or trial.state == TrialState.COMPLETE
            last = errors[-SAME_ERROR_LIMIT:]
            # the same error every time, and nothing trained to the end in this run (earlier
            # runs may have completed trials before the code broke): a bug, not a configuration
            if len(last) == SAME_ERROR_LIMIT and len(set(last)) == 1 and not completed_here:
                outcome.repeated_error = errors[-1]
                break
            if failures >= max(target, SAME_ERROR_LIMIT):
                outcome.stopped_reason = f"{failures} trials failed in this run"
                break
    except KeyboardInterrupt as stop:
        outcome.interrupted = True
        outcome.terminated = isinstance(stop, Terminated)
    trials = study.get_trials(deepcopy=False)
    for state in TrialState:
        count = sum(1 for t in trials if t.state == state)
        if count:
            outcome.states[state.name] = count
    return outcome
