"""What every reader asks of a study's trials, answered once: which are answers (feasible), the
best, the untuned baseline, how many count towards n_trials, a trial's configuration, and where
each of its knobs got its value. Read through the records of ``_records``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import TrialConfig
from autotune.faults import FaultKind
from autotune.storage._records import TrialRecord

# Trials that count towards ``n_trials``: those that told the sampler something.
COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED)
# how a trial ended (``ended``), in the order counts of a study's trials say them
ENDINGS = ("complete", "pruned", "failed", "interrupted", "running", "waiting")


def ended(trial: FrozenTrial) -> str:
    """How ``trial`` ended, one of ``ENDINGS``: its state's name, but a FAIL is "failed", or
    "interrupted" where it was stored as interrupted (Ctrl-C, SIGTERM, a lost process: nothing
    of its configuration)."""
    if trial.state != TrialState.FAIL:
        return trial.state.name.lower()
    interrupted = TrialRecord.of(trial).fail_kind == FaultKind.INTERRUPTED
    return "interrupted" if interrupted else "failed"


def count_endings(trials: Iterable[FrozenTrial]) -> dict[str, int]:
    """``trials`` counted by how they ended (``ended``), in the order of ``ENDINGS``; an ending
    no trial had is left out."""
    count = Counter(map(ended, trials))
    return {ending: count[ending] for ending in ENDINGS if count[ending]}


def is_feasible(trial: FrozenTrial) -> bool:
    """Whether ``trial`` is an answer: COMPLETE, with every constraint satisfied."""
    return trial.state == TrialState.COMPLETE and all(
        value <= 0 for value in trial.constraints.values()
    )


def feasible_trials(study: optuna.Study) -> list[FrozenTrial]:
    """COMPLETE trials that satisfy every constraint, best first."""
    trials = [t for t in study.get_trials(deepcopy=False) if is_feasible(t)]
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    return sorted(trials, key=lambda t: float(t.value or 0.0), reverse=maximize)  # COMPLETE: set


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The best feasible COMPLETE trial, or None."""
    trials = feasible_trials(study)
    return trials[0] if trials else None


def reference_trial(study: optuna.Study, kind: str) -> FrozenTrial | None:
    """The trial of the reference ``kind`` ("baseline", "checklist"), if it completed."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if TrialRecord.of(trial).reference == kind:
            return trial
    return None


def trial_config(trial: FrozenTrial) -> TrialConfig:
    """The full configuration a trial trained with (stored as its ``config`` attribute)."""
    config = TrialRecord.of(trial).config
    if config is None:
        raise KeyError(f"trial {trial.number} has no autotune configuration")
    return config


def counted_trials(study: optuna.Study) -> int:
    """Trials that count towards n_trials (COMPLETE and PRUNED)."""
    return len(study.get_trials(deepcopy=False, states=COUNTED_STATES))


def knob_origin(
    name: str, params: Any, speed_knobs: Any = (), reference: str | None = None
) -> str:
    """How a trial's knob got its value, in a word or two: "searched" (sampled by the study),
    "timed in stage 1" (the speed stage's fastest for the trial's effective batch and
    precision), "untuned" (the baseline's), "checklist" (the tuning checklist's: neither the
    study's choice), or "" (fixed by the space file)."""
    if name not in params and name not in (speed_knobs or ()):
        return ""
    if reference in ("baseline", "checklist"):  # a two-stage reference's own knobs too
        return {"baseline": "untuned", "checklist": "checklist"}[reference]
    return "searched" if name in params else "timed in stage 1"
