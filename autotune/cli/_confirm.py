"""The commands that train a stored study's configurations again: ``confirm`` (the
confirmation round, run or resumed on its own) and ``verify`` (the answer, the tuning checklist
and the untuned baseline trained for the full run, one after another, and who reaches the
target first: ``study._verify``); what they share: the study opened to train, running a round,
and what they say around their training runs. The commands are registered by ``_run`` after
``run``, in the order --help lists them."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from autotune.cli._common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    STORAGE_OPTION,
    STUDY_OPTION,
    console,
    fail,
    flag,
    in_range,
    quiet_libraries,
)
from autotune.spacefile import DEFAULT_STORAGE
from autotune.stops import Terminated, handled

ISOLATION_OPTION = typer.Option(help="worker or none. Default: study.isolation.")


def say_storage_waits(retry: Any) -> None:
    """Have ``retry`` (an ``OutageRetry``) print, outside the live display, when the study's
    database stops answering and when it answers again."""
    from autotune import display

    retry.on_wait = lambda problem, seconds: console.print(
        display.storage_waiting(problem, seconds)
    )
    retry.on_back = lambda seconds: console.print(display.storage_back(seconds))


def open_to_train(
    study_name: str | None,
    storage: str,
    isolation: str | None,
    check: Callable[[Any, Any], None] = lambda found, spec: None,
) -> tuple[Any, Any, Any]:
    """The study (the storage's only one where none is named), its space file as stored, and
    an executor as its runs had (``isolation``: worker or none, default study.isolation); a
    warning where it was created on another device. A UserError where it cannot train;
    ``check`` (study, space file) raises what else refuses it, before a worker starts."""
    from autotune import display, export, session
    from autotune import study as studies
    from autotune.machine.hardware import detect
    from autotune.storage import adapter

    quiet_libraries(verbose=False)
    found = studies.load_study(study_name, storage, "write")
    stored = export.study_spec(found)
    if stored is None:
        raise studies.StudyError(
            f"study '{found.study_name}' holds no readable space file: it cannot train again"
        )
    spec = stored.with_overrides(study={"storage": storage})  # where it is, as commands say
    retry = adapter.outage_retry_of(adapter.storage_of(found))
    retry.seconds = spec.study.storage_outage  # as long as the study's own runs wait
    say_storage_waits(retry)
    check(found, spec)
    record = studies.StudyRecord.of(found)
    base_dir = Path(record.space_file_dir) if record.space_file_dir else None
    hardware = detect(spec.workload.device)
    trains = spec.with_overrides(study={"isolation": isolation})  # as its runs, or told
    executor = session.executor_for(trains, base_dir)
    display.print_other_device(console, found, hardware.device_name)
    return found, spec, executor


def confirm_round(
    study: Any, spec: Any, executor: Any, top: int, repeats: int, again: bool = False
) -> bool:
    """Run (or resume) the confirmation round, a line per run (``again``: a new round, the
    stored one replaced); whether one exists now."""
    from autotune import display, session
    from autotune import study as studies

    def starting(plan: Any) -> None:  # a ConfirmationRecord: what it keeps, what it runs
        leaders = len(plan.candidates) - len(plan.references)  # 0: a reference leads
        named = list(plan.references)
        if leaders:
            # searched: a reference among the leaders is named as itself (a new user read "the
            # best configuration" beside the checklist, which was the best)
            one = "the best searched configuration"
            named.insert(0, one if leaders == 1 else f"the {leaders} best searched")
        beside = studies.listed(named)
        todo = plan.runs_left()  # a retake left counts; runs measured again count once
        if not plan.repeats:  # a lone configuration: nothing to compare it with
            console.print(f"No round: {beside} is the only configuration to measure.")
            return
        kept = len(plan.candidates) * plan.repeats - todo
        if not todo:
            where = display.study_options(study.study_name, spec.study.storage)
            more = display.command(
                "autotune", "confirm", *where, "--repeats", f"{plan.repeats + 1}"
            )
            console.print(
                f"Nothing new to measure: the round of {beside} has its {kept} runs "
                f"({plan.repeats} more of each); {more} adds one more of each."
            )
            return
        more = f", beside the {kept} the round has" if kept else ""
        console.print(f"Confirming {beside}: {display.plural(todo, 'run')}{more}, interleaved.")

    inputs = studies.ConfirmationInputs(
        study,
        spec.objective,
        executor,
        top,
        repeats,
        on_run=display.confirmation_progress(console, spec),
        on_start=starting,
        on_wait=lambda line: console.print(f"  {line}", style="dim", markup=False),
        again=again,
    )
    other = "Waiting for another process of this study, which runs its confirmation round."
    return session.confirm_answer(inputs, lambda: console.print(other, style="dim"))


def confirm(
    study_name: Annotated[str | None, STUDY_OPTION] = None,
    storage: Annotated[str, STORAGE_OPTION] = DEFAULT_STORAGE,
    top: Annotated[
        int | None,
        typer.Option(help="Confirm this many leaders. Default: study.confirm.top."),
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option(help="More runs of each. Default: study.confirm.repeats."),
    ] = None,
    isolation: Annotated[str | None, ISOLATION_OPTION] = None,
    again: Annotated[
        bool,
        flag("--again", help="A new round of the leaders, replacing the stored one."),
    ] = False,
) -> None:
    """Re-measure the leaders and references side by side.

    The round names the study's answer. It runs the confirmation round, or resumes it. A
    larger --repeats than the stored round's adds runs to that round; a smaller one keeps it as
    it is. Other leaders (another --top, or trials finished since the round) start a new round;
    so does --again (a noisy round measured again on a quieter machine).
    It trains, so it imports the workload's model and data functions named in the study's
    space file.
    """
    in_range("--top", top, 1)
    in_range("--repeats", repeats, 1)
    from autotune import display
    from autotune import study as studies

    found, spec, executor = open_to_train(study_name, storage, isolation)
    before = studies.answer_of(found)
    # a new round is stored as it starts: without --again the same command resumes it
    resume = "run the same command without --again" if again else "run the same command"
    with training(executor, storage, resume):
        confirmed = confirm_round(
            found,
            spec,
            executor,
            top or spec.study.confirm.top,
            repeats or spec.study.confirm.repeats,
            again,
        )
    answer = studies.answer_of(found)
    if not confirmed or answer is None:
        raise fail(f"study '{found.study_name}' has no feasible trial to confirm", EXIT_FAILED)
    display.print_confirmation(console, answer, spec, found.study_name)
    if before is not None and before.number != answer.number:  # an export follows the old one
        export = shlex.join(
            ["autotune", "export", *display.study_options(found.study_name, storage)]
        )
        console.print(
            f"The answer changed: trial {before.number} before this round, trial {answer.number} "
            f"now; what was exported of trial {before.number} no longer follows the study "
            f"(export again: {export}).",
            style="yellow",
            markup=False,
        )
    write_note(found, storage)


def write_note(study: Any, storage: str) -> None:
    """The study's note in optuna-dashboard, after a command trained: a convenience (what it
    ran is stored), so a failure to write it is not said."""
    from autotune.outputs import notes

    with contextlib.suppress(Exception):
        notes.write_note(study, storage)


@contextlib.contextmanager
def training(executor: Any, storage: str, resume: str = "run the same command") -> Iterator[None]:
    """Around a command's training runs (``confirm``, ``verify``): SIGTERM as an interruption;
    a worker that cannot start, or a storage fault, in one line (exit 1); an interruption keeps
    what finished, says how to ``resume``, and exits 130 (143 for SIGTERM); the executor
    closed in the end."""
    from autotune import session

    try:
        stops, faults = handled(sigterm=True), session.storage_faults(storage)
        with stops, faults, contextlib.closing(executor):
            yield
    except KeyboardInterrupt as stop:
        terminated = isinstance(stop, Terminated)
        console.print(f"[yellow]Interrupted.[/] The finished runs are saved; {resume} to resume.")
        raise typer.Exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED) from None


def verify(
    study_name: Annotated[str | None, STUDY_OPTION] = None,
    storage: Annotated[str, STORAGE_OPTION] = DEFAULT_STORAGE,
    epochs: Annotated[
        float | None,
        typer.Option(help="Epochs of each run. Default: objective.full_run_epochs."),
    ] = None,
    target: Annotated[
        float | None,
        typer.Option(help="The score to reach. Default: the study's min_score or target_score."),
    ] = None,
    repeats: Annotated[int, typer.Option(help="Runs of each configuration.")] = 1,
    runner_up: Annotated[
        bool, flag("--runner-up", help="Also the best other feasible trial.")
    ] = False,
    isolation: Annotated[str | None, ISOLATION_OPTION] = None,
) -> None:
    """Train the answer and the references for the full run.

    It shows who reaches the target first, and whether the short trials' ranking holds. It
    trains, so it imports the workload's model and data functions named in the study's space
    file. Finished runs are stored with the study: the same command resumes.
    """
    in_range("--epochs", epochs, 1e-3, 100_000)
    in_range("--repeats", repeats, 1, 1000)
    from autotune import display
    from autotune import study as studies

    def check(found: Any, spec: Any) -> None:  # before a worker starts (seconds)
        if not (epochs or spec.objective.full_run_epochs):
            raise fail(
                f"study '{found.study_name}' sets no objective.full_run_epochs: say how long "
                f"the real run is with --epochs",
                EXIT_FAILED,
            )
        if not studies.verify_candidates(found):
            raise fail(f"study '{found.study_name}' has no feasible trial to verify", EXIT_FAILED)

    found, spec, executor = open_to_train(study_name, storage, isolation, check)
    goal = spec.objective
    epochs = epochs or goal.full_run_epochs
    assert epochs is not None  # (check)
    with training(executor, storage):  # which closes the executor however it ends
        inputs = studies.VerifyInputs(
            found,
            executor,
            epochs,
            target if target is not None else goal.goal,
            repeats,
            runner_up,
            on_evaluation=display.verify_progress(console, spec, epochs),
            on_wait=lambda line: console.print(f"  {line}", style="dim", markup=False),
        )
        left, kept = studies.runs_left(inputs), studies.runs_kept(inputs)
        display.print_verify_plan(console, left, epochs, kept)
        verified = studies.verify_study(inputs)
    display.print_verification(console, verified, spec)
    write_note(found, storage)
