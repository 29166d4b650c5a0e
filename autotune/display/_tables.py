"""What a study prints around its trials: stage 1's table, the best trials and the answer
after (the plan before is ``_plan``'s; the round's table and verdict ``_confirmation``'s)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import optuna
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console
from rich.table import Table
from rich.text import Text

from autotune import study as studies
from autotune.display._confirmation import print_confirmation
from autotune.display._text import (
    fit,
    fmt,
    lr_text,
    metric_unit,
    params,
    print_command,
    si,
    study_options,
    visible,
)
from autotune.spacefile import Choice, ObjectiveSpec, Spec, knobs_for
from autotune.stage1._plan import describe

if TYPE_CHECKING:  # torch: the plan is printed by `autotune run` only
    from autotune.speed import SpeedTable


SPEED_COLUMNS = (
    ("micro-batch", True),
    ("precision", False),
    ("samples/s", True),
    ("next best", True),
    ("settings", False),
)


def speed_rows(table: SpeedTable) -> tuple[list[tuple[str | Text, ...]], str | None]:
    """Stage 1's answer in ``SPEED_COLUMNS``: the fastest settings of each micro-batch and
    precision, then a row for each cell where nothing ran, with its first fault; and the
    caption under them, where a row was measured only on a busy machine."""
    rows: list[tuple[str | Text, ...]] = []
    caption = None
    for choice in table:
        if choice.accumulation_steps != min(
            c.accumulation_steps for c in table if c.batch_size == choice.batch_size
        ):
            continue  # one row a micro-batch: accumulation only moves the optimizer's share
        extra = "".join(f", {k} {v}" for k, v in choice.extras)
        behind = choice.runner_up / choice.samples_per_second - 1 if choice.runner_up else None
        # under 1%: one decimal, or a next best 0.3% behind reads "-0%"
        runner_up = "-" if behind is None else f"{behind:+.{int(abs(behind) < 0.01)}%}"
        speed = Text(f"{fmt(choice.samples_per_second)} ±{choice.spread / 2:.0%}")
        settings = Text(describe(choice.settings))
        if choice.interference:  # its choice rests on a figure taken under load: said under it
            speed.append(" busy", style="yellow")
            caption = "busy: its choice rests on a figure taken while others took the cores"
        if not choice.measured:  # left out as stage 1's budget ran out: its trials measure it
            speed = Text("not measured", style="yellow")
            settings.append(" (as the nearest micro-batch measured)", style="dim")
        rows.append((str(choice.batch_size), choice.precision + extra, speed, runner_up, settings))
    unrunnable: dict[tuple[object, ...], str] = {}  # a row a cell: its first fault
    for (batch, _, precision, extras), _, why in table.unrunnable:
        unrunnable.setdefault((batch, precision, extras), why)
    for (batch, precision, _), why in unrunnable.items():
        rows.append((str(batch), str(precision), "-", "-", Text(why, style="red")))
    return rows, caption


def print_speed_table(console: Console, table: SpeedTable) -> None:
    """Stage 1's answer (``speed_rows``), and what the probe of ``batch_size: auto`` found."""
    shown = Table(
        title="Stage 1: the fastest settings per micro-batch",
        title_justify="left",
        caption_justify="left",
    )
    for name, right in SPEED_COLUMNS:
        shown.add_column(name, justify="right" if right else "left")
    rows, shown.caption = speed_rows(table)
    for row in rows:
        shown.add_row(*row)
    console.print(fit(shown, console))
    if table.batch_size_auto:
        console.print(table.batch_size_auto)


def _best_table(study: optuna.Study, spec: Spec) -> Table | None:
    trials = studies.feasible_trials(study)[:5]
    if not trials:
        return None
    unit = metric_unit(spec.objective.metric_name)
    table = Table(title=Text(f"Best trials of {visible(study.study_name)}"), title_justify="left")
    table.add_column("trial", justify="right")
    table.add_column(unit, justify="right", style="bold green")
    table.add_column(spec.objective.score_name, justify="right")
    table.add_column("seconds", justify="right")
    table.add_column("samples/s", justify="right")
    table.add_column("searched knobs", style="cyan", ratio=1)
    for trial in trials:
        record = studies.TrialRecord.of(trial)
        table.add_row(
            str(trial.number),
            fmt(trial.value),
            fmt(record.score),
            fmt(record.charged_seconds),
            fmt(record.samples_per_second),
            Text(params(trial)),  # categorical values are the user's strings
        )
    return table


def knob_rows(trial: FrozenTrial, *more: str) -> list[tuple[str, str, str]]:
    """(knob, value, where the value came from) of a trial's configuration, as the terminal, the
    note and the report show it, and ``more`` of its fields (device, seed); the base batch size
    only where the lr is scaled from it, as the lr's note says."""
    found, record = studies.trial_config(trial), studies.TrialRecord.of(trial)
    config, scaled = found.to_dict(), found.lr_scaling != "none"
    rows = []
    for name in [*knobs_for(found.world_size), *more]:
        note = studies.knob_origin(name, trial.params, record.speed_knobs, record.reference)
        if name == "lr" and scaled:
            note = f"{note}; {lr_text(found)}"
        value = config[name] if scaled or name != "base_batch_size" else None
        rows.append((name, fmt(value), note.strip("; ")))
    return rows


def config_table(trial: FrozenTrial) -> Table:
    """A trial's configuration (``knob_rows``), its processes, device, epochs and seed."""
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_column(style="dim")
    processes = ["world_size"] if studies.trial_config(trial).world_size > 1 else []
    for row in knob_rows(trial, *processes, "device", "epochs", "seed"):
        table.add_row(*map(Text, row))  # Text: a stored value (a device name) is never markup
    return table


def _nearest_miss(study: optuna.Study, spec: Spec) -> str | None:
    """Of a study no trial of which met its bar: the best score a complete trial reached, and
    what would let one reach the bar; None where none completed or the file sets no bar."""
    objective = spec.objective
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    scored = [
        (r.score, t.number) for t in done if (r := studies.TrialRecord.of(t)).score is not None
    ]
    if objective.goal is None or not scored:
        return None
    sign = 1.0 if objective.score_higher_is_better else -1.0
    score, number = max(scored, key=lambda pair: sign * pair[0])
    target = "target_accuracy" if objective.target_accuracy is not None else "target_score"
    bar = "objective." + (objective.bar_name if objective.per_second else target)
    return (
        f"The best {objective.score_name} reached was {score:.4g} (trial {number}). To reach "
        f"{objective.goal:g}: more workload.epochs, another lr range, or a bar the model can "
        f"reach ({bar})."
    )


def _one_score_everywhere(study: optuna.Study, spec: Spec) -> str | None:
    """A warning when three or more complete trials of different learning rates all ended at
    exactly one score: the model predicts the same whatever it learns (segmentation at
    0.859375, every pixel predicted background: the commonest class's share)."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    scores = {studies.TrialRecord.of(trial).score for trial in done}
    rates = {trial.params.get("lr") for trial in done}
    shares = spec.objective.score in ("accuracy", "top5")  # a share, 1 when all is right
    if not shares or len(done) < 3 or len(rates) < 2 or len(scores) != 1 or scores & {1.0, None}:
        return None
    return (
        f"Every trial ended at exactly {spec.objective.score_name} {scores.pop():.6g}, whatever "
        f"its lr: the model gives the same predictions however it trains (one class for "
        f"every sample, the commonest?); check its output and the labels"
    )


def print_summary(
    console: Console,
    study: optuna.Study,
    spec: Spec,
    outcome: studies.RunOutcome,
    confirmation: bool = False,
) -> None:
    """Trial counts, the best trials, the confirmation round (when asked), the answer; nothing
    where no trial of the study has finished (a run stopped in stage 1: its ending says why).
    The answer of a study short of its trials is the best so far, not advised for confirming
    (the run that finishes the study confirms it)."""
    if not finished_any(study):
        return
    pruned = study.get_trials(deepcopy=False, states=(TrialState.PRUNED,))
    lost = sum(studies.TrialRecord.of(t).fail_kind == "cannot_win" for t in pruned)
    said = f" ({lost} of them could not win)" if lost else ""
    counts = ", ".join(
        f"{n} {ending}{said if ending == 'pruned' else ''}" for ending, n in outcome.states.items()
    )
    console.print(f"{outcome.trials_run} trials this run; the study has {counts or 'none'}.")
    if (stuck := _one_score_everywhere(study, spec)) is not None:
        console.print(stuck, style="yellow")
    table = _best_table(study, spec)
    if table is None:
        console.print(no_answer(spec.objective), style="yellow")
        if (nearest := _nearest_miss(study, spec)) is not None:
            console.print(nearest)
        return
    console.print(fit(table, console))
    answer = studies.answer_of(study)
    assert answer is not None  # a feasible trial is in the table
    if confirmation:
        print_confirmation(console, answer, spec, study.study_name)
    finished = outcome.timed_out or studies.counted_trials(study) >= spec.study.n_trials
    how = "confirmed" if answer.confirmed else "not confirmed"
    so_far = "" if finished else " so far"
    console.print(f"\n[bold]Best configuration{so_far}[/] (trial {answer.number}, {how}):")
    console.print(config_table(answer.trial))
    if (edge := _edge_of_space(study, answer, spec, outcome.speed_table)) is not None:
        console.print(edge, style="yellow")
    where = study_options(study.study_name, spec.study.storage)
    console.print()
    print_command(console, "Inspect the study:", "autotune", "dashboard", *where[2:])
    # the run stopped before its round, or trials since have changed the leaders
    unsure = answer.round_state in ("none", "unfinished", "stale")
    if unsure and finished and spec.study.confirm.enabled:
        print_command(console, "Confirm it:       ", "autotune", "confirm", *where)
    print_command(console, "Print the winner: ", "autotune", "best", *where)


def off_stage_one(record: studies.TrialRecord) -> float | None:
    """How far a trial trained off stage 1's prediction of its samples/s (-0.3: 30% slower),
    where the study flagged it (``speed_mismatch``); None elsewhere."""
    if not record.speed_mismatch or not record.predicted_samples_per_second:
        return None
    return (record.samples_per_second or 0) / record.predicted_samples_per_second - 1


def measured_flags(record: studies.TrialRecord) -> list[str]:
    """What marks a complete trial's measurement, on its line and in the report's trial table:
    "interference 81%" (others took that share of the cores), a leak, "30% slower than stage 1"."""
    flags = [f"interference {record.other_cpu_share or 0:.0%}"] * bool(record.interference)
    if record.memory_left_bytes:  # a leak: the next trial got a fresh worker
        flags.append(f"{si(record.memory_left_bytes)}B of device memory not freed")
    if (off := off_stage_one(record)) is not None:  # "off" read as slower either way
        flags.append(f"{abs(off):.0%} {'faster' if off > 0 else 'slower'} than stage 1")
    return flags


def finished_any(study: optuna.Study) -> bool:
    """Whether a trial of the study has ended (completed, pruned or failed)."""
    return any(trial.state.is_finished() for trial in study.get_trials(deepcopy=False))


def no_answer(objective: ObjectiveSpec | None, finished: bool = True) -> str:
    """What the terminal, the note and the report say of a study with no feasible trial, and
    the score none reached where the space file (``objective``) sets one; of a study none of
    whose trials has ``finished``, only that."""
    if not finished:
        return "No trial has finished yet."
    bar = objective.goal if objective is not None else None
    reason = f" (none reached {objective.score_name} {bar:g})" if objective and bar else ""
    return f"No trial has completed feasibly yet{reason}."


def _edge_of_space(
    study: optuna.Study, answer: studies.Answer, spec: Spec, table: SpeedTable | None
) -> str | None:
    """One line when the answer's micro-batch is the largest the space offers while stage 1
    still ran it over ``MIN_GAIN`` faster than the next smaller (a doubling that paid), with
    memory to spare (its trial's peak under half the GPU's): the fastest batch may lie beyond
    the space. None for ``batch_size: auto``: its probe said why it went no further."""
    from autotune.stage1._probe import MIN_GAIN

    offered = spec.space.batch_size
    if table is None or not isinstance(offered, Choice) or offered.auto or len(offered.values) < 2:
        return None
    config = studies.trial_config(answer.trial)
    largest = int(max(offered.values))  # batch sizes: ints
    found = table.gain_at(largest, config.precision)
    if config.batch_size != largest or found is None or found[1] <= MIN_GAIN:
        return None
    peak = studies.TrialRecord.of(answer.trial).peak_memory_bytes
    memory = (studies.StudyRecord.of(study).hardware or {}).get("gpu_memory_bytes")
    if memory and peak and 2 * peak > memory:
        return None  # twice the batch would not fit
    smaller, gain = found
    return (
        f"The answer trains micro-batches of {largest}, the largest space.batch_size offers, "
        f"and stage 1 ran {largest} {gain:.0%} faster than {smaller}: add {2 * largest} to "
        "space.batch_size to try larger ones (or batch_size: auto to find them)."
    )
