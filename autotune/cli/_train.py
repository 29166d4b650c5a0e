"""The commands that train: ``run`` (the study, then its confirmation round), ``confirm`` and
``verify``."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.text import Text

from autotune import session
from autotune.cli._common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    STORAGE_ENV,
    Command,
    app,
    console,
    fail,
    flag,
    in_range,
    quiet_libraries,
    raise_terminated,
)
from autotune.cli._confirm import confirm, confirm_round, storage_failure, storage_lines
from autotune.cli._ending import finish, worker_exit
from autotune.cli._scaleout import (
    OthersShown,
    describe_shares,
    say_lines,
    start_workers,
    stop_workers,
    worker_log_dir,
)
from autotune.cli._verify import verify
from autotune.errors import UserError
from autotune.spec import DEFAULT_STORAGE
from autotune.turns import TURN_WAIT_ENV, TurnNotTaken

if TYPE_CHECKING:
    from autotune.scaleout import Workers


@app.command(cls=Command)
def run(  # noqa: C901, PLR0912, PLR0915
    space_file: Annotated[
        Path, typer.Argument(help="The space file (YAML) describing the study.")
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
    """Run (or resume) the study a space file describes and print the best configuration."""
    from autotune import scaleout

    in_range("--workers", workers, 1)
    in_range("--turn-wait", turn_wait, 0)
    if turn_wait is not None:  # read where a turn is waited for, here and in its workers
        os.environ[TURN_WAIT_ENV] = f"{turn_wait:g}"
    if as_worker is not None:  # the storage worker 0 runs on, from its environment
        storage = os.environ.pop(scaleout.WORKER_STORAGE_ENV, None) or storage
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
    except UserError as err:
        raise fail(str(err).splitlines()) from None

    try:  # the workers' shares of the machine (the space file says how many GPUs a trial)
        per_trial = spec.workload.gpus_per_trial
        shares = scaleout.plan_shares(workers, gpus, per_trial) if workers or gpus else None
        if as_worker is not None and (shares is None or not 0 < as_worker < len(shares)):
            raise scaleout.ScaleOutError("--as-worker is for the workers autotune starts itself")
    except UserError as err:
        raise fail(str(err)) from None
    share = shares[as_worker or 0] if shares is not None else None
    if share is not None:
        scaleout.apply_share(share)  # before torch sees a GPU or sizes its thread pools
    if as_worker is not None:
        os.environ.pop(scaleout.WORKER_CORES_ENV, None)  # not for what this worker starts
        if not scaleout.stop_with_parent():
            raise fail("worker 1 of this study is gone: this worker does not start", EXIT_FAILED)

    # the worker first: its imports and its copy of the workload overlap this process's own
    launched = session.launch_worker(spec, space_file.parent, verbose)

    from rich.live import Live

    from autotune import display
    from autotune import study as studies
    from autotune.errors import WorkerError
    from autotune.hardware import detect
    from autotune.worker import WorkerExecutor

    quiet_libraries(verbose)
    try:
        machine = detect(spec.workload.device) if workers is not None and gpus is None else None
        if machine is not None and machine.is_cuda:
            raise scaleout.ScaleOutError(
                f"--workers runs workers on the CPU, and this study trains on "
                f"{machine.device}: use --gpus (a worker per GPU), or --device cpu"
            )
        cpu_share = share is not None and share.count > 1
        prepared = session.prepare(
            spec, space_file.parent, new_study=new_study, cpu_share=cpu_share
        )
    except BaseException as err:
        if launched is not None:
            launched.close()
        if isinstance(err, UserError):
            raise fail(str(err).splitlines()) from None
        raise
    spec, study, hardware, workload = (
        prepared.spec,
        prepared.study,
        prepared.hardware,
        prepared.workload,
    )
    patience = prepared.patience
    patience.on_wait, patience.on_back = storage_lines(console)

    if as_worker is None:  # worker 0 (or the only one) shows the study; the others log
        display.print_plan(console, spec, hardware, study, list(prepared.dropped))
        if shares is not None and len(shares) > 1:
            display.print_item(console, "workers", describe_shares(shares))
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
    else:
        assert share is not None
        console.print(f"{share.describe()} of study {study.study_name}", markup=False)
    executor = session.executor_for(
        spec, space_file.parent, workload, verbose=verbose, launched=launched
    )
    progress = display.live_progress(console)
    previous_handler = signal.signal(signal.SIGTERM, raise_terminated)
    confirmed = False
    others: Workers | None = None
    started = time.monotonic()  # the study's timeout counts from here, stage 1 included
    began = time.time()  # every trial that starts from here is this run's, any worker's
    try:
        with (
            Live(progress, console=console, refresh_per_second=8) as live,
            contextlib.ExitStack() as showing,
        ):
            observer = display.LiveObserver(study, spec, live, progress)
            patience.on_wait, patience.on_back = observer.storage_waiting, observer.storage_back
            showing.callback(setattr, patience, "on_wait", storage_lines(console)[0])
            showing.callback(setattr, patience, "on_back", storage_lines(console)[1])

            if shares is not None and len(shares) > 1 and as_worker is None:
                # started now: their start-up overlaps stage 1, on their own cores
                log_dir = worker_log_dir(spec.study.storage, study.study_name)
                others = start_workers(
                    shares, space_file, spec, study.study_name, log_dir, spec.study.timeout
                )

            if as_worker is not None and isinstance(executor, WorkerExecutor):
                try:  # its start-up (imports, the data) before its first measurement
                    executor.start()
                except KeyboardInterrupt:
                    console.print("Stopped by worker 1 before any trial.", markup=False)
                    raise typer.Exit(EXIT_INTERRUPTED) from None

            def start_others() -> None:  # once stage 1 is measured
                if as_worker is not None:  # the trials start together, when worker 0 says
                    scaleout.wait_to_go()  # (it measured its share of stage 1 as this did)
                    return
                if others is not None:
                    timeout = spec.study.timeout
                    left = timeout - (time.monotonic() - started) if timeout else None
                    others.go(left)
                    showing.enter_context(OthersShown(study, observer, others))

            outcome = studies.run_study(
                study,
                spec,
                hardware,
                executor,
                observer,
                workload,
                remeasure,
                on_trials_start=start_others,
                worker=f"{share.index + 1}/{share.count}" if share and share.count > 1 else None,
            )
            if others is not None:  # the study is done, or this worker stopped or gave up
                showing.close()  # the display's poll ends first: the exits are said below
                gave_up = bool(outcome.interrupted or outcome.repeated_error)
                gave_up = gave_up or "trials failed" in outcome.stopped_reason
                gave_up = gave_up or not others.going  # nothing left to run, or no stage 2
                say_lines(stop_workers(others, gave_up, spec.study.trial_timeout or 600))
                studies.count_states(study, outcome, began)  # the workers' trials too
            live.update(progress)
        console.print()  # ends the progress line (piped output has no cursor to move)
        if outcome.stopped_reason:
            stopped = "" if outcome.trials_run == 0 else "Stopped: "
            console.print(Text(f"{stopped}{outcome.stopped_reason}.", style="yellow"))
        if as_worker is None:  # worker 0 (or the only one) confirms
            round_of = functools.partial(confirm_round, study, spec, executor)
            confirmed = session.confirm_after_run(study, spec, outcome, round_of)
    except (WorkerError, TurnNotTaken) as err:
        console.print()  # ends the live display's last line: the error gets a line of its own
        raise fail(str(err), EXIT_FAILED) from None
    except Exception as err:  # the disk filled up, the database became read-only, ...
        console.print()
        raise storage_failure(err, spec.study.storage) from None
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        executor.close()
        if others is not None:  # a path that left them running: never leave them behind
            others.interrupt()
            others.wait(60)

    if as_worker is not None:  # worker 0 confirms and sums up
        worker_exit(outcome)
    finish(study, spec, outcome, confirmed, new_study=new_study, verbose=verbose)


app.command(cls=Command)(confirm)  # after run: --help lists the commands in this order
app.command(cls=Command)(verify)
