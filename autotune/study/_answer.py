"""What a confirmation round concludes (``Verdict``), and the study's answer (``Answer``),
computed once by ``answer_of``, which the terminal, the dashboard note, the HTML report,
``autotune best`` and the exports render: the round's winner, with its ratio over each
reference measured beside it (the untuned baseline), or else the best feasible trial.

A measurement taken under interference (other processes took more than
``interference.INTERFERENCE_SHARE`` of its cores) is left out wherever a configuration has clean
ones; an original trial that was flagged is likewise left out. A configuration whose every
measurement was flagged keeps them, and the verdict says so (``Confirmed.interfered``).

The rule (``Verdict.of``):

- a configuration's confirmed value is the median of its measurements; one whose runs are
  mostly infeasible (below ``min_score``, or failed) cannot be the answer;
- the spread shown (``±6%``) is the median, over the confirmed configurations, of half their
  range relative to their median: the machine's run-to-run noise, measured in this round;
- the answer is the best confirmed median; every other configuration whose median is behind
  the best one's by no more than the spread (relatively) is **tied** with it within the
  measurement noise, and among tied configurations the better median score (higher accuracy,
  lower validation loss) wins, then the better median value: the study names them and says
  which rule picked. (Overlapping ranges are no test: with three runs one slow outlier makes a
  configuration 35% behind "tied".)
- a round whose spread is wider than ``NOISY_SPREAD`` cannot rank its leaders at all (with
  ±100% every leader is "tied", and the score would hand the answer to a slower one): its
  answer is the best median, and the study says the machine was too noisy and how to confirm
  again (``tie_break`` "noisy");
- the answer's ratio over a reference (its speed-up over the untuned baseline) is the ratio of
  the two medians of the round's own runs, measured side by side: the original trials are left
  out of it, because the leaders were chosen for a high original value (a winner's curse: ten
  seeds on the quickstart over-reported the speed-up by a median 9% when they counted).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Literal

import optuna
from optuna.trial import FrozenTrial

from autotune.study._queries import feasible_trials
from autotune.study._records import (
    REFERENCE_NAMES,
    ConfirmationRecord,
    ReferenceKind,
    StudyRecord,
    TrialRecord,
)


@dataclass(frozen=True)
class Confirmed:
    """One configuration's measurements in a confirmation round."""

    trial: int
    baseline: bool
    values: tuple[float, ...]  # of the runs that trained, the original first
    scores: tuple[float, ...]  # the validation scores of the same runs
    samples_per_second: tuple[float, ...]
    feasible_runs: int
    runs: int  # measurements taken, failed ones included
    interfered: bool = False  # every value was measured under interference
    # the values of the round's own runs (the original trial left out): the leaders were
    # chosen for their high original value, so the speed-up is read from these
    round_values: tuple[float, ...] = ()
    all_runs: int = 0  # every measurement of it, flagged and failed ones included
    checklist: bool = False  # the tuning checklist (a reference, which can be the answer)
    trial_feasible: bool = True  # its own trial met every requirement (min_score)

    @property
    def reference(self) -> ReferenceKind | None:
        """Which reference it is, if it is one."""
        return "baseline" if self.baseline else "checklist" if self.checklist else None

    @property
    def label(self) -> str:
        """Its trial number, and which reference it is: "0 (baseline)", "1 (checklist)"."""
        return f"{self.trial}" + (f" ({self.reference})" if self.reference else "")

    @property
    def round_median(self) -> float:
        """The median of the round's own runs; of every value when the round has none."""
        values = self.round_values or self.values
        return statistics.median(values) if values else float("nan")

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def median_score(self) -> float:
        return statistics.median(self.scores) if self.scores else float("nan")

    @property
    def median_samples_per_second(self) -> float:
        return statistics.median(self.samples_per_second) if self.samples_per_second else 0.0

    @property
    def low(self) -> float:
        return min(self.values) if self.values else float("nan")

    @property
    def high(self) -> float:
        return max(self.values) if self.values else float("nan")

    @property
    def eligible(self) -> bool:
        """Whether it can be the answer: its own trial was feasible (a reference's need not
        be: it is measured whatever it scored; the answer's trial is what ``best`` shows) and
        most of its measurements were."""
        return self.trial_feasible and self.feasible_runs * 2 > self.runs

    @property
    def relative_spread(self) -> float | None:
        """Half its range relative to its median; None with fewer than two values."""
        if len(self.values) < 2 or not self.median:
            return None
        return (self.high - self.low) / 2 / abs(self.median)


# a round whose run-to-run spread is wider than this (relative) cannot rank its leaders
NOISY_SPREAD = 0.25


@dataclass(frozen=True)
class Verdict:
    """What a confirmation round concludes (see the module's docstring for the rule)."""

    ranked: tuple[Confirmed, ...]  # eligible configurations, the answer first
    winner: Confirmed | None
    tied: tuple[Confirmed, ...]  # the others tied with the winner within the noise
    # which rule picked the winner among the tied: "score" or "value"; "noisy" when the round
    # was too noisy to rank the leaders and the best median was named
    tie_break: str
    baseline: Confirmed | None
    spread: float | None  # the typical relative spread (0.06 for ±6%)
    maximize: bool
    configurations: tuple[Confirmed, ...]  # every one measured, in the round's order
    checklist: Confirmed | None = None

    @property
    def speedup(self) -> float | None:
        """The answer's ratio over the untuned baseline (``ratio_over``)."""
        return self.ratio_over(self.baseline)

    def ratio_over(self, reference: Confirmed | None) -> float | None:
        """The answer's value over ``reference``'s, as "times better" (for a time to a target,
        the reference's time over the answer's), from the medians of the round's own runs: the
        leaders were picked for a high first measurement, which would inflate theirs (a
        reference was not), so the original trials are left out of this ratio."""
        if self.winner is None or reference is None or not reference.values:
            return None
        if not reference.round_median or not self.winner.round_median:
            return None
        ratio = self.winner.round_median / reference.round_median
        return ratio if self.maximize else 1 / ratio

    @classmethod
    def of(cls, record: ConfirmationRecord) -> Verdict:
        """The verdict on the measurements in ``record``."""
        confirmed = []
        for number in record.candidates:
            measured = [run for run in record.runs if run.trial == number]
            # measurements under interference count only where there are no clean ones
            clean = [run for run in measured if not run.interfered]
            runs = clean or measured
            # the values of feasible runs: a run below min_score (or short of the target)
            # is no measurement of an answer, and a failed one measured nothing
            trained = [run for run in runs if run.value is not None and run.feasible]
            confirmed.append(
                Confirmed(
                    trial=number,
                    baseline=number == record.baseline,
                    checklist=number == record.checklist,
                    trial_feasible=all(run.feasible for run in measured if run.repeat == 0),
                    values=tuple(run.value for run in trained if run.value is not None),
                    scores=tuple(r.score for r in trained if r.score is not None),
                    samples_per_second=tuple(
                        r.samples_per_second for r in trained if r.samples_per_second
                    ),
                    feasible_runs=sum(1 for run in runs if run.feasible),
                    runs=len(runs),
                    interfered=not clean and bool(measured),
                    round_values=tuple(
                        run.value for run in trained if run.value is not None and run.repeat > 0
                    ),
                    all_runs=len(measured),
                )
            )
        sign = 1.0 if record.maximize else -1.0
        eligible = sorted(
            (c for c in confirmed if c.eligible and c.values),
            key=lambda c: sign * c.median,
            reverse=True,
        )
        spreads = [s for c in confirmed if (s := c.relative_spread) is not None]
        spread = statistics.median(spreads) if spreads else None
        baseline = next((c for c in confirmed if c.baseline), None)
        checklist = next((c for c in confirmed if c.checklist), None)
        verdict = cls(
            (), None, (), "value", baseline, spread, record.maximize, tuple(confirmed), checklist
        )
        if not eligible:
            return verdict
        best = eligible[0]
        if spread is not None and spread > NOISY_SPREAD:
            return dataclasses.replace(
                verdict, ranked=tuple(eligible), winner=best, tie_break="noisy"
            )

        def within_noise(other: Confirmed) -> bool:
            behind = sign * (best.median - other.median) / abs(best.median or 1.0)
            return behind <= (spread or 0.0)

        tied_set = [best, *(c for c in eligible[1:] if within_noise(c))]
        # among the tied: the better median score first, then the better median value
        score_sign = 1.0 if record.higher_score_better else -1.0
        tied_set.sort(key=lambda c: (score_sign * c.median_score, sign * c.median), reverse=True)
        winner = tied_set[0]
        decided_by_score = len(tied_set) > 1 and (
            score_sign * winner.median_score > score_sign * tied_set[1].median_score
        )
        return dataclasses.replace(
            verdict,
            ranked=(winner, *(c for c in eligible if c is not winner)),
            winner=winner,
            tied=tuple(c for c in tied_set if c is not winner),
            tie_break="score" if decided_by_score else "value",
        )


@dataclass(frozen=True)
class Reference:
    """A configuration the round measured beside the answer, and the answer's ratio over it."""

    name: str  # as the answer's line names it: "the untuned baseline"
    number: int  # its trial
    median: float  # of its values in the round's own runs (all of them without such runs)
    runs: int  # the values behind that median
    ratio: float | None  # the answer's over it (``Verdict.ratio_over``); None: not measurable


# how far the confirmation round backs the answer: "confirmed" (complete, still about the
# study's current leaders, with a winner), else why not: no round, an unfinished one, one whose
# leaders trials since have changed, one where no configuration was feasible in most of its runs
RoundState = Literal["none", "unfinished", "stale", "no_winner", "confirmed"]


@dataclass(frozen=True)
class Answer:
    """The study's answer, computed once (``answer_of``): what the terminal, the dashboard
    note, the HTML report, ``autotune best`` and the exports state. The answer's own figures
    are None, empty or False unless the round confirms it; the round's, wherever it has one."""

    trial: FrozenTrial  # the round's winner when confirmed, else the best feasible trial
    round_state: RoundState = "none"
    median: float | None = None  # of its metric over its runs, its original trial included
    median_score: float | None = None
    median_samples_per_second: float | None = None
    runs: int = 0  # the runs behind its medians
    runs_side_by_side: int = 0  # the round's own runs behind its ratios (no original)
    tied: tuple[int, ...] = ()  # the trials tied with it within the round's noise
    tie_rule: str = "value"  # how it was named among them: "score", "value", "noisy"
    interfered: bool = False  # every run of it was measured under interference
    references: tuple[Reference, ...] = ()  # measured beside it: the baseline, the checklist
    repeats: int = 0  # the round's runs of each configuration, beyond its trial
    configurations: tuple[Confirmed, ...] = ()  # the round's, in its order
    spread: float | None = None  # the round's run-to-run spread (0.06: ±6%)
    flagged: int = 0  # the round's measurements taken under interference
    round_runs: int = 0  # the round's own runs, each measured again counted again
    cost_seconds: float = 0.0  # their wall-clock seconds
    search_share: float | None = None  # cost_seconds over every trial's wall-clock seconds

    @property
    def number(self) -> int:
        """The answer's trial number."""
        return self.trial.number

    @property
    def confirmed(self) -> bool:
        """Whether the confirmation round backs it."""
        return self.round_state == "confirmed"

    @property
    def noisy(self) -> bool:
        """The round was too noisy to rank the leaders: it is the best median."""
        return self.tie_rule == "noisy"

    @property
    def speedup(self) -> float | None:
        """Its ratio over the untuned baseline; None without one."""
        return self.ratio_over(REFERENCE_NAMES["baseline"])

    def ratio_over(self, name: str) -> float | None:
        """Its ratio over the reference ``name`` (``REFERENCE_NAMES``); None without one."""
        return next((r.ratio for r in self.references if r.name == name), None)

    @property
    def reference(self) -> str | None:
        """The reference the answer itself is ("the tuning checklist" when the checklist won
        the round), or None: an answer the study found."""
        winner = next((c for c in self.configurations if c.trial == self.number), None)
        if winner is None or not self.confirmed:
            return None
        return REFERENCE_NAMES[winner.reference] if winner.reference else None


def answer_of(study: optuna.Study) -> Answer | None:
    """The study's answer: the confirmation round's winner once the round is complete and still
    about the study's current leaders, else the best feasible trial; None while no trial is
    feasible, and for a study of several objectives (it has no one best)."""
    if len(study.directions) > 1:
        return None
    leaders = feasible_trials(study)
    record = StudyRecord.of(study).confirmation
    if not leaders or record is None:
        return Answer(leaders[0]) if leaders else None
    verdict = Verdict.of(record)
    trials = study.get_trials(deepcopy=False)
    own = [run for run in record.runs if run.repeat > 0]
    searched = sum(TrialRecord.of(t).wall_seconds or 0.0 for t in trials)
    cost = sum(run.wall_seconds for run in own)
    if not record.complete:
        state: RoundState = "unfinished"
    elif not {t.number for t in leaders[: record.top]} <= set(record.candidates):
        state = "stale"  # trials since have changed the leaders
    else:
        state = "confirmed" if verdict.winner is not None else "no_winner"
    best = Answer(
        leaders[0],
        state,
        repeats=record.repeats,
        configurations=verdict.configurations,
        spread=verdict.spread,
        flagged=sum(1 for run in record.runs if run.interfered),
        round_runs=len(own),
        cost_seconds=cost,
        search_share=cost / searched if searched else None,
    )
    winner = verdict.winner
    if not best.confirmed or winner is None:
        return best
    references = (
        (REFERENCE_NAMES["baseline"], verdict.baseline),
        (REFERENCE_NAMES["checklist"], verdict.checklist),
    )
    return dataclasses.replace(
        best,
        trial=next(t for t in trials if t.number == winner.trial),
        median=winner.median,
        median_score=winner.median_score,
        median_samples_per_second=winner.median_samples_per_second,
        runs=len(winner.values),
        runs_side_by_side=len(winner.round_values or winner.values),
        tied=tuple(c.trial for c in verdict.tied),
        tie_rule=verdict.tie_break,
        interfered=winner.interfered,
        references=tuple(
            Reference(
                name,
                measured.trial,
                measured.round_median,
                len(measured.round_values or measured.values),
                verdict.ratio_over(measured),
            )
            for name, measured in references
            if measured is not None and measured is not winner
        ),
    )


def answer_trial(study: optuna.Study) -> FrozenTrial | None:
    """The trial of the study's answer (``answer_of``); None while no trial is feasible."""
    answer = answer_of(study)
    return answer.trial if answer is not None else None
