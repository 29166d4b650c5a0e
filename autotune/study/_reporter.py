"""A trial's evaluations as they come: each told to Optuna and the observer, and whether the
trial stops there (``TrialReporter``), judged on a pace others' processes did not slow
(``QuietPace``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import optuna
from optuna.trial import FrozenTrial

from autotune.config import TrialConfig
from autotune.errors import ReportFailed
from autotune.machine.interference import CpuMeter
from autotune.results import Evaluation
from autotune.search import objective
from autotune.spacefile._sections import ObjectiveSpec
from autotune.study._observer import StudyObserver


class QuietPace:
    """The pace the cannot-win rule may judge: others' share of the trial's cores is read
    between evaluations (``CpuMeter``, in this process, whose tree holds the trial's worker);
    a window over ``INTERFERENCE_SHARE`` is flagged, the pace after it is the one judged."""

    def __init__(self) -> None:
        self.meter = CpuMeter().__enter__()
        self.paced_from: Evaluation | None = None  # the end of the last flagged window

    def quiet(self, evaluation: Evaluation) -> bool:
        """Whether the window that ended at ``evaluation`` was quiet; the next one starts."""
        share, self.meter = self.meter.so_far(), CpuMeter().__enter__()
        if share is not None and share.interfered:
            self.paced_from = evaluation
        return self.paced_from is not evaluation

    @property
    def said(self) -> str:
        """How a cannot-win message says it judged a pace after a busy window ("": none)."""
        since, busy = self.paced_from, "before it, other processes took its cores"
        return f" (at its pace since evaluation {since.index}; {busy})" if since else ""


@dataclass
class TrialReporter:
    """A trial's ``report``: each evaluation told to Optuna and the observer, and whether the
    trial stops there (its target reached; it cannot beat ``leader`` at its pace since a quiet
    window; the pruner; another process took it over), with where and why."""

    trial: optuna.Trial
    config: TrialConfig
    goal: ObjectiveSpec
    observer: StudyObserver
    leader: FrozenTrial | None  # the best so far (None: never stopped for it)
    reference: bool  # the untuned baseline or the tuning checklist: never pruned
    pace: QuietPace = field(default_factory=QuietPace)  # windows from the trial's start
    lost_at: tuple[Evaluation, float] | None = None  # the value it could still reach there
    pruned_at: Evaluation | None = None
    taken_over: bool = False  # failed as stale by another process: stop training it

    def report(self, evaluation: Evaluation) -> bool:
        """Whether the trial stops at ``evaluation``. ReportFailed where the database fails."""
        trial, goal, epochs = self.trial, self.goal, self.config.epochs
        value = objective.intermediate_value(evaluation, goal, epochs)
        try:
            trial.report(value, evaluation.index)
            self.observer.evaluated(trial.number, evaluation, value)
            if objective.target_reached(evaluation, goal):
                return True
            if evaluation.final:
                return False
            if self.leader is not None and self.pace.quiet(evaluation):  # never a busy window
                reachable = objective.best_reachable(
                    evaluation, goal, epochs, self.pace.paced_from
                )
                if reachable is not None and objective.cannot_win(
                    reachable, float(self.leader.value or 0.0), goal
                ):
                    self.lost_at = (evaluation, reachable)
                    return True
            if not self.reference and trial.should_prune():  # a reference trains to its end
                self.pruned_at = evaluation
                return True
            return False
        except optuna.exceptions.UpdateFinishedTrialError:
            self.taken_over = True  # failed as stale elsewhere: stop training it
            return True
        except Exception as error:  # the database: the study's fault, not the trial's
            raise ReportFailed(error) from error
