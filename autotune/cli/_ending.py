"""How ``autotune run`` ends: the summary, and the exit status of the run's ending
(``session.end_run``), with the line that says why where it failed."""

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
from autotune.errors import UserError


def finish(
    study: Any, spec: Any, outcome: Any, confirmed: bool, *, new_study: bool, verbose: bool
) -> None:
    """Print the run's summary and end the run (``session.end_run``); raise the exit its
    ending calls for (typer.Exit), or return for status 0. A stopped run says first how to
    resume (a line no second Ctrl-C during the summary can lose), then what it found."""
    from autotune import display, session
    from autotune import study as studies

    if outcome.interrupted:
        say_stopped(study, spec, outcome, new_study=new_study)
    display.print_summary(console, study, spec, outcome, confirmation=confirmed)
    if studies.password_note(spec.study.storage):
        console.print(studies.password_note(spec.study.storage), markup=False)
    try:
        end = session.end_run(study, spec, outcome, _resume(study, new_study))  # and the note
    except UserError as err:
        raise fail(str(err)) from None
    if end.status in ("interrupted", "terminated"):
        raise typer.Exit(EXIT_TERMINATED if outcome.terminated else EXIT_INTERRUPTED)
    if end.status == "failed":
        lines = list(end.lines)
        if end.traceback_in is not None:
            if verbose:
                shown = last_traceback(study, end.traceback_in)
                if shown:
                    console.print(shown, markup=False, highlight=False, soft_wrap=True)
            else:
                lines[-1] += " (or run with --verbose)"
        raise fail(lines, EXIT_FAILED)


def say_stopped(study: Any, spec: Any, outcome: Any, *, new_study: bool) -> None:
    """The line of a stopped run (``ending``'s, which reads nothing of the study): what is
    kept, and how to resume."""
    from autotune.ending import ending

    line = ending(study, spec, outcome, _resume(study, new_study)).lines[0]
    stopped, kept = line.split(" ", 1)  # "Interrupted." and the rest: prose and a command
    console.print(f"[yellow]{stopped}[/] {kept}")


def _resume(study: Any, new_study: bool) -> str:
    """How ``autotune run`` resumes the study: the same command, or (``new_study``: it would
    start yet another) with its name."""
    from autotune import display
    from autotune.ending import RESUME

    if not new_study:
        return RESUME
    return f"resume with {display.command('--study-name', study.study_name)} (without --new-study)"


def last_traceback(study: Any, where: str) -> str | None:
    """The traceback of the last failed trial of the study (``where`` "trials") or of its
    stage 1 (``where`` "stage 1"), as stored; None when none was stored."""
    import optuna

    from autotune import study as studies
    from autotune.storage import adapter

    if where == "stage 1":  # its measurements' study
        name = studies.speed_study_name(study.study_name)
        study = optuna.load_study(study_name=name, storage=adapter.storage_of(study))
    trials = study.get_trials(deepcopy=False)
    kept = [t.user_attrs["fail_traceback"] for t in trials if t.user_attrs.get("fail_traceback")]
    return str(kept[-1]) if kept else None


def worker_exit(outcome: Any) -> None:
    """How a worker started by worker 0 ends: a line, and the exit status run would give."""
    console.print(f"{outcome.trials_run} trials run by this worker.", markup=False)
    if outcome.interrupted:
        raise typer.Exit(EXIT_TERMINATED if outcome.terminated else EXIT_INTERRUPTED)
    if outcome.repeated_error or outcome.stage_failed:
        raise typer.Exit(EXIT_FAILED)
    raise typer.Exit(0)
