"""The study's answer (``Answer``), computed once by ``answer_of``, which the terminal, the
dashboard note, the HTML report, ``autotune best`` and the exports render: the confirmation
round's winner, its medians, the round's spread and ties, and its ratio over each reference
measured beside it (the untuned baseline, the tuning checklist), or else the best feasible
trial.

The rule (``Answer.of_round``):

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
- a round is quiet, or too noisy to rank its leaders (``Answer.noise``, the one rule): too
  noisy where its spread is wider than ``NOISY_SPREAD`` (with ±100% every leader is "tied", and
  the score would hand the answer to a slower one: "wide"), or where the load varied (the runs
  it compares were not measured alike, or others' share of the cores in them spans more than
  ``INTERFERENCE_SHARE``: ``loads_alike``, "varied"); a noisy round's answer is the best
  median, and the study says why and how to confirm again (``tie_rule`` "noisy");
- the answer's ratio over a reference (its speed-up over the untuned baseline) is the ratio of
  the two medians of the round's own runs, measured side by side and alike (clean with clean,
  flagged with flagged): the original trials are left out of it, because the leaders were
  chosen for a high original value (a winner's curse: ten seeds on the quickstart
  over-reported the speed-up by a median 9% when they counted);
- a ratio needs ``CONFIRMED_RUNS`` feasible runs of the round's own on each side (``_too_few``;
  a confirmed median may count its trial's own measurement, a ratio never does): a side of one
  run is one measurement, and its spread is unknown (a "1.40x the tuning checklist (1.30x to
  1.50x)" rested on one run of the answer, its other run below the bar, spread by the round's
  ±5%: measured again, 1.05x). Short of them, no ratio, and why ("it has 1 feasible run in the
  round");
- the ratio carries an interval from both sides' runs (``Answer.interval``): the better side's
  low over the other's high, and its high over their low, where a side's low and high are its
  runs' lowest and highest, widened to the round's spread about their median where they lie
  closer (``_bounds``). Two runs are a poor measure of a side's spread: its median lies between
  them with probability 1/2. On a VM whose speed drifts 30% within a minute, two runs of the
  tuning checklist fell 2% apart in a round whose configurations spread ±8%: their interval
  claimed "1.04x (1.01x to 1.07x)" where measuring again found 0.87x; with the round's spread,
  0.88x to 1.23x: tied, no gain claimed. The round's spread, taken over every configuration's
  runs (their trials' own, measured earlier, among them), is the better measure of one run's
  noise: where every run varies alike (four configurations, three runs each, simulated), two
  runs a side's extremes hold the true ratio 2 times in 3, widened 9 times in 10. (Each answer
  run over the reference run nearest it in time would not widen it: every such ratio lies
  between the lowest over the highest and the highest over the lowest.)

The answer claims a ratio where its interval excludes 1.0: runs that separate by more than the
round's spread are a measured speed-up, even in a round too noisy to rank its leaders; where
the interval includes 1.0 the two are tied in a quiet round (the same within the round's
spread: a quiet round's 0.98x-1.03x is no noise to blame) and "too noisy to quote a ratio" in
a noisy one, with what the runs allow (``Reference.said``); between runs under unlike loads
(``loads_alike``) it claims none and says both loads. Over a reference with the answer's own
execution settings (the same ``config_key``: only the learning differs, the lr say) the ratio
is learning's alone (``LEARNING_ALONE``): the two samples/s are the same settings' and differ
only by noise, so the ratio is taken with that difference out (a "1.31x" between two trials
at accuracy 1.0 that differed in lr only was that noise).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import optuna
from optuna.trial import FrozenTrial

from autotune.storage._queries import feasible_trials
from autotune.storage._records import (
    REFERENCE_NAMES,
    ConfirmationRecord,
    ReferenceKind,
    StudyRecord,
    TrialRecord,
)
from autotune.study._confirmed import (
    CONFIRMED_RUNS,
    NOISY_SPREAD,
    Confirmed,
    compared_runs,
    loads_alike,
)
from autotune.study._reference import (
    Reference,
    failed_reference,
    measured_ratio,
    ratio_interval,
    same_settings,
    too_few,
    unlike_loads,
)

# how far the confirmation round backs the answer: "confirmed" (complete, still about the
# study's current leaders, with a winner), else why not: no round, an unfinished one, one whose
# leaders trials since have changed, one where no configuration was feasible in most of its
# runs, one that compared too few runs of its best median (``CONFIRMED_RUNS``: unlike loads)
# ("alone": one configuration to measure, nothing to compare it with: no round ran)
RoundState = Literal["none", "unfinished", "stale", "no_winner", "few_runs", "alone", "confirmed"]
# how noisy a round was (``Answer.noise``): quiet, its runs' spread too wide to rank, or the
# load varied across the runs it compares
Noise = Literal["quiet", "wide", "varied"]
# why an answer is not confirmed, by its round's state: the words every rendering says it in
UNCONFIRMED: dict[str, str] = {
    "none": "one measurement",
    "unfinished": "the round is unfinished",
    "stale": "trials since have changed the leaders",
    "no_winner": "no configuration was feasible in most of its runs",
    "alone": "no other configuration was feasible or tried: the round had nothing to "
    "compare it with",
    "few_runs": f"the round compared fewer than {CONFIRMED_RUNS} runs of its best median "
    "(its other runs were measured under unlike loads)",
    # the study's answer is confirmed, this trial is not: not one of the leaders it measured
    "confirmed": "the round ranked only its leaders that met the bar in most of their runs, "
    f"with {CONFIRMED_RUNS} runs compared at least",
}


@dataclass(frozen=True)
class Answer:
    """The study's answer (``answer_of``). Its own figures (``winner``, ties, references) are
    None, empty or False unless the round confirms it; the round's, wherever it has one."""

    trial: FrozenTrial  # the round's winner when confirmed, else the best feasible trial
    round_state: RoundState = "none"
    winner: Confirmed | None = None  # its measurements in the round, when it confirms it
    tied: tuple[int, ...] = ()  # the trials tied with it within the round's noise
    tie_rule: str = "value"  # how it was named among them: "score", "value", "noisy"
    # the round compared like with like (clean with clean, flagged with flagged); False: some
    # only on a quiet machine, others only under interference, and it could not rank them
    alike: bool = True
    references: tuple[Reference, ...] = ()  # measured beside it: the baseline, the checklist
    repeats: int = 0  # the round's runs of each configuration, beyond its trial
    configurations: tuple[Confirmed, ...] = ()  # the round's, in its order
    spread: float | None = None  # the round's run-to-run spread (0.06: ±6%)
    maximize: bool = True  # the study's direction
    flagged: int = 0  # the round's measurements taken under interference
    flagged_originals: int = 0  # of them, trials' own (repeat 0), which the round never retakes
    search_load: tuple[float, float] | None = None  # others' share in its flagged originals
    retakes: int = 0  # the round's runs measured again (the machine busy the first time)
    round_runs: int = 0  # the round's own runs, each measured again counted again
    cost_seconds: float = 0.0  # their wall-clock seconds
    search_share: float | None = None  # cost_seconds over every trial's wall-clock seconds
    searched: bool = True  # the study tried a configuration besides the references

    @property
    def number(self) -> int:
        return self.trial.number

    @property
    def median(self) -> float | None:
        """The median of its metric over its runs, its original trial included."""
        return self.winner.median if self.winner is not None else None

    @property
    def runs(self) -> int:  # behind its medians
        return len(self.winner.values) if self.winner is not None else 0

    @property
    def interfered(self) -> bool:  # every run of it was measured under interference
        return self.winner is not None and self.winner.interfered

    @property
    def headline(self) -> tuple[float | None, str]:
        """Its value as a person reads it first, and what it is: the round's median where the
        round confirmed it, else its trial's one measurement."""
        return headline(self.median, self.runs, self.trial.value)

    @property
    def confirmed(self) -> bool:
        return self.round_state == "confirmed"

    @property
    def noisy(self) -> bool:
        """The round was too noisy to rank the leaders: it is the best median."""
        return self.tie_rule == "noisy"

    @property
    def load(self) -> tuple[float, float] | None:
        """The lowest and highest share of the cores other processes took in the runs the
        round compares; None where none was measured (a GPU's)."""
        return _span(share for found in self.configurations for share in found.loads)

    @property
    def noise(self) -> Noise:
        """The one rule for how noisy the round was: "varied" where the runs it compares were
        not measured alike or under like loads (``loads_alike``), "wide" where its spread is
        over ``NOISY_SPREAD``, else "quiet" (the module's docstring)."""
        if not self.alike or not loads_alike(self.load or ()):
            return "varied"
        if self.spread is not None and self.spread > NOISY_SPREAD:
            return "wide"
        return "quiet"

    @property
    def speedup(self) -> float | None:
        """Its ratio over the untuned baseline, claimed; None without one."""
        return self.ratio_over(REFERENCE_NAMES["baseline"])

    def over(self, name: str) -> Reference | None:
        """The reference ``name`` (``REFERENCE_NAMES``) measured beside it; None without."""
        return next((r for r in self.references if r.name == name), None)

    def ratio_over(self, name: str) -> float | None:
        """Its ratio over the reference ``name``, claimed; None without one."""
        found = self.over(name)
        return found.ratio if found is not None else None

    @property
    def reference(self) -> str | None:
        """The reference the answer itself is ("the tuning checklist" when the checklist won
        the round), or None: an answer the study found."""
        kind = self.winner.reference if self.winner is not None else None
        return REFERENCE_NAMES[kind] if kind else None

    def tied_with(self, found: Confirmed) -> bool:
        """Whether the round could not tell ``found`` from the answer: one of its ties, or a
        reference it is tied with (``Reference.tied``)."""
        if found.trial in self.tied:
            return True
        reference = self.over(REFERENCE_NAMES[found.reference]) if found.reference else None
        return reference is not None and reference.tied

    def configuration(self, number: int) -> Confirmed | None:
        """Trial ``number``'s measurements in the round; None where it has none."""
        return next((c for c in self.configurations if c.trial == number), None)

    def configuration_of(self, kind: ReferenceKind) -> Confirmed | None:
        """The reference ``kind``'s measurements in the round; None where it has none."""
        return next((c for c in self.configurations if c.reference == kind), None)

    def measured_ratio(self, reference: Confirmed | None) -> float | None:
        """The winner's value over ``reference``'s as "times better" (``measured_ratio``)."""
        if self.winner is None or reference is None:
            return None
        return measured_ratio(self.winner, reference, self.maximize, self.alike)

    def interval(self, reference: Confirmed | None) -> tuple[float, float] | None:
        """Where ``measured_ratio(reference)`` may lie (``ratio_interval``); None without one."""
        if self.measured_ratio(reference) is None or reference is None or self.winner is None:
            return None
        return ratio_interval(self.winner, reference, self.maximize, self.spread or 0.0)

    def _range(self, side: Confirmed) -> tuple[float, float] | None:
        """The lowest and highest of the round's own runs of ``side``, for the tie rule (for
        one run, the round's spread about it; None where the round has none)."""
        values = side.round_values or side.values
        if len(values) > 1:
            return min(values), max(values)
        if self.spread is None:
            return None
        return side.round_median * (1 - self.spread), side.round_median * (1 + self.spread)

    @classmethod
    def of_round(cls, record: ConfirmationRecord, trial: FrozenTrial) -> Answer:
        """What the round in ``record`` concludes (the rule: the module's docstring), as an
        answer whose state is the round's alone ("confirmed", "no_winner" or "unfinished"):
        ``trial`` stands for its trial, the references and ``search_share`` are left to
        ``answer_of``, which knows the study."""
        compared = compared_runs(record)
        configurations = tuple(Confirmed.of(record, n, compared) for n in record.candidates)
        own = [run for run in record.runs if run.repeat > 0]
        originals = [run for run in record.runs if run.interfered and not run.repeat]
        spreads = [s for c in configurations if (s := c.relative_spread) is not None]
        answer = cls(
            trial,
            "confirmed" if record.complete else "unfinished",
            alike=compared != "mixed",
            repeats=record.repeats,
            configurations=configurations,
            spread=statistics.median(spreads) if spreads else None,
            maximize=record.maximize,
            flagged=sum(1 for run in record.runs if run.interfered),
            flagged_originals=len(originals),
            search_load=_span(run.other_cpu_share or 0.0 for run in originals),
            retakes=sum(c.retakes for c in configurations),
            round_runs=len(own),
            cost_seconds=sum(run.wall_seconds for run in own),
        )
        sign = 1.0 if record.maximize else -1.0
        eligible = sorted(
            (c for c in configurations if c.eligible and c.values),
            key=lambda c: sign * c.median,
            reverse=True,
        )
        if record.repeats == 0:  # a lone configuration: no round ran (``confirmation_plan``)
            return dataclasses.replace(answer, round_state="alone")
        if not eligible or not eligible[0].confirmable:
            state: RoundState = "few_runs" if eligible else "no_winner"
            state = state if record.complete else "unfinished"
            return dataclasses.replace(answer, round_state=state)
        best = eligible[0]
        if answer.noise != "quiet":
            return dataclasses.replace(answer, winner=best, tie_rule="noisy")
        answer = dataclasses.replace(answer, winner=best)
        tied = [best, *(c for c in eligible[1:] if c.confirmable and answer._within_noise(c))]
        # among the tied: the better median score first, then the better median value
        score_sign = 1.0 if record.higher_score_better else -1.0
        tied.sort(key=lambda c: (score_sign * c.median_score, sign * c.median), reverse=True)
        winner = tied[0]
        by_score = len(tied) > 1 and (
            score_sign * winner.median_score > score_sign * tied[1].median_score
        )
        return dataclasses.replace(
            answer,
            winner=winner,
            tied=tuple(c.trial for c in tied if c is not winner),
            tie_rule="score" if by_score else "value",
        )

    def _within_noise(self, other: Confirmed) -> bool:
        """Whether ``other`` is tied with the best (``winner``): its median within the round's
        spread of the best's, and its best run of the round reaching the best's worst."""
        best, sign = self.winner, 1.0 if self.maximize else -1.0
        assert best is not None
        behind = sign * (best.median - other.median) / abs(best.median or 1.0)
        if behind > (self.spread or 0.0):
            return False
        mine, theirs = self._range(other), self._range(best)
        if mine is None or theirs is None:
            return True
        return mine[1] >= theirs[0] if self.maximize else mine[0] <= theirs[1]

    def _reference(self, name: str, measured: Confirmed, same: bool) -> Reference:
        """The answer against the reference ``measured`` (``same``: the two share their
        execution settings)."""
        ratio, interval = self.measured_ratio(measured), self.interval(measured)
        runs = len(measured.round_values or measured.values)
        found = Reference(
            name, measured.trial, measured.round_median, runs, None, interval, None, same
        )
        if not measured.values:
            why = "none of its runs in the round reached the bar"
            return dataclasses.replace(found, why=why, infeasible=True)
        winner = self.winner
        assert winner is not None  # (``answer_of`` asks this of a confirmed answer only)
        if (short := too_few(winner, measured)) is not None:
            return dataclasses.replace(found, why=short)
        if ratio is None:
            return dataclasses.replace(found, why=unlike_loads(winner, measured))
        if same and interval is not None:  # samples/s alike but for noise: out
            ours = winner.median_samples_per_second
            theirs = measured.median_samples_per_second
            learning = theirs / ours if ours and theirs else math.nan
            ratio, interval = ratio * learning, (interval[0] * learning, interval[1] * learning)
        if interval is None or math.isnan(ratio):
            return dataclasses.replace(found, interval=None, why="no spread to bound the ratio")
        found = dataclasses.replace(found, interval=interval)
        if interval[0] <= 1.0 <= interval[1]:  # the runs overlap: tied, or too noisy to say
            return dataclasses.replace(found, tied=self.noise == "quiet")
        return dataclasses.replace(found, ratio=ratio)


def _span(values: Iterable[float]) -> tuple[float, float] | None:
    """The lowest and highest of ``values``; None where there are none."""
    found = list(values)
    return (min(found), max(found)) if found else None


def headline(median: float | None, runs: int, value: float | None) -> tuple[float | None, str]:
    """A value as a person reads it first, and what it is: the ``median`` of ``runs``
    confirmed runs, else its trial's one measurement ``value`` ("one measurement", as
    ``UNCONFIRMED`` says it)."""
    if median is not None and runs:
        return median, f"median of {runs} confirmed run{'s' * (runs != 1)}"
    return value, UNCONFIRMED["none"]


def listed(words: Iterable[str]) -> str:
    """ "a", "a and b", "a, b and c": in the order given."""
    *rest, last = words
    return f"{', '.join(rest)} and {last}" if rest else last


def trials_named(numbers: Iterable[int]) -> str:
    """ "trial 3", "trials 3 and 5", "trials 1, 3 and 5": in the order given."""
    numbers = list(numbers)
    return f"trial{'s' * (len(numbers) > 1)} {listed(map(str, numbers))}"


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
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    searched = sum(TrialRecord.of(t).wall_seconds or 0.0 for t in trials.values())
    best = Answer.of_round(record, leaders[0])
    share = best.cost_seconds / searched if searched else None
    tried = any(TrialRecord.of(t).reference is None for t in trials.values())
    best = dataclasses.replace(best, search_share=share, searched=tried)
    if record.complete and not {t.number for t in leaders[: record.top]} <= set(record.candidates):
        best = dataclasses.replace(best, round_state="stale")  # trials since changed them
    winner = best.winner
    if not best.confirmed or winner is None:
        return dataclasses.replace(best, winner=None, tied=(), tie_rule="value")
    references = []
    for kind, name in REFERENCE_NAMES.items():
        measured = best.configuration_of(kind)
        if measured is not None and measured.trial != winner.trial:
            same = same_settings(trials[winner.trial], trials[measured.trial])
            references.append(best._reference(name, measured, same))
        elif measured is None and (failed := failed_reference(trials.values(), kind)) is not None:
            references.append(failed)
    return dataclasses.replace(best, trial=trials[winner.trial], references=tuple(references))


def answer_trial(study: optuna.Study) -> FrozenTrial | None:
    """The trial of the study's answer (``answer_of``); None while no trial is feasible."""
    answer = answer_of(study)
    return answer.trial if answer is not None else None
