"""The study's answer (``Answer``), computed once by ``answer_of``, which the terminal, the
dashboard note, the HTML report, ``autotune best`` and the exports render: the confirmation
round's winner (``_verdict.Verdict``), with its ratio over each reference measured beside it
(the untuned baseline, the tuning checklist), or else the best feasible trial.

The answer claims a ratio only where its interval excludes 1.0 and the round could rank its
leaders; else it says "no measurable speed-up on this machine as it was" and why
(``Reference.said``). Over a reference with the answer's own execution settings (the same
``config_key``: only the learning differs, the lr say) it claims the learning difference
alone: the ratio with the two samples/s taken out, which are the same settings' and differ
only by noise (a "1.31x" between two trials at accuracy 1.0 that differed in lr only was that
noise).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import optuna
from optuna.trial import FrozenTrial

from autotune.study._queries import feasible_trials
from autotune.study._records import REFERENCE_NAMES, StudyRecord, TrialRecord
from autotune.study._speed_plan import config_key
from autotune.study._verdict import Confirmed, Verdict


@dataclass(frozen=True)
class Reference:
    """A configuration the round measured beside the answer, and the answer's ratio over it:
    claimed where the round backs it, else ``why`` not (see the module's docstring)."""

    name: str  # as the answer's line names it: "the untuned baseline"
    number: int  # its trial
    median: float  # of its values in the round's own runs (all of them without such runs)
    runs: int  # the values behind that median
    ratio: float | None  # the answer's over it, claimed; None: no measurable speed-up
    interval: tuple[float, float] | None = None  # where the ratio may lie, from the spreads
    why: str | None = None  # why no ratio is claimed, in a few words
    learning_only: bool = False  # the answer's own execution settings: the ratio is learning's

    @property
    def said(self) -> str:
        """The answer over it, as every rendering says it: "2.05x the untuned baseline (1.91x
        to 2.20x)", or "over the untuned baseline, no measurable speed-up on ..." and why."""
        if self.ratio is None or self.interval is None:
            return f"over {self.name}, {NO_SPEEDUP} ({self.why})"
        learning = ", from learning alone: the same execution settings" * self.learning_only
        return f"{self.ratio:.2f}x {self.name} ({_between(*self.interval)}){learning}"


NO_SPEEDUP = "no measurable speed-up on this machine as it was"


def _between(low: float, high: float) -> str:
    return f"at least {low:.2f}x" if math.isinf(high) else f"{low:.2f}x to {high:.2f}x"


def _reference(verdict: Verdict, name: str, measured: Confirmed, same_settings: bool) -> Reference:
    """The answer (``verdict.winner``) against the reference ``measured``: the ratio it
    claims, or why it claims none; ``same_settings``: the two share their execution settings."""
    ratio, interval = verdict.ratio_over(measured), verdict.interval(measured)
    runs = len(measured.round_values or measured.values)
    found = Reference(
        name, measured.trial, measured.round_median, runs, None, interval, None, same_settings
    )
    if not measured.values:
        return dataclasses.replace(found, why="none of its runs in the round was feasible")
    if ratio is None or verdict.winner is None:
        return dataclasses.replace(found, why="the two were measured under different loads")
    if verdict.tie_break == "noisy":
        return dataclasses.replace(found, why=f"run-to-run spread ±{verdict.spread or 0:.0%}")
    if same_settings and interval is not None:  # samples/s alike but for noise: take them out
        ours, theirs = verdict.winner.median_samples_per_second, measured.median_samples_per_second
        learning = theirs / ours if ours and theirs else math.nan
        ratio, interval = ratio * learning, (interval[0] * learning, interval[1] * learning)
    if interval is None or math.isnan(ratio):
        return dataclasses.replace(found, why="no spread to bound the ratio")
    found = dataclasses.replace(found, interval=interval)
    if interval[0] <= 1.0 <= interval[1]:
        allow = f"the runs' spreads allow {_between(*interval)}"
        if same_settings:
            allow = f"the same execution settings: learning alone, {ratio:.2f}x; {allow}"
        return dataclasses.replace(found, why=allow)
    return dataclasses.replace(found, ratio=ratio)


def _same_settings(one: FrozenTrial, other: FrozenTrial) -> bool:
    """Whether two trials train with the same execution settings: stage 1 would time them as
    one (``config_key``) and they split the batch alike; only their learning sets them apart."""
    mine, theirs = TrialRecord.of(one).config, TrialRecord.of(other).config
    if mine is None or theirs is None:
        return False
    alike = mine.accumulation_steps == theirs.accumulation_steps
    return alike and config_key("", mine) == config_key("", theirs)


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
    alike: bool = True  # the round compared like with like (``Verdict.alike``)
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
    def headline(self) -> tuple[float | None, str]:
        """Its value as a person reads it first, and what it is: the round's median where the
        round confirmed it, else its trial's one measurement."""
        runs = self.runs
        if self.median is not None and runs:
            return self.median, f"median of {runs} confirmed run{'s' * (runs != 1)}"
        return self.trial.value, "one trial"

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
    numbered = {t.number: t for t in trials}
    return dataclasses.replace(
        best,
        trial=numbered[winner.trial],
        median=winner.median,
        median_score=winner.median_score,
        median_samples_per_second=winner.median_samples_per_second,
        runs=len(winner.values),
        runs_side_by_side=len(winner.round_values or winner.values),
        tied=tuple(c.trial for c in verdict.tied),
        tie_rule=verdict.tie_break,
        alike=verdict.alike,
        interfered=winner.interfered,
        references=tuple(
            _reference(
                verdict, name, measured, _same_settings(numbered[winner.trial], numbered[number])
            )
            for name, measured in references
            if measured is not None and (number := measured.trial) != winner.trial
        ),
    )


def answer_trial(study: optuna.Study) -> FrozenTrial | None:
    """The trial of the study's answer (``answer_of``); None while no trial is feasible."""
    answer = answer_of(study)
    return answer.trial if answer is not None else None
