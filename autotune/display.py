"""What people see: the live study display, the result tables and number formatting."""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from autotune import study as studies
from autotune.config import TrialConfig
from autotune.hardware import Hardware
from autotune.interference import INTERFERENCE_SHARE
from autotune.results import Evaluation
from autotune.spec import DEFAULT_STORAGE, KNOBS, Choice, Spec
from autotune.study import ConfirmRun

__all__ = [
    "METRIC_UNITS",
    "LiveObserver",
    "config_table",
    "confirmation_progress",
    "fmt",
    "fmt_metric",
    "live_progress",
    "print_confirmation",
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


def command(*words: str) -> str:
    """A command line for the user to copy, as rich markup: each word quoted for the shell and
    the whole escaped, so that a study name such as ``run[fast]`` or ``a b`` survives both."""
    return escape(shlex.join(words))


def study_options(study_name: str, storage: str) -> list[str]:
    """``--study NAME`` and ``--storage URL`` (password ``***``) unless it is the default."""
    shown = studies.display_url(storage)
    return ["--study", study_name, *([] if storage == DEFAULT_STORAGE else ["--storage", shown])]


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
            if record.interference:
                line.append(f"interference {record.other_cpu_share or 0:.0%}  ", style="yellow")
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
        f"[bold]study[/] {escape(study.study_name)} ({spec.objective.metric}, "
        f"{spec.study.n_trials} trials{resumed})  "
        f"[bold]storage[/] {escape(studies.display_url(spec.study.storage))}"
    )
    console.print(
        f"[bold]device[/] {hardware.device} ({escape(hardware.device_name)}, torch "
        f"{hardware.torch_version})  [bold]workload[/] {escape(spec.workload.model)} on "
        f"{escape(spec.workload.data)}, {spec.workload.epochs:g} epochs per trial"
    )
    searched = spec.space.searched()
    console.print(f"[bold]searching[/] {', '.join(searched) if searched else 'nothing'}")
    for line in dropped:
        console.print(f"[yellow]not searched:[/] {escape(line)}")
    created_on = studies.StudyRecord.of(study).created_on
    if created_on and created_on != hardware.device_name:
        console.print(
            f"[yellow]warning:[/] this study was created on {escape(created_on)}; trials "
            f"measured on {escape(hardware.device_name)} will be compared with its trials"
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
    table = Table(title=Text(f"Best trials of {study.study_name}"), title_justify="left")
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
            Text(_params(trial)),  # categorical values are the user's strings
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
        # Text: a stored value (a device name, say) is data, never markup
        table.add_row(Text(name), Text(fmt(config[name])), Text(note.strip("; ")))
    return table


def print_summary(
    console: Console,
    study: optuna.Study,
    spec: Spec,
    outcome: studies.RunOutcome,
    confirmation: bool = False,
) -> None:
    """Trial counts, the best trials, the confirmation round (when asked), the answer."""
    counts = ", ".join(f"{n} {state.lower()}" for state, n in outcome.states.items())
    console.print(f"{outcome.trials_run} trials this run; the study has {counts}.")
    table = _best_table(study, spec)
    if table is None:
        bar = spec.objective.min_accuracy or spec.objective.target_accuracy
        reason = f" (none reached accuracy {bar:g})" if bar else ""
        console.print(f"[yellow]No trial has completed feasibly yet{reason}.[/]")
        return
    console.print(table)
    if confirmation:
        print_confirmation(console, study, spec)
    best = studies.answer_trial(study)
    assert best is not None
    stored = studies.StudyRecord.of(study).confirmation
    how = "confirmed" if stored is not None and stored.complete else "not confirmed"
    console.print(f"\n[bold]Best configuration[/] (trial {best.number}, {how}):")
    console.print(config_table(best))
    where = study_options(study.study_name, spec.study.storage)
    console.print(
        f"\nInspect the study:  [bold]{command('autotune', 'dashboard', *where[2:])}[/]\n"
        f"Print the winner:   [bold]{command('autotune', 'best', *where)}[/]"
    )


def confirmation_progress(console: Console, spec: Spec) -> Callable[[ConfirmRun, int, int], None]:
    """A line per run of the confirmation round, as it finishes."""
    unit = METRIC_UNITS[spec.objective.metric]

    def show(run: ConfirmRun, done: int, total: int) -> None:
        line = Text(f"confirm {done:>3}/{total}  trial {run.trial:>3} run {run.repeat}  ")
        if run.value is None:
            line.append(f"{run.fault}", style="red")
        else:
            line.append(
                f"{fmt(run.value)} {unit}", style="bold green" if run.feasible else "yellow"
            )
            line.append(
                f"  acc {run.accuracy or 0:.3f}  {_si(run.samples_per_second or 0)} samples/s"
            )
        if run.interfered:
            line.append(
                f"  interference: others took {run.other_cpu_share or 0:.0%} of the cores",
                style="yellow",
            )
        console.print(line, no_wrap=True, overflow="ellipsis")

    return show


def print_confirmation(console: Console, study: optuna.Study, spec: Spec) -> None:
    """The confirmation round: each configuration's median and range, the answer, ties, the
    confirmed speed-up over the baseline, and what the round cost."""
    record = studies.StudyRecord.of(study).confirmation
    if record is None:
        console.print("[yellow]Not confirmed:[/] no feasible trial to confirm.")
        return
    verdict = studies.Verdict.of(record)
    unit = METRIC_UNITS[spec.objective.metric]
    confirmed = {c.trial: c for c in (*verdict.ranked, verdict.baseline) if c is not None}
    table = Table(
        title=f"Confirmation ({record.repeats} more runs each, interleaved)", title_justify="left"
    )
    table.add_column("trial", justify="right")
    table.add_column(f"median {unit}", justify="right", style="bold green")
    table.add_column("range", justify="right")
    table.add_column("accuracy", justify="right")
    table.add_column("runs", justify="right")
    for number in record.candidates:
        found = confirmed.get(number)
        runs = [run for run in record.runs if run.trial == number]
        label = f"{number}" + (" (baseline)" if number == record.baseline else "")
        if found is None or not found.values:
            table.add_row(label, "-", "-", "-", f"{len(runs)}, none feasible")
            continue
        table.add_row(
            label,
            fmt(found.median),
            f"{fmt(found.low)}-{fmt(found.high)}",
            f"{found.median_accuracy:.3f}",
            str(len(found.values))
            + ("" if len(found.values) == len(runs) else f" of {len(runs)}"),
        )
    console.print(table)
    spread = f"±{verdict.spread:.0%}" if verdict.spread is not None else "unknown"
    if verdict.winner is None:
        console.print("[yellow]No configuration was feasible in most of its runs.[/]")
    else:
        winner = verdict.winner
        console.print(
            f"[bold]Answer: trial {winner.trial}[/], {fmt(winner.median)} {unit} "
            f"(median of {len(winner.values)} runs; run-to-run spread {spread})"
        )
        if verdict.tied:
            numbers = [str(winner.trial), *(str(c.trial) for c in verdict.tied)]
            together = f"{', '.join(numbers[:-1])} and {numbers[-1]}"
            rule = "higher accuracy" if verdict.tie_break == "accuracy" else "better median"
            console.print(
                f"Trials {together} are tied within measurement noise ({spread}); "
                f"trial {winner.trial} is named for its {rule}."
            )
        if verdict.speedup is not None and verdict.baseline is not None:
            what = "accuracy per second" if verdict.maximize else "time to the target"
            console.print(
                f"{verdict.speedup:.2f}x the untuned baseline's {what} (confirmed, "
                f"{len(winner.values)} and {len(verdict.baseline.values)} runs)."
            )
        elif winner.baseline:
            console.print("The untuned baseline is the answer: tuning found nothing better.")
    flagged = sum(1 for run in record.runs if run.interfered)
    if flagged:
        console.print(
            f"{flagged} measurement(s) were taken while other processes took more than "
            f"{INTERFERENCE_SHARE:.0%} of the cores: each was measured again, and the flagged "
            "ones count only where a configuration has no clean one.",
            style="yellow",
        )
    if verdict.winner is not None and verdict.winner.interfered:
        console.print(
            "[yellow]warning:[/] every run of the answer was measured while other processes "
            "used the CPU; run `autotune confirm` again on a quiet machine."
        )
    cost = sum(run.wall_seconds for run in record.runs if run.repeat > 0)
    searched = sum(
        studies.TrialRecord.of(t).wall_seconds or 0.0 for t in study.get_trials(deepcopy=False)
    )
    share = f", {cost / searched:.0%} of the search" if searched else ""
    extra = sum(1 for run in record.runs if run.repeat > 0)
    console.print(f"confirmation: {extra} runs, {cost:.0f} s{share}.", style="dim")


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
