"""``autotune verify`` for people: what it will train and for about how long, a line per
evaluation while it trains, then the configurations at full length and what that says of the
answer."""

from __future__ import annotations

import math
from collections.abc import Callable

import optuna
from rich.console import Console
from rich.table import Table

from autotune import study as studies
from autotune.display._text import fmt
from autotune.results import Evaluation
from autotune.spec import Spec

ROLE_NAMES: dict[str, str] = {"answer": "the answer"} | dict(studies.REFERENCE_NAMES)
LINES_PER_RUN = 10  # evaluations shown while a run trains: about this many


def _named(role: str, trial: int) -> str:
    return f"{ROLE_NAMES[role]} (trial {trial})"


def _seconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3g}"


def print_verify_plan(
    console: Console, chosen: list[tuple[str, optuna.trial.FrozenTrial]], epochs: float, runs: int
) -> None:
    """What verify trains, and about how long it takes (from each trial's own pace)."""
    seconds = 0.0
    for _, trial in chosen:
        record = studies.TrialRecord.of(trial)
        if record.train_seconds and record.epochs_trained:
            seconds += record.train_seconds / record.epochs_trained * epochs * runs
    names = [_named(role, trial.number) for role, trial in chosen]
    listed = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
    took = f"{seconds:.0f} s" if seconds < 90 else f"{math.ceil(seconds / 60)} min"
    console.print(
        f"Verifying at {epochs:g} epochs: {listed}, {runs} run{'s' * (runs > 1)} each, one "
        f"after another; about {took} of training (from their trials' pace).",
        markup=False,
    )


def verify_progress(console: Console, spec: Spec, epochs: float) -> Callable[..., None]:
    """A line for about every tenth evaluation of a run, and its last."""
    evaluations = math.ceil(epochs / spec.workload.eval_every)
    every = max(1, math.ceil(evaluations / LINES_PER_RUN))

    def heard(role: str, trial: int, evaluation: Evaluation) -> None:
        if evaluation.index % every and not evaluation.final:
            return
        console.print(
            f"  {_named(role, trial)}  epoch {evaluation.epoch:g}/{epochs:g}  "
            f"{spec.objective.score_name} {evaluation.score:.4f}  "
            f"{evaluation.train_seconds:.3g} s",
            markup=False,
            highlight=False,
        )

    return heard


def print_verification(console: Console, verified: studies.Verification, spec: Spec) -> None:
    """The table (final score, training time, time to the target) and the answer's speed-up in
    time to the target over each reference, or where the short trials' ranking does not hold."""
    higher = spec.objective.score_higher_is_better
    target = verified.target
    table = Table(title=f"At {verified.epochs:g} epochs", title_justify="left")
    table.add_column("configuration")
    table.add_column(f"final {spec.objective.score_name}", justify="right")
    table.add_column("training s", justify="right")
    if target is not None:
        table.add_column(f"s to {target:g}", justify="right")
    for role in ROLE_NAMES:
        runs = verified.of_role(role)
        if not runs:
            continue
        final = verified.median(role, lambda run: run.final_score)
        seconds = verified.median(role, lambda run: run.seconds)
        row = [_named(role, runs[0].trial), fmt(final), _seconds(seconds)]
        if target is not None:
            reached = verified.time_to_target(role, higher)
            row.append("never" if reached is None else _seconds(reached))
        table.add_row(*row)
    console.print(table)
    losses = verified.losses(higher)
    for role, how in losses:
        console.print(
            f"The short trials' ranking does not hold: {ROLE_NAMES[role]} {how}.",
            style="yellow",
            markup=False,
        )
    if losses:
        console.print(
            f"Lengthen the trials (workload.epochs) toward the real run, or run a study with "
            f"trials of {verified.epochs:g} epochs, and verify again.",
            markup=False,
        )
        return
    answer_time = verified.time_to_target("answer", higher)
    sooner = [
        f"{their / answer_time:.2f}x sooner than {ROLE_NAMES[role]}"
        for role in studies.REFERENCE_NAMES
        if answer_time and (their := verified.time_to_target(role, higher)) is not None
    ]
    if sooner and target is not None:
        console.print(f"The answer reaches {target:g} " + " and ".join(sooner) + ".")
