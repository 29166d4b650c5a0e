"""The run loop (``run_study``): the study's stages in order, then trials until the study holds
its total. One trial's life is ``_trial``'s."""

from __future__ import annotations

import dataclasses
import datetime
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState

from autotune.faults import FaultKind
from autotune.machine.hardware import Hardware
from autotune.spacefile import FloatRange, Spec
from autotune.speed import SpeedTable
from autotune.stage1._probe import resolve_batch_sizes
from autotune.stage1._stage import run_speed_stage
from autotune.stage1._take import StageInputs, StudyParts
from autotune.storage._liveness import recover_stale_trials, study_lock
from autotune.storage._queries import COUNTED_STATES, count_endings, counted_trials
from autotune.storage._records import REFERENCES, TrialRecord
from autotune.storage._walls import MemoryWalls
from autotune.study._observer import StudyInputs
from autotune.study._open import queue_reference
from autotune.study._trial import Terminated, TrialRunner

if TYPE_CHECKING:
    from autotune.config import TrialConfig

SAME_ERROR_LIMIT = 3  # identical unexpected errors in a row, with no trial completed: stop
LR_HALVINGS = 2  # a checklist that learned nothing tried again at 1/2, then 1/4 of its lr
LEARNED_NOTHING = (FaultKind.NONFINITE_LOSS, FaultKind.DIVERGED)  # faults of too high an lr


@dataclass
class RunOutcome:
    """What one ``run_study`` call did."""

    study_name: str
    trials_run: int = 0
    stopped_reason: str = ""  # why the run ended before n_trials, if it did
    interrupted: bool = False
    terminated: bool = False  # interrupted by SIGTERM rather than Ctrl-C
    repeated_error: str | None = None
    # where the repeated error's traceback is kept: "trials" (each trial's fail_traceback) or
    # "stage 1" (the failed trials of the NAME.speed study)
    repeated_in: str = "trials"
    failed_out: bool = False  # as many trials failed in this run as the study wants: it gave up
    states: dict[str, int] = field(default_factory=dict)  # trials by how they ended (ENDINGS)
    speed_table: SpeedTable | None = None  # two-stage studies: stage 1's answer
    stage_failed: str | None = None  # stage 1 could run no setting at all: why
    taken_over: int = 0  # trials another process failed as stale while this one trained them
    timed_out: bool = False  # study.timeout ended the run
    stage_seconds: float | None = None  # what stage 1 took in this run (two-stage studies)

    def stopped_by(self, stop: KeyboardInterrupt) -> None:
        """Record an interruption: Ctrl-C, or SIGTERM (``Terminated``)."""
        self.interrupted, self.terminated = True, isinstance(stop, Terminated)


def _past(deadline: float | None) -> bool:
    """Whether the run's timeout (a ``time.monotonic()`` deadline) has passed."""
    return deadline is not None and time.monotonic() >= deadline


def requeue_lost_references(
    study: optuna.Study,
    spec: Spec,
    hardware: Hardware,
    fits: Callable[[TrialConfig], bool] | None = None,
) -> bool:
    """Queue each reference (the untuned baseline, the tuning checklist) the study wants and no
    trial counts, waits for or runs (interrupted, timed out under load, crashed, no room), as
    far as ``n_trials`` leaves room; whether one was queued. ``fits``: below the memory walls.
    A study keeps exactly one of each until it finishes: every ratio is quoted against them."""
    present = (*COUNTED_STATES, TrialState.WAITING, TrialState.RUNNING)
    trials = study.get_trials(deepcopy=False, states=present)
    kept = {TrialRecord.of(t).reference for t in trials}
    room = spec.study.n_trials - len(trials)
    queued = 0
    for kind in (kind for kind in REFERENCES if kind not in kept):
        if queued < room and queue_reference(study, spec, hardware, kind, fits):
            queued += 1
    return queued > 0


def _halvings(trials: list[optuna.trial.FrozenTrial], record: TrialRecord) -> int | None:
    """How many times the tuning checklist's learning rate was halved to make the trial of
    ``record``: 0 for the checklist itself, None for a trial that is neither it nor such."""
    if record.checklist:
        return 0
    if record.halved_lr_of is None:
        return None
    origin = _halvings(trials, TrialRecord.of(trials[record.halved_lr_of]))
    return None if origin is None else origin + 1


def _rate_raised(trials: list[optuna.trial.FrozenTrial], record: TrialRecord) -> bool:
    """Whether the trial of ``record`` trains at a higher learning rate than the untuned
    baseline (``lr_scaling`` raised it to a larger batch), or either's is unknown. At the
    baseline's rate or below, a checklist below the bar took too few steps (a 2-layer MLP at
    batch 128: 0.84 accuracy), and half its rate learned less (0.71, then 0.59)."""
    baseline = next((r for t in trials if (r := TrialRecord.of(t)).baseline), None)
    if baseline is None or baseline.config is None or record.config is None:
        return True
    return record.config.lr > baseline.config.lr


def halve_lr(study: optuna.Study, spec: Spec, trial: optuna.trial.FrozenTrial) -> bool:
    """Queue ``trial``'s settings at half its learning rate, as a searched trial, where it is
    the tuning checklist and diverged, or ended below the bar at a rate ``lr_scaling`` raised
    above the baseline's, or such a retry less than ``LR_HALVINGS`` deep that did, or that
    completed whatever it scored; whether it did. The checklist is the fast corner the speed
    stage found (the largest micro-batch, half precision), and the baseline's learning rate
    scaled up to it can be too high to learn in a short trial: on ResNet-18 (an H200, 2 epochs
    at batch 1024) it reached 0.11 accuracy, and half of it 0.991 at the same speed, a corner
    the search's few trials had not drawn. Half of a rate that learned nothing is at the edge
    of stability, where the seed decides: there half reached 0.987 in its trial and 0.33 and
    0.19 at the round's seeds (the answer fell back to the baseline); a quarter reached 0.998.
    Only the searched ``lr`` moves, never below its range; the execution knobs are drawn as
    any trial's."""
    record = TrialRecord.of(trial)
    if not record.checklist and record.halved_lr_of is None:
        return False  # every other trial: no read of the whole study after each
    trials = study.get_trials(deepcopy=False)
    halvings = _halvings(trials, record)
    lr, params = spec.space.lr, trial.params
    below_bar = trial.state == TrialState.COMPLETE and record.feasible is False
    if halvings is None or halvings >= LR_HALVINGS or "lr" not in params:
        return False
    diverged = record.fail_kind in LEARNED_NOTHING
    too_high = below_bar and _rate_raised(trials, record)  # else too few steps: lower learns less
    at_the_edge = halvings > 0 and trial.state == TrialState.COMPLETE  # whatever it scored
    if not (diverged or too_high or at_the_edge) or not isinstance(lr, FloatRange):
        return False
    lower = max(lr.low, params["lr"] / 2)
    if lr.step:  # on the range's grid, as Optuna draws it
        lower = lr.low + math.floor((lower - lr.low) / lr.step) * lr.step
    present = (*COUNTED_STATES, TrialState.WAITING, TrialState.RUNNING)
    if lower >= params["lr"] or sum(t.state in present for t in trials) >= spec.study.n_trials:
        return False
    if any(TrialRecord.of(t).halved_lr_of == trial.number for t in trials):
        return False  # another process queued it
    retry = TrialRecord(halved_lr_of=trial.number)
    study.enqueue_trial({**params, "lr": lower}, user_attrs=retry.to_attrs())
    return True


def run_study(
    inputs: StudyInputs,
    remeasure: bool = False,
    on_trials_start: Callable[[], None] | None = None,
) -> RunOutcome:
    """Run the study's stages: for ``study.strategy: two_stage`` the speed stage first (its
    measurements reused from the storage unless ``remeasure``), then trials until the study
    holds ``spec.study.n_trials`` COMPLETE or PRUNED trials, those running elsewhere counted.

    Stops early at ``spec.study.timeout`` seconds (a running trial finishes first), when as many
    trials failed as were wanted, or when the same unexpected error ends ``SAME_ERROR_LIMIT``
    trials in a row before any completes in this run (a bug, not a configuration). An
    interruption is recorded on the running trial and in ``outcome``; WorkerError (a worker
    that cannot start) propagates. ``on_trials_start``: once stage 1 is measured, before the
    first trial (``--workers``).
    """
    study, spec, observer = inputs.study, inputs.spec, inputs.observer
    outcome = RunOutcome(study_name=study.study_name)
    deadline = time.monotonic() + spec.study.timeout if spec.study.timeout else None
    walls = MemoryWalls.from_study(study)
    table = None
    if spec.study.strategy == "two_stage":
        staged = _stage_one(inputs, remeasure, outcome)
        if staged is None:  # interrupted, or no setting could train: no trial runs
            return outcome
        spec, table = staged  # batch_size: auto resolved
    trial_runner = TrialRunner(dataclasses.replace(inputs, spec=spec), walls, table)
    trial_runner.keep_sampler(study)  # no trial on what cannot run
    try:
        # a stale baseline is retried with its mark, not queued anew
        if recovered := recover_stale_trials(study):
            observer.recovered(recovered)
        if counted_trials(study) < spec.study.n_trials:

            def fits(config: TrialConfig) -> bool:  # below the walls of trials and stage 1
                oom = table is not None and table.runs_out_of_memory(
                    config.batch_size, config.precision
                )
                return walls.fits(config) and not oom

            # not into a finished study
            requeue_lost_references(study, spec, inputs.hardware, fits)
            if on_trials_start is not None:  # only when there is something left to run
                on_trials_start()
        _trials(trial_runner, deadline, outcome)
    except KeyboardInterrupt as stop:
        trial_runner.stopped_unstarted(study, stop)
        outcome.stopped_by(stop)
    count_states(study, outcome)
    return outcome


def _stage_one(
    study: StudyInputs, remeasure: bool, outcome: RunOutcome
) -> tuple[Spec, SpeedTable] | None:
    """A two-stage study's speed stage, its time and how it ended in ``outcome``: the spec
    with ``batch_size: auto`` resolved first (``stage1._probe``; what it found, said and in
    the table) and its table, or None where it was interrupted or could train no setting at all
    (why, in ``outcome``)."""
    observer = study.observer
    parts = {part.name: getattr(study, part.name) for part in dataclasses.fields(StudyParts)}
    inputs = StageInputs(**parts, on_event=observer.speed_measured, on_wait=observer.turn_waiting)
    found: str | None = None  # batch_size: auto, what its probe found, in one line
    stage_started = time.monotonic()
    try:
        if inputs.spec.space.batch_size_auto:  # the micro-batches, before the cells and references
            resolved, found = resolve_batch_sizes(inputs, observer.study_waiting)
            inputs = dataclasses.replace(inputs, spec=resolved)
            observer.turn_waiting(found)
        spent = time.monotonic() - stage_started  # the probe's: stage 1's budget counts them
        table = run_speed_stage(inputs, remeasure, spent)
    except KeyboardInterrupt as stop:
        outcome.stopped_by(stop)
        return None
    table = dataclasses.replace(table, batch_size_auto=found)
    outcome.stage_seconds = time.monotonic() - stage_started
    observer.speed_finished(table, outcome.stage_seconds)
    outcome.speed_table = table
    failure = table.failure()
    if failure is None:
        return inputs.spec, table
    kind, why = failure  # no trial could train: say why, run none
    if kind == FaultKind.ERROR:  # the same bug everywhere, as trials would show it
        outcome.repeated_error = why
        outcome.repeated_in = "stage 1"
    else:
        outcome.stage_failed = why
    return None


def _trials(trial_runner: TrialRunner, deadline: float | None, outcome: RunOutcome) -> None:
    """Trials until the study holds its total, the timeout's ``deadline`` passes, or this
    run's failures say to stop (``run_study``'s rules); what they did, in ``outcome``."""
    inputs = trial_runner.inputs
    study, spec, observer = inputs.study, inputs.spec, inputs.observer
    target = spec.study.n_trials
    errors: list[str] = []  # messages of unexpected errors since the last counted trial
    completed_here = False  # whether a trial of this run completed
    failures: Counter[str] = Counter()  # this run's failed trials by message
    wait_seconds = min(1.0, float(spec.study.heartbeat_interval))
    while True:
        if recovered := recover_stale_trials(study):
            observer.recovered(recovered)
        # counted and started under the study's lock: processes that count at the same
        # moment cannot each start the last trial
        with study_lock(study):
            trials = study.get_trials(deepcopy=False)
            counted = sum(1 for t in trials if t.state in COUNTED_STATES)
            running = sum(1 for t in trials if t.state == TrialState.RUNNING)
            asked = None
            if counted < target and counted + running < target and not _past(deadline):
                asked = trial_runner.ask(study)
        if counted >= target:
            if outcome.trials_run == 0:
                outcome.stopped_reason = (
                    f"nothing to run: the study already has {counted} trials; --n-trials "
                    f"(study.n_trials, now {target}) is the study's total, not this many more"
                )
            return
        if asked is None and _past(deadline):
            outcome.stopped_reason = f"the timeout of {spec.study.timeout:g} s was reached"
            outcome.timed_out = True
            return
        if asked is None:
            observer.waiting(running)
            time.sleep(wait_seconds)
            continue
        trial = trial_runner.run(study, asked)
        outcome.trials_run += 1
        if trial_runner.taken_over:  # failed elsewhere and queued again: not this run's
            outcome.taken_over += 1  # (the observer heard it from taken_over)
            continue
        observer.trial_finished(trial)
        halve_lr(study, spec, trial)  # the checklist's fast corner at a learning rate that learns
        if trial.state == TrialState.FAIL:
            record = TrialRecord.of(trial)
            failures[str(record.fail_msg)] += 1
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
            return
        if failures.total() >= max(target, SAME_ERROR_LIMIT):
            message, count = failures.most_common(1)[0]
            which = f"{count} of them with" if count > 1 else "each its own way, the last with"
            message = message if count > 1 else list(failures)[-1]
            outcome.stopped_reason = (
                f"{failures.total()} trials failed in this run; {which} {message}"
            )
            outcome.failed_out = True
            return


def count_states(study: optuna.Study, outcome: RunOutcome, since: float | None = None) -> None:
    """``outcome.states``: the study's trials by how they ended (``ENDINGS``), as they are now.
    ``since`` (a ``time.time()``): also ``outcome.trials_run``, every process's trials that
    started since then and have ended (``--workers``: those of the workers this run started
    too)."""
    trials = study.get_trials(deepcopy=False)
    outcome.states = count_endings(trials)
    if since is not None:
        began = datetime.datetime.fromtimestamp(since)
        starts = [t.datetime_start for t in trials if t.datetime_complete is not None]
        outcome.trials_run = sum(1 for start in starts if start is not None and start >= began)
