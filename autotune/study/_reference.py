"""A reference measured beside the study's answer (the untuned baseline, the tuning checklist)
and the answer's ratio over it, as every rendering says it (``Reference.said``), with the
reasons a ratio is not claimed in their words, and the ratio's arithmetic: the two sides'
medians of the round's own runs and where their ratio may lie. When a ratio is claimed is
``_answer``'s (its module docstring).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial

from autotune.stage1._plan import config_key
from autotune.storage._records import REFERENCE_NAMES, ReferenceKind, TrialRecord
from autotune.study._confirmed import CONFIRMED_RUNS, Confirmed, loads_alike, loads_said


@dataclass(frozen=True)
class Reference:
    """A configuration the round measured beside the answer, and the answer's ratio over it:
    claimed where the round backs it, else ``why`` not (``_answer``'s module docstring)."""

    name: str  # as the answer's line names it: "the untuned baseline"
    number: int  # its trial
    median: float  # of its values in the round's own runs (all of them without such runs)
    runs: int  # the values behind that median
    ratio: float | None  # the answer's over it, claimed; None: too noisy, or why not
    interval: tuple[float, float] | None = None  # where the ratio may lie, from the runs
    why: str | None = None  # why no interval bounds a ratio, in a few words
    learning_only: bool = False  # the answer's own execution settings: the ratio is learning's
    infeasible: bool = False  # none of its runs in the round met the study's bar
    tied: bool = False  # no ratio, in a quiet round: the two are the same within its spread

    @property
    def said(self) -> str:
        """The answer over it, as every rendering says it: "2.05x the untuned baseline (1.91x
        to 2.20x)", "tied with the untuned baseline, the same within the round's spread (the
        runs' spreads allow 0.98x to 1.03x)" (a quiet round), "over the untuned baseline, too
        noisy to quote a ratio (the runs' spreads allow 0.88x to 1.17x)", or why no ratio."""
        if self.infeasible:
            return f"over {self.name}, no ratio: none of its runs in the round reached the bar"
        if self.interval is None:
            return f"over {self.name}, no ratio: {self.why}"
        learning = f"; {LEARNING_ALONE}" * self.learning_only
        if self.ratio is None:
            allow = f"the runs' spreads allow {_between(*self.interval)}"
            tied = f"tied with {self.name}, the same within the round's spread"
            verdict = tied if self.tied else f"over {self.name}, too noisy to quote a ratio"
            return f"{verdict} ({allow}{learning})"
        return f"{self.ratio:.2f}x {self.name} ({_between(*self.interval)}{learning})"


# what a ratio over a reference with the answer's own execution settings is, as every
# rendering says it: the two samples/s differ by noise only, so the ratio leaves them out
LEARNING_ALONE = (
    "learning alone: the same execution settings, their samples/s difference left out as noise"
)


def _between(low: float, high: float) -> str:
    """ "1.91x to 2.20x", "at least 1.20x", or "any ratio" (a spread of ±100% or more)."""
    if math.isinf(high):
        return f"at least {low:.2f}x" if low > 0 else "any ratio"
    return f"{low:.2f}x to {high:.2f}x"


def few_runs(who: str, runs: int) -> str:
    """Why no ratio where one side has fewer than ``CONFIRMED_RUNS`` feasible runs of the
    round's own (``who``: "the answer", or "it": the reference): "it has 1 feasible run in the
    round (2 needed)" (its other runs fell below the bar, failed, or were measured under
    unlike loads)."""
    count = f"{runs} feasible run{'s' * (runs != 1)}" if runs else "no feasible run"
    return f"{who} has {count} in the round ({CONFIRMED_RUNS} needed)"


def unlike_loads(answer: Confirmed | None, reference: Confirmed) -> str:
    """Why no ratio of the ``answer``'s runs over the ``reference``'s: the loads differed,
    with others' share of the cores in each where both were measured."""
    why = "the two were measured under different loads"
    if answer is None or not answer.loads or not reference.loads:
        return why
    mine, theirs = loads_said(answer.loads), loads_said(reference.loads)
    return f"{why} (others took {mine} of the cores in the answer's runs, {theirs} in its)"


def same_settings(one: FrozenTrial, other: FrozenTrial) -> bool:
    """Whether two trials train with the same execution settings: stage 1 would time them as
    one (``config_key``) and they split the batch alike; only their learning sets them apart."""
    mine, theirs = TrialRecord.of(one).config, TrialRecord.of(other).config
    if mine is None or theirs is None:
        return False
    alike = mine.accumulation_steps == theirs.accumulation_steps
    return alike and config_key("", mine) == config_key("", theirs)


def failed_reference(trials: Iterable[FrozenTrial], kind: ReferenceKind) -> Reference | None:
    """The reference ``kind`` where its trial did not complete (the user's model raised at
    its batch), as the answer says it: no ratio, and its error; None where it has none."""
    for trial in trials:
        record = TrialRecord.of(trial)
        ended = trial.state in (optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
        if record.reference == kind and ended:  # (one running elsewhere has not failed)
            why = f"it failed ({record.fail_msg})" if record.fail_msg else "it did not complete"
            return Reference(REFERENCE_NAMES[kind], trial.number, math.nan, 0, None, why=why)
    return None


def measured_ratio(
    winner: Confirmed, reference: Confirmed, maximize: bool, alike: bool
) -> float | None:
    """The winner's value over ``reference``'s, as "times better" (for a time to a target,
    the reference's time over the winner's), from the round's own runs (``_answer``'s
    docstring); None where a side has too few of them (``too_few``), or the two were not
    measured alike (``alike``: the round compared like runs), or under unlike loads."""
    if too_few(winner, reference) is not None:
        return None
    if not alike or reference.interfered != winner.interfered:
        return None
    if not _alike_sides(winner, reference):
        return None
    if not reference.round_median or not winner.round_median:
        return None
    ratio = winner.round_median / reference.round_median
    return ratio if maximize else 1 / ratio


def ratio_interval(
    winner: Confirmed, reference: Confirmed, maximize: bool, spread: float
) -> tuple[float, float]:
    """Where the ratio of ``winner`` over ``reference`` may lie: the better side's low over the
    other's high, and its high over their low, each side's range at least the round's
    ``spread`` about its median (``_bounds``). The high end is infinite where the other side's
    low reaches 0."""
    ours, theirs = (winner, reference) if maximize else (reference, winner)
    top, bottom = _bounds(ours, spread), _bounds(theirs, spread)
    low = max(0.0, top[0] / bottom[1])
    return low, top[1] / bottom[0] if bottom[0] > 0 else math.inf


def _bounds(side: Confirmed, spread: float) -> tuple[float, float]:
    """Where ``side``'s value may lie, from the round's own runs of it: their lowest and
    highest, widened to the round's ``spread`` about their median where they lie closer."""
    values, middle = side.round_values, side.round_median
    return min(*values, middle * (1 - spread)), max(*values, middle * (1 + spread))


def too_few(winner: Confirmed, reference: Confirmed) -> str | None:
    """Why no ratio of ``winner`` over ``reference`` where either has fewer than
    ``CONFIRMED_RUNS`` feasible runs of the round's own, compared (``_answer``'s docstring);
    None where both have enough."""
    for who, side in (("the answer", winner), ("it", reference)):
        if len(side.round_values) < CONFIRMED_RUNS:
            return few_runs(who, len(side.round_values))
    return None


def _alike_sides(one: Confirmed, other: Confirmed) -> bool:
    """Whether two configurations' runs were taken under like loads: their median loads
    (``loads_alike``). Interleaved, both meet whatever the machine does meanwhile; a drift in
    the load that falls on one side alone sets their medians apart."""
    if not one.loads or not other.loads:
        return True
    return loads_alike((statistics.median(one.loads), statistics.median(other.loads)))
