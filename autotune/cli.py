"""The ``autotune`` command: parses arguments, calls the modules, prints for people."""

from __future__ import annotations

import json
import logging
import math
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import optuna
import typer
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from autotune import study as studies
from autotune.config import TrialConfig
from autotune.hardware import DeviceError, Hardware, detect
from autotune.runner import Evaluation
from autotune.space import restrict
from autotune.spec import DEFAULT_STORAGE, KNOBS, Choice, Spec, SpecError, load_spec
from autotune.workloads import WorkloadError
from autotune.workloads import load as load_workload

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    help="Find the PyTorch training configuration with the most accuracy per second.",
)
console = Console()
errors = Console(stderr=True)

EXIT_USAGE = 2  # the user must change a file or an argument
EXIT_FAILED = 1  # the command ran but could not do its job
EXIT_INTERRUPTED = 130

METRIC_UNITS = {"accuracy_per_second": "acc/s", "time_to_accuracy": "s to target"}


def _fail(lines: str | list[str], code: int = EXIT_USAGE) -> typer.Exit:
    for line in [lines] if isinstance(lines, str) else lines:
        errors.print(Text("error: ", style="bold red") + Text(line))
    return typer.Exit(code)


def _quiet_libraries(verbose: bool) -> None:
    """Optuna's per-trial log lines and torch's build chatter off, unless --verbose."""
    optuna.logging.set_verbosity(optuna.logging.INFO if verbose else optuna.logging.ERROR)
    if not verbose:
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        # autotune reports worker counts above the core count once, before the study
        warnings.filterwarnings("ignore", message="This DataLoader will create")


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) < 1e-2 or abs(value) >= 1e5:
            return f"{value:.2e}"
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _si(value: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def _params(trial: FrozenTrial) -> str:
    return " ".join(f"{k}={_fmt(v)}" for k, v in trial.params.items())


# ---------------------------------------------------------------------------------------------
# autotune run
# ---------------------------------------------------------------------------------------------


class _LiveObserver(studies.StudyObserver):
    """Live progress: a bar of the study's trials, the running best, the current trial."""

    def __init__(self, study: optuna.Study, spec: Spec, live: Live, progress: Progress) -> None:
        self.study, self.spec, self.live, self.progress = study, spec, live, progress
        self.unit = METRIC_UNITS[spec.objective.metric]
        self.task = progress.add_task(
            "trials",
            total=spec.study.n_trials,
            completed=min(spec.study.n_trials, studies.counted_trials(study)),
            best=self._best_text(),
        )
        self.status = Text("")

    def _best_text(self) -> str:
        best = studies.best_trial(self.study)
        if best is None:
            return "best: -"
        return f"best: {_fmt(best.value)} {self.unit} (trial {best.number})"

    def _render(self) -> None:
        self.live.update(Group(self.progress, self.status))

    def trial_started(self, number: int, config: TrialConfig) -> None:
        self.current = number
        self.status = Text(f"  trial {number}: starting", style="dim")
        self._render()

    def evaluated(self, number: int, evaluation: Evaluation, value: float) -> None:
        epochs = self.spec.workload.epochs
        self.status = Text(
            f"  trial {number}: epoch {evaluation.epoch:.2f}/{epochs:g}  "
            f"accuracy {evaluation.accuracy:.3f}  {_fmt(value)} {self.unit}",
            style="dim",
        )
        self._render()

    def trial_finished(self, trial: FrozenTrial) -> None:
        attrs = trial.user_attrs
        line = Text(f"trial {trial.number:>3} ")
        if trial.state == TrialState.COMPLETE:
            feasible = all(v <= 0 for v in trial.constraints.values())
            line.append(
                f"{_fmt(trial.value):>9} {self.unit}", style="bold green" if feasible else "yellow"
            )
            line.append(
                f"  acc {attrs.get('accuracy', 0):.3f}  {attrs.get('charged_seconds', 0):.2f} s"
                f"  {_si(attrs.get('samples_per_second', 0))} samples/s  "
            )
            if not feasible:
                line.append("infeasible  ", style="yellow")
        else:
            kind = attrs.get("fail_kind", trial.state.name.lower())
            line.append(f"{kind:>15}  ", style="dim" if kind == "pruned" else "red")
            if kind != "pruned":
                line.append(f"{attrs.get('fail_msg', '')}  ", style="red")
        line.append(_params(trial), style="cyan")
        self.live.console.print(line, no_wrap=True, overflow="ellipsis")
        if trial.state in studies.COUNTED_STATES:
            self.progress.advance(self.task)
        self.progress.update(self.task, best=self._best_text())
        self.status = Text("")
        self._render()


def _print_plan(spec: Spec, hardware: Hardware, study: optuna.Study, dropped: list[str]) -> None:
    counted = studies.counted_trials(study)
    resumed = f", resuming with {counted} done" if counted else ""
    console.print(
        f"[bold]study[/] {study.study_name} ({spec.objective.metric}, "
        f"{spec.study.n_trials} trials{resumed})  [bold]storage[/] {spec.study.storage}"
    )
    console.print(
        f"[bold]device[/] {hardware.device} ({hardware.device_name}, torch "
        f"{hardware.torch_version})  [bold]workload[/] {spec.workload.model} on "
        f"{spec.workload.data}, {spec.workload.epochs:g} epochs per trial"
    )
    searched = spec.space.searched()
    console.print(f"[bold]searching[/] {', '.join(searched) if searched else 'nothing'}")
    for line in dropped:
        console.print(f"[yellow]not on this device:[/] {line}")
    workers = spec.space.num_workers
    most = max(workers.values) if isinstance(workers, Choice) else workers.high
    if isinstance(most, int) and most > hardware.cpu_count:
        console.print(
            f"[yellow]note:[/] num_workers goes up to {most} on {hardware.cpu_count} CPU cores"
        )


def _best_table(study: optuna.Study, spec: Spec, limit: int = 5) -> Table | None:
    trials = studies.feasible_trials(study)[:limit]
    if not trials:
        return None
    unit = METRIC_UNITS[spec.objective.metric]
    table = Table(title=f"Best trials of {study.study_name}", title_justify="left")
    table.add_column("trial", justify="right")
    table.add_column(unit, justify="right", style="bold green")
    table.add_column("accuracy", justify="right")
    table.add_column("seconds", justify="right")
    table.add_column("samples/s", justify="right")
    table.add_column("searched knobs", style="cyan", ratio=1)
    for trial in trials:
        attrs = trial.user_attrs
        table.add_row(
            str(trial.number),
            _fmt(trial.value),
            f"{attrs.get('accuracy', math.nan):.3f}",
            f"{attrs.get('charged_seconds', math.nan):.2f}",
            _si(attrs.get("samples_per_second", 0)),
            _params(trial),
        )
    return table


def _config_table(trial: FrozenTrial) -> Table:
    config = studies.trial_config(trial).to_dict()
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_column(style="dim")
    for name in [*KNOBS, "device", "epochs", "seed"]:
        note = "searched" if name in trial.params else ""
        if name == "lr" and config["lr_scaling"] != "none":
            note = f"{note}; {_fmt(config['base_lr'])} per {config['base_batch_size']} examples"
        table.add_row(name, _fmt(config[name]), note.strip("; "))
    return table


def _print_summary(study: optuna.Study, spec: Spec, outcome: studies.RunOutcome) -> None:
    counts = ", ".join(f"{n} {state.lower()}" for state, n in outcome.states.items())
    console.print(f"\n{outcome.trials_run} trials this run; the study has {counts}.")
    table = _best_table(study, spec)
    if table is None:
        bar = spec.objective.min_accuracy or spec.objective.target_accuracy
        reason = f" (none reached accuracy {bar:g})" if bar else ""
        console.print(f"[yellow]No trial has completed feasibly yet{reason}.[/]")
        return
    console.print(table)
    best = studies.best_trial(study)
    assert best is not None
    console.print(f"\n[bold]Best configuration[/] (trial {best.number}):")
    console.print(_config_table(best))
    storage = spec.study.storage
    console.print(
        f"\nInspect the study:  [bold]optuna-dashboard {storage}[/]\n"
        f"Print the winner:   [bold]autotune best --study {study.study_name}"
        f"{'' if storage == DEFAULT_STORAGE else f' --storage {storage}'}[/]"
    )


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
    new_study: Annotated[
        bool,
        typer.Option(
            "--new-study", help="If the study exists with a different search, start a new one."
        ),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show Optuna's logs.")] = False,
) -> None:
    """Run (or resume) the study a space file describes and print the best configuration."""
    _quiet_libraries(verbose)
    try:
        spec = load_spec(space_file).with_overrides(
            study={
                "n_trials": n_trials,
                "timeout": timeout,
                "storage": storage,
                "name": study_name,
                "seed": seed,
            },
            workload={"device": device},
        )
        hardware = detect(spec.workload.device)
        restriction = restrict(spec, hardware)
        spec = restriction.spec
        workload = load_workload(spec.workload, base_dir=space_file.parent)
        storage_backend = studies.open_storage(spec.study.storage)
        study = studies.open_study(spec, storage_backend, hardware, new_study=new_study)
    except SpecError as err:
        raise _fail(err.problems) from None
    except (DeviceError, WorkloadError, studies.StudyError) as err:
        raise _fail(str(err).splitlines()) from None

    _print_plan(spec, hardware, study, [d.describe() for d in restriction.dropped])
    progress = Progress(
        TextColumn("[bold]trials"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[best]}"),
        TimeElapsedColumn(),
        console=console,
    )
    with Live(progress, console=console, refresh_per_second=8) as live:
        observer = _LiveObserver(study, spec, live, progress)
        outcome = studies.run_study(study, spec, hardware, workload, observer)
        live.update(progress)

    if outcome.stopped_reason:
        console.print(f"[yellow]Stopped:[/] {outcome.stopped_reason}.")
    _print_summary(study, spec, outcome)
    if outcome.interrupted:
        console.print(
            "[yellow]Interrupted.[/] Completed trials are saved; run the same command to resume."
        )
        raise typer.Exit(EXIT_INTERRUPTED)
    if outcome.repeated_error:
        raise _fail(
            [
                f"every trial failed with the same error: {outcome.repeated_error}",
                "this is a bug in the model or data code, not a bad configuration; the "
                "traceback is in each trial's fail_traceback attribute (or run with --verbose)",
            ],
            EXIT_FAILED,
        )


# ---------------------------------------------------------------------------------------------
# autotune best / autotune studies
# ---------------------------------------------------------------------------------------------


def _best_payload(study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
    attrs = trial.user_attrs
    metrics = {
        key: attrs[key]
        for key in (
            "accuracy",
            "charged_seconds",
            "train_seconds",
            "overhead_seconds",
            "samples_per_second",
            "effective_batch_size",
            "peak_memory_bytes",
            "epochs_trained",
            "device_name",
            "torch_version",
        )
        if key in attrs
    }
    return {
        "study": study.study_name,
        "trial": trial.number,
        "metric": study.user_attrs.get("metric", "value"),
        "value": trial.value,
        "params": trial.params,
        "config": attrs["config"],
        "metrics": metrics,
    }


@app.command()
def best(
    study_name: Annotated[str, typer.Option("--study", help="Study name.")],
    storage: Annotated[str, typer.Option(help="Optuna storage URL.")] = DEFAULT_STORAGE,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Print the best feasible trial of a study: its full configuration and metrics."""
    _quiet_libraries(verbose=False)
    try:
        study = studies.load_study(study_name, storage)
    except studies.StudyError as err:
        raise _fail(str(err), EXIT_FAILED) from None
    trial = studies.best_trial(study)
    if trial is None:
        raise _fail(f"study '{study_name}' has no COMPLETE feasible trial yet", EXIT_FAILED)
    payload = _best_payload(study, trial)
    if as_json:
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return
    metric = payload["metric"]
    unit = METRIC_UNITS.get(metric, "")
    console.print(
        f"[bold]{study_name}[/]: trial {trial.number}, {metric} [bold green]{_fmt(trial.value)}"
        f"[/] {unit}"
    )
    for key, value in payload["metrics"].items():
        console.print(f"  {key}: {_fmt(value)}")
    console.print(_config_table(trial))


@app.command("studies")
def list_studies(
    storage: Annotated[str, typer.Option(help="Optuna storage URL.")] = DEFAULT_STORAGE,
) -> None:
    """List the studies in a storage with their trial counts and best values."""
    _quiet_libraries(verbose=False)
    try:
        backend = studies.open_storage(storage, create_dirs=False)
    except studies.StudyError as err:
        raise _fail(str(err), EXIT_FAILED) from None
    summaries = optuna.get_all_study_summaries(backend, include_best_trial=False)
    if not summaries:
        console.print(f"No studies in {storage}.")
        return
    table = Table(title=f"Studies in {storage}", title_justify="left")
    for column in ("study", "metric", "complete", "pruned", "failed", "running", "best", "trial"):
        table.add_column(column, justify="left" if column in ("study", "metric") else "right")
    for summary in sorted(summaries, key=lambda s: s.study_name):
        study = optuna.load_study(study_name=summary.study_name, storage=backend)
        trials = study.get_trials(deepcopy=False)
        count = {state: sum(1 for t in trials if t.state == state) for state in TrialState}
        top = studies.best_trial(study)
        table.add_row(
            summary.study_name,
            str(study.user_attrs.get("metric", "-")),
            str(count[TrialState.COMPLETE]),
            str(count[TrialState.PRUNED]),
            str(count[TrialState.FAIL]),
            str(count[TrialState.RUNNING]),
            _fmt(top.value) if top else "-",
            str(top.number) if top else "-",
        )
    console.print(table)


def main() -> None:
    """Entry point of the ``autotune`` console script."""
    app()
