"""The confirmation round's verdict on one trial, as the Python API and the exports carry it
(``BestConfig.confirmation``): typed, plain data in a YAML or JSON export, and the one line
that the terminal, the note, the report and the exports say it in."""

from __future__ import annotations

import dataclasses
import math
import shlex
from dataclasses import dataclass
from typing import Any

from autotune.display._text import fmt, study_options, visible
from autotune.spacefile import DEFAULT_STORAGE
from autotune.study import REFERENCE_NAMES, UNCONFIRMED, Answer, trials_named


@dataclass(frozen=True)
class TrialConfirmation:
    """The confirmation round's verdict on one trial (the study's ``Answer``, for the answer):
    its medians and, for the answer, its ratios over the references and its ties."""

    median: float
    runs: int
    spread: float | None = None  # the round's relative spread (0.1: ±10%)
    median_score: float | None = None
    median_samples_per_second: float | None = None
    answer: bool = False  # the round's winner: the study's answer
    # the answer's metric over the untuned baseline's, and over the tuning checklist's, where
    # the round backs them (None: no measurable speed-up; ``said`` says why)
    speedup: float | None = None
    over_checklist: float | None = None
    speedup_interval: tuple[float, float] | None = None  # where the speed-up may lie
    said: tuple[str, ...] = ()  # the answer over each reference, as the terminal says it
    reference: str | None = None  # the answer is this reference ("the tuning checklist")
    tied_with: tuple[int, ...] = ()  # trials within the noise of the answer
    under_interference: bool = False  # every run measured while others used the CPU

    def to_dict(self) -> dict[str, Any]:
        """Plain data (an export's "confirmation")."""
        plain = {**dataclasses.asdict(self), "tied_with": list(self.tied_with)}
        if self.speedup_interval is not None:  # JSON has no infinity: an unbounded end is null
            low, high = self.speedup_interval
            plain["speedup_interval"] = [low, high if math.isfinite(high) else None]
        return {**plain, "said": list(self.said)}

    @classmethod
    def of(cls, answer: Answer | None, number: int) -> TrialConfirmation | None:
        """Trial ``number`` in the round that confirms the study's ``answer``: its medians,
        and for the answer its ratios over the references and its ties; None where the
        round does not confirm the answer or did not rank the trial."""
        if answer is None or not answer.confirmed:
            return None
        found = answer.configuration(number)
        if found is None or not found.eligible or not found.values:
            return None
        mine = number == answer.number
        baseline = answer.over(REFERENCE_NAMES["baseline"])
        return cls(
            median=found.median,
            runs=len(found.values),
            spread=answer.spread,
            median_score=found.median_score,
            median_samples_per_second=found.median_samples_per_second,
            answer=mine,
            speedup=answer.speedup if mine else None,
            over_checklist=answer.ratio_over(REFERENCE_NAMES["checklist"]) if mine else None,
            speedup_interval=baseline.interval if mine and baseline is not None else None,
            said=tuple(r.said for r in answer.references) if mine else (),
            reference=answer.reference if mine else None,
            tied_with=answer.tied if mine else (),
            under_interference=found.interfered,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TrialConfirmation | None:
        """Inverse of ``to_dict``; None for an empty or missing one (not confirmed)."""
        if not data:
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {key: value for key, value in data.items() if key in known}
        fields["tied_with"] = tuple(fields.get("tied_with") or ())
        fields["said"] = tuple(fields.get("said") or ())
        if fields.get("speedup_interval") is not None:
            low, high = fields["speedup_interval"]
            fields["speedup_interval"] = (low, math.inf if high is None else high)
        return cls(**fields)


def confirmation_text(
    found: TrialConfirmation | None,
    study: str,
    interleaved: str = "",
    storage: str = DEFAULT_STORAGE,
    round_state: str = "none",
) -> str:
    """One line on how sure ``study`` is of a trial: its ``TrialConfirmation``, or None (why
    not, by the ``round_state`` of the study's answer, and the command to confirm it:
    ``--storage`` where ``storage`` is not the default); ``interleaved``: what its runs
    alternated with (the note says it)."""
    if found is None:
        words = ("autotune", "confirm", *study_options(study, storage))
        again = shlex.join(visible(word) for word in words)
        why = UNCONFIRMED.get(round_state, UNCONFIRMED["none"])  # "confirmed": not this trial
        return f"not confirmed: {why} (run `{again}`)"
    text = f"confirmed: median {fmt(found.median)} over {found.runs} run{'s' * (found.runs != 1)}"
    if interleaved:
        text += f", interleaved with {interleaved}"
    if found.spread is not None:
        text += f" (spread ±{found.spread:.0%})"
    if found.said:
        text += f"; {'; '.join(found.said)}"
    if found.reference is not None:
        text += f"; it is {found.reference}: the search found nothing better"
    if found.tied_with:
        text += f"; tied within noise with {trials_named(sorted(found.tied_with))}"
    if found.under_interference:
        text += "; measured while other processes used the CPU (confirm it again)"
    return text
