"""What a person reads about a study: a summary, the optuna-dashboard note, the artifacts
(exported script, report) next to the database, and the self-contained HTML report."""

from __future__ import annotations

import datetime
import html
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import optuna
import optuna_dashboard
from optuna.artifacts import FileSystemArtifactStore, upload_artifact
from optuna.trial import FrozenTrial, TrialState

import autotune
from autotune.display import fmt_metric
from autotune.spec import DEFAULT_STORAGE, KNOBS
from autotune.study import feasible_trials, trial_config
from autotune.timing import PHASES

if TYPE_CHECKING:  # plotly is imported where a report is drawn: run and export need none
    import plotly.graph_objects as go

__all__ = [
    "ReportError",
    "Summary",
    "artifact_dir",
    "render_html",
    "study_note",
    "summarize",
    "upload",
    "write_note",
]

PHASE_LABELS = {
    "data_wait": "waiting for data",
    "host_to_device": "copy to device",
    "forward_backward": "forward + backward",
    "optimizer": "optimizer step",
}
TOP_TRIALS = 10  # trials shown in the time-breakdown chart


class ReportError(Exception):
    """A report that cannot be written here (a user-fixable problem): one line."""


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

    def ratio(self, key: str, other: FrozenTrial | None) -> float | None:
        """best's ``key`` attribute (or value for "value") over ``other``'s."""
        if self.best is None or other is None:
            return None
        mine, theirs = _attr(self.best, key), _attr(other, key)
        if mine is None or not theirs:
            return None
        return mine / theirs

    @property
    def median(self) -> FrozenTrial | None:
        if not self.feasible:
            return None
        ranked = sorted(self.feasible, key=lambda t: _attr(t, "samples_per_second") or 0.0)
        return ranked[len(ranked) // 2]

    @property
    def slowest(self) -> FrozenTrial | None:
        if not self.feasible:
            return None
        return min(self.feasible, key=lambda t: _attr(t, "samples_per_second") or float("inf"))

    def comparisons(self) -> list[tuple[str, FrozenTrial, float, float | None]]:
        """(who, trial, best's samples/s over its, best's value over its) against the untuned
        baseline and the median and slowest feasible trials, where they are not the best; a
        trial that is two of these is listed once, under the first."""
        found = []
        shown = {self.best.number} if self.best is not None else set()
        for label, other in (
            ("the untuned baseline", self.baseline),
            ("the median feasible trial", self.median),
            ("the slowest feasible trial", self.slowest),
        ):
            speed = self.ratio("samples_per_second", other)
            if other is None or self.best is None or other.number in shown or not speed:
                continue
            shown.add(other.number)
            found.append((label, other, speed, self.ratio("value", other)))
        return found


def _attr(trial: FrozenTrial, key: str) -> float | None:
    if key == "value":
        return trial.value
    value = trial.user_attrs.get(key)
    return float(value) if isinstance(value, int | float) else None


def summarize(study: optuna.Study) -> Summary:
    """Best, baseline, feasible trials, state counts and bottlenecks of a study."""
    trials = study.get_trials(deepcopy=False)
    feasible = feasible_trials(study)
    baseline = next(
        (t for t in trials if t.user_attrs.get("baseline") and t.state == TrialState.COMPLETE),
        None,
    )
    bottlenecks: dict[str, int] = {}
    for trial in trials:
        kind = trial.user_attrs.get("bottleneck")
        if trial.state == TrialState.COMPLETE and kind:
            bottlenecks[kind] = bottlenecks.get(kind, 0) + 1
    states: dict[str, int] = {}
    for trial in trials:
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
    return Summary(
        study=study.study_name,
        metric=str(study.user_attrs.get("metric", "value")),
        best=feasible[0] if feasible else None,
        baseline=baseline,
        feasible=feasible,
        states=states,
        bottlenecks=dict(sorted(bottlenecks.items(), key=lambda kv: -kv[1])),
    )


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e3 else f"{value:,.0f}"
    return "-" if value is None else str(value)


def _measurements(trial: FrozenTrial) -> list[tuple[str, str]]:
    """(label, formatted value) of a trial's compile, FLOP and memory measurements."""
    attrs = trial.user_attrs
    shown = []
    for key, label in (
        ("compile_seconds", "torch.compile time"),
        ("achieved_flops", "achieved FLOP/s"),
        ("mfu", "model FLOP utilization"),
        ("gpu_utilization", "GPU utilization (NVML)"),
        ("gpu_memory_used_bytes", "GPU memory used (NVML)"),
        ("peak_memory_bytes", "peak memory"),
    ):
        if isinstance(attrs.get(key), int | float):
            shown.append((label, fmt_metric(key, attrs[key])))
    return shown


def _breakdown_text(trial: FrozenTrial) -> str:
    shares = trial.user_attrs.get("time_breakdown") or {}
    parts = [f"{PHASE_LABELS[p]} {shares[p]:.0%}" for p in PHASES if shares.get(p, 0) >= 0.005]
    return ", ".join(parts)


def study_note(study: optuna.Study, storage_url: str = DEFAULT_STORAGE) -> str:
    """The markdown note autotune keeps on a study in optuna-dashboard."""
    summary = summarize(study)
    storage = "" if storage_url == DEFAULT_STORAGE else f" --storage {storage_url}"
    lines = [f"## autotune: {summary.study}", ""]
    best = summary.best
    if best is None:
        lines += ["No trial has completed feasibly yet.", ""]
    else:
        attrs = best.user_attrs
        lines += [
            f"**Best: trial {best.number}**, {summary.metric} **{_number(best.value)}** "
            f"(validation accuracy {_number(attrs.get('accuracy'))}, "
            f"{_number(attrs.get('samples_per_second'))} samples/s, "
            f"{_number(attrs.get('charged_seconds'))} s of training).",
            "",
        ]
        comparisons = [
            f"- {speed:.2f}x the samples/s of {label} (trial {other.number})"
            + (f", {value:.2f}x its {summary.metric}" if value else "")
            for label, other, speed, value in summary.comparisons()
        ]
        lines += comparisons + ([""] if comparisons else [])
        if attrs.get("bottleneck"):
            lines.append(f"Its bottleneck: **{attrs['bottleneck']}** ({_breakdown_text(best)}).")
        if summary.bottlenecks:
            counted = ", ".join(f"{kind} {n}" for kind, n in summary.bottlenecks.items())
            lines.append(f"Bottlenecks of the completed trials: {counted}.")
        lines += ["", "| knob | value |", "|---|---|"]
        config = trial_config(best).to_dict()
        for name in KNOBS:
            mark = " (searched)" if name in best.params else ""
            lines.append(f"| {name} | {_number(config[name])}{mark} |")
        lines.append("")
    lines += [
        f"Export it: `autotune export --study {summary.study}{storage} -o train.py` "
        f"(or `--format yaml`).  ",
        f"Report: `autotune report --study {summary.study}{storage} -o report.html`.",
        "",
        f"_Updated {datetime.datetime.now().isoformat(timespec='seconds')} by autotune "
        f"{autotune.__version__}._",
    ]
    return "\n".join(lines)


def write_note(study: optuna.Study, storage_url: str = DEFAULT_STORAGE) -> None:
    """Save ``study_note`` as the study's note in optuna-dashboard."""
    optuna_dashboard.save_note(study, study_note(study, storage_url))


def artifact_dir(storage_url: str) -> Path:
    """Where a study's artifacts live: ``artifacts/`` next to a SQLite database, else
    ``studies/artifacts`` in the working directory."""
    if storage_url.startswith("sqlite:///") and storage_url != "sqlite:///:memory:":
        return Path(storage_url.removeprefix("sqlite:///")).parent / "artifacts"
    return Path("studies") / "artifacts"


def upload(study: optuna.Study, path: Path, storage_url: str) -> str:
    """Attach a file (an exported script, a report) to the study as an Optuna artifact."""
    directory = artifact_dir(storage_url)
    directory.mkdir(parents=True, exist_ok=True)
    return upload_artifact(
        artifact_store=FileSystemArtifactStore(str(directory)),
        file_path=str(path),
        study_or_trial=study,
    )


# ---------------------------------------------------------------------------------------------
# The HTML report
# ---------------------------------------------------------------------------------------------


def _figure_html(figure: go.Figure) -> str:
    figure.update_layout(template="plotly_white", margin={"l": 60, "r": 20, "t": 50, "b": 50})
    return figure.to_html(full_html=False, include_plotlyjs=False)


def _pareto_front(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Trials no other trial beats on both accuracy and samples/s."""
    points = [
        (t, _attr(t, "accuracy") or 0.0, _attr(t, "samples_per_second") or 0.0) for t in trials
    ]
    front = []
    for trial, accuracy, speed in points:
        dominated = any(
            a >= accuracy and s >= speed and (a > accuracy or s > speed) for _, a, s in points
        )
        if not dominated:
            front.append(trial)
    return sorted(front, key=lambda t: _attr(t, "samples_per_second") or 0.0)


def _scatter(study: optuna.Study, summary: Summary) -> go.Figure:
    import plotly.graph_objects as go

    complete = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if "samples_per_second" in t.user_attrs
    ]
    feasible_numbers = {t.number for t in summary.feasible}
    figure = go.Figure()
    for label, chosen, symbol in (
        ("feasible", [t for t in complete if t.number in feasible_numbers], "circle"),
        ("infeasible", [t for t in complete if t.number not in feasible_numbers], "x"),
    ):
        figure.add_trace(
            go.Scatter(
                x=[t.user_attrs["samples_per_second"] for t in chosen],
                y=[t.user_attrs.get("accuracy") for t in chosen],
                mode="markers",
                name=label,
                marker={"symbol": symbol, "size": 9},
                text=[f"trial {t.number}" for t in chosen],
            )
        )
    front = _pareto_front(summary.feasible)
    figure.add_trace(
        go.Scatter(
            x=[t.user_attrs["samples_per_second"] for t in front],
            y=[t.user_attrs.get("accuracy") for t in front],
            mode="lines+markers",
            name="Pareto front (feasible)",
            line={"dash": "dot"},
            text=[f"trial {t.number}" for t in front],
        )
    )
    figure.update_layout(
        title="Accuracy against samples/s",
        xaxis_title="samples/s (steady state)",
        yaxis_title="validation accuracy",
    )
    return figure


def _breakdown_bars(summary: Summary) -> go.Figure | None:
    import plotly.graph_objects as go

    trials = [t for t in summary.feasible[:TOP_TRIALS] if t.user_attrs.get("time_breakdown")]
    baseline = summary.baseline
    if (
        baseline is not None
        and baseline not in trials
        and baseline.user_attrs.get("time_breakdown")
    ):
        trials.append(baseline)
    if not trials:
        return None
    labels = [
        f"trial {t.number}" + (" (baseline)" if t.user_attrs.get("baseline") else "")
        for t in trials
    ]
    figure = go.Figure()
    for phase in PHASES:
        figure.add_trace(
            go.Bar(
                x=labels,
                y=[t.user_attrs["time_breakdown"].get(phase, 0.0) for t in trials],
                name=PHASE_LABELS[phase],
            )
        )
    figure.update_layout(
        barmode="stack",
        title="Where the training step's time goes (best trials first)",
        yaxis_title="share of a steady-state step",
        yaxis_tickformat=".0%",
    )
    return figure


def _optuna_figures(study: optuna.Study) -> list[tuple[str, str]]:
    """(title, html) of Optuna's optimization history and parameter importances."""
    figures = []
    for title, make in (
        ("Optimization history", optuna.visualization.plot_optimization_history),
        ("Parameter importances", optuna.visualization.plot_param_importances),
    ):
        try:
            figures.append((title, _figure_html(make(study))))
        except (ValueError, RuntimeError, ZeroDivisionError) as err:  # too few trials, say
            figures.append((title, f"<p class='note'>Not available: {html.escape(str(err))}</p>"))
    return figures


def render_html(study: optuna.Study, storage_url: str = DEFAULT_STORAGE) -> str:
    """A single self-contained HTML page about a study (plotly included: it opens offline).

    ReportError when plotly is missing (a bare CUDA image may lack it; studies can be reported
    on any machine that has it)."""
    try:
        import plotly.offline
    except ImportError:
        raise ReportError("autotune report needs plotly: pip install plotly") from None
    summary = summarize(study)
    best = summary.best
    config_rows: list[tuple[str, str, str, str]] = []
    if best is not None:
        config = trial_config(best).to_dict()
        baseline = trial_config(summary.baseline).to_dict() if summary.baseline else {}
        for name in KNOBS:
            config_rows.append(
                (
                    name,
                    _number(config[name]),
                    _number(baseline.get(name)) if baseline else "",
                    "searched" if name in best.params else "",
                )
            )
    comparisons = [
        (label.removeprefix("the "), other.number, speed, value, other.user_attrs)
        for label, other, speed, value in summary.comparisons()
    ]
    bars = _breakdown_bars(summary)
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("autotune", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
    )
    environment.filters["number"] = _number
    return environment.get_template("report.html.j2").render(
        summary=summary,
        best=best,
        config_rows=config_rows,
        comparisons=comparisons,
        measurements=_measurements(best) if best is not None else [],
        phases=[(p, PHASE_LABELS[p]) for p in PHASES],
        hardware=study.user_attrs.get("hardware", {}),
        figures=_optuna_figures(study),
        scatter=_figure_html(_scatter(study, summary)),
        bars=_figure_html(bars) if bars is not None else None,
        plotly_js=plotly.offline.get_plotlyjs(),
        generated=datetime.datetime.now().isoformat(timespec="seconds"),
        version=autotune.__version__,
        storage=storage_url,
    )
