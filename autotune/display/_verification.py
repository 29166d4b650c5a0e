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
from autotune.display._text import duration, fit, fmt, plural, score_text
from autotune.results import Evaluation
from autotune.spacefile import Spec

LINES_PER_RUN = 10  # evaluations shown while a run trains: about this many


def print_verify_plan(
    console: Console,
    left: list[tuple[str, optuna.trial.FrozenTrial, int]],
    epochs: float,
    kept: int = 0,
) -> None:
    """What verify still trains (``left``: role, trial, repeat) beside the ``kept`` runs stored
    already, and about how long it takes (from each trial's own pace); that nothing is left,
    where the runs are stored."""
    if not left:
        console.print(f"Verified at {epochs:g} epochs before: the runs stored with the study.")
        return
    seconds = 0.0
    for _, trial, _ in left:
        record = studies.TrialRecord.of(trial)
        if record.train_seconds and record.epochs_trained:
            seconds += record.train_seconds / record.epochs_trained * epochs
    names = list(dict.fromkeys(studies.role_name(role, trial.number) for role, trial, _ in left))
    # a new user's --repeats 3 read "4 runs" where 2 of the 6 were stored: said
    stored = f", beside the {kept} stored at {epochs:g} epochs" if kept else ""
    console.print(
        f"Verifying at {epochs:g} epochs: {studies.listed(names)}, {plural(len(left), 'run')} "
        f"one after another{stored}; about {duration(seconds)} of training (from their trials' "
        "pace).",
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
            f"  {studies.role_name(role, trial)}  epoch {evaluation.epoch:g}/{epochs:g}  "
            f"{score_text(spec.objective, evaluation.score, short=False)}  "
            f"{fmt(evaluation.train_seconds)} s",
            markup=False,
            highlight=False,
        )

    return heard


def verification_rows(
    verified: studies.Verification, score_name: str, higher: bool, per_second: bool
) -> tuple[list[list[str]], list[str]]:
    """verify's table as the terminal and the note show it, its header first (final score,
    training seconds, seconds to the target: a row per configuration), and its verdict: a line
    per reference that beats the answer at full length on the study's metric, or that the
    ranking holds; then a line per reference that ends with a better score."""
    reach = [f"s to {verified.target:g}"] if verified.target is not None else []
    rows = [["configuration", f"final {score_name}", "training s", *reach]]
    for row in verified.rows(higher):
        reached = ["never" if row.to_target is None else fmt(row.to_target)] if reach else []
        rows.append([row.name, fmt(row.final_score), fmt(row.seconds), *reached])
    said = "The short trials' ranking does not hold"
    losses = [f"{said}: {name} {how}." for name, how in verified.losses(higher, per_second)]
    others = [studies.role_name(row.role) for row in verified.rows(higher) if row.role != "answer"]
    unlike = verified.unlike_loads()
    loads = [
        f"The runs were measured under unlike loads (others' share of the cores: {unlike}): "
        "their times compare the loads as much as the configurations; verify again on a "
        "quiet machine."
    ] * bool(unlike)
    better = [
        f"{name[0].upper()}{name[1:]} ends with a better {score_name}, {how}: the answer trades "
        f"it for speed; where the final {score_name} matters more, lengthen the trials "
        "(workload.epochs) toward the real run, or ask for a higher min_score."
        for name, how in verified.ends_better(higher)
    ]
    if losses or not others:  # nothing verified beside the answer: no ranking to hold
        return rows, [*losses, *better, *loads]
    arrives = verified.time_to_target("answer", higher) is not None
    measure = [f"trains the most {score_name} per second"] if per_second else []
    measure += [f"reaches {verified.target:g} first"] if reach and arrives else []
    holds = f"the answer {' and '.join(measure) or 'is not beaten'}, within noise"
    holds = f"{holds}, against {studies.listed(others)}"
    return rows, [f"The short trials' ranking holds at full length: {holds}.", *better, *loads]


def print_verification(console: Console, verified: studies.Verification, spec: Spec) -> None:
    """The table, whether the short trials' ranking holds, and the answer's speed-up in time to
    the target over each reference (where it does not hold: what to do; none between runs
    under unlike loads, whose times compare the loads)."""
    higher, target = spec.objective.score_higher_is_better, verified.target
    per_second = spec.objective.per_second
    (head, *rows), verdict = verification_rows(
        verified, spec.objective.score_name, higher, per_second
    )
    holds = not verified.losses(higher, per_second)
    table = Table(title=f"At {verified.epochs:g} epochs", title_justify="left")
    for column, name in enumerate(head):
        table.add_column(name, justify="right" if column else "left")
    for cells in rows:
        table.add_row(*cells)
    console.print(fit(table, console))
    for line in verdict:
        console.print(line, style=None if holds else "yellow", markup=False)
    if not holds:
        console.print(
            f"Lengthen the trials (workload.epochs) toward the real run, or run a study with "
            f"trials of {verified.epochs:g} epochs, and verify again.",
            markup=False,
        )
        return
    answer_time = verified.time_to_target("answer", higher)
    sooner = [
        f"{row.to_target / answer_time:.2f}x sooner than {studies.role_name(row.role)}"
        for row in verified.rows(higher)
        if row.role != "answer" and answer_time and row.to_target is not None
    ]
    if sooner and target is not None and not verified.unlike_loads():  # else: loads compared
        console.print(f"The answer reaches {target:g} " + " and ".join(sooner) + ".")
