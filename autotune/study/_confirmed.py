"""One configuration's runs in a confirmation round (``Confirmed``), and which of the round's
runs are compared (``compared_runs``).

A measurement taken under interference (other processes took more than
``interference.INTERFERENCE_SHARE`` of its cores) is never compared with a clean one: the round
ranks its configurations on their clean runs where every one that can be the answer has a clean
run of the round's own (its trial's own alone is one measurement, not side by side), else on
the round's own flagged runs where every one has one (and says so:
``Confirmed.interfered``), else it cannot rank them like for like (``Answer.alike``) and counts
as too noisy to rank. A trial's own measurement under interference is never compared with the
round's: the search took it at another time under another load, not side by side (on a busy
2-core VM the search ran at 69-76% of the cores taken by others, the round at 78-86%, and the
trials' own figures sat above their round's runs in 10 of 12 rows). Each compared run's load
(others' share of its cores) is kept (``Confirmed.loads``): the answer says when it varied.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from autotune.machine.interference import INTERFERENCE_SHARE, interfered
from autotune.storage._records import ConfirmationRecord, ConfirmRun, ReferenceKind

# the fewest compared runs a confirmed median counts: one run is one measurement, whatever
# the round took (a round resumed under another load compared 1 of its 3 runs)
CONFIRMED_RUNS = 2


@dataclass(frozen=True)
class Confirmed:
    """One configuration's measurements in a confirmation round."""

    trial: int
    reference: ReferenceKind | None  # the untuned baseline or the tuning checklist (it can win)
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
    retakes: int = 0  # of all_runs, runs measured again (their first was under interference)
    trial_feasible: bool = True  # its own trial met every requirement (min_score)
    loads: tuple[float, ...] = ()  # others' share of the cores in the runs behind ``values``

    @property
    def label(self) -> str:  # "0 (baseline)", "1 (checklist)", "3"
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
    def confirmable(self) -> bool:
        """Whether its median is confirmed: eligible, and counting ``CONFIRMED_RUNS`` compared
        runs at least (the best median of one run leaves the round unconfirmed)."""
        return self.eligible and len(self.values) >= CONFIRMED_RUNS

    @property
    def relative_spread(self) -> float | None:
        """Half its range relative to its median; None with fewer than two values."""
        if len(self.values) < 2 or not self.median:
            return None
        return (self.high - self.low) / 2 / abs(self.median)

    @classmethod
    def of(cls, record: ConfirmationRecord, number: int, compared: str) -> Confirmed:
        """Trial ``number``'s measurements in ``record``, on the runs the round compares."""
        measured = [run for run in record.runs if run.trial == number]
        busy = [run for run in measured if run.interfered and run.repeat]  # side by side
        clean = [run for run in measured if not run.interfered]
        runs = busy if compared == "flagged" and busy else clean or measured
        trained = _trained(runs)
        references: dict[int | None, ReferenceKind] = {
            record.baseline: "baseline",
            record.checklist: "checklist",
        }
        return cls(
            trial=number,
            reference=references.get(number),
            trial_feasible=_own_trial_feasible(measured),
            values=_values(trained),
            # every run that trained, feasible or not: the score it really reaches
            scores=tuple(r.score for r in runs if r.value is not None and r.score),
            samples_per_second=tuple(
                r.samples_per_second for r in trained if r.samples_per_second
            ),
            feasible_runs=sum(1 for run in runs if run.feasible),
            runs=len(runs),
            interfered=bool(runs) and all(run.interfered for run in runs),
            round_values=_values([run for run in trained if run.repeat > 0]),
            all_runs=len(measured),
            retakes=len(measured) - len({run.repeat for run in measured}),
            loads=tuple(r.other_cpu_share for r in trained if r.other_cpu_share is not None),
        )


def _values(runs: list[ConfirmRun]) -> tuple[float, ...]:
    return tuple(run.value for run in runs if run.value is not None)


def _own_trial_feasible(runs: list[ConfirmRun]) -> bool:
    """Whether the configuration's own trial (its round's repeat 0) met every requirement."""
    return all(run.feasible for run in runs if run.repeat == 0)


def _trained(runs: list[ConfirmRun]) -> list[ConfirmRun]:
    """The feasible runs: a run below min_score (or short of the target) is no measurement of
    an answer, and a failed one measured nothing."""
    return [run for run in runs if run.value is not None and run.feasible]


def compared_runs(record: ConfirmationRecord) -> Literal["clean", "flagged", "mixed"]:
    """Which runs the round compares: the clean ones where every configuration that can be the
    answer (its own trial feasible, a run of the round feasible) has a feasible clean run of
    the round, else the round's own flagged ones (never a trial's: the search's load was
    another) where every one has one, else none alike ("mixed"). A trial's own clean
    measurement is not enough: a round whose runs were all flagged after a quiet search
    compared the trials' own alone, one measurement each, and confirmed nothing."""
    measured = ([run for run in record.runs if run.trial == n] for n in record.candidates)
    trained = [_trained(runs) for runs in measured if _own_trial_feasible(runs)]
    rankable = [own for runs in trained if (own := [run for run in runs if run.repeat])]
    if not rankable:  # no run of the round yet (or none: a lone configuration's)
        rankable = [runs for runs in trained if runs]
    if all(any(not run.interfered for run in runs) for runs in rankable):
        return "clean"
    if all(any(run.interfered and run.repeat for run in runs) for runs in rankable):
        return "flagged"
    return "mixed"


# a round whose run-to-run spread is wider than this (relative) cannot rank its leaders
NOISY_SPREAD = 0.25


# shares that differ by INTERFERENCE_SHARE exactly compare as alike: 0.65 - 0.5 is
# 0.15000000000000002 in floating point
LOADS_TOLERANCE = 1e-9


def loads_alike(shares: Iterable[float | None]) -> bool:
    """Whether measurements were taken under like loads: others' share of the cores in each
    (None: not measured, left out) on one side of ``INTERFERENCE_SHARE`` (all quiet, or all
    flagged) and no more than ``INTERFERENCE_SHARE`` apart (a search at 69-76% and a round at
    78-86% are not: 17 points)."""
    known = [share for share in shares if share is not None]
    if not known:
        return True
    one_side = len({interfered(share) for share in known}) == 1
    return one_side and max(known) - min(known) <= INTERFERENCE_SHARE + LOADS_TOLERANCE


def loads_said(shares: Iterable[float]) -> str:
    """Others' share of the cores over some measurements, as every rendering says it: "78-86%",
    "80%" ("-" for none)."""
    percents = [round(share * 100) for share in shares]
    if not percents:
        return "-"
    low, high = min(percents), max(percents)
    return f"{low}%" if low == high else f"{low}-{high}%"
