"""The objective: charged seconds, values, constraints, and the best trial being feasible."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from autotune.search.objective import (
    best_reachable,
    cannot_win,
    charged_seconds,
    intermediate_value,
    score,
    target_reached,
)
from autotune.spacefile import ObjectiveSpec
from autotune.study import best_trial, feasible_trials
from autotune.testing import make_evaluation as evaluation
from autotune.testing import make_result as result


def test_overhead_is_charged_in_proportion_to_the_full_run():
    # 10 s of training of which 4 s compilation, 3 epochs of a 30-epoch run: 6 + 4 * 3/30
    assert charged_seconds(10.0, 4.0, 3.0, 30.0) == pytest.approx(6.4)
    assert charged_seconds(10.0, 4.0, 3.0, None) == 10.0  # unknown full run: charged in full
    assert charged_seconds(10.0, 4.0, 30.0, 30.0) == pytest.approx(10.0)
    assert charged_seconds(10.0, 4.0, 45.0, 30.0) == pytest.approx(10.0)  # never more than all


def test_amortization_lets_a_compiled_run_win_when_the_full_run_is_long():
    """Compiled: 2x faster steady state but 8 s of compilation; eager: no overhead."""
    eager = result(evaluation(1, 3.0, 0.9, seconds=12.0))
    compiled = result(evaluation(1, 3.0, 0.9, seconds=6.0 + 8.0, overhead=8.0))
    short = ObjectiveSpec()
    long_run = ObjectiveSpec(full_run_epochs=90)
    assert score(compiled, short).value < score(eager, short).value
    assert score(compiled, long_run).value > score(eager, long_run).value
    assert score(compiled, long_run).charged_seconds == pytest.approx(6.0 + 8.0 * 3 / 90)


def test_accuracy_per_second_value_and_min_accuracy_constraint():
    objective = ObjectiveSpec(min_accuracy=0.9)
    good = score(result(evaluation(1, 1.0, 0.95, 2.0)), objective)
    assert good.value == pytest.approx(0.475) and good.feasible and good.reason == ""
    assert good.constraint == pytest.approx(-0.05) and good.constraint_name == "min_accuracy"
    fast_but_wrong = score(result(evaluation(1, 1.0, 0.2, 0.1)), objective)
    assert fast_but_wrong.value > good.value and not fast_but_wrong.feasible
    assert "below min_accuracy 0.9" in fast_but_wrong.reason
    unconstrained = score(result(evaluation(1, 1.0, 0.2, 0.1)), ObjectiveSpec())
    assert unconstrained.constraint is None and unconstrained.feasible


def test_time_to_accuracy():
    objective = ObjectiveSpec(metric="time_to_accuracy", target_accuracy=0.9)
    curve = [
        evaluation(1, 1.0, 0.6, 3.0),
        evaluation(2, 2.0, 0.92, 6.0),
        evaluation(3, 3.0, 0.95, 9.0),
    ]
    reached = score(result(*curve), objective)
    assert reached.value == 6.0 and reached.feasible and reached.score == 0.92
    assert [target_reached(e, objective) for e in curve] == [False, True, True]
    # linear extrapolation to the target for the pruner; the seconds themselves once reached
    assert intermediate_value(curve[0], objective) == pytest.approx(3.0 * 0.9 / 0.6)
    assert intermediate_value(curve[1], objective) == pytest.approx(6.0)
    missed = score(result(evaluation(1, 1.0, 0.5, 3.0), evaluation(2, 2.0, 0.7, 6.0)), objective)
    assert not missed.feasible and missed.constraint == pytest.approx(0.2)
    assert "never reached target_accuracy 0.9" in missed.reason


def test_intermediate_accuracy_per_second_charges_overhead_so_far():
    objective = ObjectiveSpec(full_run_epochs=10)
    value = intermediate_value(evaluation(1, 1.0, 0.8, seconds=5.0, overhead=3.0), objective)
    assert value == pytest.approx(0.8 / (2.0 + 3.0 * 0.1))


def test_a_value_reported_mid_trial_is_on_a_finished_trials_scale():
    """Optuna stores a pruned trial's last reported value as its value, and the dashboard and
    the report show it beside finished ones: at epoch 1 of 3 a trial reports what it ends at
    if it keeps its pace and its score, not its score over the seconds so far (3x that)."""
    objective = ObjectiveSpec()
    first = evaluation(1, 1.0, 0.9, seconds=2.0)
    assert intermediate_value(first, objective, epochs=3) == pytest.approx(0.9 / 6.0)
    assert intermediate_value(first, objective) == pytest.approx(0.9 / 2.0)  # its seconds so far
    last = evaluation(3, 3.0, 0.95, seconds=6.0)
    finished = score(result(first, last), objective).value
    assert intermediate_value(last, objective, epochs=3) == pytest.approx(finished)
    # a one-time cost is counted once, at the full run's share, not scaled with the pace
    compiled = evaluation(1, 1.0, 0.9, seconds=5.0, overhead=3.0)
    long_run = ObjectiveSpec(full_run_epochs=30)
    assert intermediate_value(compiled, long_run, epochs=3) == pytest.approx(
        0.9 / (2.0 * 3 + 3.0 * 3 / 30)
    )


def test_infeasible_trials_are_never_the_best():
    study = optuna.create_study(direction="maximize")
    distributions = {"lr": FloatDistribution(1e-4, 1.0, log=True)}

    def add(value: float, constraint: float | None, state=TrialState.COMPLETE) -> None:
        trial = create_trial(
            state=state,
            value=value if state == TrialState.COMPLETE else None,
            params={"lr": 0.01},
            distributions=distributions,
            system_attrs={} if constraint is None else {"constraints:min_accuracy": constraint},
        )
        study.add_trial(trial)

    add(5.0, 0.3)  # fastest, but 30 points below min_accuracy
    add(1.0, -0.05)
    add(2.0, -0.01)
    add(9.0, None, state=TrialState.PRUNED)
    assert best_trial(study).value == 2.0
    assert [t.value for t in feasible_trials(study)] == [2.0, 1.0]
    assert study.best_trial.value == 2.0  # Optuna agrees


def test_the_best_a_trial_can_still_reach_bounds_it_by_its_pace_and_a_perfect_score():
    # 1 epoch of 4 in 3 s, 1 s of it compiling: 3 epochs left at 2 s each, up to 20% faster
    at = evaluation(1, 1.0, 0.6, seconds=3.0, overhead=1.0)
    per_second = ObjectiveSpec()
    assert best_reachable(at, per_second, 4) == pytest.approx(1.0 / (3.0 + 3 * 2.0 * 0.8))
    # a long full run charges only its share of the compile, at the end as at every step
    amortized = ObjectiveSpec(full_run_epochs=40)
    assert best_reachable(at, amortized, 4) == pytest.approx(1.0 / (2.0 + 4.8 + 1.0 * 4 / 40))
    # a user's score has no known ceiling: nothing bounds it
    assert best_reachable(at, ObjectiveSpec(score="my.scores:f1"), 4) is None
    # time to a target: the seconds spent so far are spent
    to_target = ObjectiveSpec(metric="time_to_accuracy", target_accuracy=0.9)
    assert best_reachable(at, to_target, 4) == pytest.approx(3.0)


def test_after_a_busy_window_the_best_reachable_is_read_at_the_quiet_pace_since():
    # 1 s of compiling, then 5.5 s for epoch 1 while others took the cores, 0.5 s for epoch 2
    busy = evaluation(1, 1.0, 0.6, seconds=6.5, overhead=1.0)
    quiet = evaluation(2, 2.0, 0.7, seconds=7.0, overhead=1.0)
    per_second = ObjectiveSpec()
    # at 0.5 s an epoch throughout: 1 + 2 x 0.5 s so far, 2 epochs left 20% faster still
    assert best_reachable(quiet, per_second, 4, busy) == pytest.approx(1 / (2.0 + 2 * 0.5 * 0.8))
    assert best_reachable(quiet, per_second, 4) == pytest.approx(1 / (7.0 + 2 * 3.0 * 0.8))
    to_target = ObjectiveSpec(metric="time_to_accuracy", target_accuracy=0.9)
    assert best_reachable(quiet, to_target, 4, busy) == pytest.approx(2.0)
    assert best_reachable(busy, per_second, 4, busy) == best_reachable(busy, per_second, 4)


def test_a_trial_cannot_win_only_when_even_its_best_is_well_behind_the_leader():
    per_second, to_target = ObjectiveSpec(), ObjectiveSpec(metric="time_to_score", target_score=1)
    assert cannot_win(0.1, 0.2, per_second)  # half the leader's: lost
    assert not cannot_win(0.9, 1.0, per_second)  # within the noise of one measurement
    assert not cannot_win(None, 1.0, per_second)  # unbounded
    assert cannot_win(20.0, 10.0, to_target)  # already twice the leader's time to the target
    assert not cannot_win(11.0, 10.0, to_target)
