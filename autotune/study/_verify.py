"""The answer at full length (``autotune verify``): the answer, the tuning checklist and the
untuned baseline, each trained for the real run's epochs in the trials' own machinery, one after
another (A B C, then C B A with more repeats), every evaluation recorded; who reaches the target
first, and whether the short trials' ranking holds.

Trials are short, and what they rank can change over a real run: a learning rate or a batch
size chosen on 3 epochs favours fast early progress (short-horizon bias, Wu et al., ICLR 2018),
and one-time costs are charged in proportion, never measured. The runs are stored with the study
(its ``verify`` attribute) after each one, so an interrupted verify resumes.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import optuna

from autotune.results import Evaluation
from autotune.storage._queries import feasible_trials, reference_trial, trial_config
from autotune.storage._records import REFERENCE_NAMES
from autotune.study._answer import answer_of
from autotune.study._confirm import interleaved, train_once
from autotune.study._confirmed import loads_alike, loads_said

if TYPE_CHECKING:
    from autotune.executor import TrialExecutor

ATTRIBUTE = "verify"  # the study's user attribute that holds the runs
# what "better" must exceed before a reference is said to beat the answer at full length: one run
# each cannot tell smaller differences from noise (a final accuracy of 0.998 against 0.996 is one
# sample of 600; epoch times on a shared CPU vary by 10-15% run to run)
SCORE_MARGIN = 0.005  # relative
TIME_MARGIN = 0.10  # relative
ROLE_NAMES: dict[str, str] = {"answer": "the answer", "runner_up": "the runner-up"}
ROLE_NAMES.update(REFERENCE_NAMES.items())


@dataclass(frozen=True)
class VerifyRun:
    """One configuration trained for the full run: its curve, (training seconds, score) at each
    evaluation (compile and warm-up included, evaluation excluded)."""

    trial: int
    role: str  # "answer", "checklist" or "baseline"
    repeat: int
    curve: tuple[tuple[float, float], ...]
    samples_per_second: float | None = None
    fault: str | None = None  # why it did not train to its end
    other_cpu_share: float | None = None  # others' share of its cores while it trained

    @property
    def seconds(self) -> float | None:
        return self.curve[-1][0] if self.curve and self.fault is None else None

    @property
    def final_score(self) -> float | None:
        return self.curve[-1][1] if self.curve and self.fault is None else None

    def time_to(self, target: float, higher_is_better: bool) -> float | None:
        """Training seconds until the score first reached ``target``, interpolated linearly
        between the evaluations around it (the first evaluation's time when it did at once);
        None when it never did."""
        before: tuple[float, float] | None = None
        for seconds, score in self.curve:
            if (score >= target) if higher_is_better else (score <= target):
                if before is None or before[1] == score:
                    return seconds
                share = (target - before[1]) / (score - before[1])
                return before[0] + share * (seconds - before[0])
            before = (seconds, score)
        return None


def role_name(role: str, trial: int | None = None) -> str:
    """ "the untuned baseline", or with its trial "the untuned baseline (trial 0)"."""
    return ROLE_NAMES[role] + (f" (trial {trial})" if trial is not None else "")


class VerifiedRow(NamedTuple):
    """One configuration at full length: medians over its runs (None: no run had one)."""

    role: str
    trial: int
    final_score: float | None
    seconds: float | None  # training seconds of the whole run
    to_target: float | None  # training seconds to the target; None: never (or no target)

    @property
    def name(self) -> str:
        """ "the answer (trial 12)", "the untuned baseline (trial 0)"."""
        return role_name(self.role, self.trial)


@dataclass(frozen=True)
class Verification:
    """What ``verify`` stored: the epochs and target it trained to, and its runs."""

    epochs: float
    target: float | None
    runs: tuple[VerifyRun, ...] = ()

    def to_attrs(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of(cls, study: optuna.Study) -> Verification | None:
        stored = study.user_attrs.get(ATTRIBUTE)
        if not isinstance(stored, dict):
            return None
        runs = tuple(
            VerifyRun(**{**run, "curve": tuple(map(tuple, run["curve"]))})
            for run in stored.get("runs", ())
        )
        return cls(stored["epochs"], stored.get("target"), runs)

    def of_role(self, role: str) -> list[VerifyRun]:
        return [run for run in self.runs if run.role == role]

    def median(self, role: str, value: Callable[[VerifyRun], float | None]) -> float | None:
        """The median of ``value`` over the role's runs that have one."""
        values = [v for run in self.of_role(role) if (v := value(run)) is not None]
        return statistics.median(values) if values else None

    def time_to_target(self, role: str, higher_is_better: bool) -> float | None:
        """The median over the role's runs of their seconds to the target (None: none)."""
        target = self.target
        if target is None:
            return None
        return self.median(role, lambda run: run.time_to(target, higher_is_better))

    def rows(self, higher_is_better: bool) -> list[VerifiedRow]:
        """A row per configuration verified (the answer first): its medians over its runs."""
        rows = []
        for role in ROLE_NAMES:
            runs = self.of_role(role)
            if runs:
                final = self.median(role, lambda run: run.final_score)
                seconds = self.median(role, lambda run: run.seconds)
                reached = self.time_to_target(role, higher_is_better)
                rows.append(VerifiedRow(role, runs[0].trial, final, seconds, reached))
        return rows

    def unlike_loads(self) -> str:
        """Where the runs were measured under unlike loads (``loads_alike``), others' share of
        the cores in each configuration's: "the answer's 5%, the untuned baseline's 70-74%";
        else ""."""
        if loads_alike(run.other_cpu_share for run in self.runs):
            return ""
        said = []
        for role in ROLE_NAMES:
            shares = [
                r.other_cpu_share for r in self.of_role(role) if r.other_cpu_share is not None
            ]
            said += [f"{ROLE_NAMES[role]}'s {loads_said(shares)}"] * bool(shares)
        return ", ".join(said)

    def losses(self, higher_is_better: bool, per_second: bool) -> list[tuple[str, str]]:
        """(reference's name, how) for each reference that beats the answer at full length on
        the study's metric by more than ``TIME_MARGIN``: more score per second of training
        (``per_second``), or the target sooner, or at all."""
        found: list[tuple[str, str]] = []
        answer_rate = self.median("answer", _rate)
        answer_time = self.time_to_target("answer", higher_is_better)
        for role in list(ROLE_NAMES)[1:]:
            rate = self.median(role, _rate)
            if per_second and rate and answer_rate and rate > answer_rate * (1 + TIME_MARGIN):
                how = f"scores {rate:.4g} per second of training, the answer {answer_rate:.4g}"
                found.append((ROLE_NAMES[role], how))
                continue
            their_time = self.time_to_target(role, higher_is_better)
            if their_time is None:
                continue
            if answer_time is None or their_time < answer_time * (1 - TIME_MARGIN):
                reached = "never" if answer_time is None else f"in {answer_time:.3g} s"
                how = f"reaches {self.target:g} in {their_time:.3g} s, the answer {reached}"
                found.append((ROLE_NAMES[role], how))
        return found

    def ends_better(self, higher_is_better: bool) -> list[tuple[str, str]]:
        """(reference's name, its final score against the answer's) for each reference that
        ends better than the answer beyond noise: by more than ``SCORE_MARGIN``, and every run
        of it better than every run of the answer where both have several. A trade the study's
        metric may accept (a learning rate chosen on short trials favours early progress:
        short-horizon bias), said apart from the ranking: a new user read "does not hold" of an
        answer 1.6x ahead per second that ended 0.0056 lower, one run each."""
        sign = 1 if higher_is_better else -1
        mine = [sign * s for r in self.of_role("answer") if (s := r.final_score) is not None]
        found: list[tuple[str, str]] = []
        for role in list(ROLE_NAMES)[1:]:
            theirs = [sign * s for r in self.of_role(role) if (s := r.final_score) is not None]
            if not mine or not theirs:
                continue
            score, answer = statistics.median(theirs), statistics.median(mine)
            apart = min(len(mine), len(theirs)) < 2 or min(theirs) > max(mine)
            if score - answer > SCORE_MARGIN * abs(answer) and apart:
                each = "one run" if len(mine) == 1 else f"{len(mine)} runs"
                runs = f"{each} each" if len(mine) == len(theirs) else f"{len(theirs)} and {each}"
                how = f"{sign * score:.4g} against the answer's {sign * answer:.4g} ({runs})"
                found.append((ROLE_NAMES[role], how))
        return found


def _rate(run: VerifyRun) -> float | None:
    """The run's final score per second of its training (the per-second metric's measure)."""
    score, seconds = run.final_score, run.seconds
    return score / seconds if score is not None and seconds else None


def verify_candidates(
    study: optuna.Study, runner_up: bool = False
) -> list[tuple[str, optuna.trial.FrozenTrial]]:
    """(role, trial) of the answer and the references it is verified against (``runner_up``:
    and the best other feasible trial), the answer first; a reference that is the answer is not
    trained twice."""
    answer = answer_of(study)
    if answer is None:
        return []
    chosen = [("answer", answer.trial)]
    references: list[tuple[str, optuna.trial.FrozenTrial | None]]
    references = [(role, reference_trial(study, role)) for role in REFERENCE_NAMES]
    if runner_up:
        taken = {answer.trial.number} | {t.number for _, t in references if t is not None}
        second = next((t for t in feasible_trials(study) if t.number not in taken), None)
        references.insert(0, ("runner_up", second))
    for role, trial in references:
        if trial is not None and trial.number != answer.trial.number:
            chosen.append((role, trial))
    return chosen


def _kept(study: optuna.Study, epochs: float) -> Verification:
    """The stored verification where it trained for ``epochs``, else an empty one."""
    stored = Verification.of(study)
    if stored is not None and math.isclose(stored.epochs, epochs):
        return stored
    return Verification(epochs, None)


@dataclass(frozen=True)
class VerifyInputs:
    """A verify as it runs in this process: ``repeats`` runs of each configuration (``runner_up``:
    the best other feasible trial too) for the full run's ``epochs``, and who hears of it:
    ``on_evaluation(role, trial, evaluation)``, ``on_wait`` (a run waits for its turn)."""

    study: optuna.Study
    executor: TrialExecutor
    epochs: float
    target: float | None
    repeats: int = 1
    runner_up: bool = False
    on_evaluation: Callable[[str, int, Evaluation], None] | None = None
    on_wait: Callable[[str], None] | None = None


def runs_left(inputs: VerifyInputs) -> list[tuple[str, optuna.trial.FrozenTrial, int]]:
    """(role, trial, repeat) of the runs a verify still has to train, in the order it trains
    them (A B C, then C B A, ...)."""
    order, done = _planned(inputs)
    return [(role, trial, repeat) for (role, trial), repeat in order if (role, repeat) not in done]


def runs_kept(inputs: VerifyInputs) -> int:
    """How many of the runs a verify plans are stored at its epochs already (a resume, or more
    ``repeats`` than before): kept, not trained again."""
    order, done = _planned(inputs)
    return sum((role, repeat) in done for (role, _), repeat in order)


def _planned(
    inputs: VerifyInputs,
) -> tuple[list[tuple[tuple[str, Any], int]], set[tuple[str, int]]]:
    """The runs a verify plans, in order, and the (role, repeat) of those stored already."""
    done = {(run.role, run.repeat) for run in _kept(inputs.study, inputs.epochs).runs}
    return interleaved(verify_candidates(inputs.study, inputs.runner_up), inputs.repeats), done


def verify_study(inputs: VerifyInputs) -> Verification:
    """Train each configuration (``verify_candidates``) for ``inputs.epochs``, ``repeats``
    times, interleaved, storing the verification after every run; runs stored at the same
    epochs are kept (a resume), another ``epochs`` starts over. An interruption propagates;
    what finished is kept."""
    study = inputs.study
    verification = dataclasses.replace(_kept(study, inputs.epochs), target=inputs.target)
    for role, trial, repeat in runs_left(inputs):
        run = _train(inputs, trial, role, repeat)
        verification = dataclasses.replace(verification, runs=(*verification.runs, run))
        study.set_user_attr(ATTRIBUTE, verification.to_attrs())  # each run, as it ends
    if Verification.of(study) != verification:  # nothing left to train: the target's change
        study.set_user_attr(ATTRIBUTE, verification.to_attrs())
    return verification


def _train(
    inputs: VerifyInputs, trial: optuna.trial.FrozenTrial, role: str, repeat: int
) -> VerifyRun:
    """``trial``'s configuration trained once for the full run (its seed the trial's, moved on
    by the repeat), evaluated as often as its trial was."""
    config = trial_config(trial)
    config = config.replace(epochs=inputs.epochs, seed=config.seed + repeat - 1)
    curve: list[tuple[float, float]] = []

    def report(evaluation: Evaluation) -> bool:
        curve.append((evaluation.train_seconds, evaluation.score))
        if inputs.on_evaluation is not None:
            inputs.on_evaluation(role, trial.number, evaluation)
        return False  # the whole run: that is what is verified

    result, _ = train_once(inputs.executor, config, report, inputs.on_wait)
    if isinstance(result, str):
        return VerifyRun(trial.number, role, repeat, tuple(curve), fault=result)
    speed, share = result.samples_per_second, result.other_cpu_share
    return VerifyRun(trial.number, role, repeat, tuple(curve), speed, other_cpu_share=share)
