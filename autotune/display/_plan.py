"""What a run says before it starts: its plan (the device, what stage 1 times and about how
long it takes, what stage 2 searches, the references) and the warnings that go with it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from autotune import study as studies
from autotune.display._text import duration, plural, print_item, visible
from autotune.knobs import SPEED_KNOBS, SPLIT_KNOBS
from autotune.spacefile import Choice, Spec
from autotune.stage1._plan import SpeedPlan, describe
from autotune.storage import adapter

if TYPE_CHECKING:  # torch: the plan is printed by `autotune run` only
    from autotune.machine.hardware import Hardware


def print_plan(
    console: Console, spec: Spec, hardware: Hardware, study: optuna.Study, dropped: list[str]
) -> None:
    """The study, its storage, device, workload and knobs searched, an item a line (long
    values on lines of their own: the storage URL is never broken)."""
    counted = studies.counted_trials(study)
    resumed = f", resuming with {counted} done" if counted else ""
    goal = f"{spec.objective.metric_name}, {spec.study.n_trials} trials{resumed}"
    print_item(console, "study", f"{visible(study.study_name)} ({goal})")
    print_item(console, "storage", studies.display_url(spec.study.storage), copy=True)
    database = studies.sqlite_path(spec.study.storage)
    if database is not None and not database.is_absolute():  # another folder: another database
        where = Text(f"  relative to this folder: {database.resolve()}")
        console.print(where, soft_wrap=True, highlight=False)  # a path to copy: never broken
    device = f"{hardware.device} ({hardware.device_name}, torch {hardware.torch_version})"
    print_item(console, "device", device)
    workload = spec.workload
    epochs = f"{workload.epochs:g} epoch{'s' * (workload.epochs != 1)}"
    trained = f"{workload.model} on {workload.data}, {epochs} per trial"
    print_item(console, "workload", trained)
    if workload.gpus_per_trial > 1:
        processes = workload.gpus_per_trial
        each = "a GPU each (NCCL)" if hardware.is_cuda else "a share of the cores each (gloo)"
        print_item(
            console,
            "processes",
            f"{processes} per trial under DDP, {each}; batch_size is per process, the "
            f"effective batch is every process's",
        )
    if spec.space.batch_size_auto:
        spec, found = _auto_batch(spec, study)
        print_item(console, "batch_size", found.removeprefix("batch_size "))
    searched = spec.space.searched()
    varied = bool(searched)  # the trials differ in some knob (two-stage: in stage 2)
    if spec.study.strategy == "two_stage":
        declared = spec.study.learning_knobs
        timed = [k for k in searched if k in SPEED_KNOBS and k not in declared]
        split = [k for k in searched if k in SPLIT_KNOBS and k not in declared]
        learned = [k for k in searched if k not in timed and k not in split]
        if split and not any(k in declared for k in SPLIT_KNOBS):
            learned.insert(1 if "lr" in learned else 0, "effective_batch_size")
        if len(split) > 1:  # one split knob alone is the effective batch, searched in stage 2
            timed.append(f"the split of each effective batch into {' x '.join(split)}")
        only = "each micro-batch's speed: no execution knob to choose"  # not "timing nothing"
        print_item(console, "timing", f"{', '.join(timed) or only} (stage 1: speed)")
        print_item(console, "stage 1", stage_one_plan(spec, hardware, _measured_before(study)))
        print_item(console, "searching", f"{', '.join(learned) or 'nothing'} (stage 2: learning)")
        varied = bool(learned)
    else:
        print_item(console, "searching", ", ".join(searched) if searched else "nothing")
    named, references = _references(spec, hardware)
    print_item(console, "references", named)
    if (alone := _tries_nothing(spec, references, varied)) is not None:
        console.print(f"[yellow]note:[/] {escape(alone)}")
    for line in dropped:
        console.print(f"[yellow]not searched:[/] {escape(line)}")
    print_other_device(console, study, hardware.device_name, cores_said=True)
    workers = spec.space.num_workers
    most = max(workers.values) if isinstance(workers, Choice) else workers.high
    if isinstance(most, int) and most > hardware.cpu_count:
        console.print(
            f"[yellow]note:[/] num_workers goes up to {most} on {hardware.cpu_count} CPU cores"
        )


def _tries_nothing(spec: Spec, references: int, searched: bool) -> str | None:
    """Why the study will try no configuration besides its ``references`` (how many), said
    before anything runs; None where it tries some."""
    if not searched:
        return (
            "nothing to search: every trial trains the same configuration, a new seed each; "
            "add a space section to search"
        )
    if spec.study.n_trials <= references:
        which = "reference" if references == 1 else f"{references} references"
        return (
            f"study.n_trials {spec.study.n_trials} leaves no trial beside the {which}: no "
            f"other configuration will be tried"
        )
    return None


def _references(spec: Spec, hardware: Hardware) -> tuple[str, int]:
    """The references the study trains beside its search, and why the tuning checklist is not
    one where it is not (``study._open.queue_reference`` queues them); and how many."""
    from autotune.search import references

    named = [studies.REFERENCE_NAMES["baseline"]] if spec.study.baseline is not False else []
    why = None
    if not spec.study.checklist:
        why = "switched off in the space file"
    elif references.checklist_params(spec, hardware) is None:
        why = "this space leaves it nothing to set beyond the untuned baseline"
    else:
        named.append(studies.REFERENCE_NAMES["checklist"])
    shown = " and ".join(named) or "none"
    return shown + (f"; no tuning checklist: {why}" if why else ""), len(named)


def print_other_device(
    console: Console, study: optuna.Study, device_name: str, cores_said: bool = False
) -> None:
    """A warning where ``study`` was created on another device than ``device_name``;
    ``cores_said``: not where only the CPU's core count differs (the run's plan says that in
    a line of its own, with what to do)."""
    created_on = studies.StudyRecord.of(study).created_on
    if cores_said and created_on and _cpu(created_on) == _cpu(device_name):
        return
    if created_on and created_on != device_name:
        console.print(
            f"[yellow]warning:[/] this study was created on {escape(created_on)}; what is "
            f"measured on {escape(device_name)} will be compared with its trials"
        )


def _cpu(device_name: str) -> str:
    """A device's name without its core count: "AMD EPYC" of "AMD EPYC (2 cores)"."""
    return re.sub(r" \(\d+ cores?\)$", "", device_name)


def _auto_batch(spec: Spec, study: optuna.Study) -> tuple[Spec, str]:
    """``batch_size: auto`` as the plan shows it: the study's micro-batches and the probe's
    line once it ran, else its first doubling and what the probe will do."""
    from autotune.stage1._probe import MIN_GAIN

    record = studies.StudyRecord.of(study)
    if record.batch_sizes:
        return spec.with_batch_sizes(tuple(record.batch_sizes)), record.batch_size_auto or ""
    start = int(spec.space.batch_size.values[0])  # type: ignore[union-attr]  # auto: a Choice
    return spec.with_batch_sizes((start, 2 * start)), (
        f"auto: doubled from {start} before stage 1 until out of memory (then halfway to it), "
        f"a doubling that gains under {MIN_GAIN:.0%} samples/s, or the training set's size (the "
        f"estimate below counts {start} and {2 * start}; the budget counts the whole probe)"
    )


def _measured_before(study: optuna.Study) -> int:
    """How many measurements the study's own speed study holds (stage 1 of an earlier run of
    it), read from the storage alone: the plan is printed before the workload loads."""
    storage = adapter.storage_of(study)
    try:
        speed_id = storage.get_study_id_from_name(studies.speed_study_name(study.study_name))
    except KeyError:
        return 0
    return storage.get_n_trials(speed_id, state=TrialState.COMPLETE)


def stage_one_plan(spec: Spec, hardware: Hardware, measured_before: int = 0) -> str:
    """What stage 1 will time and about how long it takes, said before it starts: its
    measurements, cold compiles, an estimate from guessed compile times (``measured_before``:
    the study's speed study holds that many measurements, whose settings are not timed
    again), its budget, and what it times first (``SpeedPlan.predicted``,
    ``SpeedPlan.reference``)."""
    speed = spec.study.speed
    plan = SpeedPlan.for_hardware(spec, hardware)
    estimate = plan.estimate(speed.burst_seconds, speed.bursts, speed.repeats)
    cells = f"{plural(estimate.cells, 'cell')} (a micro-batch and a precision each)"
    words = [f"{plural(estimate.measurements, 'measurement')} of {cells}"]
    if estimate.graphs:
        words.append(
            f"{estimate.graphs_first_cells} to {estimate.graphs} cold compiles (one per "
            f"distinct graph; a mode that cannot pay back is dropped after its first cell)"
        )
    low, high = duration(estimate.low_seconds), duration(estimate.high_seconds)
    words.append(f"about {low}" if low == high else f"about {low} to {high}")
    if measured_before:
        words[-1] += (
            f" (measured before: settings covered by its "
            f"{plural(measured_before, 'stored measurement')} are reused, unless --remeasure)"
        )
    budget = speed.budget_seconds(spec.study.timeout)
    if spec.study.timeout and budget < speed.max_seconds:
        bound = f"half of study.timeout {spec.study.timeout:g} s, which counts stage 1"
    else:
        bound = "study.speed.max_seconds"
    words.append(f"at most {duration(budget)} ({bound})")
    first = plan.predicted()[0]
    checklist = f"the tuning checklist's settings ({describe(plan.reference(first))})"
    if len(plan.all_settings(first)) == 1:  # nothing else to time in a cell
        words.append(f"each cell timed with {checklist}, from {first.label()} down")
    else:
        words.append(
            f"each cell timed first with {checklist}, from {first.label()} down; then the "
            "fastest cells' other settings"
        )
    return "; ".join(words)


# stage 1's table, as the terminal and the report show it: (column, right-justified)
