"""What autotune says about a study where people look first: the summary of its answer, the
note optuna-dashboard shows (the files attached to the study: artifacts.py)."""

from __future__ import annotations

import contextlib
import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune._version import __version__
from autotune.display import fmt_metric
from autotune.results import PHASES
from autotune.spec import DEFAULT_STORAGE, knobs_for
from autotune.study import (
    REFERENCE_NAMES,
    Answer,
    StudyRecord,
    TrialRecord,
    Verification,
    adapter,
    answer_of,
    baseline_trial,
    display_url,
    feasible_trials,
    reference_trial,
    speed_study_name,
    trial_config,
    trial_knob_origin,
)

__all__ = [
    "PHASE_LABELS",
    "Summary",
    "measured",
    "measurements",
    "number",
    "study_note",
    "summarize",
    "verify_block",
    "write_note",
]

PHASE_LABELS = {
    "data_wait": "waiting for data",
    "host_to_device": "copy to device",
    "forward_backward": "forward + backward",
    "optimizer": "optimizer step",
}


@dataclass(frozen=True)
class Summary:
    """The facts a note or a report states about a study."""

    study: str
    metric: str
    best: FrozenTrial | None
    baseline: FrozenTrial | None  # the untuned trial, if it completed
    feasible: list[FrozenTrial]  # best first
    states: dict[str, int]
    bottlenecks: dict[str, int]  # bottleneck -> COMPLETE trials limited by it
    score_name: str = "accuracy"  # the validation score's: accuracy, val_loss, macro_f1, ...
    higher_score_better: bool = True
    answer: Answer | None = None  # best is its trial
    checklist: FrozenTrial | None = None  # the tuning checklist's trial, if it completed

    @property
    def headline(self) -> tuple[float | None, str]:
        """The best trial's value as a person reads it first, and what it is: the confirmation
        round's median where the round confirmed it, else its trial's one measurement."""
        if self.answer is not None:
            return self.answer.headline
        return (self.best.value if self.best is not None else None), "one trial"

    @property
    def spread(self) -> float | None:
        """The confirmation round's run-to-run spread (0.06: ±6%); None before one."""
        return self.answer.spread if self.answer is not None else None

    def ratio(self, key: str, other: FrozenTrial | None) -> float | None:
        """best's ``key`` attribute (or value for "value") over ``other``'s."""
        if self.best is None or other is None:
            return None
        mine, theirs = measured(self.best, key), measured(other, key)
        if mine is None or not theirs:
            return None
        return mine / theirs

    @property
    def median(self) -> FrozenTrial | None:
        if not self.feasible:
            return None
        ranked = sorted(self.feasible, key=lambda t: measured(t, "samples_per_second") or 0.0)
        return ranked[len(ranked) // 2]

    @property
    def slowest(self) -> FrozenTrial | None:
        if not self.feasible:
            return None
        return min(self.feasible, key=lambda t: measured(t, "samples_per_second") or float("inf"))

    def comparisons(self) -> list[tuple[str, FrozenTrial, float, float | None]]:
        """(who, trial, best's samples/s over its, best's value over its) against the untuned
        baseline, the tuning checklist and the median and slowest feasible trials, where they
        are not the best; a trial that is two of these is listed once, under the first. The
        value's ratio over a reference is the answer's to state (``Answer.references``, from
        the confirmation round), never one measurement's: None here."""
        found = []
        shown = {self.best.number} if self.best is not None else set()
        for label, other in (
            (REFERENCE_NAMES["baseline"], self.baseline),
            (REFERENCE_NAMES["checklist"], self.checklist),
            ("the median feasible trial", self.median),
            ("the slowest feasible trial", self.slowest),
        ):
            speed = self.ratio("samples_per_second", other)
            if other is None or self.best is None or other.number in shown or not speed:
                continue
            shown.add(other.number)
            reference = label in REFERENCE_NAMES.values()
            found.append((label, other, speed, None if reference else self.ratio("value", other)))
        return found


def measured(trial: FrozenTrial, key: str) -> float | None:
    """A trial's value ("value") or a numeric field of its record."""
    if key == "value":
        return trial.value
    value = getattr(TrialRecord.of(trial), key)
    return float(value) if isinstance(value, int | float) else None


def summarize(study: optuna.Study) -> Summary:
    """Best, baseline, feasible trials, state counts and bottlenecks of a study."""
    trials = study.get_trials(deepcopy=False)
    feasible = feasible_trials(study)
    bottlenecks: dict[str, int] = {}
    for trial in trials:
        kind = TrialRecord.of(trial).bottleneck
        if trial.state == TrialState.COMPLETE and kind:
            bottlenecks[kind] = bottlenecks.get(kind, 0) + 1
    states: dict[str, int] = {}
    for trial in trials:
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
    record = StudyRecord.of(study)
    answer = answer_of(study)
    return Summary(
        study=study.study_name,
        metric=record.metric or "value",
        score_name=record.score_name or "accuracy",
        higher_score_better=record.score_higher_is_better is not False,
        answer=answer,
        best=answer.trial if answer is not None else None,
        baseline=baseline_trial(study),
        checklist=reference_trial(study, "checklist"),
        feasible=feasible,
        states=states,
        bottlenecks=dict(sorted(bottlenecks.items(), key=lambda kv: -kv[1])),
    )


def number(value: Any) -> str:
    """A value as a note or report shows it: 3 significant digits, thousands separated."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e3 else f"{value:,.0f}"
    return "-" if value is None else str(value)


def measurements(trial: FrozenTrial) -> list[tuple[str, str]]:
    """(label, formatted value) of a trial's compile, FLOP and memory measurements."""
    record = TrialRecord.of(trial)
    shown = []
    for key, label in (
        ("compile_seconds", "torch.compile time"),
        ("achieved_flops", "achieved FLOP/s"),
        ("mfu", "model FLOP utilization"),
        ("gpu_utilization", "GPU utilization (NVML)"),
        ("gpu_memory_used_bytes", "GPU memory used (NVML)"),
        ("peak_memory_bytes", "peak memory"),
    ):
        value = getattr(record, key)
        if isinstance(value, int | float):
            shown.append((label, fmt_metric(key, value)))
    return shown


def _breakdown_text(trial: FrozenTrial) -> str:
    shares = TrialRecord.of(trial).time_breakdown or {}
    parts = [f"{PHASE_LABELS[p]} {shares[p]:.0%}" for p in PHASES if shares.get(p, 0) >= 0.005]
    return ", ".join(parts)


def _confirmation_line(answer: Answer | None, study_name: str) -> str:
    """How sure the study is of its answer, for the note."""
    if answer is None or not answer.confirmed:
        return (
            "_Not confirmed: the answer rests on one measurement per configuration; "
            f"`autotune confirm --study {study_name}` re-measures the leaders._"
        )
    spread = f"±{answer.spread:.0%}" if answer.spread is not None else "unknown"
    beside = "".join(f" and {reference.name}" for reference in answer.references)
    text = (
        f"**Confirmed**: median {number(answer.median)} over {answer.runs} runs, "
        f"interleaved with the other leaders{beside} (spread {spread})"
    )
    if answer.references:
        text += f"; measured side by side: {'; '.join(r.said for r in answer.references)}"
    if answer.reference is not None:
        text += f". It is {answer.reference}: the search found nothing better"
    if answer.tied:
        tied = ", ".join(str(n) for n in answer.tied)
        text += f". Tied within measurement noise with trial {tied}"
    if answer.interfered:
        text += (
            ". Measured while other processes used the CPU: confirm it again on a quiet machine"
        )
    return text + "."


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
    title = (
        f"The space file ({record.space_file_path})"
        if record.space_file_path
        else "The space file"
    )
    lines = [f"### {title}", "", f"{fence}yaml", text, fence, ""]
    if cut:
        lines += [
            f"(the first {NOTE_SPACE_CHARS:,} characters; the study attribute space_file "
            "holds the whole file)",
            "",
        ]
    return lines


def verify_block(study: optuna.Study, summary: Summary) -> list[str]:
    """Markdown of ``autotune verify``'s runs: a row per configuration at full length, and where
    the short trials' ranking does not hold (nothing before a verify)."""
    verified = Verification.of(study)
    if verified is None or not verified.runs:
        return []
    higher = summary.higher_score_better
    reach = [f"s to {verified.target:g}"] if verified.target is not None else []
    head = ["configuration", f"final {summary.score_name}", "training s", *reach]
    lines = [
        f"**At full length** (`autotune verify`, {verified.epochs:g} epochs):",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in verified.rows(higher):
        cells = [row.name, number(row.final_score), number(row.seconds)]
        cells += ["never" if row.to_target is None else number(row.to_target)] if reach else []
        lines.append("| " + " | ".join(cells) + " |")
    losses = verified.losses(higher)
    return [*lines, "", *(f"The short trials' ranking does not hold: {n} {h}." for n, h in losses)]


def study_note(study: optuna.Study, storage_url: str = DEFAULT_STORAGE) -> str:
    """The markdown note autotune keeps on a study in optuna-dashboard."""
    summary = summarize(study)
    # the password never goes into the study: the command shows *** in its place
    shown = display_url(storage_url)
    storage = "" if storage_url == DEFAULT_STORAGE else f" --storage {shown}"
    lines = [f"## autotune: {summary.study}", ""]
    best = summary.best
    if best is None:
        lines += ["No trial has completed feasibly yet.", ""]
    else:
        record = TrialRecord.of(best)
        lines += [
            f"**Best: trial {best.number}**, {summary.metric} **{number(summary.headline[0])}**"
            + (f" ±{summary.spread:.0%}" if summary.spread is not None else "")
            + f" ({summary.headline[1]}; its trial: "
            f"validation {summary.score_name} {number(record.score)}, "
            f"{number(record.samples_per_second)} samples/s, "
            f"{number(record.charged_seconds)} s of training).",
            "",
        ]
        comparisons = [
            f"- {speed:.2f}x the samples/s of {label} (trial {other.number})"
            + (f", {value:.2f}x its {summary.metric}" if value else "")
            for label, other, speed, value in summary.comparisons()
        ]
        lines += comparisons + ([""] if comparisons else [])
        lines += [_confirmation_line(summary.answer, summary.study), ""]
        if record.bottleneck:
            lines.append(f"Its bottleneck: **{record.bottleneck}** ({_breakdown_text(best)}).")
        if summary.bottlenecks:
            counted = ", ".join(f"{kind} {n}" for kind, n in summary.bottlenecks.items())
            lines.append(f"Bottlenecks of the completed trials: {counted}.")
        lines += ["", "| knob | value |", "|---|---|"]
        config = trial_config(best).to_dict()
        for name in knobs_for(config.get("world_size", 1)):
            origin = trial_knob_origin(best, name)
            mark = f" ({origin})" if origin else ""
            lines.append(f"| {name} | {number(config[name])}{mark} |")
        lines.append("")
        if StudyRecord.of(study).strategy == "two_stage":
            predicted = record.predicted_samples_per_second
            lines += [
                "Two stages: the knobs *timed in stage 1* are the fastest of the speed "
                f"stage's measurements (study `{summary.study}.speed`"
                + (f", which predicted {number(predicted)} samples/s" if predicted else "")
                + "); the *searched* ones were sampled by this study.",
                "",
            ]
    lines += verify_block(study, summary)
    lines += _space_file_block(study)
    lines += [
        f"Export it: `autotune export --study {summary.study}{storage} -o train.py` "
        f"(or `--format yaml`).  ",
        f"Report: `autotune report --study {summary.study}{storage} -o report.html`.",
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
