"""The ``autotune`` command: parses arguments, calls the modules, prints for people.

Heavy modules (torch, Optuna, scikit-learn) are imported inside the commands, so that
``autotune --help`` and a typo in a space file answer at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from autotune.errors import UserError
from autotune.files import write_new_file
from autotune.spec import DEFAULT_STORAGE, load_spec

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # a bug gets a plain traceback; user errors get one line
    help="Find the PyTorch training configuration with the most accuracy per second.",
)
console = Console()
errors = Console(stderr=True)

EXIT_USAGE = 2  # the user must change a file or an argument
EXIT_FAILED = 1  # the command ran but could not do its job
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM


def _raise_terminated(signum: int, frame: object) -> None:
    """SIGTERM handler: stop the study like Ctrl-C does, recording the running trial."""
    from autotune.study import Terminated

    raise Terminated()


def _fail(lines: str | list[str], code: int = EXIT_USAGE) -> typer.Exit:
    for line in [lines] if isinstance(lines, str) else lines:
        errors.print(Text("error: ", style="bold red") + Text(line))
    return typer.Exit(code)


def _open_for_reading(storage: str) -> Any:  # an Optuna RDBStorage (imported lazily)
    """The storage of existing studies; one line and exit 1 when there is none."""
    from autotune import study as studies

    try:
        return studies.open_storage(storage, create_dirs=False)
    except UserError as err:
        raise _fail(str(err), EXIT_FAILED) from None


def _quiet_libraries(verbose: bool) -> None:
    """Optuna's per-trial log lines and torch's build chatter off, unless --verbose."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.INFO if verbose else optuna.logging.ERROR)
    if not verbose:
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        # autotune reports worker counts above the core count once, before the study
        warnings.filterwarnings("ignore", message="This DataLoader will create")


@app.command()
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
        typer.Option(help=f"Optuna storage URL. Default: study.storage or {DEFAULT_STORAGE}."),
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
        typer.Option(
            "--new-study", help="If the study exists with a different search, start a new one."
        ),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show Optuna's logs.")] = False,
) -> None:
    """Run (or resume) the study a space file describes and print the best configuration."""
    try:
        spec = load_spec(space_file).with_overrides(
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
        raise _fail(str(err).splitlines()) from None

    from rich.live import Live

    from autotune import display
    from autotune import study as studies
    from autotune.executor import InProcessExecutor, WorkerError
    from autotune.hardware import detect
    from autotune.space import restrict
    from autotune.worker import WorkerExecutor
    from autotune.workloads import load as load_workload

    _quiet_libraries(verbose)
    try:
        hardware = detect(spec.workload.device)
        workload = load_workload(spec.workload, base_dir=space_file.parent)
        restriction = restrict(spec, hardware, workload)
        spec = restriction.spec
        storage_backend = studies.open_storage(
            spec.study.storage, heartbeat_interval=spec.study.heartbeat_interval
        )
        study = studies.open_study(spec, storage_backend, hardware, workload, new_study)
    except UserError as err:
        raise _fail(str(err).splitlines()) from None

    display.print_plan(console, spec, hardware, study, [d.describe() for d in restriction.dropped])
    executor = (
        WorkerExecutor(spec.workload, space_file.parent, spec.study.trial_timeout, verbose)
        if spec.study.isolation == "worker"
        else InProcessExecutor(workload)
    )
    progress = display.live_progress(console)
    previous_handler = signal.signal(signal.SIGTERM, _raise_terminated)
    confirmed = False
    try:
        with Live(progress, console=console, refresh_per_second=8) as live:
            observer = display.LiveObserver(study, spec, live, progress)
            outcome = studies.run_study(study, spec, hardware, executor, observer)
            live.update(progress)
        console.print()  # ends the progress line (piped output has no cursor to move)
        if outcome.stopped_reason:
            console.print(f"[yellow]Stopped:[/] {outcome.stopped_reason}.")
        finished = studies.counted_trials(study) >= spec.study.n_trials
        plan = spec.study.confirm
        if plan.enabled and finished and not outcome.interrupted and not outcome.repeated_error:
            try:
                confirmed = _confirm(study, spec, executor, plan.top, plan.repeats)
            except KeyboardInterrupt as stop:
                outcome.interrupted = True
                outcome.terminated = isinstance(stop, studies.Terminated)
    except WorkerError as err:
        raise _fail(str(err), EXIT_FAILED) from None
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        executor.close()

    display.print_summary(console, study, spec, outcome, confirmation=confirmed)
    if outcome.trials_run:
        from autotune import notes

        notes.write_note(study, spec.study.storage)  # what optuna-dashboard shows first
    if outcome.interrupted:
        how = "run the same command to resume"
        if new_study:  # the same command would start yet another study
            how = f"resume with --study-name {study.study_name} (without --new-study)"
        console.print(
            f"[yellow]{'Terminated' if outcome.terminated else 'Interrupted'}.[/] The running "
            f"trial (or confirmation run) is recorded as interrupted and finished ones are "
            f"saved; {how}."
        )
        raise typer.Exit(EXIT_TERMINATED if outcome.terminated else EXIT_INTERRUPTED)
    if outcome.repeated_error:
        raise _fail(
            [
                f"every trial failed with the same error: {outcome.repeated_error}",
                "this is a bug in the model or data code, not a bad configuration; the "
                "traceback is in each trial's fail_traceback attribute (or run with --verbose)",
            ],
            EXIT_FAILED,
        )


def _confirm(study: Any, spec: Any, executor: Any, top: int, repeats: int) -> bool:
    """Run (or resume) the confirmation round, a line per run; whether one exists now."""
    from autotune import display
    from autotune import study as studies

    plan = studies.confirmation_plan(study, top, repeats)
    if plan is None:
        return False
    todo = len(plan.candidates) * repeats - sum(1 for run in plan.runs if run.repeat > 0)
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


@app.command()
def confirm(
    study_name: Annotated[str, typer.Option("--study", help="Study name.")],
    storage: Annotated[str, typer.Option(help="Optuna storage URL.")] = DEFAULT_STORAGE,
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

    _quiet_libraries(verbose=False)
    try:
        found = studies.load_study(study_name, storage)
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
            WorkerExecutor(spec.workload, base_dir, spec.study.trial_timeout)
            if isolation == "worker"
            else InProcessExecutor(load_workload(spec.workload, base_dir))
        )
    except UserError as err:
        raise _fail(str(err).splitlines(), EXIT_FAILED) from None
    if record.created_on and record.created_on != hardware.device_name:
        console.print(
            f"[yellow]warning:[/] this study was created on {record.created_on}; the runs on "
            f"{hardware.device_name} will be compared with its trials"
        )
    previous_handler = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        confirmed = _confirm(
            found,
            spec,
            executor,
            top or spec.study.confirm.top,
            repeats or spec.study.confirm.repeats,
        )
    except WorkerError as err:
        raise _fail(str(err), EXIT_FAILED) from None
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
        raise _fail(f"study '{study_name}' has no feasible trial to confirm", EXIT_FAILED)
    display.print_confirmation(console, found, spec)
    from autotune import notes

    with contextlib.suppress(Exception):  # the note is a convenience; the answer is stored
        notes.write_note(found, storage)


# ---------------------------------------------------------------------------------------------
# autotune best / autotune studies
# ---------------------------------------------------------------------------------------------


@app.command()
def best(
    study_name: Annotated[str, typer.Option("--study", help="Study name.")],
    storage: Annotated[str, typer.Option(help="Optuna storage URL.")] = DEFAULT_STORAGE,
    trial: Annotated[
        int | None, typer.Option(help="Show this trial instead of the best feasible one.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Print the best feasible trial of a study: its full configuration and metrics."""
    from autotune import display, export
    from autotune import study as studies

    _quiet_libraries(verbose=False)
    try:
        found = studies.load_study(study_name, storage)
        chosen = export.select_trial(found, trial)
    except UserError as err:
        raise _fail(str(err), EXIT_FAILED) from None
    result = export.best_config(found, chosen)
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return
    unit = display.METRIC_UNITS.get(result.metric, "")
    console.print(
        f"[bold]{study_name}[/]: trial {result.trial}, {result.metric} "
        f"[bold green]{display.fmt(result.value)}[/] {unit}"
    )
    console.print(f"  {result.confirmation_text()}")
    for key, value in result.metrics.items():
        console.print(f"  {key}: {display.fmt_metric(key, value)}")
    console.print(display.config_table(chosen))
    console.print(
        f"\nExport it:  [bold]autotune export --study {study_name}"
        f"{'' if storage == DEFAULT_STORAGE else f' --storage {storage}'} -o train.py[/]"
    )


@app.command("export")
def export_command(
    study_name: Annotated[str, typer.Option("--study", help="Study name.")],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="File to write. Default: print to the terminal."),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="script (a training script), yaml or json.")
    ] = "script",
    storage: Annotated[str, typer.Option(help="Optuna storage URL.")] = DEFAULT_STORAGE,
    trial: Annotated[
        int | None, typer.Option(help="Export this trial instead of the best feasible one.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
) -> None:
    """Export the best configuration as a standalone training script, YAML or JSON."""
    formats = ("script", "yaml", "json")
    if fmt not in formats:
        raise _fail(f"--format must be one of {', '.join(formats)}, not '{fmt}'")
    from autotune import display, export
    from autotune import study as studies

    _quiet_libraries(verbose=False)
    try:
        found = studies.load_study(study_name, storage)
        chosen = export.select_trial(found, trial)
        result = export.best_config(found, chosen)
        name = output.name if output is not None else "train.py"
        text = export.render(result, fmt, found, script_name=name)
        if output is None:
            sys.stdout.write(text)
            return
        write_new_file(output, text, force=force)
    except UserError as err:
        raise _fail(str(err), EXIT_FAILED) from None
    _attach(found, output, storage)
    what = {"script": "training script", "yaml": "YAML", "json": "JSON"}[fmt]
    console.print(
        f"Wrote {output}: the {what} of trial {result.trial} of {study_name} "
        f"({result.metric} {display.fmt(result.value)})."
    )
    if fmt == "script":
        console.print(
            f"Run it:  [bold]python {output}[/]  ({result.epochs} epochs; --epochs N, --resume)"
        )


def _attach(study: Any, output: Path, storage: str) -> None:
    """Upload ``output`` as an artifact of ``study`` and refresh its note, for optuna-dashboard.
    The file is written already: a failure here is a warning, not a failed command."""
    from autotune import notes

    try:
        notes.upload(study, output, storage)
        notes.write_note(study, storage)
    except Exception as err:  # an unwritable artifact folder, a storage hiccup
        console.print(
            f"[yellow]Warning:[/] {output} is written, but it could not be attached to the "
            f"study for optuna-dashboard: {type(err).__name__}: {err}"
        )


@app.command("report")
def report_command(
    study_name: Annotated[str, typer.Option("--study", help="Study name.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")] = Path(
        "report.html"
    ),
    storage: Annotated[str, typer.Option(help="Optuna storage URL.")] = DEFAULT_STORAGE,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
) -> None:
    """Write a self-contained HTML report of a study (opens offline)."""
    from autotune import report
    from autotune import study as studies

    _quiet_libraries(verbose=False)
    try:
        found = studies.load_study(study_name, storage)
        write_new_file(output, report.render_html(found, storage), force=force)
    except UserError as err:
        raise _fail(str(err), EXIT_FAILED) from None
    _attach(found, output, storage)
    console.print(f"Wrote {output}: the report of {study_name}. Open it in a browser.")


@app.command()
def dashboard(
    storage: Annotated[str, typer.Option(help="Optuna storage URL.")] = DEFAULT_STORAGE,
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8080,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
) -> None:
    """Open the studies in optuna-dashboard, with autotune's notes and artifacts."""
    import optuna_dashboard
    from optuna.artifacts import FileSystemArtifactStore

    from autotune import notes

    _quiet_libraries(verbose=False)
    backend = _open_for_reading(storage)
    artifacts = notes.artifact_dir(storage)
    artifacts.mkdir(parents=True, exist_ok=True)
    console.print(f"optuna-dashboard on [bold]http://{host}:{port}/[/] (Ctrl-C to stop)")
    try:
        optuna_dashboard.run_server(
            backend, host=host, port=port, artifact_store=FileSystemArtifactStore(str(artifacts))
        )
    except OSError as err:  # the port is taken, say
        raise _fail(f"cannot serve on {host}:{port}: {err.strerror or err}", EXIT_FAILED) from None
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@app.command("studies")
def list_studies(
    storage: Annotated[str, typer.Option(help="Optuna storage URL.")] = DEFAULT_STORAGE,
) -> None:
    """List the studies in a storage with their trial counts and best values."""
    import optuna
    from optuna.trial import TrialState
    from rich.table import Table

    from autotune import display
    from autotune import study as studies

    _quiet_libraries(verbose=False)
    backend = _open_for_reading(storage)
    summaries = optuna.get_all_study_summaries(backend, include_best_trial=False)
    if not summaries:
        console.print(f"No studies in {storage}.")
        return
    table = Table(title=f"Studies in {storage}", title_justify="left")
    table.add_column("study", no_wrap=True)
    table.add_column("metric", no_wrap=True)
    for column in ("complete", "pruned", "failed", "running", "best", "trial"):
        table.add_column(column, justify="right")
    for summary in sorted(summaries, key=lambda s: s.study_name):
        study = optuna.load_study(study_name=summary.study_name, storage=backend)
        trials = study.get_trials(deepcopy=False)
        count = {state: sum(1 for t in trials if t.state == state) for state in TrialState}
        top = studies.answer_trial(study)
        table.add_row(
            summary.study_name,
            studies.StudyRecord.of(study).metric or "-",
            str(count[TrialState.COMPLETE]),
            str(count[TrialState.PRUNED]),
            str(count[TrialState.FAIL]),
            str(count[TrialState.RUNNING]),
            display.fmt(top.value) if top else "-",
            str(top.number) if top else "-",
        )
    console.print(table)


def main() -> None:
    """Entry point of the ``autotune`` console script."""
    app()
