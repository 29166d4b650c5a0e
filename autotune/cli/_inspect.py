"""The commands that read a study: ``best``, ``export``, ``report``, ``dashboard``."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.padding import Padding
from rich.text import Text

from autotune.cli._common import (
    ARTIFACTS_OPTION,
    EXIT_FAILED,
    STORAGE_OPTION,
    STUDY_OPTION,
    Command,
    app,
    console,
    errors,
    fail,
    flag,
    in_range,
    quiet_libraries,
)
from autotune.errors import UserError

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from autotune.outputs.artifacts import ArtifactLocation
from autotune.files import make_folder_for, write_new_file
from autotune.spacefile import DEFAULT_STORAGE

NOTES_LISTED = 10  # the studies whose note `dashboard` names, at most


@app.command(cls=Command)
def best(
    study_name: Annotated[str | None, STUDY_OPTION] = None,
    storage: Annotated[str, STORAGE_OPTION] = DEFAULT_STORAGE,
    trial: Annotated[
        int | None, typer.Option(help="Show this trial instead of the best feasible one.")
    ] = None,
    as_json: Annotated[bool, flag("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Print the best feasible trial's configuration and metrics."""
    from autotune import display, export
    from autotune import study as studies

    quiet_libraries(verbose=False)
    found = studies.load_study(study_name, storage)
    chosen = export.select_trial(found, trial)
    study_name = found.study_name  # the storage's only study where none was named
    result = export.best_config(found, chosen)
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return
    unit = display.metric_unit(result.metric)
    console.print(
        f"[bold]{escape(display.visible(study_name))}[/]: trial {result.trial}, "
        f"{escape(result.metric)} "
        f"[bold green]{escape(display.value_text(result.headline_value, unit, result.feasible))}"
        f"[/] ({result.headline_source})"
    )
    if not result.feasible:
        console.print(f"[yellow]warning:[/] {escape(_infeasible(chosen))}")
    # what the run said of it: a speed-up only where the confirmation round backs one
    display.print_fact(console, result.confirmation_text(storage))
    if result.confirmation is None and result.round_state != "none":  # "none": it says so
        display.print_fact(console, _one_measurement(found, chosen.number))
    below = display.round_figures(result.confirmation, result.score_name, result.trial)
    if below is not None:  # None: the value is its trial's own, as the figures below are
        display.print_fact(console, below)
    for key, value in result.metrics.items():
        note = display.METRIC_NOTES.get(key)
        name = f"validation {result.score_name}" if key == "score" else key
        shown = f"{name}: {display.fmt_metric(key, value)}" + (f"  ({note})" if note else "")
        display.print_fact(console, shown)
    console.print(display.config_table(chosen))
    spec = export.study_spec(found)
    imported = spec.user_entry_points() if spec is not None else []
    if imported:
        display.print_fact(console, f"its workload is your code: {', '.join(imported)}")
    where = display.study_options(study_name, storage)
    console.print()
    chosen_one = ("--trial", str(trial)) if trial is not None else ()  # not the answer, say
    display.print_command(
        console, "Export it:", "autotune", "export", *where, *chosen_one, "-o", "train.py"
    )
    if studies.password_note(storage):
        console.print(studies.password_note(storage), markup=False)


@app.command("export", cls=Command)
def export_command(
    study_name: Annotated[str | None, STUDY_OPTION] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="File to write. Default: print to the terminal."),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="script (a training script), yaml, json, lightning (Trainer, DataLoader and "
            "optimizer settings) or hf (Hugging Face TrainingArguments).",
        ),
    ] = "script",
    storage: Annotated[str, STORAGE_OPTION] = DEFAULT_STORAGE,
    artifacts: Annotated[str | None, ARTIFACTS_OPTION] = None,
    trial: Annotated[
        int | None, typer.Option(help="Export this trial instead of the best feasible one.")
    ] = None,
    force: Annotated[bool, flag("--force", help="Replace an existing file.")] = False,
    rebuild_workload: Annotated[
        bool,
        flag(
            "--rebuild-workload",
            help="Let the export import and run the study's model and data code (for studies "
            "that did not record what the script needs). Only for studies you trust.",
        ),
    ] = False,
) -> None:
    """Export the answer: a script, YAML, JSON, or Trainer settings.

    A standalone training script, YAML, JSON, or the settings of a Lightning or Hugging Face
    Trainer, for the study's answer (or --trial)."""
    from autotune import display, export
    from autotune import study as studies
    from autotune.outputs import artifacts as stores

    if fmt not in export.FORMATS:
        raise fail(f"--format must be one of {', '.join(export.FORMATS)}, not '{fmt}'")
    quiet_libraries(verbose=False)
    notices = console if output is not None else errors  # stdout may be the script itself
    try:
        location = stores.locate(storage, artifacts)  # a bad --artifacts: first
        found = studies.load_study(study_name, storage)
        study_name = found.study_name  # the storage's only study where none was named
        chosen = export.select_trial(found, trial)
        result = export.best_config(found, chosen)
        spec = export.study_spec(found)
        imported = spec.user_entry_points() if spec is not None else []
        yours = f"It imports and runs your code: {', '.join(imported)}."
        if rebuild_workload and fmt == "script" and imported:  # before it runs any of it
            notices.print(
                f"Rebuilding the workload: importing and running {', '.join(imported)}.",
                markup=False,
            )
        if not result.feasible:
            notices.print(
                f"[yellow]warning:[/] {escape(_infeasible(chosen))}, and the export says so"
            )
        name = output.name if output is not None else "train.py"
        with contextlib.redirect_stdout(sys.stderr):  # what the user's code prints, say
            # the script finds the user's modules from where it is written (or printed: here)
            where = output.parent if output is not None else Path.cwd()
            text = export.render(result, fmt, found, name, rebuild_workload, where)
        if output is None:
            sys.stdout.write(text)
            if fmt == "script" and imported:
                notices.print(yours, markup=False)
            return
        made = make_folder_for(output, parents=True)  # -o runs/b/train.py: made, and said
        if made:
            notices.print(f"Created {', '.join(map(str, made))}.", markup=False)
        write_new_file(output, text, force=force)
    except OSError as err:  # the folder could not be made
        raise fail(f"cannot write {output}: {err.strerror}", EXIT_FAILED) from None
    _attach(found, output, storage, location)
    console.print(
        f"Wrote {output}: the {export.FORMATS[fmt]} of trial {result.trial} of {study_name} "
        f"({result.headline}).",
        markup=False,
    )
    if fmt == "script":
        processes = result.config.world_size  # a DDP trial's script runs as its processes
        launch = ("torchrun", "--nproc-per-node", str(processes)) if processes > 1 else ("python",)
        display.print_command(console, "Run it:", *launch, str(output))
        options = "--epochs N, --resume, --run-dir DIR, --lr, --seed, --threads N, --device"
        epochs = f"{result.epochs} epoch{'s' if result.epochs != 1 else ''}"
        console.print(Padding(Text(f"{epochs} into run/; {options}"), (0, 0, 0, 2)))
        if imported:  # say so before the user runs it: a shared study could name anything
            console.print(yours, markup=False)


def _one_measurement(study: Any, number: int) -> str:
    """What the value of trial ``number``, which the confirmation round of ``study`` does not
    rank, rests on: its trial's one measurement, and the round's runs of it, where it has
    some ("its value is one measurement, its trial's; the confirmation round measured it 3
    times, its trial's included, feasible in 1: not most of them, so it is not ranked")."""
    from autotune import study as studies

    answer = studies.answer_of(study)
    measured = answer.configuration(number) if answer is not None else None
    said = "its value is one measurement, its trial's; the confirmation round "
    if measured is None:
        return said + "did not run it"
    if measured.runs <= 1:
        return said + "has not run it yet"
    said += f"measured it {measured.runs} times, its trial's included, "
    said += f"feasible in {measured.feasible_runs}"
    unranked = measured.trial_feasible and not measured.eligible  # (infeasible: said above)
    return said + (": not most of them, so it is not ranked" if unranked else "")


def _infeasible(trial: FrozenTrial) -> str:
    """ "trial 9 is infeasible (accuracy 0.8972 is below min_accuracy 0.9): it is not the
    study's answer", as ``best`` and ``export`` warn of it."""
    from autotune import study as studies

    why = studies.TrialRecord.of(trial).infeasible_reason or "below min_score, or a fault"
    return f"trial {trial.number} is infeasible ({why}): it is not the study's answer"


def _attach(study: Any, output: Path, storage: str, location: ArtifactLocation | None) -> None:
    """Refresh the study's note and upload ``output`` as its artifact, for optuna-dashboard
    (the study was read read-only: a storage opened for writing). The file is written
    already: a failure here is a warning of one line."""
    from autotune import study as studies
    from autotune.outputs import artifacts as stores
    from autotune.outputs import notes

    try:
        writable = studies.load_study(study.study_name, storage, "write")
        notes.write_note(writable, storage)  # first: a read-only storage stops before the upload
        if location is not None:
            stores.upload(writable, output, location)
    except Exception as err:  # a read-only or full storage, an unwritable artifact folder
        why = str(err) if isinstance(err, UserError) else studies.storage_problem(err)
        why = why or f"{type(err).__name__}: {err}".splitlines()[0]
        console.print(
            f"[yellow]Warning:[/] {escape(str(output))} is written, but it could not be attached "
            f"to the study for optuna-dashboard: {escape(why)}",
            soft_wrap=True,
        )
        return
    if location is None:
        console.print(
            f"{output} is not attached to the study for optuna-dashboard: a study on a shared "
            f"storage keeps its files where --artifacts (or ${stores.ARTIFACTS_ENV}) names, "
            f"a folder every machine sees or s3://bucket.",
            markup=False,
            soft_wrap=True,
        )


@app.command("report", cls=Command)
def report_command(
    study_name: Annotated[str | None, STUDY_OPTION] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")] = Path(
        "report.html"
    ),
    storage: Annotated[str, STORAGE_OPTION] = DEFAULT_STORAGE,
    artifacts: Annotated[str | None, ARTIFACTS_OPTION] = None,
    force: Annotated[bool, flag("--force", help="Replace an existing file.")] = False,
) -> None:
    """Write a self-contained HTML report of a study (opens offline)."""
    from autotune import study as studies
    from autotune.outputs import artifacts as stores
    from autotune.outputs import report

    quiet_libraries(verbose=False)
    location = stores.locate(storage, artifacts)  # a bad --artifacts: first
    found = studies.load_study(study_name, storage)
    study_name = found.study_name  # the storage's only study where none was named
    write_new_file(output, report.render_html(found, storage), force=force)
    _attach(found, output, storage, location)
    console.print(
        f"Wrote {output}: the report of {study_name}. Open it in a browser.", markup=False
    )


@app.command(cls=Command)
def dashboard(
    storage: Annotated[str, STORAGE_OPTION] = DEFAULT_STORAGE,
    artifacts: Annotated[str | None, ARTIFACTS_OPTION] = None,
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    verbose: Annotated[bool, flag("--verbose", "-v", help="Log every HTTP request.")] = False,
) -> None:
    """Open the studies in optuna-dashboard, with notes and artifacts."""
    in_range("--port", port, 1, 65535)
    from wsgiref.simple_server import WSGIServer

    import bottle
    import optuna_dashboard

    from autotune import study as studies
    from autotune.outputs import artifacts as stores
    from autotune.outputs import notes
    from autotune.stage1._store import SPEED_SUFFIX

    quiet_libraries(verbose)
    # read-only (notes are edited with `optuna-dashboard URL` itself); no artifact folder made
    backend = studies.open_storage(storage, "read", follow_writers=True)
    location = stores.locate(storage, artifacts)
    store = stores.open_store(location, create=False) if location is not None else None
    if artifacts and store is None:
        raise fail(f"--artifacts {location}: no such folder", EXIT_FAILED)

    class Listening(WSGIServer):  # its URL said once the port is its own, not before
        def server_activate(self) -> None:
            super().server_activate()
            url = escape(f"http://{host}:{port}/")
            console.print(f"optuna-dashboard on [bold]{url}[/] (Ctrl-C to stop; read-only)")
            noted = [  # a NAME.speed study's note is stage 1's table
                s
                for s in backend.get_all_studies()
                if notes.has_note(s.system_attrs) and not s.study_name.endswith(SPEED_SUFFIX)
            ]
            if noted:  # its "Best Trial" card is the search's best single value, not the answer
                console.print("Each study's answer, confirmed side by side, is on its Note tab:")
            for summary in noted[:NOTES_LISTED]:
                number = backend.get_study_id_from_name(summary.study_name)  # the page's id
                page = escape(f"{url}dashboard/studies/{number}/note")
                console.print(f"  {escape(summary.study_name)}: {page}")
            if location is None:
                console.print(
                    f"No artifacts shown: name where this storage's studies keep them with "
                    f"--artifacts (or ${stores.ARTIFACTS_ENV}).",
                    markup=False,
                )

    try:
        # optuna_dashboard.run_server, but quiet: no line per HTTP request unless --verbose
        app = optuna_dashboard.wsgi(backend, artifact_store=store)
        bottle.run(app, host=host, port=port, quiet=not verbose, server_class=Listening)
    except OSError as err:  # the port is taken, say
        raise fail(f"cannot serve on {host}:{port}: {err.strerror or err}", EXIT_FAILED) from None
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
