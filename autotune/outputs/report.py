"""The self-contained HTML report of a study: its answer against the baseline and the others,
where the time goes, the score against speed, Optuna's history and importances, the machine."""

from __future__ import annotations

import dataclasses
import datetime
import html
import re
import statistics
from dataclasses import dataclass
from typing import Any

import jinja2
import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune._imports import optional
from autotune._version import __version__
from autotune.display import (
    SPEED_COLUMNS,
    TO_TARGET,
    confirmation_cost,
    confirmation_rows,
    finished_any,
    flagged_measurements,
    fmt,
    fmt_metric,
    measured_flags,
    metric_unit,
    no_answer,
    noisy_round,
    off_stage_one,
    runs_used_note,
    speed_rows,
    study_options,
    value_text,
)
from autotune.errors import UserError
from autotune.export import study_spec
from autotune.machine.interference import INTERFERENCE_SHARE, interfered
from autotune.outputs import charts
from autotune.outputs.notes import (
    PHASE_LABELS,
    best_headline,
    comparisons,
    knob_rows,
    names,
    unlike_loads,
    value_ratio_name,
    verdict,
    verify_block,
)
from autotune.results import PHASES
from autotune.spacefile import DEFAULT_STORAGE, KNOBS
from autotune.speed import SpeedTable
from autotune.study import (
    REFERENCE_NAMES,
    UNCONFIRMED,
    Answer,
    StudyRecord,
    TrialRecord,
    answer_of,
    count_endings,
    reference_trial,
)


class ReportError(UserError):
    """A report that cannot be written here (a user-fixable problem): one line."""


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


@dataclass(frozen=True)
class TrialRow:
    """One trial as the report's table of all trials shows it (formatted)."""

    number: int
    state: str  # COMPLETE, COMPLETE (infeasible), PRUNED, FAIL, ...
    value: str
    score: str
    samples_per_second: str
    tokens_per_second: str  # token inputs, padding excluded ("-" for others)
    params: tuple[str, ...]  # in the order of the table's parameter columns
    fail_kind: str  # pruned, oom, ...; for an infeasible trial: infeasible
    fail_msg: str  # why; for an infeasible trial: which constraint failed
    flags: str = ""  # a complete trial's, as its line said them: "interference 81%", ...


def _knob_value(trial: FrozenTrial, record: TrialRecord, name: str) -> Any:
    """A trial's value of knob ``name``: sampled, else its configuration's (a two-stage trial's
    execution knobs, which stage 1 chose: batch_size, data_pipeline, ...)."""
    if name in trial.params:
        return trial.params[name]
    return getattr(record.config, name, None) if record.config is not None else None


def trial_rows(study: optuna.Study) -> tuple[list[str], list[TrialRow]]:
    """The searched parameters' names and a row for every trial of ``study``, by number."""
    trials = study.get_trials(deepcopy=False)
    configs = [c for c in (TrialRecord.of(t).config for t in trials) if c is not None]
    varied = {k for k in KNOBS if len({repr(getattr(c, k)) for c in configs}) > 1}
    names = [k for k in KNOBS if k in varied or any(k in t.params for t in trials)]
    names += sorted({k for t in trials for k in t.params} - set(names))
    rows, to_target = [], metric_unit(StudyRecord.of(study).metric or "") == TO_TARGET
    for trial in trials:
        record = TrialRecord.of(trial)
        state, kind, message = trial.state.name, record.fail_kind or "", record.fail_msg or ""
        value = fmt(trial.value)
        if to_target and (trial.state != TrialState.COMPLETE or record.feasible is False):
            # the seconds it spent, or (stopped early) a projection: no time to the target
            finished = trial.state == TrialState.COMPLETE
            value = value_text(trial.value if finished else None, TO_TARGET, reached=False)
        if trial.state == TrialState.COMPLETE and record.feasible is False:
            state, kind = f"{state} (infeasible)", "infeasible"
            message = record.infeasible_reason or ""
        if (off := off_stage_one(record)) is not None and not kind:
            kind = "speed_mismatch"
            message = (
                f"trained {abs(off):.0%} {'faster' if off > 0 else 'slower'} than stage 1's "
                f"prediction of "
                f"{fmt(record.predicted_samples_per_second)} samples/s (interference, or a "
                f"stale speed cache: --remeasure)"
            )
        rows.append(
            TrialRow(
                number=trial.number,
                state=state,
                value=value,
                score=fmt(record.score),
                samples_per_second=fmt(record.samples_per_second),
                tokens_per_second=fmt(record.tokens_per_second),
                params=tuple(fmt(_knob_value(trial, record, k)) for k in names),
                fail_kind=str(kind),
                fail_msg=message or "",
                flags="; ".join(measured_flags(record) * (trial.state == TrialState.COMPLETE)),
            )
        )
    return names, rows


@dataclass(frozen=True)
class KnobSpeed:
    """How fast the completed trials trained at one value of a searched categorical knob."""

    knob: str
    value: str
    trials: int  # completed trials with this value that measured samples/s
    median_samples_per_second: float
    over_slowest: float  # the median over the slowest value's median (1.0 for the slowest)


def knob_speeds(study: optuna.Study) -> list[KnobSpeed]:
    """For each searched categorical knob, the median samples/s of the completed trials at each
    of its values and its ratio to the slowest value's median: the knob's effect on speed,
    which the objective's importances do not show (a knob can change speed ten-fold and still
    rank low). Knobs with fewer than two values tried are left out."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    speeds: dict[str, dict[str, list[float]]] = {}
    for trial in complete:
        speed = TrialRecord.of(trial).samples_per_second
        for name, distribution in trial.distributions.items():
            if isinstance(distribution, CategoricalDistribution) and speed:
                by_value = speeds.setdefault(name, {})
                by_value.setdefault(fmt(trial.params[name]), []).append(speed)
    found, order = [], list(KNOBS)
    for name in sorted(speeds, key=lambda k: (order.index(k) if k in order else len(order), k)):
        medians = {value: statistics.median(s) for value, s in speeds[name].items()}
        if len(medians) < 2:
            continue
        slowest = min(medians.values())
        for value, median in sorted(medians.items(), key=lambda item: -item[1]):
            found.append(
                KnobSpeed(name, value, len(speeds[name][value]), median, median / slowest)
            )
    return found


def cudnn_version(version: int) -> str:
    """cuDNN's version as torch.backends.cudnn.version() gives it (CUDNN_VERSION: 92400 for
    9.24.0) in words: from cuDNN 9 on it is major * 10000 + minor * 100 + patch, before that
    major * 1000 + minor * 100 + patch."""
    if version >= 90000:
        major, minor, patch = version // 10000, version % 10000 // 100, version % 100
    else:
        major, minor, patch = version // 1000, version % 1000 // 100, version % 100
    return f"{major}.{minor}.{patch}"


def hardware_rows(hardware: dict[str, object]) -> list[tuple[str, str]]:
    """(fact, value) of the machine the trials ran on; CUDA and cuDNN only when the trials used
    the GPU (torch records the versions it was built with even where there is none)."""
    if not hardware:
        return []
    on_gpu = str(hardware.get("device", "")).startswith("cuda")
    rows = []
    for key, value in hardware.items():
        if key in ("cuda", "cudnn") and not on_gpu:
            continue
        if key == "cudnn" and isinstance(value, int):
            value = cudnn_version(value)
        rows.append((key, str(value)))
    if not on_gpu:
        rows.append(("cuda, cudnn", "not used (the trials ran on the CPU)"))
    return rows


def stored_speed_table(study: optuna.Study) -> SpeedTable | None:
    """Stage 1's table as its last run printed it, stored with the study (cells it reused from
    another study's measurements included); None where no stage 1 ran (or ran before tables
    were stored: a resumed run stores it, reusing every measurement)."""
    record = StudyRecord.of(study)
    if record.speed_table is None:
        return None
    return dataclasses.replace(record.speed_table, batch_size_auto=record.batch_size_auto)


def confirmation_notes(answer: Answer | None) -> list[str]:
    """The lines under the report's confirmation table, as the terminal prints them under its
    own: what "runs used" counts, why a noisy round could not rank its leaders, the
    measurements taken under interference (which the round retook), and its cost."""
    if answer is None or not answer.configurations:
        return []
    noisy = [f"{noisy_round(answer)}."] * (answer.confirmed and answer.noisy)
    flagged = [flagged_measurements(answer)] * bool(answer.flagged)
    return [runs_used_note(answer), *noisy, *flagged, confirmation_cost(answer)]


def over_references(answer: Answer | None, labels: list[str]) -> list[str]:
    """Why the table's ratio of the metric over each reference among ``labels`` is "-": the
    answer's over it is the confirmation round's to claim (``Reference.said``, its ``why``
    where it claims none), and a study without a round, or with a round that backs no answer,
    claims none."""
    if answer is None:
        return []
    said = []
    for name in (label for label in labels if label in REFERENCE_NAMES.values()):
        found = answer.over(name)
        if found is not None:
            said.append(found.said)
        elif answer.confirmed:
            said.append(f"over {name}, no ratio: the round did not measure it beside the answer")
        else:
            said.append(f"over {name}, no ratio: not confirmed, {UNCONFIRMED[answer.round_state]}")
    return said


def busy_pair(best: FrozenTrial | None, other: FrozenTrial) -> bool:
    """Whether either trial's own measurement of a comparison was taken under interference:
    its one-measurement ratio is marked busy (a figure taken under load, never unmarked)."""
    trials = (other,) if best is None else (best, other)
    return any(interfered(TrialRecord.of(t).other_cpu_share or 0.0) for t in trials)


def as_html(markdown: str) -> str:
    """A line of the note in HTML: escaped, ``**`` as ``<strong>``, backticks as ``<code>``."""
    strong = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html.escape(markdown))
    return re.sub(r"`(.+?)`", r"<code>\1</code>", strong)


def render_html(study: optuna.Study, storage_url: str = DEFAULT_STORAGE) -> str:
    """A single self-contained HTML page about a study (plotly included: it opens offline).

    ReportError when plotly is missing (a bare CUDA image may lack it; studies can be reported
    on any machine that has it)."""
    plotly_offline = optional("plotly.offline")
    if plotly_offline is None:
        raise ReportError("autotune report needs plotly: pip install plotly")
    answer = answer_of(study)
    best = answer.trial if answer is not None else None
    baseline = reference_trial(study, "baseline")
    metric, score_name, _ = names(study)
    base = {name: value for name, value, _ in knob_rows(baseline)} if baseline else {}
    config_rows = [
        (name, value, base.get(name, fmt(None)) if base else "", origin)
        for name, value, origin in (knob_rows(best) if best is not None else [])
    ]
    found, compared = comparisons(study, answer), []
    for label, other, speed, value in found:  # over a reference: the round's ratio, if claimed
        confirmed = answer.ratio_over(label) if answer is not None else None
        compared.append(
            (label.removeprefix("the "), other.number, speed, value or confirmed,
             TrialRecord.of(other), confirmed is not None, busy_pair(best, other))
        )  # fmt: skip
    table = stored_speed_table(study)
    stage_one, caption = speed_rows(table) if table is not None else ([], None)
    bars = charts.breakdown_bars(study, baseline)
    curves = charts.verified_curves(study)
    param_names, rows = trial_rows(study)
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("autotune", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
    )
    environment.filters["number"] = fmt
    return environment.get_template("report.html.j2").render(
        study=study.study_name,
        metric=metric,
        value_ratio=value_ratio_name(study, metric) if answer is not None else metric,
        score_name=score_name,
        states=count_endings(study.get_trials(deepcopy=False)),
        answer=answer,
        spread=answer.spread if answer is not None else None,
        baseline=baseline,
        best=best,
        best_record=TrialRecord.of(best) if best is not None else None,
        headline=as_html(best_headline(answer, metric, score_name)) if answer else "",
        no_answer=no_answer(
            spec.objective if (spec := study_spec(study)) else None, finished_any(study)
        ),
        verdict=as_html(verdict(answer, study.study_name, storage_url)) if answer else "",
        config_rows=config_rows,
        comparisons=compared,
        any_busy=any(row[-1] for row in compared),
        busy_share=f"{INTERFERENCE_SHARE:.0%}",
        confirmation=confirmation_rows(answer) if answer is not None else [],
        confirmation_notes=confirmation_notes(answer),
        over_references=over_references(answer, [label for label, *_ in found]),
        unlike_loads=[
            f"{label.removeprefix('the ')}: {loads}"
            for label, other, *_ in found
            if best is not None and (loads := unlike_loads(best, other))
        ],
        measurements=measurements(best) if best is not None else [],
        phases=[(p, PHASE_LABELS[p]) for p in PHASES],
        param_names=param_names,
        trial_rows=rows,
        any_tokens=any(row.tokens_per_second != fmt(None) for row in rows),
        any_flags=any(row.flags for row in rows),
        knob_speeds=knob_speeds(study),
        speed_columns=SPEED_COLUMNS,
        speed_rows=[[str(cell) for cell in row] for row in stage_one],
        speed_caption=caption,
        batch_size_auto=table.batch_size_auto if table else None,
        hardware=hardware_rows(StudyRecord.of(study).hardware or {}),
        figures=charts.optuna_figures(study),
        scatter=charts.figure_html(charts.scatter(study)),
        bars=charts.figure_html(bars) if bars is not None else None,
        verified=charts.figure_html(curves) if curves is not None else None,
        verify_lines=verify_block(study),
        plotly_js=plotly_offline.get_plotlyjs(),
        generated=datetime.datetime.now().isoformat(timespec="seconds"),
        version=__version__,
        where=" ".join(study_options(study.study_name, storage_url)),  # a password as ***
    )
