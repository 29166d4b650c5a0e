"""The commands that train: ``run`` (the study, then its confirmation round), ``confirm`` and
``verify``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from autotune import session
from autotune import study as studies
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
    in_range,
    quiet_libraries,
)
from autotune.cli._confirm import confirm, confirm_round, say_storage_waits, verify
from autotune.cli._ending import finish, say_stopped, worker_exit
from autotune.errors import UserError, WorkerError
from autotune.machine import scaleout
from autotune.machine.turns import TURN_WAIT_ENV, DeviceLockTimeout
from autotune.spacefile import DEFAULT_STORAGE

if TYPE_CHECKING:
    from autotune.machine.scaleout import Workers, WorkerShare


@app.command(cls=Command)
def run(
    space_file: Annotated[
        Path,
        typer.Argument(metavar="SPACE_FILE", help="The space file (YAML) describing the study."),
    ],
    n_trials: Annotated[
        int | None,
        typer.Option(
            help="Trials the study should hold in total (COMPLETE + PRUNED), counting those "
            "of earlier runs; not 'this many more'. Default: study.n_trials.",
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Stop starting trials after this many seconds.")
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
    workers: Annotated[
        int | None,
        typer.Option(
            help="Run N workers on this machine's CPU, each on an equal share of its cores, "
            "all on this study; they split stage 1's settings, then train.",
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            help="One worker per GPU: all, or indices such as 0,2,3; each sees its GPU as "
            "cuda:0 and runs on an equal share of the cores.",
        ),
    ] = None,
    turn_wait: Annotated[
        float | None,
        typer.Option(
            help="Seconds to wait for another autotune process that trains on the same cores "
            "or GPU before giving up; 0: never wait, train beside it. Default: "
            "$AUTOTUNE_TURN_WAIT, else 1800.",
        ),
    ] = None,
    as_worker: Annotated[int | None, typer.Option(hidden=True)] = None,
    verbose: Annotated[bool, flag("--verbose", "-v", help="Show Optuna's logs.")] = False,
) -> None:
    """Run (or resume) a space file's study and print its answer."""
    in_range("--workers", workers, 1)
    in_range("--turn-wait", turn_wait, 0)
    if turn_wait is not None:  # read where a turn is waited for, here and in its workers
        os.environ[TURN_WAIT_ENV] = f"{turn_wait:g}"
    if as_worker is not None:  # the storage worker 0 runs on, from its environment
        storage = os.environ.pop(scaleout.WORKER_STORAGE_ENV, None) or storage

    def meanwhile() -> None:  # while the worker starts: its imports overlap these
        quiet_libraries(verbose)
        if workers is not None and gpus is None:
            scaleout.refuse_cuda_workers(spec.workload.device)
        if gpus is not None:
            _refuse_cpu_gpus(gpus, spec.workload.device)

    try:
        options = session.RunOptions(
            n_trials=n_trials,
            timeout=timeout,
            storage=storage,
            study_name=study_name,
            device=device,
            seed=seed,
            isolation=isolation,
        )
        spec = session.load_run_spec(space_file, options)
        shares = scaleout.take_share(spec.workload.gpus_per_trial, workers, gpus, as_worker)
        share = shares[as_worker or 0] if shares is not None else None
        prepared = session.prepare(
            spec,
            space_file.parent,
            verbose=verbose,
            new_study=new_study,
            cpu_share=share is not None and share.count > 1,
            meanwhile=meanwhile,
        )
    except UserError as err:
        code = EXIT_FAILED if isinstance(err, scaleout.WorkerGone) else EXIT_USAGE
        raise fail(str(err).splitlines(), code) from None
    spec, study = prepared.spec, prepared.study
    say_storage_waits(prepared.retry)
    if share is None or share.index == 0:  # worker 0 (or the only one) shows the study
        show_plan(prepared, shares)
    else:
        console.print(f"{share.describe()} of study {study.study_name}", markup=False)
    scale = session.ScaleOut(shares, as_worker or 0, space_file) if shares else None
    try:
        outcome, confirmed = session.run_prepared(
            prepared,
            space_file.parent,
            Shown(prepared, as_worker),
            verbose=verbose,
            remeasure=remeasure,
            confirm=as_worker is None,  # worker 0 (or the only one) confirms and sums up
            scale=scale,
        )
    except UserError as err:  # a worker that cannot start, the disk filled up, ...
        console.print()  # ends the live display's last line: the error gets a line of its own
        code = EXIT_FAILED if isinstance(err, (WorkerError, DeviceLockTimeout)) else EXIT_USAGE
        raise fail(str(err), code) from None
    except KeyboardInterrupt as stop:  # a second Ctrl-C (or SIGTERM) as it stopped for the first
        console.print()
        stopped = studies.RunOutcome(study.study_name)
        stopped.stopped_by(stop)
        say_stopped(study, spec, stopped, new_study=new_study)
        raise typer.Exit(EXIT_TERMINATED if stopped.terminated else EXIT_INTERRUPTED) from None
    if as_worker is not None:
        worker_exit(outcome)
    finish(study, spec, outcome, confirmed, new_study=new_study, verbose=verbose)


def _refuse_cpu_gpus(gpus: str, device: str) -> None:
    """A UserError where ``--gpus`` would train on the CPU: a study whose workload.device is
    cpu, or auto where this worker's GPU (its share, applied) is none torch sees."""
    if device == "auto":
        from autotune.machine.hardware import detect

        if detect(device).device == "cpu":
            raise UserError(
                f"--gpus {gpus}: torch sees no CUDA GPU of these, and workload.device auto "
                f"would train on the CPU: name GPUs this machine has (nvidia-smi -L lists them)"
            )
    elif device == "cpu":
        raise UserError(
            f"--gpus {gpus}: this study trains on the CPU (workload.device: cpu): use "
            f"--device cuda, or --workers N for workers on the CPU"
        )


def show_plan(prepared: session.Prepared, shares: list[WorkerShare] | None) -> None:
    """What ``run`` shows before it trains: the plan, the workers, and what the check of the
    workload found doubtful."""
    from autotune import display

    spec, workload = prepared.spec, prepared.workload
    display.print_plan(console, spec, prepared.hardware, prepared.study, list(prepared.dropped))
    if shares is not None and len(shares) > 1:
        display.print_item(console, "workers", display.describe_shares(shares))
    mixed = _other_cores(prepared, shares)
    if mixed is not None:
        console.print(Text("warning: ", style="yellow") + Text(mixed), soft_wrap=True)
    for line in workload.warnings:  # what the check of the workload found doubtful
        console.print(f"[yellow]warning:[/] {escape(line)}")
    untrained = workload.untrained_score
    if spec.objective.per_second and untrained is not None and untrained < 0:
        goal = spec.objective
        console.print(
            f"[yellow]warning:[/] score {escape(goal.score_name)} is {untrained:.4g} on the "
            f"untrained model: {goal.metric_name} needs a score of 0 or more (a trial that "
            f"ends below 0 is infeasible); use objective.metric time_to_score with a "
            f"target_score, or a score that is 0 or more",
            soft_wrap=True,
        )


def _other_cores(prepared: session.Prepared, shares: list[WorkerShare] | None) -> str | None:
    """The plan's line where this run trains on other cores than the study's trials did
    (``session.cores_changed``: --workers added to a study, or left out), with what to do:
    a new study, or the cores the study started with; None where they are the same."""
    from autotune.display import plural

    changed = session.cores_changed(prepared)
    if changed is None:
        return None
    before, now = changed
    name = prepared.study.study_name
    shares = shares if shares is not None and len(shares) > 1 else []
    workers = len(shares) or 1
    machine = now * workers + len(scaleout.unused_cores(shares)) if shares else now
    cores = plural(now, "core")
    run = f"--workers {workers} trains each on {cores}" if workers > 1 else f"this run on {cores}"
    new_name = f"{name}-{workers}workers" if workers > 1 else f"{name}-{now}cores"
    remedy = f"name a new study (--study-name {new_name})"
    if before == machine:
        remedy += " or drop --workers"
    elif machine % before == 0:
        remedy += f" or run it with --workers {machine // before}, as it started"
    return (
        f"study {name}'s trials trained on {plural(before, 'core')}, {run}: their times will "
        f"not compare; {remedy}"
    )


class Shown(session.RunHooks):
    """``run``'s live display of the study and of the other workers' trials (worker 0's); a
    worker that worker 0 started starts its trial process at once, and stops quietly if told
    to before it trained. SIGTERM stops the run as Ctrl-C does."""

    sigterm_stops = True

    def __init__(self, prepared: session.Prepared, as_worker: int | None) -> None:
        super().__init__()
        self.prepared, self.as_worker = prepared, as_worker
        self.outcome: Any = None  # the trials' RunOutcome, once they are done
        self.showing = contextlib.ExitStack()

    @contextlib.contextmanager
    def training(self, study: Any, executor: Any) -> Iterator[Any]:
        from rich.live import Live

        from autotune import display
        from autotune.worker import WorkerExecutor

        spec, retry = self.prepared.spec, self.prepared.retry
        progress = display.live_progress(console)
        with Live(progress, console=console, refresh_per_second=8) as live, self.showing:
            self.observer = display.LiveObserver(study, spec, live, progress)
            retry.on_wait = self.observer.storage_waiting
            retry.on_back = self.observer.storage_back
            self.showing.callback(say_storage_waits, retry)
            if self.as_worker is not None and isinstance(executor, WorkerExecutor):
                try:  # its start-up (imports, the data) before its first measurement
                    executor.start()
                except KeyboardInterrupt:
                    console.print("Stopped by worker 1 before any trial.", markup=False)
                    raise typer.Exit(EXIT_INTERRUPTED) from None
            yield self.observer
            live.update(progress)
        console.print()  # ends the progress line (piped output has no cursor to move)
        if self.outcome.stopped_reason:
            stopped = "" if self.outcome.trials_run == 0 else "Stopped: "
            console.print(Text(f"{stopped}{self.outcome.stopped_reason}.", style="yellow"))

    def trials_start(self, others: Workers | None) -> None:
        if others is not None:
            from autotune.display import OthersShown

            self.showing.enter_context(OthersShown(self.prepared.study, self.observer, others))

    def trials_done(self, outcome: Any) -> None:
        self.outcome = outcome
        self.showing.close()  # the display's poll of the others ends first: their exits follow

    def others_ended(self, lines: list[str]) -> None:
        for line in lines:
            console.print(Text(line, style="yellow"))

    def confirm(self, study: Any, spec: Any, executor: Any, top: int, repeats: int) -> bool:
        return confirm_round(study, spec, executor, top, repeats)


app.command(cls=Command)(confirm)  # after run: --help lists the commands in this order
app.command(cls=Command)(verify)
