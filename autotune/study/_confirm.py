"""The confirmation round: a study's leading configurations and its references (the untuned
baseline, the tuning checklist) trained again, side by side, so that its answer does not rest
on one noisy measurement each and its ratios over the references are measured alike.

After the search, the ``top`` feasible trials with the best values and the references
each train ``repeats`` more times with their trial's own budget, in interleaved order (A B C D,
then D C B A, ...) so that whatever the machine does meanwhile falls on all of them alike, and
each run with a new seed so that the score's own variance is part of the spread. The original
trial counts as one of a configuration's measurements.

A run measured under interference (other processes took more than
``interference.INTERFERENCE_SHARE`` of its cores) is kept but measured again, up to
``REMEASURES`` times; once that many retakes in a row were busy too, the machine stays busy and
the round's later runs are kept as measured (on a busy 2-core VM every retake was busy: the
round cost 150% of the search and still could not rank). What the round concludes, and the
study's answer, are ``_answer``'s.

The round is stored in the study (``StudyRecord.confirmation``) after every run: an interrupted
round resumes where it stopped, and a round whose leaders changed (more trials since) starts
over.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import optuna
from optuna.trial import FrozenTrial

from autotune import faults
from autotune.machine.turns import device_lock
from autotune.results import Evaluation, TrialResult
from autotune.search import objective
from autotune.spacefile import ObjectiveSpec
from autotune.storage._queries import feasible_trials, reference_trial, trial_config
from autotune.storage._records import (
    REMEASURES,
    ConfirmationRecord,
    ConfirmRun,
    StudyRecord,
    TrialRecord,
)

if TYPE_CHECKING:
    from autotune.config import TrialConfig
    from autotune.executor import TrialExecutor

SEED_STRIDE = 1_000_003  # repeat r of a trial trains with its seed + r * this: new, reproducible
T = TypeVar("T")


def confirmation_plan(
    study: optuna.Study,
    top: int,
    repeats: int,
    higher_score_better: bool = True,
    again: bool = False,
) -> ConfirmationRecord | None:
    """The round to run now: the stored one when it confirms the same leaders, its runs kept
    (resumed, or with more ``repeats`` than it has, added to: a round is never replaced by a
    shorter one), else a new one; None when the study has no feasible trial to confirm.
    ``higher_score_better``: the score's direction, for the tie rule; ``again``: a new round
    whatever is stored (a noisy round measured again, on a quieter machine). A lone
    configuration (no other feasible or tried: the search ran nothing) gets a round of no runs:
    a round compares, and re-measuring one configuration compares nothing."""
    feasible = feasible_trials(study)
    leaders = feasible[:top]
    if not leaders:
        return None
    baseline = reference_trial(study, "baseline")
    checklist = reference_trial(study, "checklist")
    candidates = tuple(t.number for t in leaders)
    for reference in (baseline, checklist):
        if reference is not None and reference.number not in candidates:
            candidates = (*candidates, reference.number)
    if len(candidates) == 1 and len(feasible) == 1:  # nothing to compare: no runs (``alone``)
        repeats, again = 0, True
    stored = StudyRecord.of(study).confirmation
    if not again and stored is not None and stored.candidates == candidates and stored.top == top:
        if repeats <= stored.repeats:
            return stored
        return dataclasses.replace(stored, repeats=repeats, complete=False)
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    originals = tuple(_original(trials[number]) for number in candidates)
    return ConfirmationRecord(
        top=top,
        repeats=repeats,
        maximize=maximize,
        candidates=candidates,
        baseline=baseline.number if baseline is not None else None,
        checklist=checklist.number if checklist is not None else None,
        runs=originals,
        higher_score_better=higher_score_better,
    )


def _original(trial: FrozenTrial) -> ConfirmRun:
    """A trial's own measurement, as the round's repeat 0."""
    record = TrialRecord.of(trial)
    return ConfirmRun(
        trial=trial.number,
        repeat=0,
        seed=trial_config(trial).seed,
        value=trial.value,
        score=record.score,
        samples_per_second=record.samples_per_second,
        feasible=record.feasible is not False,
        wall_seconds=record.wall_seconds or 0.0,
        other_cpu_share=record.other_cpu_share,
    )


def interleaved(items: Sequence[T], repeats: int) -> list[tuple[T, int]]:
    """(item, repeat) in the order they run: A B C D, then D C B A, then A B C D..."""
    return [
        (item, repeat)
        for repeat in range(1, repeats + 1)
        for item in (items if repeat % 2 else items[::-1])
    ]


def fewest_switches(candidates: Sequence[int], trials: dict[int, FrozenTrial]) -> list[int]:
    """The candidates in the order they run: those with the first's cudnn.benchmark first. A
    switch of it takes a new worker process on CUDA (``cudnn_plans_differ``: 16 s on an H200's
    ResNet-18, whose trial trains 1.5 s), and the untuned baseline (off) sat between the
    leaders and the checklist (on): four switches in a round of 2 repeats, now two."""
    first = trial_config(trials[candidates[0]]).cudnn_benchmark
    return sorted(candidates, key=lambda n: trial_config(trials[n]).cudnn_benchmark != first)


@dataclasses.dataclass(frozen=True)
class ConfirmationInputs:
    """The confirmation round as it runs in this process: the study and its objective, the
    executor that trains each run, the round's size (the ``top`` leaders and the references,
    ``repeats`` more runs of each; a run under interference measured again up to ``remeasures``
    times), and who hears of it: ``on_start(plan)`` the round before it runs (what it keeps,
    what is left: ``runs_left``, none where it is complete), ``on_run(run, done, total)`` each
    finished run (one measured again is heard again at the same place), ``on_wait`` that a run
    waits for its turn (``turns``); ``again``: a new round, the stored one replaced."""

    study: optuna.Study
    goal: ObjectiveSpec
    executor: TrialExecutor
    top: int
    repeats: int
    on_run: Callable[[ConfirmRun, int, int], None] | None = None
    on_start: Callable[[ConfirmationRecord], None] | None = None
    on_wait: Callable[[str], None] | None = None
    remeasures: int = REMEASURES
    again: bool = False  # a new round, the stored one replaced (``confirmation_plan``)


def confirm_study(inputs: ConfirmationInputs) -> ConfirmationRecord | None:
    """Run (or resume) the confirmation round of ``inputs.study``; its record, stored in the
    study after every run. None when there is nothing to confirm. An interruption propagates;
    what ran is kept."""
    study, goal = inputs.study, inputs.goal
    higher = goal.score_higher_is_better
    record = confirmation_plan(study, inputs.top, inputs.repeats, higher, inputs.again)
    if record is None:
        return None
    if inputs.again:  # stored at once: an interrupted new round resumes, the old one is gone
        _store(study, record)
    if inputs.on_start is not None:
        inputs.on_start(record)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    order = interleaved(fewest_switches(record.candidates, trials), record.repeats)
    for position, (number, repeat) in enumerate(order, start=1):
        while record.needs_run(number, repeat, inputs.remeasures):
            run = _measure(inputs, trials[number], repeat)
            record = record.with_run(run)
            _store(study, record)
            if inputs.on_run is not None:
                inputs.on_run(run, position, len(order))
    record = dataclasses.replace(record, complete=True)
    _store(study, record)
    return record


def _store(study: optuna.Study, record: ConfirmationRecord) -> None:
    study.set_user_attr("confirmation", record.to_attrs())


def _measure(inputs: ConfirmationInputs, trial: FrozenTrial, repeat: int) -> ConfirmRun:
    """Train ``trial``'s configuration once more, with a new seed and its own budget."""
    goal, config = inputs.goal, trial_config(trial)
    seed = config.seed + repeat * SEED_STRIDE

    def report(evaluation: Evaluation) -> bool:  # the whole budget, or to the target
        return objective.target_reached(evaluation, goal)

    config = config.replace(seed=seed)
    result, seconds = train_once(inputs.executor, config, report, inputs.on_wait)
    run = ConfirmRun(trial.number, repeat, seed, None, None, None, False, seconds)
    if isinstance(result, str):
        return dataclasses.replace(run, fault=result)
    scored = objective.score(result, goal)
    return dataclasses.replace(
        run,
        value=scored.value,
        score=scored.score,
        samples_per_second=result.samples_per_second,
        feasible=scored.feasible,
        other_cpu_share=result.other_cpu_share,
    )


def train_once(
    executor: TrialExecutor,
    config: TrialConfig,
    report: Callable[[Evaluation], bool],
    on_wait: Callable[[str], None] | None,
) -> tuple[TrialResult | str, float]:
    """``config`` trained once more on this machine's turn (waited for off the clock): its
    result, or its fault in a line ("kind: message"), and the run's wall seconds."""
    from autotune.executor import attempt  # torch: only a run that trains needs it

    with device_lock(config.device, config.world_size, on_wait):
        started = time.monotonic()
        result = attempt(lambda: executor.train(config, report))
    seconds = time.monotonic() - started
    if isinstance(result, faults.TrialFault):
        return f"{result.kind}: {result.message}", seconds
    return result, seconds
