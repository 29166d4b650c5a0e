"""What people see: the live study display, the result tables and number formatting."""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from autotune import study as studies
from autotune.config import TrialConfig
from autotune.hardware import Hardware
from autotune.results import Evaluation
from autotune.spec import DEFAULT_STORAGE, KNOBS, Choice, Spec

__all__ = [
    "METRIC_UNITS",
    "LiveObserver",
    "config_table",
    "fmt",
    "fmt_metric",
    "live_progress",
    "print_plan",
    "print_summary",
]

METRIC_UNITS = {"accuracy_per_second": "acc/s", "time_to_accuracy": "s to target"}


def fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) < 1e-2 or abs(value) >= 1e5:
            return f"{value:.2e}"
        return f"{value:.4g}"
    return "-" if value is None else str(value)


_METRIC_FORMATS: dict[str, Any] = {
    "charged_seconds": lambda v: f"{v:.3g} s",
    "train_seconds": lambda v: f"{v:.3g} s",
    "overhead_seconds": lambda v: f"{v:.3g} s",
    "compile_seconds": lambda v: f"{v:.1f} s",
    "samples_per_second": lambda v: f"{v:,.0f}",
    "achieved_flops": lambda v: f"{v / 1e9:,.1f} GFLOP/s",
    "mfu": lambda v: f"{v:.1%}",
    "gpu_utilization": lambda v: f"{v:.0%}",
    "data_wait_fraction": lambda v: f"{v:.1%}",
    "gpu_memory_used_bytes": lambda v: f"{v / 2**30:.2f} GiB",
    "peak_memory_bytes": lambda v: f"{v / 2**20:,.0f} MiB",
}


def fmt_metric(key: str, value: Any) -> str:
    """A trial measurement in its unit (seconds, GFLOP/s, %, MiB) where it has one."""
    if isinstance(value, int | float) and not isinstance(value, bool) and key in _METRIC_FORMATS:
        return _METRIC_FORMATS[key](value)
    return fmt(value)


def _si(value: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def _params(trial: FrozenTrial) -> str:
    return " ".join(f"{k}={fmt(v)}" for k, v in trial.params.items())


class LiveObserver(studies.StudyObserver):
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
        return f"best: {fmt(best.value)} {self.unit} (trial {best.number})"

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
            f"accuracy {evaluation.accuracy:.3f}  {fmt(value)} {self.unit}",
            style="dim",
        )
        self._render()

    def waiting(self, running: int) -> None:
        self.status = Text(
            f"  waiting for {running} running trial(s) of this study in other processes "
            f"(or left by a stopped run: stale after 3 heartbeats without news)",
            style="dim",
        )
        self._render()

    def trial_finished(self, trial: FrozenTrial) -> None:
        record = studies.TrialRecord.of(trial)
        line = Text(f"trial {trial.number:>3} ")
        if trial.state == TrialState.COMPLETE:
            feasible = studies.is_feasible(trial)
            if feasible or self.spec.objective.metric != "time_to_accuracy":
                line.append(
                    f"{fmt(trial.value):>9} {self.unit}",
                    style="bold green" if feasible else "yellow",
                )
            else:  # its value is a penalty, not a time to the target
                line.append(f"{'target not reached':>21}", style="yellow")
            line.append(
                f"  acc {record.accuracy or 0:.3f}  {record.charged_seconds or 0:.2f} s"
                f"  {_si(record.samples_per_second or 0)} samples/s  "
            )
            if not feasible and self.spec.objective.metric != "time_to_accuracy":
                line.append("infeasible  ", style="yellow")
        else:
            kind = record.fail_kind or trial.state.name.lower()
            line.append(f"{kind:>15}  ", style="dim" if kind == "pruned" else "red")
            if kind != "pruned":
                line.append(f"{record.fail_msg or ''}  ", style="red")
        if record.baseline:
            line.append("(untuned baseline) ", style="bold")
        line.append(_params(trial), style="cyan")
        self.live.console.print(line, no_wrap=True, overflow="ellipsis")
        if trial.state in studies.COUNTED_STATES:
            self.progress.advance(self.task)
        self.progress.update(self.task, best=self._best_text())
        self.status = Text("")
        self._render()


def print_plan(
    console: Console, spec: Spec, hardware: Hardware, study: optuna.Study, dropped: list[str]
) -> None:
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
    created_on = studies.StudyRecord.of(study).created_on
    if created_on and created_on != hardware.device_name:
        console.print(
            f"[yellow]warning:[/] this study was created on {created_on}; trials measured on "
            f"{hardware.device_name} will be compared with its trials"
        )
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
        record = studies.TrialRecord.of(trial)
        table.add_row(
            str(trial.number),
            fmt(trial.value),
            f"{record.accuracy if record.accuracy is not None else math.nan:.3f}",
            f"{record.charged_seconds if record.charged_seconds is not None else math.nan:.2f}",
            _si(record.samples_per_second or 0),
            _params(trial),
        )
    return table


def config_table(trial: FrozenTrial) -> Table:
    config = studies.trial_config(trial).to_dict()
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_column(style="dim")
    for name in [*KNOBS, "device", "epochs", "seed"]:
        note = "searched" if name in trial.params else ""
        if name == "lr" and config["lr_scaling"] != "none":
            note = f"{note}; {fmt(config['base_lr'])} per {config['base_batch_size']} examples"
        table.add_row(name, fmt(config[name]), note.strip("; "))
    return table


def print_summary(
    console: Console, study: optuna.Study, spec: Spec, outcome: studies.RunOutcome
) -> None:
    counts = ", ".join(f"{n} {state.lower()}" for state, n in outcome.states.items())
    console.print(f"{outcome.trials_run} trials this run; the study has {counts}.")
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
    console.print(config_table(best))
    storage = spec.study.storage
    console.print(
        f"\nInspect the study:  [bold]autotune dashboard"
        f"{'' if storage == DEFAULT_STORAGE else f' --storage {storage}'}[/]\n"
        f"Print the winner:   [bold]autotune best --study {study.study_name}"
        f"{'' if storage == DEFAULT_STORAGE else f' --storage {storage}'}[/]"
    )


def live_progress(console: Console) -> Progress:
    """The study's progress bar: trials done of the total, the running best, elapsed time."""
    return Progress(
        TextColumn("[bold]trials"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[best]}"),
        TimeElapsedColumn(),
        console=console,
    )
