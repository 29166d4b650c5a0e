"""The self-contained HTML report of a study: its answer against the baseline and the others,
where the time goes, accuracy against speed, Optuna's history and importances, the machine."""

from __future__ import annotations

import datetime
import html
from typing import TYPE_CHECKING

import jinja2
import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune._version import __version__
from autotune.errors import UserError
from autotune.export import best_config
from autotune.notes import PHASE_LABELS, Summary, measured, measurements, number, summarize
from autotune.results import PHASES
from autotune.spec import DEFAULT_STORAGE, KNOBS
from autotune.study import StudyRecord, TrialRecord, display_url, trial_config

if TYPE_CHECKING:  # plotly is imported where a report is drawn: run and export need none
    import plotly.graph_objects as go

__all__ = ["ReportError", "render_html"]

TOP_TRIALS = 10  # trials shown in the time-breakdown chart


class ReportError(UserError):
    """A report that cannot be written here (a user-fixable problem): one line."""


def _figure_html(figure: go.Figure) -> str:
    figure.update_layout(template="plotly_white", margin={"l": 60, "r": 20, "t": 50, "b": 50})
    return figure.to_html(full_html=False, include_plotlyjs=False)


def _pareto_front(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Trials no other trial beats on both accuracy and samples/s."""
    points = [
        (t, measured(t, "accuracy") or 0.0, measured(t, "samples_per_second") or 0.0)
        for t in trials
    ]
    front = []
    for trial, accuracy, speed in points:
        dominated = any(
            a >= accuracy and s >= speed and (a > accuracy or s > speed) for _, a, s in points
        )
        if not dominated:
            front.append(trial)
    return sorted(front, key=lambda t: measured(t, "samples_per_second") or 0.0)


def _scatter(study: optuna.Study, summary: Summary) -> go.Figure:
    import plotly.graph_objects as go

    complete = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if TrialRecord.of(t).samples_per_second is not None
    ]
    feasiblenumbers = {t.number for t in summary.feasible}
    figure = go.Figure()
    for label, chosen, symbol in (
        ("feasible", [t for t in complete if t.number in feasiblenumbers], "circle"),
        ("infeasible", [t for t in complete if t.number not in feasiblenumbers], "x"),
    ):
        figure.add_trace(
            go.Scatter(
                x=[measured(t, "samples_per_second") for t in chosen],
                y=[measured(t, "accuracy") for t in chosen],
                mode="markers",
                name=label,
                marker={"symbol": symbol, "size": 9},
                text=[f"trial {t.number}" for t in chosen],
            )
        )
    front = _pareto_front(summary.feasible)
    figure.add_trace(
        go.Scatter(
            x=[measured(t, "samples_per_second") for t in front],
            y=[measured(t, "accuracy") for t in front],
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

    def shares(trial: FrozenTrial) -> dict[str, float]:
        return TrialRecord.of(trial).time_breakdown or {}

    trials = [t for t in summary.feasible[:TOP_TRIALS] if shares(t)]
    baseline = summary.baseline
    if baseline is not None and baseline not in trials and shares(baseline):
        trials.append(baseline)
    if not trials:
        return None
    labels = [
        f"trial {t.number}" + (" (baseline)" if TrialRecord.of(t).baseline else "") for t in trials
    ]
    figure = go.Figure()
    for phase in PHASES:
        figure.add_trace(
            go.Bar(
                x=labels,
                y=[shares(t).get(phase, 0.0) for t in trials],
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
                    number(config[name]),
                    number(baseline.get(name)) if baseline else "",
                    "searched" if name in best.params else "",
                )
            )
    comparisons = [
        (label.removeprefix("the "), other.number, speed, value, TrialRecord.of(other))
        for label, other, speed, value in summary.comparisons()
    ]
    bars = _breakdown_bars(summary)
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("autotune", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
    )
    environment.filters["number"] = number
    return environment.get_template("report.html.j2").render(
        summary=summary,
        best=best,
        best_record=TrialRecord.of(best) if best is not None else None,
        confirmation=best_config(study, best).confirmation_text() if best is not None else "",
        config_rows=config_rows,
        comparisons=comparisons,
        measurements=measurements(best) if best is not None else [],
        phases=[(p, PHASE_LABELS[p]) for p in PHASES],
        hardware=StudyRecord.of(study).hardware or {},
        figures=_optuna_figures(study),
        scatter=_figure_html(_scatter(study, summary)),
        bars=_figure_html(bars) if bars is not None else None,
        plotly_js=plotly.offline.get_plotlyjs(),
        generated=datetime.datetime.now().isoformat(timespec="seconds"),
        version=__version__,
        storage=display_url(storage_url),  # never the password: it is a file people share
    )
