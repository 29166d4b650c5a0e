"""What a confirmation round concludes (``Verdict``), from its measurements: each
configuration's (``Confirmed``), the round's ranking, its winner and its ratio over each
reference measured beside it. The study's answer (``_answer.Answer``) is read from it.

A measurement taken under interference (other processes took more than
``interference.INTERFERENCE_SHARE`` of its cores) is never compared with a clean one: the round
ranks its configurations on their clean runs where every one that can be the answer has one,
else on their flagged runs where every one has one (and says so: ``Confirmed.interfered``),
else it cannot rank them like for like (``Verdict.alike``) and counts as too noisy to rank.

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
  the two medians of the round's own runs, measured side by side and alike (clean with clean,
  flagged with flagged): the original trials are left out of it, because the leaders were
  chosen for a high original value (a winner's curse: ten seeds on the quickstart
  over-reported the speed-up by a median 9% when they counted);
- the ratio carries an interval from both sides' spreads (``Verdict.interval``): the better
  side's lowest run over the other's highest, and its highest over their lowest.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Literal

from autotune.study._records import ConfirmationRecord, ReferenceKind


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


def _compared(record: ConfirmationRecord) -> Literal["clean", "flagged", "mixed"]:
    """Which runs the round compares: the clean ones where every configuration that can be the
    answer (its own trial feasible) has a feasible clean run, else the flagged ones where every
    one has a flagged run, else none alike ("mixed")."""
    rankable = []
    for number in record.candidates:
        runs = [run for run in record.runs if run.trial == number]
        if all(run.feasible for run in runs if run.repeat == 0):
            rankable.append([run for run in runs if run.value is not None and run.feasible])
    rankable = [runs for runs in rankable if runs]
    if all(any(not run.interfered for run in runs) for runs in rankable):
        return "clean"
    if all(any(run.interfered for run in runs) for runs in rankable):
        return "flagged"
    return "mixed"


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
    # its configurations were compared alike (clean with clean, flagged with flagged); False:
    # some only on a quiet machine, others only under interference, and it could not rank them
    alike: bool = True

    @property
    def speedup(self) -> float | None:
        """The answer's ratio over the untuned baseline (``ratio_over``)."""
        return self.ratio_over(self.baseline)

    def ratio_over(self, reference: Confirmed | None) -> float | None:
        """The answer's value over ``reference``'s, as "times better" (for a time to a target,
        the reference's time over the answer's), from the medians of the round's own runs: the
        leaders were picked for a high first measurement, which would inflate theirs (a
        reference was not), so the original trials are left out of this ratio. None where the
        two were not measured alike (one on a quiet machine, the other under interference)."""
        if self.winner is None or reference is None or not reference.values:
            return None
        if not self.alike or reference.interfered != self.winner.interfered:
            return None
        if not reference.round_median or not self.winner.round_median:
            return None
        ratio = self.winner.round_median / reference.round_median
        return ratio if self.maximize else 1 / ratio

    def interval(self, reference: Confirmed | None) -> tuple[float, float] | None:
        """Where ``ratio_over(reference)`` may lie, from both sides' spreads: the better
        side's lowest run over the other's highest, and its highest over the other's lowest
        (a side of one run spreads as the round does); None without a ratio or a spread. The
        high end is infinite where the other side's low reaches 0."""
        if self.ratio_over(reference) is None or reference is None or self.winner is None:
            return None
        ours, theirs = (self.winner, reference) if self.maximize else (reference, self.winner)
        top, bottom = self._range(ours), self._range(theirs)
        if top is None or bottom is None:
            return None
        low = max(0.0, top[0] / bottom[1])
        return low, top[1] / bottom[0] if bottom[0] > 0 else math.inf

    def _range(self, side: Confirmed) -> tuple[float, float] | None:
        """The lowest and highest of the round's own runs of ``side`` (the spread of the
        round about its median, for one run; None where the round has no spread)."""
        values = side.round_values or side.values
        if len(values) > 1:
            return min(values), max(values)
        if self.spread is None:
            return None
        return side.round_median * (1 - self.spread), side.round_median * (1 + self.spread)

    @classmethod
    def of(cls, record: ConfirmationRecord) -> Verdict:
        """The verdict on the measurements in ``record``."""
        compared = _compared(record)
        confirmed = []
        for number in record.candidates:
            measured = [run for run in record.runs if run.trial == number]
            clean = [run for run in measured if not run.interfered]
            flagged = [run for run in measured if run.interfered]
            runs = flagged if compared == "flagged" and flagged else clean or measured
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
                    # every run that trained, feasible or not: the score it really reaches
                    scores=tuple(r.score for r in runs if r.value is not None and r.score),
                    samples_per_second=tuple(
                        r.samples_per_second for r in trained if r.samples_per_second
                    ),
                    feasible_runs=sum(1 for run in runs if run.feasible),
                    runs=len(runs),
                    interfered=bool(runs) and all(run.interfered for run in runs),
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
            (), None, (), "value", baseline, spread, record.maximize, tuple(confirmed), checklist,
            alike=compared != "mixed",
        )  # fmt: skip
        if not eligible:
            return verdict
        best = eligible[0]
        if not verdict.alike or (spread is not None and spread > NOISY_SPREAD):
            return dataclasses.replace(
                verdict, ranked=tuple(eligible), winner=best, tie_break="noisy"
            )

        def within_noise(other: Confirmed) -> bool:
            """Its median within the round's spread of the best's, and, side by side, not
            measurably behind it: its best run of the round reaches the best's worst (else
            the ratio between them, ``interval``, lies wholly on one side of 1)."""
            behind = sign * (best.median - other.median) / abs(best.median or 1.0)
            if behind > (spread or 0.0):
                return False
            mine, theirs = verdict._range(other), verdict._range(best)
            if mine is None or theirs is None:
                return True
            return mine[1] >= theirs[0] if record.maximize else mine[0] <= theirs[1]

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
