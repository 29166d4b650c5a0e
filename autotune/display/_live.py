"""What a running study shows: the progress bar, the current trial, each trial and confirmation
run as it ends, and the trials of the other workers of ``--workers`` and ``--gpus``."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from autotune import study as studies
from autotune.config import TrialConfig
from autotune.display._tables import measured_flags, print_speed_table
from autotune.display._text import (
    INDENT,
    TO_TARGET,
    fmt,
    metric_unit,
    params,
    plural,
    print_beside,
    score_text,
    si,
    storage_back,
    storage_waiting,
    value_text,
    visible,
    words,
)
from autotune.machine.scaleout import Workers
from autotune.results import Evaluation
from autotune.spacefile import Spec
from autotune.speed import SpeedTable
from autotune.study import ConfirmRun

PIPED_PROGRESS_SECONDS = 15.0  # piped output (no status line): stage 1's progress this often


class LiveObserver(studies.StudyObserver):
    """Live progress: a bar of the study's trials, the running best, the current trial."""

    def __init__(self, study: optuna.Study, spec: Spec, live: Live, progress: Progress) -> None:
        self.study, self.spec, self.live, self.progress = study, spec, live, progress
        self.unit = metric_unit(spec.objective.metric_name)
        counted = studies.counted_trials(study)
        self.task = progress.add_task(
            "trials",
            total=spec.study.n_trials,
            completed=min(spec.study.n_trials, counted),
            best=self._best_text(),
            visible=counted < spec.study.n_trials,  # no full bar for a run with nothing to do
            start=False,  # its clock starts with the first trial: stage 1 says its own seconds
        )
        self.status = Text("")
        self.current: int | None = None  # the trial this process trains
        # stage 1's settings: timed, reused, skipped (not tried), again (a leader timed again)
        self.speed: Counter[str] = Counter()
        self.left_out: Counter[str] = Counter()  # stage 1's settings not tried, by rule
        self.progress_said = time.monotonic()  # when piped output was last told stage 1's
        self.shown: set[int] = set()  # trials whose line is printed (this and other workers')
        self.own: set[int] = set()  # trials this process trains (the others' are polled)
        self.lock = threading.Lock()  # worker 0 shows other workers' trials from a thread
        self.said_printed = False  # the user's code printed in a trial: said once

    def _best_text(self) -> str:
        best = studies.best_trial(self.study)
        if best is None:
            return "best: -"
        answer = studies.answer_of(self.study)  # an earlier round's run-to-run spread: " ±6%"
        noise = f" ±{answer.spread:.0%}" if answer is not None and answer.spread else ""
        return f"best: {fmt(best.value)} {self.unit}{noise} (trial {best.number})"

    def _render(self) -> None:
        self.live.update(Group(self.progress, self.status))

    def _show(self, line: str = "", cut: bool = False) -> None:
        """``line`` as the status under the bar (``cut``: one line, an ellipsis where it ends)."""
        self.status = Text(line, style="dim", no_wrap=cut or None)
        self.status.overflow = "ellipsis" if cut else None
        self._render()

    def speed_measured(self, event: studies.SpeedEvent) -> None:
        measured = ("again" if event.round > 1 else "timed") if event.measured else "skipped"
        self.speed["reused" if event.cached else measured] += 1
        if not event.measured:
            self.left_out[event.reason or "for another reason"] += 1
        if event.samples_per_second is not None:
            result = f"{si(event.samples_per_second)} samples/s"
        else:
            result = event.fault or "failed"
        again = f", again ({event.round})" if event.round > 1 else ""
        counts = f"{self.speed['timed']} timed, {self.speed['reused']} reused"
        self._show(
            f"  stage 1, speed: {counts}  {event.cell}{again}: {event.settings}: {result}", True
        )
        # piped output shows no status line: a minute's stage 1 said nothing until its table
        now = time.monotonic()
        if (
            not self.live.console.is_terminal
            and now - self.progress_said >= PIPED_PROGRESS_SECONDS
        ):
            self.progress_said = now
            # no figure: one measurement (a losing setting's, a busy one) read as the cell's
            self.say(f"  stage 1: {counts} so far; now {event.cell}", "dim")

    def speed_finished(self, table: SpeedTable, seconds: float) -> None:
        console = self.live.console
        print_speed_table(console, table)
        name = studies.speed_study_name(self.study.study_name)
        reasons = ", ".join(f"{count} {why}" for why, count in self.left_out.most_common())
        skipped = (
            f", {self.speed['skipped']} not tried ({reasons})" if self.speed["skipped"] else ""
        )
        leaders = self.speed["again"]  # measurements of round 2 and later: of the leaders
        again = f" ({plural(leaders, 'more measurement')} of the leaders)" if leaders else ""
        # what was reused may be another study's (the cache is per hardware, model and data)
        timed, reused = self.speed["timed"], self.speed["reused"]
        kept = f"; {'those timed' if reused else 'all'} in study {name}" if timed else ""
        by = "this run's other workers, other processes or earlier runs"  # --workers: each times
        earlier = f", {reused} reused (timed by {by})" if reused else ""
        console.print(
            f"stage 1: {plural(timed, 'setting')} timed{again}{earlier}{skipped}, in "
            f"{seconds:.0f} s{kept}. Stage 2 trains with the fastest of each.",
            markup=False,
        )
        busy = sum(1 for choice in table.choices if choice.interference)
        if busy and reused:  # figures an earlier, busier run left: kept until asked
            console.print(
                f"{plural(busy, 'row')} of it {'rests' if busy == 1 else 'rest'} on figures taken "
                "while other processes took the cores: --remeasure times stage 1 again, on a "
                "quiet machine.",
                style="yellow",
                markup=False,
            )
        self._show()

    def trial_started(self, number: int, config: TrialConfig) -> None:
        self.progress.start_task(self.task)  # (the first trial's start; later ones keep it)
        self.own.add(number)  # its line is this process's to print, however it ends
        self.current = number
        self._show(f"  trial {number}: starting")

    def evaluated(self, number: int, evaluation: Evaluation, value: float) -> None:
        epochs = self.spec.workload.epochs
        self._show(
            f"  trial {number}: epoch {evaluation.epoch:.2f}/{epochs:g}  "
            f"{score_text(self.spec.objective, evaluation.score, short=False)}  "
            f"{fmt(value)} {self.unit}"
        )

    def waiting(self, running: int) -> None:
        self._show(
            f"  waiting for {running} running trial(s) of this study in other processes "
            f"(or left by a stopped run: stale after 3 heartbeats without news)"
        )

    def turn_waiting(self, line: str) -> None:
        """A wait for the machine's turn, under the bar; piped output (no status line) gets a
        line of its own once the wait is said again ("still waiting": ``turns``): a wait of a
        second or two between two runs' trials is routine, one of minutes is news."""
        doing = f"trial {self.current}" if self.current is not None else "stage 1"
        self._show(f"  {doing}: {line}", cut=True)
        if line.startswith("still ") and not self.live.console.is_terminal:
            self.say(f"  {doing}: {line}", "dim")

    def study_waiting(self, line: str) -> None:
        self.say(f"  {line}", "dim")  # a line of its own: piped output shows no status line

    def recovered(self, count: int) -> None:
        self.say(
            f"{count} trial(s) left running by a stopped autotune process (killed, or "
            "lost) recorded as interrupted; their configurations are queued to train again",
            "yellow",
        )

    def storage_waiting(self, problem: str, seconds: float) -> None:
        self.say(storage_waiting(problem, seconds))

    def storage_back(self, seconds: float) -> None:
        self.say(storage_back(seconds))

    def taken_over(self, number: int, kept_on: str | None) -> None:
        kept = f"; what it measured is kept on {kept_on} (earlier_attempt)" if kept_on else ""
        self.say(
            f"trial {number:>3} was failed as stale by another process while this one "
            f"trained it (its heartbeat came late) and was queued again; stopped it{kept}",
            "yellow",
        )
        with self.lock:
            self.shown.add(number)  # its line is this one
        self._show()

    def mark_shown(self, trials: list[FrozenTrial]) -> None:
        """Finished ``trials`` not to show (an earlier run's)."""
        with self.lock:
            self.shown.update(t.number for t in trials if t.state.is_finished())

    def show_finished(self, trials: list[FrozenTrial]) -> None:
        """Show the finished ``trials`` of other workers not shown yet, leaving this process's
        status line as it is."""
        for trial in trials:
            if trial.state.is_finished() and trial.number not in self.own:
                with self.lock:
                    if trial.number not in self.shown:
                        self.shown.add(trial.number)
                        self._trial_line(trial, own=False)

    def say(self, line: Text | str, style: str = "") -> None:
        """A line of its own above the progress bar."""
        with self.lock:
            self.live.console.print(Text(line, style=style) if isinstance(line, str) else line)

    def trial_finished(self, trial: FrozenTrial) -> None:
        with self.lock:
            if trial.number in self.shown:
                return
            self.shown.add(trial.number)
            self._trial_line(trial)
            self._printed_once(trial)

    def _printed_once(self, trial: FrozenTrial) -> None:
        """Once a run: the user's code printed lines in a trial's worker, not shown."""
        record = studies.TrialRecord.of(trial)
        if record.printed_lines and not self.said_printed:
            self.said_printed = True
            self.live.console.print(
                Text(
                    f"        your code printed {record.printed_lines:,} "
                    f"line{'s' if record.printed_lines != 1 else ''} in trial {trial.number} "
                    f"(the first: {visible(record.first_printed or '')}); trials' prints are "
                    f"not shown: --verbose shows them",
                    style="dim",
                )
            )

    def _completed(
        self, trial: FrozenTrial, record: studies.TrialRecord
    ) -> tuple[list[Text], list[Text]]:
        """A complete trial's measurements on its line, a figure with its unit a piece, and its
        flags (infeasible, and ``measured_flags``)."""
        feasible = studies.is_feasible(trial)
        if feasible or self.spec.objective.per_second:
            style = "bold green" if feasible else "yellow"
            value = Text(f"{fmt(trial.value):>9} {self.unit}", style=style)
        else:  # its value is a penalty, not a time to the target
            value = Text(f"{value_text(None, TO_TARGET, reached=False):>21}", style="yellow")
        figures = [
            score_text(self.spec.objective, record.score),
            f"{record.charged_seconds or 0:.2f} s",
            f"{si(record.samples_per_second or 0)} samples/s",
        ]
        if record.tokens_per_second:  # token inputs: the unit that fits them
            figures.append(f"{si(record.tokens_per_second)} tokens/s")
        flags = ["infeasible"] * (not feasible and self.spec.objective.per_second)
        flags += measured_flags(record)
        measured = [value, *(Text(f"  {figure}") for figure in figures)]
        return measured, [Text(f"  {flag}", style="yellow") for flag in flags]

    def _trial_line(self, trial: FrozenTrial, own: bool = True) -> None:
        record = studies.TrialRecord.of(trial)
        # a --workers / --gpus run: which worker trained it
        worker = f"w{record.worker.split('/')[0]} " if record.worker else ""
        line = [Text(f"{worker}trial {trial.number:>3} ")]
        flags: list[Text] = []  # infeasible, interference: else with the knobs
        hang = INDENT  # a fault's message goes on under itself, as cli's errors do
        if trial.state == TrialState.COMPLETE:
            measured, flags = self._completed(trial, record)
            line += measured
        else:
            kind = record.fail_kind or trial.state.name.lower()
            stopped = kind in ("pruned", "cannot_win")  # stopped early, no fault: knobs say more
            line.append(Text(f"{kind:>15}", style="dim" if stopped else "red"))
            hang = sum(piece.cell_len for piece in line) + 2
            line += [] if stopped else words(record.fail_msg or "", "red")
        name = studies.REFERENCE_NAMES.get(record.reference) if record.reference else None
        if record.halved_lr_of is not None:  # the checklist's settings at a learning rate lower
            name = f"trial {record.halved_lr_of}'s settings at half its lr"
        label = [Text(f"  ({name.removeprefix('the ')})", style="bold")] if name else []
        knobs = words(params(trial, own=True), "cyan", " " if name else "  ")
        console = self.live.console
        if sum(piece.cell_len for piece in [*line, *flags]) <= console.width:
            line, flags = [*line, *flags], []  # the flags on the line where they fit
        print_beside(console, line, [*flags, *label, *knobs], hang)  # never cut
        if trial.state in studies.COUNTED_STATES:
            self.progress.advance(self.task)
        self.progress.update(self.task, best=self._best_text())
        if own:  # this process's trial ended: its status line with it
            self.status = Text("")
        self._render()


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


def confirmation_progress(console: Console, spec: Spec) -> Callable[[ConfirmRun, int, int], None]:
    """A line per run of the confirmation round, as it finishes."""
    unit = metric_unit(spec.objective.metric_name)
    shown: set[tuple[int, int]] = set()  # a run measured again (others took its cores) says so

    def show(run: ConfirmRun, done: int, total: int) -> None:
        again = " again" if (run.trial, run.repeat) in shown else ""
        shown.add((run.trial, run.repeat))
        line = [Text(f"confirm {done:>3}/{total}  trial {run.trial:>3} run {run.repeat}{again}")]
        hang = INDENT  # a fault's message goes on under itself, as cli's errors do
        if run.value is None:
            hang = line[0].cell_len + 2
            line += words(run.fault or "", "red")
        elif not run.feasible and not spec.objective.per_second:  # its value is time spent
            spent = value_text(run.value, TO_TARGET, reached=False)
            line += [Text(f"  {spent}", style="yellow")]
            line += [Text(f"  best {score_text(spec.objective, run.score)}")]
        else:
            style = "bold green" if run.feasible else "yellow"
            line += [
                Text(f"  {fmt(run.value)} {unit}", style=style),
                Text(f"  {score_text(spec.objective, run.score)}"),
                Text(f"  {si(run.samples_per_second or 0)} samples/s"),
            ]
        said = []  # last, under the line where it has no room: wrapped, never cut
        bar = spec.objective.bar
        if run.value is not None and not run.feasible and spec.objective.per_second:
            # no measurement of an answer: the medians leave it out
            said.append(
                f"infeasible: below {spec.objective.bar_name} {bar:g}" if bar else "infeasible"
            )
        if run.interfered:
            said.append(f"interference: others took {run.other_cpu_share or 0:.0%} of the cores")
        print_beside(console, line, words("; ".join(said), "yellow"), hang)

    return show


OTHERS_POLL_SECONDS = 0.5  # how often worker 0 looks for the other workers' finished trials


class OthersShown:
    """While the other workers run, show their trials as the study records them (through the
    same observer that shows worker 0's own), and say when a worker ends badly."""

    def __init__(self, study: Any, observer: Any, workers: Workers) -> None:
        self.study, self.observer, self.workers = study, observer, workers
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, name="autotune-others", daemon=True)

    def __enter__(self) -> OthersShown:
        self.observer.mark_shown(self.study.get_trials(deepcopy=False))  # earlier runs' trials
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop polling, after showing what finished meanwhile."""
        self.stop.set()
        self.thread.join()
        self.observer.show_finished(self.study.get_trials(deepcopy=False))

    def _poll(self) -> None:
        while not self.stop.wait(OTHERS_POLL_SECONDS):
            self._show()

    def _show(self) -> None:
        try:
            with studies.without_retry():  # a database that restarts: the next poll shows them
                trials = self.study.get_trials(deepcopy=False)
        except Exception:  # a busy database: the next poll shows them
            return
        self.observer.show_finished(trials)
        if self.workers.interrupted:  # their exit statuses are worker 0's to say
            return
        for line in self.workers.ended_badly():
            self.observer.say(Text(line, style="yellow"))
