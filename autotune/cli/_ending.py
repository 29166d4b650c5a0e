"""How ``autotune run`` ends: the summary, the dashboard note, and one exit status for each way
a run can end (said in the README): 0 when a trial of the study trained to its end, 1 with one
line saying why when none did (the same error everywhere, stage 1 with nothing to run, the
timeout before the first trial, every trial failed), 130 or 143 when interrupted."""

from __future__ import annotations

from typing import Any

import typer

from autotune.cli._common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    console,
    fail,
)
from autotune.cli._confirm import storage_failure

__all__ = ["finish", "worker_exit"]


def finish(
    study: Any, spec: Any, outcome: Any, confirmed: bool, *, new_study: bool, verbose: bool
) -> None:
    """Print the run's summary and write the study's note; raise the exit its outcome calls
    for (typer.Exit), or return for status 0."""
    from autotune import display
    from autotune import study as studies

    display.print_summary(console, study, spec, outcome, confirmation=confirmed)
    if studies.password_note(spec.study.storage):
        console.print(studies.password_note(spec.study.storage), markup=False)
    if outcome.trials_run:
        from autotune import notes

        try:
            notes.write_note(study, spec.study.storage)  # what optuna-dashboard shows first
        except Exception as err:
            raise storage_failure(err, spec.study.storage) from None
    if outcome.interrupted:
        how = "run the same command to resume"
        if new_study:  # the same command would start yet another study
            how = (
                f"resume with {display.command('--study-name', study.study_name)} "
                f"(without --new-study)"
            )
        stopped = "Terminated" if outcome.terminated else "Interrupted"
        if spec.study.strategy == "two_stage" and outcome.speed_table is None:
            saved = "stage 1's finished measurements are saved and will be reused"
        else:
            saved = (
                "the running trial (or confirmation run) is recorded as interrupted and "
                "finished ones are saved"
            )
        console.print(f"[yellow]{stopped}.[/] {saved[0].upper()}{saved[1:]}; {how}.")
        raise typer.Exit(EXIT_TERMINATED if outcome.terminated else EXIT_INTERRUPTED)
    if outcome.stage_failed:
        raise fail(
            f"stage 1 could not train any configuration of the space: {outcome.stage_failed}",
            EXIT_FAILED,
        )
    if outcome.timed_out and outcome.trials_run == 0:
        took = (
            f" (stage 1 took {outcome.stage_seconds:.0f} s of it)"
            if outcome.stage_seconds is not None
            else ""
        )
        raise fail(
            f"the timeout of {spec.study.timeout:g} s (study.timeout, or --timeout) ran out "
            f"before the first trial{took}: give the run more time, or bound stage 1 with "
            f"study.speed.max_seconds",
            EXIT_FAILED,
        )
    if outcome.repeated_error:
        speed = studies.speed_study_name(study.study_name)
        kept = (
            f"the failed trials of study {speed}"
            if outcome.repeated_in == "stage 1"
            else "each failed trial"
        )
        if verbose:
            shown = last_traceback(study, outcome.repeated_in)
            if shown:
                console.print(shown, markup=False, highlight=False, soft_wrap=True)
        raise fail(
            [
                f"every trial failed with the same error: {outcome.repeated_error}",
                f"this is a bug in the model or data code, not a bad configuration; the "
                f"traceback is in the fail_traceback attribute of {kept}"
                + ("" if verbose else " (or run with --verbose)"),
            ],
            EXIT_FAILED,
        )
    # one rule for a run whose trials all failed, whatever their messages: it fails too
    never_trained = none_trained(study)
    if never_trained is not None:
        raise fail(never_trained, EXIT_FAILED)


def last_traceback(study: Any, where: str) -> str | None:
    """The traceback of the last failed trial of the study (``where`` "trials") or of its
    stage 1 (``where`` "stage 1"), as stored; None when none was stored."""
    import optuna

    from autotune import study as studies
    from autotune.study import adapter

    if where == "stage 1":
        name = studies.speed_study_name(study.study_name)
        speed = optuna.load_study(study_name=name, storage=adapter.storage_of(study))
        records = [studies.SpeedRecord.of(t) for t in speed.get_trials(deepcopy=False)]
        kept = [r.fail_traceback for r in records if r is not None and r.fail_traceback]
    else:
        trials = study.get_trials(deepcopy=False)
        kept = [t.user_attrs.get("fail_traceback") for t in trials]
        kept = [text for text in kept if text]
    return str(kept[-1]) if kept else None


def none_trained(study: Any) -> str | None:
    """One line when no trial of the study trained to its end (every one failed or was
    stopped), with its trials' commonest reason; None when one did."""
    from collections import Counter

    from optuna.trial import TrialState

    from autotune import study as studies

    if study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    reasons: Counter[str] = Counter()
    for trial in study.get_trials(deepcopy=False):
        record = studies.TrialRecord.of(trial)
        if record.fail_msg:
            reasons[record.fail_msg] += 1
    said = "no trial of the study trained to its end"
    if not reasons:
        return said
    reason, count = reasons.most_common(1)[0]
    return f"{said}; {count} of its trials: {reason}"


def worker_exit(outcome: Any) -> None:
    """How a worker started by worker 0 ends: a line, and the exit status run would give."""
    console.print(f"{outcome.trials_run} trials run by this worker.", markup=False)
    if outcome.interrupted:
        raise typer.Exit(EXIT_TERMINATED if outcome.terminated else EXIT_INTERRUPTED)
    if outcome.repeated_error or outcome.stage_failed:
        raise typer.Exit(EXIT_FAILED)
    raise typer.Exit(0)
