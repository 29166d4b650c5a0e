"""The HTML report's charts (plotly, imported where a chart is drawn: run and export need
none): the score against the training seconds with its Pareto front, the verified runs' curves,
where a step's time goes, and Optuna's history and importances."""

from __future__ import annotations

import html
import warnings
from typing import TYPE_CHECKING

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.outputs.notes import PHASE_LABELS, measured, names
from autotune.results import PHASES
from autotune.study import TrialRecord, Verification, feasible_trials

if TYPE_CHECKING:
    import plotly.graph_objects as go

TOP_TRIALS = 10  # trials shown in the time-breakdown chart


def figure_html(figure: go.Figure) -> str:
    figure.update_layout(template="plotly_white", margin={"l": 60, "r": 20, "t": 50, "b": 50})
    return figure.to_html(full_html=False, include_plotlyjs=False)


def _pareto_front(trials: list[FrozenTrial], higher_score_better: bool) -> list[FrozenTrial]:
    """Trials no other trial beats on both the score and samples/s."""
    sign = 1.0 if higher_score_better else -1.0
    points = [
        (t, sign * (measured(t, "score") or 0.0), measured(t, "samples_per_second") or 0.0)
        for t in trials
    ]
    front = []
    for trial, score, speed in points:
        dominated = any(
            a >= score and s >= speed and (a > score or s > speed) for _, a, s in points
        )
        if not dominated:
            front.append(trial)
    return sorted(front, key=lambda t: measured(t, "samples_per_second") or 0.0)


def scatter(study: optuna.Study) -> go.Figure:
    import plotly.graph_objects as go

    complete = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if TrialRecord.of(t).samples_per_second is not None
    ]
    feasible = feasible_trials(study)
    numbers = {t.number for t in feasible}
    _, score_name, higher = names(study)
    figure = go.Figure()
    for label, chosen, style in (
        ("feasible", [t for t in complete if t.number in numbers], {"symbol": "circle"}),
        ("infeasible", [t for t in complete if t.number not in numbers], {"symbol": "x"}),
        ("Pareto front (feasible)", _pareto_front(feasible, higher), None),
    ):
        figure.add_trace(
            go.Scatter(
                x=[measured(t, "samples_per_second") for t in chosen],
                y=[measured(t, "score") for t in chosen],
                mode="lines+markers" if style is None else "markers",
                name=label,
                marker={**style, "size": 9} if style is not None else None,
                line={"dash": "dot"} if style is None else None,
                text=[f"trial {t.number}" for t in chosen],
            )
        )
    figure.update_layout(
        title=f"{score_name} against samples/s",
        xaxis_title="samples/s (steady state)",
        yaxis_title=f"validation {score_name}",
    )
    return figure


def verified_curves(study: optuna.Study) -> go.Figure | None:
    """``autotune verify``'s runs: the score against training seconds, a line a run, the
    target marked; None before a verify."""
    import plotly.graph_objects as go

    verified = Verification.of(study)
    if verified is None or not verified.runs:
        return None
    figure = go.Figure()
    _, score_name, higher = names(study)
    role_names = {row.role: row.name for row in verified.rows(higher)}
    for run in verified.runs:
        figure.add_trace(
            go.Scatter(
                x=[0.0, *(seconds for seconds, _ in run.curve)],
                y=[None, *(score for _, score in run.curve)],
                mode="lines+markers",
                name=role_names[run.role] + (f", run {run.repeat}" if run.repeat > 1 else ""),
            )
        )
    if verified.target is not None:
        figure.add_hline(y=verified.target, line_dash="dot", annotation_text="target")
    figure.update_layout(
        title=f"At full length: {verified.epochs:g} epochs (autotune verify)",
        xaxis_title="training seconds (one-time costs included)",
        yaxis_title=f"validation {score_name}",
    )
    return figure


def breakdown_bars(study: optuna.Study, baseline: FrozenTrial | None) -> go.Figure | None:
    import plotly.graph_objects as go

    def shares(trial: FrozenTrial) -> dict[str, float]:
        return TrialRecord.of(trial).time_breakdown or {}

    trials = [t for t in feasible_trials(study)[:TOP_TRIALS] if shares(t)]
    if baseline is not None and baseline not in trials and shares(baseline):
        trials.append(baseline)
    if not trials:
        return None
    kinds = [(t.number, TrialRecord.of(t).reference) for t in trials]  # baseline, checklist
    labels = [f"trial {number}" + (f" ({kind})" if kind else "") for number, kind in kinds]
    figure = go.Figure()
    for phase in PHASES:
        figure.add_trace(
            go.Bar(
                x=labels, y=[shares(t).get(phase, 0.0) for t in trials], name=PHASE_LABELS[phase]
            )
        )
    figure.update_layout(
        barmode="stack",
        title="Where the training step's time goes (best trials first)",
        yaxis_title="share of a steady-state step",
        yaxis_tickformat=".0%",
    )
    return figure


def optuna_figures(study: optuna.Study) -> list[tuple[str, str]]:
    """(title, html) of Optuna's optimization history and parameter importances."""
    figures = []
    for title, make in (
        ("Optimization history", optuna.visualization.plot_optimization_history),
        ("Parameter importances", optuna.visualization.plot_param_importances),
    ):
        try:
            with warnings.catch_warnings():  # "some regimes have less than 2 trials": the
                warnings.simplefilter("ignore", UserWarning)  # page says what it measures
                figures.append((title, figure_html(make(study))))
        except (ValueError, RuntimeError, ZeroDivisionError) as err:  # too few trials, say
            figures.append((title, f"<p class='note'>Not available: {html.escape(str(err))}</p>"))
    return figures
