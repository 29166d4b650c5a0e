"""The confirmation round's verdict on one trial, as the Python API and the exports carry it
(``BestConfig.confirmation``): typed, and plain data in a YAML or JSON export."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import optuna

from autotune.study import StudyRecord, Verdict

__all__ = ["TrialConfirmation", "confirmation_of"]


@dataclass(frozen=True)
class TrialConfirmation:
    """The confirmation round's verdict on one trial: its median metric over its runs, how
    far the round's runs spread, whether it is the study's answer, and (for the answer) its
    speed-up over the untuned baseline and the trials it is tied with within the noise."""

    median: float
    runs: int
    spread: float | None = None  # the round's relative spread (0.1: ±10%)
    median_score: float | None = None
    median_samples_per_second: float | None = None
    answer: bool = False  # the round's winner: the study's answer
    speedup: float | None = None  # the answer's metric over the untuned baseline's
    tied_with: tuple[int, ...] = ()  # trials within the noise of the answer
    under_interference: bool = False  # every run measured while others used the CPU

    def to_dict(self) -> dict[str, Any]:
        """Plain data (an export's "confirmation")."""
        return {**dataclasses.asdict(self), "tied_with": list(self.tied_with)}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TrialConfirmation | None:
        """Inverse of ``to_dict``; None for an empty or missing one (not confirmed)."""
        if not data:
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {key: value for key, value in data.items() if key in known}
        fields["tied_with"] = tuple(fields.get("tied_with") or ())
        return cls(**fields)


def confirmation_of(study: optuna.Study, number: int) -> TrialConfirmation | None:
    """The confirmation round's verdict on trial ``number`` (None if none)."""
    record = StudyRecord.of(study).confirmation
    if record is None or not record.complete or number not in record.candidates:
        return None
    verdict = Verdict.of(record)
    mine = next((c for c in verdict.ranked if c.trial == number), None)
    if mine is None or not mine.values:
        return None
    is_winner = verdict.winner is not None and verdict.winner.trial == number
    return TrialConfirmation(
        median=mine.median,
        runs=len(mine.values),
        spread=verdict.spread,
        median_score=mine.median_score,
        median_samples_per_second=mine.median_samples_per_second,
        answer=is_winner,
        speedup=verdict.speedup if is_winner else None,
        tied_with=tuple(c.trial for c in verdict.tied) if is_winner else (),
        under_interference=mine.interfered,
    )
