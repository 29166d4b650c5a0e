"""The objective: trial measurements -> the value Optuna stores, and which answers are acceptable.

A trial is judged by its validation ``score`` (``objective.score``: accuracy by default).
``score_per_second`` (maximize; older name ``accuracy_per_second``): the score / charged training
seconds, for a score where higher is better. ``time_to_score`` (minimize; older name
``time_to_accuracy``): charged training seconds until the score first reaches ``target_score`` in
its direction (at or above it, or at or below it for a lower-is-better score such as val_loss).

Charged seconds are training seconds with the one-time overhead (compilation, cuDNN autotuning,
worker start-up) charged in proportion ``epochs / full_run_epochs`` when the full run's length is
known: a compile that pays off over a 90-epoch run must not lose to eager in a 3-epoch trial.
Without ``full_run_epochs``, and always for ``time_to_score`` (the run to the target *is* the
full run), overhead is charged in full.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autotune.results import Evaluation, TrialResult
from autotune.spacefile import ObjectiveSpec

MIN_SCORE_FOR_EXTRAPOLATION = 1e-3

# the highest a built-in score can be: a per-second trial can end at best with this score
SCORE_CEILINGS = {"accuracy": 1.0, "top5": 1.0}

# a trial is stopped as one that cannot win when even its best possible end is this many times
# worse than the best answer so far: more than one measurement's run-to-run noise (about +-15%
# on a shared CPU) can make up
CANNOT_WIN_MARGIN = 1.25

# the epochs a trial has left are assumed up to this much faster than the ones it trained
REMAINING_PACE_SLACK = 0.8


def charged_seconds(
    train_seconds: float, overhead_seconds: float, epochs: float, full_run_epochs: float | None
) -> float:
    """Training seconds with overhead charged in proportion ``epochs / full_run_epochs``.

    Example: 10 s of training of which 4 s compilation, after 3 epochs of a 30-epoch run:
    6 s + 4 s x 3/30 = 6.4 s.
    """
    if full_run_epochs is None:
        return train_seconds
    share = min(1.0, epochs / full_run_epochs)
    return train_seconds - overhead_seconds * (1.0 - share)


def _charged(evaluation: Evaluation, objective: ObjectiveSpec) -> float:
    full = objective.full_run_epochs if objective.per_second else None
    return charged_seconds(
        evaluation.train_seconds, evaluation.overhead_seconds, evaluation.epoch, full
    )


def _distance_to_target(score: float, objective: ObjectiveSpec) -> float:
    """How many times the way to the target is still to go, 1.0 once it is reached: the ratio
    of target to score (higher is better) or of score to target (lower is better)."""
    target = objective.target
    assert target is not None
    if objective.reaches(score, target):
        return 1.0
    if objective.score_higher_is_better:
        return (
            target / max(score, MIN_SCORE_FOR_EXTRAPOLATION)
            if target > 0
            else 1.0 + target - score
        )
    return score / target if target > 0 else 1.0 + score - target


def intermediate_value(
    evaluation: Evaluation, objective: ObjectiveSpec, epochs: float | None = None
) -> float:
    """The value reported to the pruner at an evaluation, in the study's direction, on the
    scale of a finished trial's value: what the trial ends at if it keeps its pace and its
    score. Optuna stores a pruned trial's last one as its value, so it must not read as more.

    score_per_second: the score so far / the charged seconds the trial will have spent after
    its ``epochs`` epochs at its steady pace so far (None: the seconds so far). At a given
    evaluation every trial's seconds are scaled alike, so the pruners rank them as they rank
    the seconds so far. time_to_score: the seconds so far extrapolated linearly to the target
    (lower is better; equal to the seconds once the target is reached).
    """
    if objective.per_second:
        ahead = max(1.0, (epochs or evaluation.epoch) / max(evaluation.epoch, 1e-9))
        steady = evaluation.train_seconds - evaluation.overhead_seconds
        projected = dataclasses.replace(
            evaluation,
            epoch=evaluation.epoch * ahead,
            train_seconds=steady * ahead + evaluation.overhead_seconds,
        )
        return max(evaluation.score, 0.0) / _charged(projected, objective)
    return _charged(evaluation, objective) * _distance_to_target(evaluation.score, objective)


def best_reachable(
    evaluation: Evaluation,
    objective: ObjectiveSpec,
    epochs: float,
    paced_from: Evaluation | None = None,
) -> float | None:
    """The best value a trial of ``epochs`` epochs can still end with, from where it stands at
    ``evaluation``, in the study's direction; None when nothing bounds it.

    score_per_second: the score's ceiling (1.0 for accuracy and top5; a user's score has none:
    None) over the charged seconds the trial will have spent at its end, the epochs left taken
    at the steady pace of those trained (``REMAINING_PACE_SLACK`` faster). time_to_score: the
    charged seconds so far, which the trial cannot take back.

    ``paced_from``: an earlier evaluation of the trial after which it trained on a quiet machine
    (before it, others took its cores): its pace is the one since then, and its seconds so far
    are counted at that pace, not at the pace interference imposed.
    """
    if paced_from is not None and evaluation.epoch > paced_from.epoch:
        since = _steady(evaluation) - _steady(paced_from)
        pace = since / (evaluation.epoch - paced_from.epoch)
        evaluation = dataclasses.replace(
            evaluation, train_seconds=evaluation.overhead_seconds + pace * evaluation.epoch
        )
    seconds = _charged(evaluation, objective)
    if not objective.per_second:
        return seconds
    ceiling = SCORE_CEILINGS.get(objective.score)
    if ceiling is None or evaluation.epoch <= 0:
        return None
    left = _steady(evaluation) / evaluation.epoch * max(epochs - evaluation.epoch, 0.0)
    end = dataclasses.replace(
        evaluation,
        epoch=max(epochs, evaluation.epoch),
        train_seconds=evaluation.train_seconds + left * REMAINING_PACE_SLACK,
    )
    return ceiling / max(_charged(end, objective), 1e-9)


def _steady(evaluation: Evaluation) -> float:
    """The steady-state training seconds up to ``evaluation`` (its one-time costs left out)."""
    return max(evaluation.train_seconds - evaluation.overhead_seconds, 0.0)


def cannot_win(reachable: float | None, best: float, objective: ObjectiveSpec) -> bool:
    """Whether a trial whose ``best_reachable`` value is ``reachable`` cannot beat ``best``,
    the best answer's value, by more than ``CANNOT_WIN_MARGIN``."""
    if reachable is None:
        return False
    if objective.per_second:
        return reachable * CANNOT_WIN_MARGIN < best
    return reachable > best * CANNOT_WIN_MARGIN


def target_reached(evaluation: Evaluation, objective: ObjectiveSpec) -> bool:
    """Whether this evaluation ends a time_to_score trial: its target is reached."""
    target = objective.target
    return (
        not objective.per_second
        and target is not None
        and objective.reaches(evaluation.score, target)
    )


@dataclass(frozen=True)
class Score:
    """A finished trial as the study sees it."""

    value: float  # stored as the trial's value (maximize or minimize per metric)
    score: float  # the validation score the value is based on
    charged_seconds: float  # the seconds the value is based on
    constraint: float | None  # <= 0 means feasible; None when the objective has no constraint
    constraint_name: str | None
    reason: str  # why the trial is infeasible; "" when feasible

    @property
    def feasible(self) -> bool:
        return self.constraint is None or self.constraint <= 0


def score(result: TrialResult, objective: ObjectiveSpec) -> Score:
    """Score a trial that trained to its end (or to its target)."""
    last = result.evaluations[-1]
    name = objective.score_name
    if objective.per_second:
        seconds, bar = _charged(last, objective), objective.bar
        if last.score < 0:  # score / seconds would rank a worse negative score higher
            value, bar = 0.0, 0.0  # a constraint of -score: infeasible
            why = (
                f"{name} {last.score:.4g} is below 0: {objective.metric} needs a score of 0 "
                "or more"
            )
        else:
            value = last.score / seconds
            below = bar is not None and last.score < bar
            why = f"{name} {last.score:.4g} is below {objective.bar_name} {bar:g}" if below else ""
        return Score(
            value=value,
            score=last.score,
            charged_seconds=seconds,
            constraint=None if bar is None else bar - last.score,
            constraint_name=None if bar is None else objective.bar_name,
            reason=why,
        )
    target = objective.target
    assert target is not None
    sign = 1.0 if objective.score_higher_is_better else -1.0
    reached = next((e for e in result.evaluations if objective.reaches(e.score, target)), None)
    if reached is not None:
        seconds, shown, why = _charged(reached, objective), reached.score, ""
    else:  # the time spent without reaching the target; infeasible, so never the answer
        shown = max((e.score for e in result.evaluations), key=lambda value: sign * value)
        seconds = _charged(last, objective)
        why = f"best {name} {shown:.4g} never reached {objective.target_name} {target:g}"
    return Score(
        value=seconds,
        score=shown,
        charged_seconds=seconds,
        # how far short of the target a score is, in the score's direction
        constraint=sign * (target - shown),
        constraint_name=objective.target_name,
        reason=why,
    )
