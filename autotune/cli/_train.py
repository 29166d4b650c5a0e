"""The commands that train: ``run`` (the study, then its confirmation round) and ``confirm``."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from autotune.cli._common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    STORAGE_ENV,
    Command,
    app,
    console,
    fail,
    flag,
    quiet_libraries,
    raise_terminated,
)
from autotune.cli._confirm import confirm, confirm_round, storage_failure
from autotune.cli._scaleout import (
    OthersShown,
    describe_shares,
    say_lines,
    start_workers,
    stop_workers,
    worker_log_dir,
)
from autotune.errors import UserError
from autotune.spec import DEFAULT_STORAGE, Spec, load_spec

if TYPE_CHECKING:
    from autotune.scaleout import Workers


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
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
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
    as_worker: Annotated[int | None, typer.Option(hidden=True)] = None,
    verbose: Annotated[bool, flag("--verbose", "-v", help="Show Optuna's logs.")] = False,
) -> None:
    """Run (or resume) the study a space file describes and print the best configuration."""
    from autotune import scaleout

    if as_worker is not None:  # the storage worker 0 runs on, from its environment
        storage = os.environ.pop(scaleout.WORKER_STORAGE_ENV, None) or storage
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

    from rich.live import Live

    from autotune import display
    from autotune import study as studies
    from autotune.distributed import WorkloadSource
    from autotune.executor import InProcessExecutor, WorkerError
    from autotune.hardware import detect
    from autotune.space import restrict
    from autotune.worker import WorkerExecutor
    from autotune.workloads import load as load_workload

    quiet_libraries(verbose)
    try:
        hardware = detect(spec.workload.device)
        if workers is not None and gpus is None and hardware.is_cuda:
            raise scaleout.ScaleOutError(
                f"--workers runs workers on the CPU, and this study trains on "
                f"{hardware.device}: use --gpus (a worker per GPU), or --device cpu"
            )
        if share is not None and share.count > 1:  # its cores are a share of the machine's
            hardware = dataclasses.replace(hardware, cpu_share=True)
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
        raise storage_failure(err, spec.study.storage) from None

    if as_worker is None:  # worker 0 (or the only one) shows the study; the others log
        display.print_plan(
            console, spec, hardware, study, [d.describe() for d in restriction.dropped]
        )
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
    executor = (
        WorkerExecutor(
            spec.workload,
            space_file.parent,
            spec.study.trial_timeout,
            verbose,
            score=spec.objective.score,
        )
        if spec.study.isolation == "worker"
        else InProcessExecutor(
            workload, source=WorkloadSource(spec.workload, space_file.parent, spec.objective.score)
        )
    )
    progress = display.live_progress(console)
    previous_handler = signal.signal(signal.SIGTERM, raise_terminated)
    confirmed = False
    others: Workers | None = None
    started = time.monotonic()  # the study's timeout counts from here, stage 1 included
    try:
        with (
            Live(progress, console=console, refresh_per_second=8) as live,
            contextlib.ExitStack() as showing,
        ):
            observer = display.LiveObserver(study, spec, live, progress)

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
            live.update(progress)
        console.print()  # ends the progress line (piped output has no cursor to move)
        if outcome.stopped_reason:
            stopped = "" if outcome.trials_run == 0 else "Stopped: "
            console.print(Text(f"{stopped}{outcome.stopped_reason}.", style="yellow"))
        finished = studies.counted_trials(study) >= spec.study.n_trials
        plan = spec.study.confirm
        ended_early = bool(outcome.interrupted or outcome.repeated_error or outcome.stage_failed)
        if plan.enabled and finished and not ended_early and as_worker is None:
            try:
                confirmed = confirm_round(study, spec, executor, plan.top, plan.repeats)
            except KeyboardInterrupt as stop:
                outcome.interrupted = True
                outcome.terminated = isinstance(stop, studies.Terminated)
    except WorkerError as err:
        raise fail(str(err), EXIT_FAILED) from None
    except Exception as err:  # the disk filled up, the database became read-only, ...
        raise storage_failure(err, spec.study.storage) from None
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        executor.close()
        if others is not None:  # a path that left them running: never leave them behind
            others.interrupt()
            others.wait(60)

    if as_worker is not None:  # worker 0 confirms and sums up
        _worker_exit(outcome)
    display.print_summary(console, study, spec, outcome, confirmation=confirmed)
    if studies.password_note(spec.study.storage):
        console.print(studies.password_note(spec.study.storage), markup=False)
    if outcome.trials_run:
        from autotune import notes

        try:
            notes.write_note(study, spec.study.storage)  # what optuna-dashboard shows first
        except Exception as err:
            raise storage_failure(err, spec.study.storage) from None
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
    if outcome.timed_out and outcome.trials_run == 0:
        took = (
            f" (stage 1 took {outcome.stage_seconds:.0f} s of it)"
            if outcome.stage_seconds is not None
            else ""
        )
        raise fail(
            f"the timeout of {spec.study.timeout:g} s (study.timeout, or --timeout) ran out "
            f"before the first trial{took}: give the run more time, or bound stage 1 with "
            f"study.speed.max_seconds",
            EXIT_FAILED,
        )
    if outcome.repeated_error:
        speed = studies.speed_study_name(study.study_name)
        kept = (
            f"the failed trials of study {speed}"
            if outcome.repeated_in == "stage 1"
            else "each failed trial"
        )
        if verbose:
            shown = last_traceback(study, outcome.repeated_in)
            if shown:
                console.print(shown, markup=False, highlight=False, soft_wrap=True)
        raise fail(
            [
                f"every trial failed with the same error: {outcome.repeated_error}",
                f"this is a bug in the model or data code, not a bad configuration; the "
                f"traceback is in the fail_traceback attribute of {kept}"
                + ("" if verbose else " (or run with --verbose)"),
            ],
            EXIT_FAILED,
        )
    # one rule for a run whose trials all failed, whatever their messages: it fails too
    never_trained = none_trained(study)
    if never_trained is not None:
        raise fail(never_trained, EXIT_FAILED)


def last_traceback(study: Any, where: str) -> str | None:
    """The traceback of the last failed trial of the study (``where`` "trials") or of its
    stage 1 (``where`` "stage 1"), as stored; None when none was stored."""
    import optuna

    from autotune import study as studies
    from autotune.study import adapter

    if where == "stage 1":
        name = studies.speed_study_name(study.study_name)
        speed = optuna.load_study(study_name=name, storage=adapter.storage_of(study))
        records = [studies.SpeedRecord.of(t) for t in speed.get_trials(deepcopy=False)]
        kept = [r.fail_traceback for r in records if r is not None and r.fail_traceback]
    else:
        trials = study.get_trials(deepcopy=False)
        kept = [t.user_attrs.get("fail_traceback") for t in trials]
        kept = [text for text in kept if text]
    return str(kept[-1]) if kept else None


def none_trained(study: Any) -> str | None:
    """One line when no trial of the study trained to its end (every one failed or was
    stopped), with its trials' commonest reason; None when one did."""
    from collections import Counter

    from optuna.trial import TrialState

    from autotune import study as studies

    if study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    reasons: Counter[str] = Counter()
    for trial in study.get_trials(deepcopy=False):
        record = studies.TrialRecord.of(trial)
        if record.fail_msg:
            reasons[record.fail_msg] += 1
    said = "no trial of the study trained to its end"
    if not reasons:
        return said
    reason, count = reasons.most_common(1)[0]
    return f"{said}; {count} of its trials: {reason}"


def _worker_exit(outcome: Any) -> None:
    """How a worker started by worker 0 ends: a line, and the exit status run would give."""
    console.print(f"{outcome.trials_run} trials run by this worker.", markup=False)
    if outcome.interrupted:
        raise typer.Exit(EXIT_TERMINATED if outcome.terminated else EXIT_INTERRUPTED)
    if outcome.repeated_error or outcome.stage_failed:
        raise typer.Exit(EXIT_FAILED)
    raise typer.Exit(0)


def environment_storage(spec: Spec) -> str | None:
    """$AUTOTUNE_STORAGE, unless the space file names its storage (an explicit study.storage
    comes before an environment's default)."""
    if "storage" in spec.study.model_fields_set:
        return None
    return os.environ.get(STORAGE_ENV) or None


app.command(cls=Command)(confirm)  # after run: --help lists the commands in this order
