"""The commands that train: ``run`` (the study, then its confirmation round) and ``confirm``."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from autotune.cli._common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    STORAGE_ENV,
    Command,
    app,
    console,
    fail,
    flag,
    quiet_libraries,
    raise_terminated,
    storage_option,
)
from autotune.errors import UserError
from autotune.spec import DEFAULT_STORAGE, Spec, load_spec


@app.command(cls=Command)
def run(
    space_file: Annotated[
        Path, typer.Argument(help="The space file (YAML) describing the study.")
    ],
    n_trials: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Trials the study should hold in total (COMPLETE + PRUNED), counting those "
            "of earlier runs; not 'this many more'. Default: study.n_trials.",
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(min=0.001, help="Stop starting trials after this many seconds.")
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            help=f"Optuna storage URL. Default: study.storage, else ${STORAGE_ENV}, else "
            f"{DEFAULT_STORAGE}."
        ),
    ] = None,
    study_name: Annotated[
        str | None, typer.Option(help="Study name. Default: study.name or the file's stem.")
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="auto, cpu, cuda or cuda:N. Default: workload.device.")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Study seed; trial k uses seed + k.")] = None,
    isolation: Annotated[
        str | None,
        typer.Option(
            help="worker: trials in a supervised worker process (crashes and hangs are "
            "contained); none: in this process, for debugging. Default: study.isolation."
        ),
    ] = None,
    new_study: Annotated[
        bool,
        flag("--new-study", help="If the study exists with a different search, start a new one."),
    ] = False,
    remeasure: Annotated[
        bool,
        flag(
            "--remeasure",
            help="Time the execution knobs again (stage 1 of a two-stage study) instead of "
            "reusing the measurements stored for this machine, model and data.",
        ),
    ] = False,
    verbose: Annotated[bool, flag("--verbose", "-v", help="Show Optuna's logs.")] = False,
) -> None:
    """Run (or resume) the study a space file describes and print the best configuration."""
    try:
        spec = load_spec(space_file)
        storage = storage or environment_storage(spec)
        spec = spec.with_overrides(
            study={
                "n_trials": n_trials,
                "timeout": timeout,
                "storage": storage,
                "name": study_name,
                "seed": seed,
                "isolation": isolation,
            },
            workload={"device": device},
        )
    except UserError as err:
        raise fail(str(err).splitlines()) from None

    from rich.live import Live

    from autotune import display
    from autotune import study as studies
    from autotune.executor import InProcessExecutor, WorkerError
    from autotune.hardware import detect
    from autotune.space import restrict
    from autotune.worker import WorkerExecutor
    from autotune.workloads import load as load_workload

    quiet_libraries(verbose)
    try:
        hardware = detect(spec.workload.device)
        workload = load_workload(spec.workload, space_file.parent, spec.objective.score)
        restriction = restrict(spec, hardware, workload)
        spec = restriction.spec
    except UserError as err:
        raise fail(str(err).splitlines()) from None
    try:
        storage_backend = studies.open_storage(
            spec.study.storage, "create", heartbeat_interval=spec.study.heartbeat_interval
        )
        study = studies.open_study(spec, storage_backend, hardware, workload, new_study)
        spec = studies.with_study_strategy(study, spec)  # an older study resumes as it was
    except UserError as err:
        raise fail(str(err).splitlines()) from None
    except Exception as err:
        raise _storage_failure(err, spec.study.storage) from None

    display.print_plan(console, spec, hardware, study, [d.describe() for d in restriction.dropped])
    for line in workload.warnings:  # what the check of the workload found doubtful
        console.print(f"[yellow]warning:[/] {escape(line)}")
    executor = (
        WorkerExecutor(
            spec.workload,
            space_file.parent,
            spec.study.trial_timeout,
            verbose,
            score=spec.objective.score,
        )
        if spec.study.isolation == "worker"
        else InProcessExecutor(workload)
    )
    progress = display.live_progress(console)
    previous_handler = signal.signal(signal.SIGTERM, raise_terminated)
    confirmed = False
    try:
        with Live(progress, console=console, refresh_per_second=8) as live:
            observer = display.LiveObserver(study, spec, live, progress)
            outcome = studies.run_study(
                study, spec, hardware, executor, observer, workload, remeasure
            )
            live.update(progress)
        console.print()  # ends the progress line (piped output has no cursor to move)
        if outcome.stopped_reason:
            stopped = "" if outcome.trials_run == 0 else "Stopped: "
            console.print(Text(f"{stopped}{outcome.stopped_reason}.", style="yellow"))
        finished = studies.counted_trials(study) >= spec.study.n_trials
        plan = spec.study.confirm
        ended_early = bool(outcome.interrupted or outcome.repeated_error or outcome.stage_failed)
        if plan.enabled and finished and not ended_early:
            try:
                confirmed = _confirm(study, spec, executor, plan.top, plan.repeats)
            except KeyboardInterrupt as stop:
                outcome.interrupted = True
                outcome.terminated = isinstance(stop, studies.Terminated)
    except WorkerError as err:
        raise fail(str(err), EXIT_FAILED) from None
    except Exception as err:  # the disk filled up, the database became read-only, ...
        raise _storage_failure(err, spec.study.storage) from None
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        executor.close()

    display.print_summary(console, study, spec, outcome, confirmation=confirmed)
    if studies.password_note(spec.study.storage):
        console.print(studies.password_note(spec.study.storage), markup=False)
    if outcome.trials_run:
        from autotune import notes

        try:
            notes.write_note(study, spec.study.storage)  # what optuna-dashboard shows first
        except Exception as err:
            raise _storage_failure(err, spec.study.storage) from None
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
    if outcome.repeated_error:
        raise fail(
            [
                f"every trial failed with the same error: {outcome.repeated_error}",
                "this is a bug in the model or data code, not a bad configuration; the "
                "traceback is in each trial's fail_traceback attribute (or run with --verbose)",
            ],
            EXIT_FAILED,
        )


def environment_storage(spec: Spec) -> str | None:
    """$AUTOTUNE_STORAGE, unless the space file names its storage (an explicit study.storage
    comes before an environment's default)."""
    if "storage" in spec.study.model_fields_set:
        return None
    return os.environ.get(STORAGE_ENV) or None


def _storage_failure(err: Exception, storage: str, code: int = EXIT_USAGE) -> typer.Exit:
    """A storage fault (a full disk, a read-only or damaged database) as one line and exit
    ``code``; anything else is a bug and is raised again with its traceback."""
    from autotune import study as studies

    problem = studies.storage_problem(err)
    if problem is None:
        raise err
    return fail(f"cannot write the study to {studies.display_url(storage)}: {problem}", code)


def _confirm(study: Any, spec: Any, executor: Any, top: int, repeats: int) -> bool:
    """Run (or resume) the confirmation round, a line per run; whether one exists now."""
    from autotune import display
    from autotune import study as studies

    plan = studies.confirmation_plan(study, top, repeats, spec.objective.score_higher_is_better)
    if plan is None:
        return False
    todo = plan.runs_left()  # runs measured again count once: never "-8 runs"
    if todo:
        console.print(
            f"Confirming the {len(plan.candidates) - (plan.baseline is not None)} best "
            f"configurations and the untuned baseline: {todo} runs, interleaved."
        )
    studies.confirm_study(
        study,
        spec.objective,
        executor,
        top,
        repeats,
        on_run=display.confirmation_progress(console, spec),
    )
    return True


@app.command(cls=Command)
def confirm(
    study_name: Annotated[str, typer.Option("--study", help="Study name.")],
    storage: Annotated[str, storage_option()] = DEFAULT_STORAGE,
    top: Annotated[
        int | None,
        typer.Option(min=1, help="Confirm this many leaders. Default: study.confirm.top."),
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option(min=1, help="More runs of each. Default: study.confirm.repeats."),
    ] = None,
    isolation: Annotated[
        str | None, typer.Option(help="worker or none. Default: study.isolation.")
    ] = None,
) -> None:
    """Re-measure a study's leaders and its untuned baseline side by side, and name the answer.

    Runs (or resumes) the confirmation round; with other --top/--repeats, a new one. It trains,
    so it imports the workload's model and data functions named in the study's space file.
    """
    from autotune import display, export
    from autotune import study as studies
    from autotune.executor import InProcessExecutor, WorkerError
    from autotune.hardware import detect
    from autotune.worker import WorkerExecutor
    from autotune.workloads import load as load_workload

    quiet_libraries(verbose=False)
    try:
        found = studies.load_study(study_name, storage, "write")
        spec = export.study_spec(found)
        if spec is None:
            raise studies.StudyError(
                f"study '{study_name}' holds no readable space file: it cannot train again"
            )
        record = studies.StudyRecord.of(found)
        base_dir = Path(record.space_file_dir) if record.space_file_dir else None
        hardware = detect(spec.workload.device)
        isolation = isolation or spec.study.isolation
        executor = (
            WorkerExecutor(
                spec.workload, base_dir, spec.study.trial_timeout, score=spec.objective.score
            )
            if isolation == "worker"
            else InProcessExecutor(load_workload(spec.workload, base_dir, spec.objective.score))
        )
    except UserError as err:
        raise fail(str(err).splitlines(), EXIT_FAILED) from None
    if record.created_on and record.created_on != hardware.device_name:
        console.print(
            f"[yellow]warning:[/] this study was created on {escape(record.created_on)}; the "
            f"runs on {escape(hardware.device_name)} will be compared with its trials"
        )
    previous_handler = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        confirmed = _confirm(
            found,
            spec,
            executor,
            top or spec.study.confirm.top,
            repeats or spec.study.confirm.repeats,
        )
    except WorkerError as err:
        raise fail(str(err), EXIT_FAILED) from None
    except Exception as err:  # the disk filled up, the database became read-only, ...
        raise _storage_failure(err, storage, EXIT_FAILED) from None
    except KeyboardInterrupt as stop:
        terminated = isinstance(stop, studies.Terminated)
        console.print(
            "[yellow]Interrupted.[/] The finished runs are saved; run the same command to resume."
        )
        raise typer.Exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        executor.close()
    if not confirmed:
        raise fail(f"study '{study_name}' has no feasible trial to confirm", EXIT_FAILED)
    display.print_confirmation(console, found, spec)
    from autotune import notes

    with contextlib.suppress(Exception):  # the note is a convenience; the answer is stored
        notes.write_note(found, storage)
