"""``verify``: the answer, the tuning checklist and the untuned baseline trained for the full
run, one after another, and who reaches the target first (``study._verify``). Registered by
``_run`` after ``confirm``."""

from __future__ import annotations

from typing import Annotated

import typer

from autotune.cli._common import (
    EXIT_FAILED,
    console,
    fail,
    flag,
    in_range,
    storage_option,
    study_option,
)
from autotune.cli._confirm import open_to_train, training, write_note
from autotune.spacefile import DEFAULT_STORAGE


def verify(
    study_name: Annotated[str | None, study_option()] = None,
    storage: Annotated[str, storage_option()] = DEFAULT_STORAGE,
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
    isolation: Annotated[
        str | None, typer.Option(help="worker or none. Default: study.isolation.")
    ] = None,
) -> None:
    """Train the answer and the references for the full run and show who reaches the target
    first, and whether the short trials' ranking holds.

    It trains, so it imports the workload's model and data functions named in the study's space
    file. Finished runs are stored with the study: the same command resumes.
    """
    in_range("--epochs", epochs, 1e-3, 100_000)
    in_range("--repeats", repeats, 1, 1000)
    from autotune import display
    from autotune import study as studies

    found, spec, executor = open_to_train(study_name, storage, isolation)
    goal = spec.objective
    epochs = epochs or goal.full_run_epochs
    with training(executor, storage):  # which closes the executor however it ends
        if epochs is None:
            raise fail(
                f"study '{found.study_name}' sets no objective.full_run_epochs: say how long "
                f"the real run is with --epochs",
                EXIT_FAILED,
            )
        if not studies.verify_candidates(found):
            raise fail(f"study '{found.study_name}' has no feasible trial to verify", EXIT_FAILED)
        left = studies.runs_left(found, epochs, repeats, runner_up)
        display.print_verify_plan(console, left, epochs)
        verified = studies.verify_study(
            found,
            executor,
            epochs,
            target if target is not None else goal.goal,
            repeats,
            on_evaluation=display.verify_progress(console, spec, epochs),
            on_wait=lambda line: console.print(f"  {line}", style="dim", markup=False),
            runner_up=runner_up,
        )
    display.print_verification(console, verified, spec)
    write_note(found, storage)
