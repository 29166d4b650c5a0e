"""What autotune says about a study where people look first: the summary of its answer, the
note optuna-dashboard shows (the files attached to the study: artifacts.py)."""

from __future__ import annotations

import contextlib
import datetime
import functools
import math
import re
from collections import Counter
from collections.abc import Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune._version import __version__
from autotune.display import (
    finished_any,
    fmt,
    knob_rows,
    no_answer,
    study_options,
    verification_rows,
)
from autotune.export import TrialConfirmation, confirmation_text, study_spec
from autotune.results import PHASES
from autotune.spacefile import DEFAULT_STORAGE
from autotune.storage import adapter
from autotune.study import (
    REFERENCE_NAMES,
    Answer,
    StudyRecord,
    TrialRecord,
    Verification,
    answer_of,
    feasible_trials,
    loads_alike,
    loads_said,
    reference_trial,
    speed_study_name,
)

PHASE_LABELS = {
    "data_wait": "waiting for data",
    "host_to_device": "copy to device",
    "forward_backward": "forward + backward",
    "optimizer": "optimizer step",
}


def measured(trial: FrozenTrial, key: str) -> float | None:
    """A trial's value ("value") or a numeric field of its record."""
    if key == "value":
        return trial.value
    value = getattr(TrialRecord.of(trial), key)
    return float(value) if isinstance(value, int | float) else None


def _over(trial: FrozenTrial, other: FrozenTrial, key: str) -> float | None:
    """``trial``'s ``key`` (``measured``) over ``other``'s."""
    mine, theirs = measured(trial, key), measured(other, key)
    return mine / theirs if mine is not None and theirs else None


Comparison = tuple[str, FrozenTrial, float, float | None]


def unlike_loads(trial: FrozenTrial, other: FrozenTrial) -> str:
    """Where the two trials' own measurements were taken under unlike loads (``loads_alike``),
    what each was taken at: "measured under unlike loads: others took 5% of the cores in trial
    3's run, 72% in trial 0's"; else ""."""
    mine, theirs = (TrialRecord.of(t).other_cpu_share for t in (trial, other))
    if mine is None or theirs is None or loads_alike((mine, theirs)):
        return ""
    return (
        f"measured under unlike loads: others took {loads_said((mine,))} of the cores in trial "
        f"{trial.number}'s run, {loads_said((theirs,))} in trial {other.number}'s"
    )


def value_ratio_name(study: optuna.Study, metric: str) -> str:
    """What ``comparisons``' value ratio is, as the note and the report say it: "faster to the
    target" for a time to a target (the other's time over the answer's), else the metric."""
    minimize = study.direction == optuna.study.StudyDirection.MINIMIZE
    return "faster to the target" if minimize else metric


def comparisons(study: optuna.Study, answer: Answer | None) -> list[Comparison]:
    """(who, trial, the answer's samples/s over its, its value over its) against the untuned
    baseline, the tuning checklist and the median and slowest feasible trials, where they are
    not the answer, each from the two trials' one measurement; a trial that is two of these is
    listed once, under the first. The value's ratio reads "times better" (a time to a target:
    the other's over the answer's); over a reference it is the answer's to state
    (``Answer.references``, from the confirmation round), never one measurement's: None."""
    if answer is None:
        return []
    speed = functools.partial(measured, key="samples_per_second")
    by_speed = sorted(feasible_trials(study), key=lambda t: speed(t) or 0.0)  # answer's too
    found, shown = [], {answer.number}
    for label, other in (
        (REFERENCE_NAMES["baseline"], reference_trial(study, "baseline")),
        (REFERENCE_NAMES["checklist"], reference_trial(study, "checklist")),
        ("the median feasible trial", by_speed[len(by_speed) // 2]),
        ("the slowest feasible trial", min(by_speed, key=lambda t: speed(t) or math.inf)),
    ):
        faster = _over(answer.trial, other, "samples_per_second") if other else None
        if other is None or other.number in shown or not faster:
            continue
        shown.add(other.number)
        minimize = study.direction == optuna.study.StudyDirection.MINIMIZE
        mine, theirs = (other, answer.trial) if minimize else (answer.trial, other)
        value = None if label in REFERENCE_NAMES.values() else _over(mine, theirs, "value")
        found.append((label, other, faster, value))
    return found


def _bottlenecks(study: optuna.Study) -> str:
    """The completed trials counted by bottleneck, the commonest first: "data 3, compute 1"."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    counted = Counter(kind for t in complete if (kind := TrialRecord.of(t).bottleneck))
    return ", ".join(f"{kind} {n}" for kind, n in counted.most_common())


def _breakdown_text(trial: FrozenTrial) -> str:
    shares = TrialRecord.of(trial).time_breakdown or {}
    parts = [f"{PHASE_LABELS[p]} {shares[p]:.0%}" for p in PHASES if shares.get(p, 0) >= 0.005]
    return ", ".join(parts)


def verdict(answer: Answer, study_name: str, storage_url: str) -> str:
    """How sure the study is of its answer, in markdown for the note and the report: the
    verdict's line (``confirmation_text``), with what the runs were interleaved with."""
    found = TrialConfirmation.of(answer, answer.number)
    beside = (r.name for r in answer.references if r.runs)  # a failed one was not measured
    leaders = "the other leaders" + "".join(f" and {name}" for name in beside)
    said = confirmation_text(found, study_name, leaders, storage_url, answer.round_state)
    said, _, rest = said.partition(":")
    return f"**{said.capitalize()}**:{rest}."


NOTE_SPACE_CHARS = 20_000  # the longest space file the note shows whole


def _space_file_block(study: optuna.Study) -> list[str]:
    """The study's space file as a fenced YAML block for the note (its study attribute
    space_file holds the same text, flattened into one line by the dashboard)."""
    record = StudyRecord.of(study)
    if not record.space_file:
        return []
    text = record.space_file.rstrip("\n")
    cut = len(text) > NOTE_SPACE_CHARS
    if cut:
        text = text[:NOTE_SPACE_CHARS].rsplit("\n", 1)[0]
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)  # a fence the file's own backticks cannot close
    title = "The space file" + (f" ({record.space_file_path})" * bool(record.space_file_path))
    lines = [f"### {title}", "", f"{fence}yaml", text, fence, ""]
    if cut:
        lines += [
            f"(the first {NOTE_SPACE_CHARS:,} characters; the study attribute space_file "
            "holds the whole file)",
            "",
        ]
    return lines


def names(study: optuna.Study) -> tuple[str, str, bool]:
    """The study's metric, its score's name and whether a higher score is better."""
    record = StudyRecord.of(study)
    higher = record.score_higher_is_better is not False
    return record.metric or "value", record.score_name or "accuracy", higher


def verify_block(study: optuna.Study) -> list[str]:
    """Markdown of ``autotune verify``'s runs: a row per configuration at full length, and where
    the short trials' ranking does not hold (nothing before a verify)."""
    verified = Verification.of(study)
    if verified is None or not verified.runs:
        return []
    metric, score_name, higher = names(study)
    per_second = metric.endswith("_per_second")
    (head, *rows), losses = verification_rows(verified, score_name, higher, per_second)
    title = f"**At full length** (`autotune verify`, {verified.epochs:g} epochs):"
    return [title, "", *_markdown_table(head, rows), "", *losses]


def _markdown_table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(cells) + " |" for cells in (head, *rows)]
    return [lines[0], "|" + "---|" * len(head), *lines[1:]]


def best_headline(answer: Answer, metric: str, score_name: str) -> str:
    """The sentence the note and the report open with, in markdown (``**`` for what stands out:
    ``<strong>`` in the report)."""
    record = TrialRecord.of(answer.trial)
    value, what = answer.headline
    spread = f" ±{answer.spread:.0%}" if answer.spread is not None else ""
    return (
        f"**Best: trial {answer.number}**, {metric} **{fmt(value)}**{spread} ({what}; its trial: "
        f"validation {score_name} {fmt(record.score)}, {fmt(record.samples_per_second)} "
        f"samples/s, {fmt(record.charged_seconds)} s of training)."
    )


def study_note(study: optuna.Study, storage_url: str = DEFAULT_STORAGE) -> str:
    """The markdown note autotune keeps on a study in optuna-dashboard."""
    answer = answer_of(study)
    metric, score_name, _ = names(study)
    study_name = study.study_name
    where = " ".join(study_options(study_name, storage_url))  # a password as ***: it is shared
    lines = [f"## autotune: {study_name}", ""]
    if answer is None:
        spec = study_spec(study)
        lines += [no_answer(spec.objective if spec else None, finished_any(study)), ""]
    else:
        best, record = answer.trial, TrialRecord.of(answer.trial)
        lines += [best_headline(answer, metric, score_name), ""]
        lines += [verdict(answer, study_name, storage_url), ""]
        ratio_name = value_ratio_name(study, metric)
        compared = [
            f"- {speed:.2f}x the samples/s of {label} (trial {other.number})"
            + (f", {value:.2f}x {'its ' * (ratio_name == metric)}{ratio_name}" if value else "")
            + (f"; {loads}" if (loads := unlike_loads(best, other)) else "")
            for label, other, speed, value in comparisons(study, answer)
        ]
        heading = f"One measurement each (trial {best.number}'s own and theirs), not confirmed:"
        lines += [heading, *compared, ""] if compared else []
        if record.bottleneck:
            lines.append(f"Its bottleneck: **{record.bottleneck}** ({_breakdown_text(best)}).")
        if bottlenecks := _bottlenecks(study):
            lines.append(f"Bottlenecks of the completed trials: {bottlenecks}.")
        knobs = [
            [name, f"{value} ({origin})" if origin else value]
            for name, value, origin in knob_rows(best)
        ]
        lines += ["", *_markdown_table(["knob", "value"], knobs), ""]
        if StudyRecord.of(study).strategy == "two_stage":
            predicted = record.predicted_samples_per_second
            lines += [
                "Two stages: the knobs *timed in stage 1* are the fastest of the speed "
                f"stage's measurements (study `{study_name}.speed`"
                + (f", which predicted {fmt(predicted)} samples/s" if predicted else "")
                + "); the *searched* ones were sampled by this study.",
                "",
            ]
    lines += verify_block(study)
    lines += _space_file_block(study)
    lines += [
        f"Export it: `autotune export {where} -o train.py` (or `--format yaml`).  ",
        f"Report: `autotune report {where} -o report.html`.",
        "",
        f"_Updated {datetime.datetime.now().isoformat(timespec='seconds')} by autotune "
        f"{__version__}._",
    ]
    return "\n".join(lines)


def speed_note(study_name: str) -> str:
    """The note on a study's speed study (``NAME.speed``): what its trials are."""
    return "\n".join(
        [
            f"## autotune: {study_name}.speed, stage 1 of study `{study_name}`",
            "",
            "Each trial is one timed measurement of a way to *execute* training steps (the data "
            "pipeline, DataLoader workers, compile, channels_last, cudnn.benchmark) at one "
            "micro-batch size and precision: short bursts of real steps, no evaluation. Its "
            "value is samples/s, epoch starts included, at accumulation 1; its user attributes "
            "hold every burst (`measurement`), the predicted samples/s at each accumulation, the "
            "round (2 and up: a cell's leaders measured again) and the cache key.",
            "",
            f"The trials of `{study_name}` train with the fastest settings per micro-batch and "
            f"precision; their knobs marked *timed in stage 1* come from here. Any later study "
            f"on the same machine, model and data reuses these measurements "
            f"(`autotune run --remeasure` times them again).",
        ]
    )


def write_note(study: optuna.Study, storage_url: str = DEFAULT_STORAGE) -> None:
    """Save ``study_note`` as the study's note in optuna-dashboard (and ``speed_note`` on its
    speed study, when it has one)."""
    save_note = dashboard_save_note()
    save_note(study, study_note(study, storage_url))
    speed = speed_study_name(study.study_name)
    storage = adapter.storage_of(study)
    if speed in optuna.get_all_study_names(storage):
        speed_study = optuna.load_study(study_name=speed, storage=storage)
        save_note(speed_study, speed_note(study.study_name))


def has_note(study_system_attrs: dict[str, object]) -> bool:
    """Whether a study carries a note (optuna-dashboard's ``note_ver_key(None)``)."""
    return "dashboard:note_ver" in study_system_attrs


def dashboard_save_note() -> Callable[[optuna.Study, str], None]:
    """optuna-dashboard's own ``save_note``, taken from its ``_note`` module (which imports
    optuna alone) without running the package's ``__init__``: that imports the dashboard's web
    app and, through ``optuna.importance``, scikit-learn, 1.6 s at the end of every run. Where
    the module is not where this version of optuna-dashboard keeps it, the package's export."""
    import importlib.util
    import sys
    from pathlib import Path

    loaded = sys.modules.get("optuna_dashboard")
    if loaded is not None:
        return loaded.save_note
    package = importlib.util.find_spec("optuna_dashboard")
    locations = package.submodule_search_locations if package is not None else None
    if locations:
        path = Path(next(iter(locations))) / "_note.py"
        # a top-level name: a relative import in it fails rather than reaching autotune's
        spec = importlib.util.spec_from_file_location("_autotune_dashboard_note", path)
        if path.is_file() and spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            save_note = None
            with contextlib.suppress(Exception):  # it needs more than optuna in this version
                spec.loader.exec_module(module)
                save_note = getattr(module, "save_note", None)
            if callable(save_note):
                return save_note
    import optuna_dashboard

    return optuna_dashboard.save_note
