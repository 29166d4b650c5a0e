"""How a run ended: the one rule for ``autotune run``'s exit status and ``autotune.run``'s
report (``ending``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from optuna.trial import TrialState

from autotune import study as studies
from autotune.faults import FaultKind
from autotune.spacefile import Spec

if TYPE_CHECKING:
    import optuna

    from autotune.study import RunOutcome


@dataclass(frozen=True)
class Ending:
    """A run's ending and ``autotune run``'s exit status for it: ok 0, interrupted (Ctrl-C) 130,
    terminated (SIGTERM) 143, failed 1 (``lines`` say why)."""

    status: Literal["ok", "interrupted", "terminated", "failed"]
    lines: tuple[str, ...] = ()
    # the same error ended every trial: where its traceback is kept ("trials": each failed
    # trial's fail_traceback; "stage 1": the failed trials of the NAME.speed study)
    traceback_in: str | None = None


RESUME = "run the same command to resume"  # ``autotune run``'s way; a library call says its own


def ending(study: optuna.Study, spec: Spec, outcome: RunOutcome, resume: str = RESUME) -> Ending:
    """The one rule for how a run ended (said in the README): interrupted or terminated (the
    line says what is kept and ``resume``, how to go on); failed when stage 1 could train
    nothing, the timeout came before the first trial, the same error ended every trial, or no
    trial of the study trained to its end; else ok. An interrupted run's ending reads nothing
    of the study: it is said at once, before anything else a second Ctrl-C could stop."""
    if outcome.interrupted:
        return Ending(
            "terminated" if outcome.terminated else "interrupted",
            (_stopped(spec, outcome, resume),),
        )
    if outcome.stage_failed:
        return Ending(
            "failed",
            (f"stage 1 could not train any configuration of the space: {outcome.stage_failed}",),
        )
    if outcome.timed_out and outcome.trials_run == 0:
        took = ""
        if outcome.stage_seconds is not None:
            took = f" (stage 1 took {outcome.stage_seconds:.0f} s of it)"
        return Ending(
            "failed",
            (
                f"the timeout of {spec.study.timeout:g} s (study.timeout, or --timeout) ran "
                f"out before the first trial{took}: give the run more time, or bound stage 1 "
                f"with study.speed.max_seconds",
            ),
        )
    if outcome.repeated_error:
        kept = "each failed trial"
        if outcome.repeated_in == "stage 1":
            kept = f"the failed trials of study {studies.speed_study_name(study.study_name)}"
        return Ending(
            "failed",
            (
                f"every trial failed with the same error: {outcome.repeated_error}",
                f"this is a bug in the model or data code, not a bad configuration; the "
                f"traceback is in the fail_traceback attribute of {kept}",
            ),
            traceback_in=outcome.repeated_in,
        )
    never_trained = none_trained(study, spec.workload.loss)
    if never_trained is not None:
        return Ending("failed", (never_trained,))
    return Ending("ok")


def _stopped(spec: Spec, outcome: RunOutcome, resume: str) -> str:
    """ "Interrupted. What is kept; ``resume``." for a run stopped by Ctrl-C (or SIGTERM)."""
    stopped = "Terminated" if outcome.terminated else "Interrupted"
    if spec.study.strategy == "two_stage" and outcome.speed_table is None:
        saved = "Stage 1's finished measurements are saved and will be reused"
    else:
        saved = (
            "The running trial (or confirmation run) is recorded as interrupted and finished "
            "ones are saved"
        )
    return f"{stopped}. {saved}; {resume}."


def none_trained(study: optuna.Study, loss: str = "cross_entropy") -> str | None:
    """One line when no trial of the study trained to its end (every one failed or was
    stopped): its trials' commonest kind of failure, how many of them it ended, and one of its
    messages; for a loss that was not finite, what to look at (``loss``: workload.loss, named
    when it is the user's). None when a trial trained to its end."""
    if study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    kinds: Counter[str] = Counter()
    example: dict[str, str] = {}
    for trial in study.get_trials(deepcopy=False):
        record = studies.TrialRecord.of(trial)
        if record.fail_msg:  # grouped by kind: messages that differ in the lr are one failure
            kind = record.fail_kind or record.fail_msg
            kinds[kind] += 1
            example.setdefault(kind, record.fail_msg)
    said = "no trial of the study trained to its end"
    if not kinds:
        return said
    kind, count = kinds.most_common(1)[0]
    share = f"all {count}" if count == kinds.total() else f"{count} of {kinds.total()}"
    line = f"{said}; {share} of its trials: {example[kind]}"
    if kind == FaultKind.NONFINITE_LOSS:  # the user's loss is a suspect beside the lr
        yours = (
            "" if loss == "cross_entropy" else f"check that the loss ({loss}) stays finite, or "
        )
        return f"{line}; {yours}lower the lr range"
    return line
