"""The objective: trial measurements -> the value Optuna stores, and which answers are acceptable.

``accuracy_per_second`` (maximize): validation accuracy / charged training seconds.
``time_to_accuracy`` (minimize): charged training seconds until validation accuracy first reaches
``target_accuracy``.

Charged seconds are training seconds with the one-time overhead (compilation, cuDNN autotuning,
worker start-up) charged in proportion ``epochs / full_run_epochs`` when the full run's length is
known: a compile that pays off over a 90-epoch run must not lose to eager in a 3-epoch trial.
Without ``full_run_epochs``, and always for ``time_to_accuracy`` (the run to the target *is* the
full run), overhead is charged in full.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.results import Evaluation, TrialResult
from autotune.spec import ObjectiveSpec

__all__ = ["Score", "charged_seconds", "intermediate_value", "score", "target_reached"]

MIN_ACCURACY_FOR_EXTRAPOLATION = 1e-3


def charged_seconds(
    train_seconds: float,
    overhead_seconds: float,
    epochs: float,
    full_run_epochs: float | None,
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
    full = objective.full_run_epochs if objective.metric == "accuracy_per_second" else None
    return charged_seconds(
        evaluation.train_seconds, evaluation.overhead_seconds, evaluation.epoch, full
    )


def intermediate_value(evaluation: Evaluation, objective: ObjectiveSpec) -> float:
    """The value reported to the pruner at an evaluation, in the study's direction.

    accuracy_per_second: accuracy so far / charged seconds so far. time_to_accuracy: the
    seconds so far extrapolated linearly to the target (lower is better; equal to the seconds
    once the target is reached).
    """
    seconds = _charged(evaluation, objective)
    if objective.metric == "accuracy_per_second":
        return evaluation.accuracy / seconds
    assert objective.target_accuracy is not None
    accuracy = max(evaluation.accuracy, MIN_ACCURACY_FOR_EXTRAPOLATION)
    return seconds * max(1.0, objective.target_accuracy / accuracy)


def target_reached(evaluation: Evaluation, objective: ObjectiveSpec) -> bool:
    """Whether this evaluation ends a time_to_accuracy trial: its target is reached."""
    return (
        objective.metric == "time_to_accuracy"
        and objective.target_accuracy is not None
        and evaluation.accuracy >= objective.target_accuracy
    )


@dataclass(frozen=True)
class Score:
    """A finished trial as the study sees it."""

    value: float  # stored as the trial's value (maximize or minimize per metric)
    accuracy: float  # the accuracy the value is based on
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
    if objective.metric == "accuracy_per_second":
        seconds = _charged(last, objective)
        bar = objective.min_accuracy
        return Score(
            value=last.accuracy / seconds,
            accuracy=last.accuracy,
            charged_seconds=seconds,
            constraint=None if bar is None else bar - last.accuracy,
            constraint_name=None if bar is None else "min_accuracy",
            reason=""
            if bar is None or last.accuracy >= bar
            else f"accuracy {last.accuracy:.3f} is below min_accuracy {bar:g}",
        )
    assert objective.target_accuracy is not None
    target = objective.target_accuracy
    reached = next((e for e in result.evaluations if e.accuracy >= target), None)
    if reached is not None:
        seconds = _charged(reached, objective)
        return Score(
            value=seconds,
            accuracy=reached.accuracy,
            charged_seconds=seconds,
            constraint=target - reached.accuracy,
            constraint_name="target_accuracy",
            reason="",
        )
    best = max(e.accuracy for e in result.evaluations)
    seconds = _charged(last, objective)
    return Score(
        value=seconds,  # time spent without reaching the target; infeasible, so never the answer
        accuracy=best,
        charged_seconds=seconds,
        constraint=target - best,
        constraint_name="target_accuracy",
        reason=f"best accuracy {best:.3f} never reached target_accuracy {target:g}",
    )
