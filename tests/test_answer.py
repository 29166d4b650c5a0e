"""The study's answer (study/_answer.py): computed once from the trials and the recorded
confirmation round, and rendered alike by the terminal, the note, the report and ``best``."""

from __future__ import annotations

import dataclasses
import html
import io
import re

import optuna
import pytest
from rich.console import Console

from autotune import display, export
from autotune.config import TrialConfig
from autotune.outputs import notes, report
from autotune.spacefile import parse_spec
from autotune.study import (
    REFERENCE_NAMES,
    Answer,
    ConfirmationRecord,
    ConfirmRun,
    Reference,
    RunOutcome,
    TrialRecord,
    answer_of,
    answer_trial,
    feasible_trials,
    reference_trial,
)
from autotune.testing import make_config

TRIAL_SECONDS = 10.0  # each trial's wall-clock seconds, as the study process saw it
RUN_SECONDS = 2.0  # each confirmation run's


def _study(
    values: list[float],
    baseline: int | None = None,
    maximize: bool = True,
    checklist: int | None = None,
    configs: dict[int, TrialConfig] | None = None,
):
    """An in-memory study of COMPLETE feasible trials 0, 1, ... with these values (and these
    configurations, where given)."""
    study = optuna.create_study(direction="maximize" if maximize else "minimize")
    for number, value in enumerate(values):
        record = TrialRecord(
            config=(configs or {}).get(number),
            baseline=number == baseline,
            checklist=number == checklist,
            wall_seconds=TRIAL_SECONDS,
        )
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs=record.to_attrs()))
    return study


def _round(
    series: dict[int, list[float]],
    scores: dict[int, float] | None = None,
    other: dict[int, float] | None = None,
    speed: dict[int, float] | None = None,
    **fields: object,
) -> ConfirmationRecord:
    """A recorded round: trial -> its values (repeat 0, its trial, first); ``other``: the
    others' share of the cores in each of a trial's runs; ``speed``: a trial's samples/s in
    each run (100 times its value where not given)."""
    runs = tuple(
        ConfirmRun(
            trial=number,
            repeat=repeat,
            seed=repeat,
            value=value,
            score=(scores or {}).get(number, 0.9),
            samples_per_second=(speed or {}).get(number, 100.0 * value),
            feasible=True,
            wall_seconds=RUN_SECONDS,
            other_cpu_share=(other or {}).get(number),
        )
        for number, values in series.items()
        for repeat, value in enumerate(values)
    )
    defaults = {"top": 2, "repeats": 2, "maximize": True, "baseline": None, "complete": True}
    return ConfirmationRecord(candidates=tuple(series), runs=runs, **{**defaults, **fields})


def _answer(study: optuna.Study, record: ConfirmationRecord) -> Answer:
    study.set_user_attr("confirmation", record.to_attrs())
    found = answer_of(study)
    assert found is not None
    return found


def test_a_clear_winner_carries_its_medians_the_rounds_facts_and_its_ratio_over_the_baseline():
    # trial 1 had the best single value; trial 2 is confirmed faster, beyond the noise
    study = _study([1.0, 3.0, 2.6], baseline=0)
    record = _round({1: [3.0, 2.0, 2.1], 2: [2.6, 2.7, 2.65], 0: [1.0, 1.1, 1.05]}, baseline=0)
    answer = _answer(study, record)
    assert answer.confirmed and answer.round_state == "confirmed"
    assert answer.number == 2 and answer.trial.value == 2.6
    assert answer_trial(study) == answer.trial
    assert answer.median == 2.65 and answer.runs == 3 and len(answer.winner.round_values) == 2
    assert answer.headline == (2.65, "median of 3 confirmed runs")  # not its trial's 2.6
    assert answer.winner is not None and answer.winner.median_score == 0.9
    assert answer.winner.median_samples_per_second == pytest.approx(265)
    assert answer.tied == () and answer.tie_rule == "value" and not answer.noisy
    # the typical half-range: 0.238 (trial 1), 0.019 (trial 2), 0.048 (the baseline)
    assert answer.spread == pytest.approx(0.05 / 1.05)
    # the ratio of the round's own runs, the originals left out: 2.675 against 1.075, between
    # the answer's low over the baseline's high and its high over their low, each side's runs
    # (2.65-2.7, 1.05-1.1) closer than the round's spread: that spread about their medians
    low, high = 1 - answer.spread, 1 + answer.spread
    assert answer.references == (
        Reference(
            "the untuned baseline",
            0,
            pytest.approx(1.075),
            2,
            pytest.approx(2.675 / 1.075),
            (pytest.approx(2.675 * low / 1.075 / high), pytest.approx(2.675 * high / 1.075 / low)),
        ),
    )
    assert answer.references[0].said == "2.49x the untuned baseline (2.26x to 2.74x)"
    assert answer.speedup == answer.references[0].ratio
    assert [c.trial for c in answer.configurations] == [1, 2, 0] and answer.repeats == 2
    assert not answer.interfered and answer.flagged == 0
    assert answer.round_runs == 6 and answer.cost_seconds == 6 * RUN_SECONDS
    assert answer.search_share == pytest.approx(6 * RUN_SECONDS / (3 * TRIAL_SECONDS))


def test_tied_leaders_are_named_with_the_rule_that_picked_among_them():
    study = _study([2.0, 2.05])
    record = _round({0: [2.0, 2.2, 2.1], 1: [2.05, 2.15, 2.12]}, scores={0: 0.9, 1: 0.95})
    answer = _answer(study, record)
    assert answer.number == 1 and answer.tied == (0,) and answer.tie_rule == "score"
    assert answer.references == () and answer.speedup is None  # no baseline in this round
    # the better median, where the scores are alike
    alike = _answer(study, _round({0: [2.0, 2.2, 2.1], 1: [2.05, 2.15, 2.12]}))
    assert alike.number == 1 and alike.tied == (0,) and alike.tie_rule == "value"


def test_a_round_too_noisy_to_rank_names_the_best_median_and_says_so():
    study = _study([0.05, 0.092, 0.166], baseline=0)
    record = _round(
        {2: [0.166, 0.05, 0.4], 1: [0.092, 0.02, 0.2], 0: [0.05, 0.01, 0.1]},
        scores={1: 0.916, 2: 0.9},
        baseline=0,
    )
    answer = _answer(study, record)
    assert answer.noisy and answer.tie_rule == "noisy" and answer.tied == ()
    assert answer.number == 2 and answer.spread is not None and answer.spread > 0.25


def test_a_noisy_round_whose_named_trial_beats_every_other_run_gives_the_figures():
    """A new user read "too noisy to rank the leaders" beside the answer's runs of 11.7-15.4
    against at most 8.63 as a contradiction: under a load that varied, the rule stands (a
    varying load can open such a gap), and the figures are said beside it."""
    study = _study([8.06, 4.73, 12.9], baseline=0)
    series = {2: [12.9, 11.7, 15.4], 0: [8.06, 7.5, 8.63], 1: [4.73, 4.48, 4.98]}
    loads = {2: 0.2, 0: 0.9, 1: 0.5}  # every run flagged, the load 20-90%: "varied"
    answer = _answer(study, _round(series, other=loads, baseline=0))
    assert answer.noise == "varied" and answer.noisy and answer.number == 2
    assert "trial 2 is named for the best median; its runs (11.7-15.4) all beat every other's " \
        "(at most 8.63), as a varying load can. " in display.noisy_round(answer)  # fmt: skip
    series[1] = [4.73, 4.48, 12.0]  # overlapping: nothing more said
    overlapping = _answer(study, _round(series, other=loads, baseline=0))
    assert overlapping.number == 2 and overlapping.noisy
    assert "all beat" not in display.noisy_round(overlapping)


def test_the_baseline_can_be_the_answer_and_is_then_named_so():
    study = _study([2.0, 1.9], baseline=0)
    answer = _answer(study, _round({1: [1.9, 1.0, 1.05], 0: [2.0, 2.1, 2.2]}, baseline=0, top=1))
    assert answer.confirmed and answer.number == 0
    assert (
        answer.reference == REFERENCE_NAMES["baseline"]
        and answer.references == ()
        and answer.speedup is None
    )


def test_the_answer_is_measured_against_both_references_and_the_checklist_can_win():
    study = _study([1.0, 2.0, 3.0], baseline=0, checklist=1)
    series = {2: [3.0, 3.1, 2.9], 0: [1.0, 1.0, 1.1], 1: [2.0, 2.1, 1.9]}
    answer = _answer(study, _round(series, baseline=0, checklist=1, top=1))
    assert answer.number == 2 and answer.reference is None
    assert [(r.name, r.number, r.runs) for r in answer.references] == [
        (REFERENCE_NAMES["baseline"], 0, 2),
        (REFERENCE_NAMES["checklist"], 1, 2),
    ]
    assert answer.speedup == pytest.approx(3.0 / 1.05)
    assert answer.ratio_over(REFERENCE_NAMES["checklist"]) == pytest.approx(3.0 / 2.0)
    said = export.TrialConfirmation.of(answer, 2)
    assert said is not None and said.over_checklist == pytest.approx(1.5)
    assert "; 2.86x the untuned baseline (2.59x to 3.16x); 1.50x the tuning checklist " in (
        export.confirmation_text(said, study.study_name)
    )
    # the search's leader falls back in the round: the checklist is the answer, and says so
    series[2] = [3.0, 1.5, 1.6]
    won = _answer(study, _round(series, baseline=0, checklist=1, top=1))
    assert won.number == 1 and won.reference == REFERENCE_NAMES["checklist"]
    assert [r.name for r in won.references] == [
        REFERENCE_NAMES["baseline"]
    ]  # never a ratio over itself
    text = export.confirmation_text(export.TrialConfirmation.of(won, 1), study.study_name)
    assert text.endswith("; it is the tuning checklist: the search found nothing better")


def test_a_reference_whose_own_trial_was_infeasible_is_never_the_answer():
    """A reference is measured whatever it scored; once, the checklist won a round on two
    feasible runs while its own trial had scored 0.258 under min_accuracy 0.5, and `best`
    showed that score as the answer's."""
    study = _study([1.0, 2.0, 3.0], baseline=0, checklist=1)
    record = _round(
        {2: [3.0, 2.0, 2.1], 0: [1.0, 1.0, 1.1], 1: [2.0, 3.3, 3.2]},
        baseline=0,
        checklist=1,
        top=1,
    )
    infeasible_trial = tuple(
        dataclasses.replace(run, feasible=False) if (run.trial, run.repeat) == (1, 0) else run
        for run in record.runs
    )
    answer = _answer(study, dataclasses.replace(record, runs=infeasible_trial))
    assert answer.number == 2 and answer.reference is None
    assert _answer(study, record).number == 1  # with its trial feasible, it wins


def test_an_answer_measured_only_under_interference_says_so():
    study = _study([1.0, 3.0], baseline=0)
    record = _round({1: [3.0, 3.1, 2.9], 0: [1.0, 1.1, 1.05]}, other={1: 0.9}, baseline=0)
    answer = _answer(study, record)
    assert answer.number == 1 and answer.interfered and answer.flagged == 3
    assert answer.runs == 3  # every run flagged: they count, and the answer says so
    # measured again on a quiet machine: the clean run is its one measurement compared, no
    # confirmed median (``CONFIRMED_RUNS``); the slower baseline's 3 clean runs do not win
    again = dataclasses.replace(record.runs[2], value=3.05, other_cpu_share=0.0)
    clean = _answer(study, record.with_run(again))
    assert clean.round_state == "few_runs" and clean.number == 1 and clean.flagged == 3
    assert clean.configuration(1).values == (3.05,) and clean.median is None


def test_a_round_busy_after_a_quiet_search_compares_its_own_runs_not_the_trials():
    """A round whose runs were all measured under interference (others started once the
    search was done; no retakes left) was ranked on the trials' own quiet measurements, one
    each: nothing confirmed, its ``winner`` None (test_study's round test, in a whole-suite
    run: "'NoneType' object has no attribute 'trial'"). The round's own runs, side by side
    under one load, are what it compares."""
    study = _study([1.0, 2.0, 1.8], baseline=0)
    record = _round({1: [2.0, 2.1, 2.2], 2: [1.8, 1.9, 1.85], 0: [1.0, 1.1, 1.05]}, baseline=0)
    busy = tuple(
        dataclasses.replace(run, other_cpu_share=0.8 if run.repeat else 0.05)
        for run in record.runs
    )
    answer = _answer(study, dataclasses.replace(record, runs=busy))
    assert answer.confirmed and answer.number == 1 and answer.interfered
    assert answer.winner is not None and answer.winner.values == (2.1, 2.2)
    assert answer.speedup == pytest.approx(2.15 / 1.075)
    # where one configuration's runs of the round were quiet, the others' not: unlike loads
    one = tuple(
        dataclasses.replace(run, other_cpu_share=0.05) if run.trial == 2 else run for run in busy
    )
    mixed = _answer(study, dataclasses.replace(record, runs=one))
    assert not mixed.alike and mixed.round_state == "few_runs" and mixed.references == ()


def _runs(trial: int, *measured: tuple[int, float, float | None]) -> list[ConfirmRun]:
    """A configuration's runs as the round recorded them: (repeat, value, others' share of the
    cores), a run measured again under interference once more for each try."""
    return [
        ConfirmRun(trial, repeat, repeat, value, 0.9, 1e4 * value, True, RUN_SECONDS, None, other)
        for repeat, value, other in measured
    ]


def test_one_clean_run_is_never_compared_with_six_flagged_ones():
    """Measured once: "28.60x the untuned baseline's accuracy per second (confirmed: medians of
    1 and 6 runs side by side)" was the answer's one clean run against six baseline runs, every
    one of them flagged for interference. Flagged runs are compared with flagged runs."""
    study = _study([0.1, 0.85], baseline=0)
    answer_runs = _runs(
        1,
        (0, 0.85, 0.4),
        (1, 0.9, 0.45), (1, 0.8, 0.5), (1, 2.86, 0.02),  # measured again until quiet
        (2, 0.7, 0.6), (2, 0.75, 0.55), (2, 0.8, 0.5),  # never quiet: kept, flagged
    )  # fmt: skip
    baseline_runs = _runs(
        0,
        (0, 0.1, 0.5),
        (1, 0.098, 0.6), (1, 0.1, 0.55), (1, 0.104, 0.5),
        (2, 0.096, 0.6), (2, 0.1, 0.55), (2, 0.112, 0.5),
    )  # fmt: skip
    record = _round({1: [], 0: []}, baseline=0, top=1)
    record = dataclasses.replace(record, runs=(*answer_runs, *baseline_runs))
    answer = _answer(study, record)
    assert answer.number == 1 and answer.interfered  # its flagged runs are what it is ranked on
    # the round's own: its trial's flagged 0.85 was the search's, under another load
    assert answer.median == 0.8 and answer.runs == 5 and len(answer.winner.round_values) == 5
    (baseline,) = answer.references
    assert baseline.runs == 6 and baseline.ratio == pytest.approx(0.8 / 0.1)  # not 2.86 / 0.1
    # the round's spread is ±10.25% (the answer's ±12.5%, the baseline's ±8%): the baseline's
    # low end widens to 0.1 * 0.8975, its high stays its run's 0.112; the answer's runs (0.7 to
    # 0.9) are wider than the spread about their median
    assert answer.spread == pytest.approx(0.1025)
    assert baseline.interval == (pytest.approx(0.7 / 0.112), pytest.approx(0.9 / 0.08975))
    assert baseline.said == "8.00x the untuned baseline (6.25x to 10.03x)"
    # where the answer has no flagged run to set beside them, nothing is compared at all
    clean_only = [run for run in answer_runs if not run.interfered]
    # (and its one clean run is no confirmed median: ``CONFIRMED_RUNS``)
    quiet = _answer(study, dataclasses.replace(record, runs=(*clean_only, *baseline_runs)))
    assert quiet.number == 1 and quiet.round_state == "few_runs" and not quiet.alike
    assert quiet.speedup is None and quiet.references == ()


def test_a_round_that_kept_one_clean_run_of_seven_ranks_on_the_flagged_ones():
    """Measured once: a round kept "1 of 7" runs of a configuration, its one clean run at
    221.9k samples/s against 13k in its own trial, and named it the answer over leaders it had
    measured only under interference."""
    study = _study([1.0, 1.3, 1.5], baseline=0)
    outlier = _runs(
        1,
        (0, 1.3, 0.5),
        (1, 1.2, 0.6), (1, 1.4, 0.5), (1, 22.19, 0.0),  # 221.9k samples/s
        (2, 1.1, 0.6), (2, 1.3, 0.5), (2, 1.25, 0.55),
    )  # fmt: skip
    leader = _runs(2, *((repeat, value, 0.5) for repeat, value in (
        (0, 1.5), (1, 1.45), (1, 1.55), (1, 1.5), (2, 1.6), (2, 1.4), (2, 1.5),
    )))  # fmt: skip
    baseline = _runs(0, *((repeat, value, 0.5) for repeat, value in (
        (0, 1.0), (1, 0.95), (1, 1.05), (1, 1.0), (2, 1.1), (2, 0.9), (2, 1.0),
    )))  # fmt: skip
    record = _round({2: [], 1: [], 0: []}, baseline=0)
    answer = _answer(study, dataclasses.replace(record, runs=(*leader, *outlier, *baseline)))
    assert answer.number == 2 and answer.interfered and answer.alike and not answer.noisy
    kept = next(c for c in answer.configurations if c.trial == 1)
    # its flagged 1.3 (the search's) and its quiet 22.19 are not compared with the round's runs
    assert 22.19 not in kept.values and len(kept.values) == 5 and kept.all_runs == 7
    assert answer.references[0].said == "1.50x the untuned baseline (1.23x to 1.83x)"
    said = io.StringIO()
    spec = parse_spec("workload: {model: digits_cnn, data: digits}\n")
    display.print_confirmation(Console(file=said, width=200), answer, spec, study.study_name)
    shown = " ".join(said.getvalue().split())
    assert "│ 1 │" in shown and "5 of 7" in shown
    narrow = io.StringIO()  # narrower than the table: the cell stays whole (it wrapped at "(")
    display.print_confirmation(Console(file=narrow, width=70), answer, spec, study.study_name)
    assert "5 of 7 (4 retakes)" in narrow.getvalue(), narrow.getvalue()
    run = f"run `autotune confirm --study {study.study_name} --again`"  # a new round: confirm
    assert f"; measured while other processes used the CPU (on a quiet machine, {run})." in shown
    assert "confirmed under load: median" in shown  # first, before the ratios it qualifies
    # what the round cost, against what (a new user could not tell what "the search" was)
    assert re.search(r"confirmation: \d+ runs, \d+ s, \d+% of the trials' \d+ s\.", shown)


def test_a_ratio_whose_interval_includes_one_is_too_noisy_to_quote():
    """Measured once: "1.87x" the untuned baseline printed at a run-to-run spread of ±373%."""
    study = _study([0.05, 0.12, 0.1], baseline=0)
    series = {2: [0.1, 0.2, 1.592], 1: [0.12, 0.15, 1.2], 0: [0.05, 0.1, 0.858]}
    answer = _answer(study, _round(series, baseline=0))
    assert answer.number == 2 and answer.noisy and answer.spread == pytest.approx(3.73)
    (baseline,) = answer.references
    assert baseline.ratio is None and answer.speedup is None
    assert baseline.said == (
        "over the untuned baseline, too noisy to quote a ratio (the runs' spreads allow any ratio)"
    )
    said = export.TrialConfirmation.of(answer, 2)
    assert said is not None and said.speedup is None and said.said == (baseline.said,)
    assert baseline.said in export.confirmation_text(said, study.study_name)
    # a quiet round whose ratio is still within the two sides' spreads claims nothing either:
    # there the two are tied (test_a_quiet_round_calls_overlapping_runs_tied_not_noisy)
    close = {2: [1.1, 1.2, 0.95], 1: [1.0, 1.0, 1.02], 0: [1.0, 1.05, 0.95]}
    near = _answer(study, _round(close, baseline=0)).references[0]
    assert near.ratio is None and near.interval is not None and near.tied
    assert near.interval[0] < 1.0 < near.interval[1]
    assert near.said == (
        "tied with the untuned baseline, the same within the round's spread (the runs' spreads "
        "allow 0.90x to 1.26x)"
    )


def test_runs_that_separate_by_more_than_the_spread_are_a_speedup_even_in_a_noisy_round():
    """Measured once (seq.yaml, 2 workers): trial 14 ran 1.329-2.137 acc/s against the
    baseline's 0.8232-0.9679, every run above every baseline run, in a round at ±29%; the
    verdict read "over the untuned baseline, no measurable speed-up on this machine". Two runs
    a side that separate are no measured ratio by themselves (one chance in six that they
    would by chance alone): the ratio is claimed where they separate by more than the round's
    spread, and else the runs' range is said."""
    study = _study([0.9679, 1.3, 1.5, 2.137], baseline=0, checklist=1)
    series = {3: [2.137, 1.329, 1.658], 2: [1.5, 0.9, 2.3], 1: [1.3, 0.7, 1.6]}
    record = _round({**series, 0: [0.9679, 0.8232, 0.8823]}, baseline=0, checklist=1)
    answer = _answer(study, record)
    assert answer.number == 3 and answer.noisy and answer.spread == pytest.approx(0.295, 0.01)
    baseline, checklist = answer.references
    # 1.4935 against 0.85275: the baseline's runs widened to ±29.5% reach the answer's low
    assert baseline.ratio is None and baseline.interval is not None
    assert baseline.interval[0] < 1.0 < baseline.interval[1]
    assert baseline.said == (
        "over the untuned baseline, too noisy to quote a ratio (the runs' spreads allow 0.95x "
        "to 3.22x)"
    )
    # the answer's runs further ahead, the noisier leaders noisier still: claimed
    series = {3: [2.137, 2.3, 2.6], 2: [1.5, 0.6, 2.4], 1: [1.3, 0.5, 1.8]}
    record = _round({**series, 0: [0.9679, 0.8232, 0.8823]}, baseline=0, checklist=1)
    ahead = _answer(study, record)
    assert ahead.number == 3 and ahead.noisy and ahead.spread == pytest.approx(0.3, 0.01)
    baseline, checklist = ahead.references
    assert baseline.ratio == pytest.approx(2.45 / 0.85275)
    assert baseline.said == "2.87x the untuned baseline (1.55x to 5.34x)"
    # the checklist's widened runs reach into the answer's: the spread hides any gain
    assert checklist.ratio is None and checklist.said == (
        "over the tuning checklist, too noisy to quote a ratio (the runs' spreads allow 0.95x "
        "to 6.37x)"
    )


def _quickstart_round(
    changed: dict[int, list[float]] | None = None,
) -> tuple[optuna.Study, ConfirmationRecord]:
    """A quickstart study and its round as measured on a 2-core VM (trials 0 and 1 its
    references, 20, 21 and 12 its leaders), a trial's values ``changed`` where given."""
    measured = {
        20: [3.456, 2.387, 3.136],
        21: [3.453, 3.288, 3.186],
        12: [3.393, 2.188, 3.745],
        0: [1.654, 1.662, 2.070],
        1: [2.749, 2.613, 2.748],
    }
    measured.update(changed or {})
    values = [measured.get(number, [2.0])[0] for number in range(22)]
    record = _round(measured, baseline=0, checklist=1, top=3)
    return _study(values, baseline=0, checklist=1), record


def _below_the_bar(record: ConfirmationRecord, *runs: tuple[int, int]) -> ConfirmationRecord:
    """``record`` with the runs (trial, repeat) trained to a score below the study's bar."""
    return dataclasses.replace(
        record,
        runs=tuple(
            dataclasses.replace(run, feasible=False, score=0.711)
            if (run.trial, run.repeat) in runs
            else run
            for run in record.runs
        ),
    )


def test_a_ratio_needs_two_runs_of_the_round_on_each_side():
    """Measured on the quickstart: "1.40x the tuning checklist (1.30x to 1.50x)" rested on one
    round run of the answer (trial 12), its other run at another seed below the bar, spread by
    the round's ±5%; measured again side by side, 5 runs each, it was 1.05x. Its trial's own
    value confirms its median; no ratio is read from one run."""
    study, record = _quickstart_round()
    answer = _answer(study, _below_the_bar(record, (12, 1)))
    assert answer.confirmed and answer.number == 12 and answer.runs == 2  # its trial and 1 run
    assert answer.speedup is None and answer.ratio_over(REFERENCE_NAMES["checklist"]) is None
    why = "no ratio: the answer has 1 feasible run in the round (2 needed)"
    assert [reference.said for reference in answer.references] == [
        f"over the untuned baseline, {why}",
        f"over the tuning checklist, {why}",
    ]
    assert all(r.interval is None and not r.tied for r in answer.references)
    said = export.TrialConfirmation.of(answer, 12)
    assert said is not None and said.speedup is None and said.speedup_interval is None
    assert f"; over the tuning checklist, {why}" in export.confirmation_text(said, "q")
    # with both its runs feasible, the ratios are claimed
    study, record = _quickstart_round({12: [3.393, 3.6, 3.745]})
    claimed = _answer(study, record)
    assert claimed.number == 12 and claimed.speedup == pytest.approx(3.6725 / 1.866)
    # a reference with one feasible run of its own in the round: no ratio over it, the other
    # reference's stands
    study, record = _quickstart_round({12: [3.393, 3.6, 3.745]})
    one = _answer(study, _below_the_bar(record, (1, 2)))
    baseline, checklist = one.references
    assert baseline.ratio == claimed.speedup and checklist.ratio is None
    assert checklist.runs == 1 and checklist.said == (
        "over the tuning checklist, no ratio: it has 1 feasible run in the round (2 needed)"
    )
    # none: said so
    none = _answer(study, _below_the_bar(record, (1, 1), (1, 2))).references[1]
    assert none.said == (
        "over the tuning checklist, no ratio: it has no feasible run in the round (2 needed)"
    )
    # a round of one more run each compares no ratio at all, and says so
    study, record = _quickstart_round()
    short = dataclasses.replace(record, runs=tuple(r for r in record.runs if r.repeat < 2))
    single = _answer(study, dataclasses.replace(short, repeats=1))
    assert single.confirmed and single.speedup is None
    assert single.references[0].said == (
        "over the untuned baseline, no ratio: the answer has 1 feasible run in the round "
        "(2 needed)"
    )


def test_two_close_runs_a_side_are_widened_to_the_rounds_spread():
    """Measured on the quickstart, on a VM whose speed drifts 30% within a minute: the answer's
    two runs 3.5% apart and the checklist's 2.4%, in a round whose configurations spread ±8%,
    claimed "1.04x the tuning checklist (1.01x to 1.07x)"; measured again, 0.87x. Each side's
    range is at least the round's spread about its median: tied, no gain claimed."""
    series = {
        10: [3.883, 4.274, 4.423],  # the answer; the original first, then the round's runs
        7: [3.609, 3.981, 4.213],
        1: [3.511, 4.125, 4.226],  # the tuning checklist
        0: [2.16, 2.506, 2.638],  # the untuned baseline
    }
    values = [series.get(number, [2.0])[0] for number in range(11)]
    study = _study(values, baseline=0, checklist=1)
    answer = _answer(study, _round(series, baseline=0, checklist=1, top=2))
    assert answer.number == 10 and answer.noise == "quiet"
    assert answer.spread == pytest.approx(0.0813, abs=1e-4)
    baseline, checklist = answer.references
    low, high = 1 - answer.spread, 1 + answer.spread
    ours, theirs = (4.274 + 4.423) / 2, (4.125 + 4.226) / 2
    assert checklist.interval == (
        pytest.approx(ours * low / (theirs * high)),
        pytest.approx(ours * high / (theirs * low)),
    )
    assert checklist.ratio is None and checklist.tied
    assert checklist.said == (
        "tied with the tuning checklist, the same within the round's spread (the runs' spreads "
        "allow 0.88x to 1.23x)"
    )
    # the baseline, further behind than both spreads: claimed, with the wider interval
    assert baseline.ratio == pytest.approx(ours / 2.572)
    assert baseline.said == "1.69x the untuned baseline (1.44x to 1.99x)"
    # the tuning checklist is said tied with the answer everywhere
    said = export.TrialConfirmation.of(answer, 10)
    assert said is not None and said.over_checklist is None
    assert checklist.said in export.confirmation_text(said, study.study_name)
    # a side whose own runs lie wider than the spread keeps them: its lowest and highest
    wide = _answer(study, _round({**series, 1: [3.511, 3.6, 4.6]}, baseline=0, checklist=1))
    spread = wide.spread  # ±8.6%: 3.6 and 4.6 lie outside 4.1's
    assert spread is not None and 4.1 * (1 + spread) < 4.6 and 4.1 * (1 - spread) > 3.6
    assert wide.references[1].interval == (
        pytest.approx(ours * (1 - spread) / 4.6),
        pytest.approx(ours * (1 + spread) / 3.6),
    )


def test_the_baselines_own_execution_settings_claim_the_learning_difference_alone():
    """Measured once: "1.31x" the untuned baseline for a configuration whose execution
    settings were the baseline's (it differed in lr only), both at accuracy 1.0: the
    difference in samples/s between two runs of the same settings is noise."""
    configs = {0: make_config(lr=0.01), 1: make_config(lr=0.03)}
    study = _study([0.0311, 0.0408], baseline=0, configs=configs)
    series = {1: [0.0408, 0.0412, 0.0404], 0: [0.0311, 0.0312, 0.0310]}
    round_ = _round(series, scores={0: 1.0, 1: 1.0}, baseline=0, top=1)
    answer = _answer(study, round_)
    (baseline,) = answer.references
    assert baseline.learning_only and baseline.ratio is None and answer.speedup is None
    assert baseline.said == (
        "tied with the untuned baseline, the same within the round's spread (the runs' spreads "
        "allow 0.98x to 1.02x; learning alone: the same execution settings, their samples/s "
        "difference left out as noise)"
    )
    # the same settings learning faster (the baseline at half the accuracy): that is claimed
    alike = _round(series, scores={0: 0.5, 1: 1.0}, speed={0: 1000.0, 1: 1000.0}, baseline=0)
    learned = _answer(study, dataclasses.replace(alike, top=1)).references[0]
    assert learned.ratio == pytest.approx(0.0408 / 0.0311)
    assert learned.said == (
        "1.31x the untuned baseline (1.29x to 1.33x; learning alone: the same execution "
        "settings, their samples/s difference left out as noise)"
    )
    # other execution settings: the same figures are a speed-up
    configs[1] = make_config(lr=0.03, batch_size=64)
    other = _answer(_study([0.0311, 0.0408], baseline=0, configs=configs), round_)
    assert other.speedup == pytest.approx(0.0408 / 0.0311)
    assert not other.references[0].learning_only


def test_best_says_no_speedup_over_a_baseline_infeasible_in_the_round():
    """Measured once: where the untuned baseline was below min_score, ``run`` printed no
    speed-up and ``best`` said "4.71x ... one measurement each", from the trials' values
    (0.3837 for the answer, whose round measured 2.004)."""
    configs = {0: make_config(), 1: make_config(batch_size=64)}
    study = _study([0.3837 / 4.71, 0.3837], baseline=0, configs=configs)
    record = _round({1: [0.3837, 2.004, 1.98], 0: [0.3837 / 4.71, 0.4, 0.41]}, baseline=0, top=1)
    below = tuple(dataclasses.replace(r, feasible=r.trial != 0) for r in record.runs)
    answer = _answer(study, dataclasses.replace(record, runs=below))
    assert answer.confirmed and answer.number == 1 and answer.speedup is None
    best = export.best_config(study, answer.trial)
    text = best.confirmation_text()
    assert "4.71x" not in text and "x the untuned baseline" not in text
    # not the machine's noise: the baseline never reached the bar (a new user read it as noise)
    assert text.endswith(
        "over the untuned baseline, no ratio: none of its runs in the round reached the bar"
    )
    plain = best.to_dict()["confirmation"]
    assert plain["speedup"] is None and plain["speedup_interval"] is None
    assert plain["said"] == [answer.references[0].said]
    # the baseline itself, measured 3 times in the round and short of the bar: not "one
    # measurement", and no `autotune confirm` to run (it would measure it again alike)
    missed = export.best_config(study, study.trials[0]).confirmation_text()
    assert missed == (
        "not confirmed: the round ranked only its leaders that met the bar in most of their "
        "runs, with 2 runs compared at least"
    )


def test_for_a_time_to_a_target_the_ratio_is_the_references_time_over_the_answers():
    study = _study([20.0, 10.0], baseline=0, maximize=False)
    record = _round({1: [10.0, 11.0, 12.0], 0: [20.0, 22.0, 24.0]}, baseline=0, maximize=False)
    answer = _answer(study, record)
    assert answer.number == 1 and answer.median == 11.0
    assert answer.speedup == pytest.approx(23.0 / 11.5)  # medians of the round's own runs


def test_a_round_that_does_not_back_the_best_trial_leaves_it_unconfirmed():
    study = _study([1.0, 3.0, 2.6], baseline=0)
    assert answer_of(optuna.create_study()) is None  # no feasible trial: no answer
    several = optuna.create_study(directions=["maximize", "minimize"])
    several.add_trial(optuna.trial.create_trial(values=[2.0, 0.5]))
    assert answer_of(several) is None  # several objectives: no one best
    plain = answer_of(study)
    assert plain is not None and plain.round_state == "none" and plain.number == 1
    assert plain.spread is None and plain.configurations == ()
    assert plain.headline == (3.0, "one measurement")  # as "not confirmed: one measurement"
    record = _round({1: [3.0, 2.0, 2.1], 2: [2.6, 2.7, 2.65], 0: [1.0, 1.1, 1.05]}, baseline=0)
    unfinished = _answer(study, dataclasses.replace(record, complete=False))
    assert unfinished.round_state == "unfinished" and unfinished.number == 1
    assert unfinished.median is None and unfinished.spread == pytest.approx(0.05 / 1.05)
    # a trial since beats both leaders: the round is about leaders that are no longer
    study.add_trial(
        optuna.trial.create_trial(
            value=5.0, user_attrs=TrialRecord(wall_seconds=TRIAL_SECONDS).to_attrs()
        )
    )
    stale = _answer(study, record)
    assert stale.round_state == "stale" and not stale.confirmed and stale.number == 3
    assert stale.median is None and stale.references == () and stale.speedup is None
    assert stale.spread == pytest.approx(0.05 / 1.05)  # the machine's noise still is
    assert answer_trial(study) == stale.trial


def test_a_round_where_no_configuration_was_mostly_feasible_names_no_winner():
    study = _study([1.0, 3.0], baseline=0)
    record = _round({1: [3.0, 2.0, 2.1], 0: [1.0, 1.1, 1.05]}, baseline=0)
    runs = tuple(dataclasses.replace(run, feasible=run.repeat == 0) for run in record.runs)
    answer = _answer(study, dataclasses.replace(record, runs=runs))
    assert answer.round_state == "no_winner" and not answer.confirmed and answer.number == 1


def _copy(seen) -> optuna.Study:
    """The real study of the session, in memory: what is recorded on it stays here."""
    study, _ = seen
    copy = optuna.create_study(study_name="seen", direction=study.direction)
    for trial in study.get_trials():
        copy.add_trial(trial)
    for key, value in study.user_attrs.items():
        copy.set_user_attr(key, value)
    return copy


def _renderings(study: optuna.Study) -> dict[str, str]:
    """What the terminal, the note, the report and ``best`` say of the study's answer."""
    spec = export.study_spec(study)
    assert spec is not None
    console = Console(file=io.StringIO(), width=200, emoji=False)
    outcome = RunOutcome(study_name="seen", states={"complete": 5})
    display.print_summary(console, study, spec, outcome, confirmation=True)
    best = export.best_config(study, export.select_trial(study))
    page = report.render_html(study, "sqlite:///x.db")
    assert isinstance(console.file, io.StringIO)
    return {
        "terminal": " ".join(console.file.getvalue().split()),
        "note": notes.study_note(study),
        "report": " ".join(page.split()),
        "best": f"trial {best.trial}: {best.confirmation_text()}",
    }


def _leaders_round(study: optuna.Study) -> tuple[int, ConfirmationRecord]:
    """A clean round of the study's three leaders and its references, won by a leader that is
    neither the best single trial nor a reference: that leader and the round."""
    baseline = reference_trial(study, "baseline")
    checklist_trial = reference_trial(study, "checklist")
    assert baseline is not None and checklist_trial is not None
    base, checklist = baseline.number, checklist_trial.number
    leaders = [t.number for t in feasible_trials(study)[:3]]
    winner = next(n for n in leaders[1:] if n not in (base, checklist))
    series = {n: [1.0, 0.98, 1.02] for n in leaders}  # each within ±2% or ±2.4%
    series[base] = [2.0, 1.96, 2.04]
    series[checklist] = [3.0, 2.94, 3.06]
    series[winner] = [4.1, 4.0, 4.2]
    # one pace for all: the winner's settings may be the baseline's (its lr alone differs)
    speed = dict.fromkeys(series, 1000.0)
    return winner, _round(series, speed=speed, baseline=base, checklist=checklist, top=3)


def test_every_rendering_names_the_same_answer_and_ratio(seen):
    study = _copy(seen)
    winner, record = _leaders_round(study)
    answer = _answer(study, record)
    assert answer.confirmed and answer.number == winner
    assert answer.speedup == pytest.approx(4.1 / 2.0)  # the round's own runs' medians
    said = _renderings(study)
    over = "; ".join(r.said for r in answer.references)
    # (and "; learning alone: ..." inside the baseline's, if the winner has its settings)
    assert over.startswith("2.05x the untuned baseline (1.96x to 2.")
    assert over.endswith("; 1.37x the tuning checklist (1.31x to 1.43x)")
    confirmed = f"confirmed: median 4.1 over 3 runs (spread ±2%); {over}"
    assert f"Best configuration (trial {winner}, confirmed)" in said["terminal"]
    assert f"Answer: trial {winner}, {confirmed}." in said["terminal"]  # the verdict's words
    assert f"**Best: trial {winner}**" in said["note"]
    assert (
        "**Confirmed**: median 4.1 over 3 runs, interleaved with the other leaders" in said["note"]
    )
    assert f"(spread ±2%); {over}." in said["note"]  # the terminal's clauses
    assert f"<strong>Best: trial {winner}</strong>" in said["report"]
    interleaved = "median 4.1 over 3 runs, interleaved with the other leaders and the untuned"
    assert f"<strong>Confirmed</strong>: {interleaved}" in said["report"]  # the note's words
    assert f"(spread ±2%); {over}.</p>" in said["report"]
    assert re.search(r'<td>tuning checklist</td><td class="num">\d+</td>', said["report"])
    # "Against the others": the round's ratio over each reference, not "-", and said beneath
    assert re.search(r"<td>tuning checklist</td>.*?1\.37x confirmed</td>", said["report"])
    assert f"never one measurement's: {over}.</p>" in said["report"]
    assert said["best"] == f"trial {winner}: {confirmed}"
    # ``best --trial`` of another configuration: its medians in the round, no ratio, no ties
    other = next(c.trial for c in answer.configurations if c.trial != winner)
    contender = export.TrialConfirmation.of(answer, other)
    assert contender is not None and not contender.answer and contender.runs == 3
    assert contender.median == sorted(r.value for r in record.runs if r.trial == other)[1]
    assert contender.speedup is None and contender.tied_with == () and contender.said == ()


def test_a_round_about_leaders_since_changed_is_confirmed_nowhere(seen):
    """A round whose leaders trials since have changed backs no answer. Once, the summary
    still said "confirmed", ``best`` gave the round's medians for the best single trial, and
    the note stopped on an assertion where that trial was a leader of the round but not its
    winner."""
    study = _copy(seen)
    winner, record = _leaders_round(study)
    _answer(study, record)
    assert f"Best configuration (trial {winner}, confirmed)" in _renderings(study)["terminal"]
    # a trial since comes between the first two leaders: the best single value is the answer
    first, second = feasible_trials(study)[:2]
    copied = {key: value for key, value in second.user_attrs.items() if key != "baseline"}
    between = (first.value + second.value) / 2
    study.add_trial(optuna.trial.create_trial(value=between, user_attrs=copied))
    stale = answer_of(study)
    assert stale is not None and stale.round_state == "stale" and stale.number == first.number
    said = _renderings(study)
    assert f"Best configuration (trial {first.number}, not confirmed)" in said["terminal"]
    assert "Not confirmed: trials since have changed the leaders" in said["terminal"]
    assert "Answer: trial" not in said["terminal"]
    # the terminal's words everywhere: they once said "one measurement" of a study with a round
    why = "trials since have changed the leaders (run `autotune confirm --study seen`)"
    assert f"**Not confirmed**: {why}." in said["note"] and "**Confirmed**" not in said["note"]
    assert said["best"] == f"trial {first.number}: not confirmed: {why}"
    exported = export.best_config(study, export.select_trial(study)).to_dict()  # best --json
    assert export.BestConfig.from_dict(exported).confirmation_text() == f"not confirmed: {why}"
    # the report's study is elsewhere than the default storage: the command says --storage
    again = "autotune confirm --study seen --storage sqlite:///x.db"
    why = f"trials since have changed the leaders (run <code>{again}</code>)"
    coded = f"<strong>Not confirmed</strong>: {why}."
    assert coded in said["report"]
    ratio = "over the tuning checklist, no ratio: not confirmed, trials since have changed"
    assert f"{ratio} the leaders" in said["report"]  # under "Against the others"
    assert f"(run `{again}`)." in notes.study_note(study, "sqlite:///x.db")


def test_an_answer_measured_only_under_interference_is_said_so_everywhere(seen):
    """The note said nothing where the terminal, the report and best warned."""
    study = _copy(seen)
    winner, record = _leaders_round(study)
    flagged = tuple(
        dataclasses.replace(run, other_cpu_share=0.9) if run.trial == winner else run
        for run in record.runs
    )
    answer = _answer(study, dataclasses.replace(record, runs=flagged))
    assert answer.confirmed and answer.number == winner and answer.interfered
    said = _renderings(study)
    # its trial's own measurement is never retaken, and the machine stayed busy for the others:
    # the note once said "each was measured again" of all three
    flagged = (
        "cores: 1 of the trials' own (the search's, at 90%), never compared with the round's "
        "runs, and 2 of the round's (none"
    )
    assert (
        "3 measurements of the round's configurations were taken while other processes took"
        in said["terminal"]
    )
    assert f"{flagged} of them measured again). The round compares" in said["terminal"]
    # the report's confirmation table, and the same line under it (it said nothing of it)
    page = html.unescape(said["report"])
    assert re.search(rf'<td>{winner}</td><td class="num">4\.1</td>', page)
    assert f"{flagged} of them measured again). The round compares" in page
    assert "runs used: the measurements each median counts: feasible, and measured" in page
    # with the command that measures again (a plain confirm keeps the finished round)
    warned = re.compile(
        r"measured while other processes used the CPU \(on a quiet machine, run `autotune "
        r"confirm --study \S+( --storage \S+)? --again`\)"
    )
    for where in ("terminal", "note", "report"):  # (the report's <code> is the note's `)
        shown = re.sub("</?code>", "`", " ".join(html.unescape(said[where]).split()))
        assert warned.search(shown), where
    assert warned.search(said["best"]) and said["best"].endswith("--again`)")


def test_the_confirmation_shows_every_runs_score_and_marks_an_infeasible_run():
    """Issue 44 item 6: trial 2's median accuracy was 0.9056 over its feasible runs while 2
    of its 4 runs were below min_accuracy; the table's "runs" column said "2 of 4" unexplained;
    the confirm lines did not mark an infeasible run."""
    study = _study([2.0, 3.0, 3.1], baseline=0)
    record = _round({1: [3.0, 2.9, 3.1, 3.0], 2: [3.1, 3.2, 3.0, 3.1], 0: [2.0, 2.1, 1.9, 2.0]})
    below = {(2, 1): 0.7, (2, 2): 0.72}  # two of trial 2's runs short of min_accuracy 0.85
    runs = tuple(
        dataclasses.replace(run, score=below[key], feasible=False)
        if (key := (run.trial, run.repeat)) in below
        else run
        for run in record.runs
    )
    answer = _answer(study, dataclasses.replace(record, runs=runs, baseline=0))
    found = next(c for c in answer.configurations if c.trial == 2)
    assert not found.eligible and found.median_score == pytest.approx((0.72 + 0.9) / 2)
    said = io.StringIO()
    spec = parse_spec(
        "workload: {model: digits_cnn, data: digits}\nobjective: {min_accuracy: 0.85}\n"
    )
    display.print_confirmation(Console(file=said, width=200), answer, spec, study.study_name)
    shown = " ".join(said.getvalue().split())
    assert "runs used: the measurements each median counts: feasible, and measured" in shown
    assert "│ 2 │ - │ - │ 0.81 │ 2 of 4 │" in shown, shown
    assert "Trial 2 met the bar in its own trial but missed it in 2 of its runs in the" in shown
    assert "Trial 1 met" not in shown  # every run of it met the bar
    lines = io.StringIO()
    show = display.confirmation_progress(Console(file=lines, width=200), spec)
    show(runs[5], 6, 12)
    assert "infeasible: below min_accuracy 0.85" in lines.getvalue(), lines.getvalue()
    show(runs[4], 5, 12)
    assert lines.getvalue().count("infeasible") == 1


def test_a_leader_measurably_slower_than_the_checklist_side_by_side_is_not_tied_with_it():
    """A quickstart on 504e919: trial 7's median (5.658) was within the round's ±10% of the
    checklist's (5.977), so the two were 'tied' and trial 7 named for its better accuracy,
    while side by side it read 0.85x the checklist (0.76x to 0.95x): measurably slower."""
    study = _study([3.2, 5.406, 6.007], baseline=0, checklist=1)
    series = {
        2: [6.007, 4.726, 5.658],  # the leader: a lucky trial, then two runs below the checklist
        1: [5.406, 5.977, 6.236],  # the checklist
        0: [3.159, 3.858, 3.94],  # the untuned baseline
    }
    scores = {2: 0.9667, 1: 0.9528, 0: 0.9667}
    answer = _answer(study, _round(series, scores=scores, baseline=0, checklist=1, top=1))
    assert answer.number == 1 and answer.reference == "the tuning checklist"
    assert 2 not in answer.tied


def test_tied_trials_are_named_alike_everywhere(seen):
    """The note said "tied ... with trial 3, 1", unsorted and without "and", where the report
    and ``best`` said "trials 1 and 3" and the terminal "Trials 4, 1 and 3"."""
    study = _copy(seen)
    _, record = _leaders_round(study)
    numbers = [trial.number for trial in feasible_trials(study)]
    series = {n: [4.0, 4.05, 4.1] for n in numbers}  # every one but the references: tied
    series[record.baseline], series[record.checklist] = [2.0, 1.9, 2.1], [3.0, 2.9, 3.1]
    every = _round(series, speed=dict.fromkeys(series, 1e3), top=len(numbers))
    every = dataclasses.replace(every, baseline=record.baseline, checklist=record.checklist)
    answer = _answer(study, every)
    assert answer.confirmed and len(answer.tied) >= 2
    *rest, last = sorted(answer.tied)
    said = _renderings(study)
    named = f"trials {', '.join(map(str, rest))} and {last}"
    assert f"; tied within noise with {named}." in said["note"]
    assert f"; tied within noise with {named}" in said["report"]
    assert said["best"].endswith(f"; tied within noise with {named}")
    assert f"; tied within noise with {named}." in said["terminal"]


LOADED_SPACE = """\
study: {name: loaded, n_trials: 3, seed: 0, pruner: none, n_startup_trials: 3}
workload: {model: autotune.testing:tiny_mlp, data: autotune.testing:blobs, epochs: 1}
space:
  lr: {low: 0.01, high: 0.1, log: true}
"""


def _loaded(record: ConfirmationRecord, search: float, round_: tuple[float, ...]) -> tuple:
    """``record``'s runs with others' share of the cores fabricated: ``search`` in the trials'
    own (the search), ``round_`` in the round's, in turn."""
    shares = iter(round_ * len(record.runs))
    return tuple(
        dataclasses.replace(run, other_cpu_share=search if not run.repeat else next(shares))
        for run in record.runs
    )


@pytest.mark.slow
def test_a_busy_round_compares_its_own_runs_and_says_when_the_load_differed(
    tmp_path, prepare_study
):
    """Measured on a busy 2-core VM: the search ran at 69-76% of the cores taken by others, the
    round at 78-86%, and a trial's own measurement sat above its round's runs in 10 of 12 rows:
    the round compared it, flagged like them, with runs under a heavier load."""
    from autotune.executor import InProcessExecutor
    from autotune.study import ConfirmationInputs, confirm_study
    from autotune.workloads import load

    prepared = prepare_study(LOADED_SPACE, tmp_path)
    study = prepared.study
    spec = export.study_spec(study)
    assert spec is not None
    executor = InProcessExecutor(load(spec.workload, tmp_path, spec.objective.score))
    inputs = ConfirmationInputs(study, spec.objective, executor, top=2, repeats=2, remeasures=0)
    real = confirm_study(inputs)  # real runs; their loads fabricated in storage below
    assert real is not None and real.complete
    busy = dataclasses.replace(real, runs=_loaded(real, 0.72, (0.78, 0.86, 0.82)))
    answer = _answer(study, busy)
    for found in answer.configurations:  # the round's own runs only, never the search's
        own = [run.value for run in busy.runs if run.trial == found.trial and run.repeat]
        assert found.values == tuple(own) and found.interfered and found.runs == 2
    assert answer.load == (0.78, 0.86) and answer.search_load == (0.72, 0.72)
    assert answer.noise != "varied"  # 78-86%: steady, the same load side by side
    console = Console(file=io.StringIO(), width=400)
    display.print_confirmation(console, answer, spec, "loaded")
    said = " ".join(console.file.getvalue().split())
    assert "of the trials' own (the search's, at 72%), never compared with the round's" in said
    assert "only with its own flagged ones (in the runs it compares, others took 78-86%)." in said
    # the load varied within the round: too noisy, whatever the spread, and said with it
    varied = _answer(study, dataclasses.replace(real, runs=_loaded(real, 0.72, (0.2, 0.86))))
    assert varied.noise == "varied" and varied.noisy and varied.load == (0.2, 0.86)
    assert not any(reference.tied for reference in varied.references)
    console = Console(file=io.StringIO(), width=400)
    display.print_confirmation(console, varied, spec, "loaded")
    said = " ".join(console.file.getvalue().split())
    assert "(the load varied: other processes took 20-86% of the cores)" in said
    # with the command that measures again: a plain confirm keeps the stored round
    assert "Confirm again on a quiet machine: autotune confirm --study loaded --again" in said
    # the report says it under its table, in the same words
    page = " ".join(html.unescape(report.render_html(study)).split())
    assert "The round was too noisy to rank the leaders (the load varied: other processes " in page


def test_overlapping_runs_are_tied_in_a_quiet_round_and_too_noisy_in_a_noisy_one():
    """Measured in quiet rounds: ratios of 0.98x-1.03x read "too noisy to quote a ratio", which
    blamed a quiet machine for two configurations of the same speed. One rule
    (``Answer.noise``): tied where the round was quiet, too noisy where its spread was wide
    (over ``NOISY_SPREAD``) or the load varied (over ``INTERFERENCE_SHARE`` apart)."""
    study = _study([2.0, 2.1], baseline=0)

    def said(values: list[float], other: dict[int, float] | None = None) -> tuple[str, str]:
        record = _round({1: [2.0, *values], 0: [2.0, *values]}, other=other, baseline=0, top=1)
        answer = _answer(study, record)
        spreads[tuple(values)] = answer.spread
        (baseline,) = answer.references
        assert baseline.ratio is None and baseline.tied == (answer.noise == "quiet")
        return answer.noise, baseline.said.partition(" (")[0]

    spreads: dict[tuple[float, ...], float | None] = {}
    tied = "tied with the untuned baseline, the same within the round's spread"
    noisy = "over the untuned baseline, too noisy to quote a ratio"
    assert said([1.98, 2.06]) == ("quiet", tied)  # 0.98x-1.03x, as measured
    assert said([1.5, 2.5]) == ("quiet", tied)  # ±25%: the edge, still quiet
    assert said([1.48, 2.52]) == ("wide", noisy)  # ±26%
    assert said([1.98, 2.06], {1: 0.5, 0: 0.64}) == ("quiet", tied)  # loads 14% apart
    unlike = "over the untuned baseline, no ratio: the two were measured under different loads"
    assert said([1.98, 2.06], {1: 0.5, 0: 0.66}) == ("varied", unlike)  # 16 points apart
    assert said([1.98, 2.06], {1: 0.5, 0: 0.5 + 1e-9})[0] == "quiet"
    assert spreads[(1.5, 2.5)] == 0.25 and spreads[(1.48, 2.52)] == pytest.approx(0.26)


def test_times_to_a_target_too_close_to_separate_are_tied_at_their_figures():
    """Measured in quiet rounds: times to a target milliseconds apart on runs of tenths of a
    second showed four digits each ("0.3124", "0.3151") and the advice to confirm on a quiet
    machine, which cannot separate them. The medians are shown to the digits the round's
    spread leaves them, and the round says they are tied where the figure is."""
    study = _study([0.3151, 0.3124, 0.3301], baseline=0, maximize=False)
    series = {
        1: [0.3124, 0.3090, 0.3201],
        2: [0.3301, 0.3390, 0.3350],
        0: [0.3151, 0.3080, 0.3230],  # the untuned baseline
    }
    answer = _answer(study, _round(series, baseline=0, maximize=False))
    assert answer.number == 1 and answer.noise == "quiet" and answer.tied == (0,)
    assert answer.spread == pytest.approx(0.0178, abs=1e-4)  # ±2%: three digits
    rows = {row[0]: row[1:3] for row in display.confirmation_rows(answer)}
    assert rows == {
        "1": ("0.312", "0.309-0.32"),  # the answer: no mark
        "2": ("0.335", "0.33-0.339"),  # 7% behind: measurably slower
        "0 (baseline)": ("0.315 tied", "0.308-0.323"),
    }
    (baseline,) = answer.references
    assert baseline.tied and baseline.ratio is None
    found = export.TrialConfirmation.of(answer, 1)
    assert found is not None and found.tied_with == ()  # the baseline's tie: said once
    said = export.confirmation_text(found, study.study_name)
    assert "tied within noise" not in said and said.startswith(
        "confirmed: median 0.312 over 3 runs (spread ±2%); tied with the untuned baseline, "
        "the same within the round's spread (the runs' spreads allow "
    )
    console = Console(file=io.StringIO(), width=300)
    spec = parse_spec("workload: {model: digits_cnn, data: digits}\n")
    display.print_confirmation(console, answer, spec, study.study_name)
    shown = " ".join(console.file.getvalue().split())
    assert "0.3124" not in shown and "quiet machine" not in shown and "noisy" not in shown


def test_a_figure_keeps_the_digits_the_spread_leaves_it():
    assert [display.fmt_within(0.31237, s) for s in (0.003, 0.03, 0.1, 0.25, 0.9)] == [
        "0.3124",  # ±0.3%: four, fmt's
        "0.312",
        "0.31",  # ±10%: the edge of two
        "0.31",
        "0.31",  # never fewer than two
    ]
    assert display.fmt_within(0.31237, None) == "0.3124" and display.fmt_within(0.2, 0.0) == "0.2"
    assert display.fmt_within(27_712.0, 0.3) == "27,712"  # from 1,000: fmt's, whole
    assert display.fmt_within(156.385, 0.19) == "156"  # whole digits kept: never "1.6e+02"
    assert display.fmt_within(97.234, 0.19) == "97" and display.fmt_within(2.0, 0.02) == "2"


def test_no_ratio_is_quoted_between_runs_under_unlike_loads_and_the_loads_are_said():
    """Interleaved runs share the machine's load, unless it changed with the configuration: a
    ratio of runs at 78-80% of the cores taken by others over runs at 50-55% measures the load
    as much as the configuration."""
    study = _study([1.0, 3.0], baseline=0)
    runs = (*_runs(1, (1, 3.0, 0.78), (2, 3.1, 0.8)), *_runs(0, (1, 1.0, 0.5), (2, 1.1, 0.55)))
    record = dataclasses.replace(_round({1: [], 0: []}, baseline=0, top=1), runs=runs)
    answer = _answer(study, record)
    assert answer.number == 1 and answer.noise == "varied" and answer.speedup is None
    assert answer.references[0].said == (
        "over the untuned baseline, no ratio: the two were measured under different loads "
        "(others took 78-80% of the cores in the answer's runs, 50-55% in its)"
    )
    # the answer at 64%, 11.5 points from the baseline's median: like loads, the ratio stands
    alike = tuple(
        dataclasses.replace(run, other_cpu_share=0.64) if run.trial == 1 else run for run in runs
    )
    near = _answer(study, dataclasses.replace(record, runs=alike))
    assert near.noise != "varied" and near.speedup == pytest.approx(3.05 / 1.05)
    # a load that drifts from 50% to 80% on both sides alike, interleaved: too noisy to rank,
    # and the runs that separate by more than the spread still a ratio
    drift = (*_runs(1, (1, 3.0, 0.5), (2, 3.1, 0.8)), *_runs(0, (1, 1.0, 0.5), (2, 1.1, 0.8)))
    drifted = _answer(study, dataclasses.replace(record, runs=drift))
    assert drifted.noise == "varied" and drifted.speedup == pytest.approx(3.05 / 1.05)


def test_a_median_of_one_compared_run_is_not_confirmed():
    """Found by a new user: after a Ctrl-C and a resume under load the like-loads rule left one
    run of 3, and the answer read "confirmed: median 0.7174 over 1 run". A confirmed median
    counts 2 compared runs at least; else the round says it compared too few."""
    study = _study([1.0, 3.0], baseline=0)
    # each configuration's trial on a quiet machine, the answer's first run too; resumed under
    # load, the rest (A B, then B A): the round compares its flagged runs, one of the answer's
    runs = (*_runs(1, (0, 3.0, 0.0), (1, 2.0, 0.0), (2, 2.1, 0.8)),)
    runs += (*_runs(0, (0, 1.0, 0.0), (1, 0.9, 0.8), (2, 1.1, 0.8)),)
    record = dataclasses.replace(_round({1: [], 0: []}, baseline=0, top=1), runs=runs)
    answer = _answer(study, record)
    assert answer.round_state == "few_runs" and not answer.confirmed and answer.winner is None
    said = display.confirmation_text(None, study.study_name, round_state=answer.round_state)
    assert said.startswith(
        "not confirmed: the round compared fewer than 2 runs of its best median (its other runs "
        "were measured under unlike loads) (run `autotune confirm"
    ), said
    # the round ran every run: the same command would measure nothing (a new user went round
    # in that circle three times); a new round would
    assert said.endswith(" --again`)"), said
    # one more quiet run of each: the quiet ones compared (the answer's trial, 2 runs)
    more = (*runs, *_runs(1, (3, 2.9, 0.0)), *_runs(0, (3, 1.05, 0.0)))
    confirmed = _answer(study, dataclasses.replace(record, runs=more, repeats=3))
    assert confirmed.confirmed and confirmed.runs == 3 and confirmed.number == 1


def test_a_baseline_that_failed_is_said_where_its_ratio_would_be():
    """Found by a new user: the user's model raised at the untuned baseline's batch, and the
    answer had no ratio ("speedup": null) with nothing saying why."""
    study = _study([3.0, 2.5])
    failed = TrialRecord(baseline=True, fail_msg="RuntimeError: CUDA error (injected)")
    study.add_trial(
        optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs=failed.to_attrs())
    )
    answer = _answer(study, _round({0: [3.0, 3.1, 2.9], 1: [2.5, 2.4, 2.6]}))
    assert answer.confirmed and answer.number == 0 and answer.speedup is None
    said = "over the untuned baseline, no ratio: it failed (RuntimeError: CUDA error (injected))"
    assert [reference.said for reference in answer.references] == [said]
    assert said in display.confirmation_text(
        display.TrialConfirmation.of(answer, 0), study.study_name
    )
    # the note does not say its runs were interleaved with it: it has none
    assert "interleaved with the other leaders (" in notes.verdict(answer, "s", "sqlite:///x.db")


def test_a_lone_configuration_gets_no_round_and_references_alone_are_said_so():
    """Found by a new user: the search ran nothing, the round re-measured a lone baseline 5
    times, and the answer said "it is the untuned baseline: the search found nothing better"."""
    from autotune.study import confirmation_plan

    study = _study([1.0], baseline=0, configs={0: make_config()})
    plan = confirmation_plan(study, 2, 5)
    assert plan is not None and plan.candidates == (0,) and plan.repeats == 0  # no runs
    alone = _answer(study, dataclasses.replace(plan, complete=True))
    assert alone.round_state == "alone" and not alone.confirmed
    said = display.confirmation_text(None, study.study_name, round_state=alone.round_state)
    assert said == (
        "not confirmed: no other configuration was feasible or tried: the round had nothing to "
        "compare it with"
    )  # and no `autotune confirm` to run: it would measure nothing
    # the two references alone: the checklist wins, and no search found "nothing better"
    both = _study([1.0, 2.0], baseline=0, checklist=1)
    record = _round({1: [2.0, 2.1, 1.9], 0: [1.0, 1.1, 0.9]}, baseline=0, checklist=1)
    answer = _answer(both, record)
    verdict = display.confirmation_text(display.TrialConfirmation.of(answer, 1), "s")
    assert "; it is the tuning checklist: no configuration besides the references was tried" in (
        verdict
    )
    searched = optuna.trial.create_trial(value=0.5, user_attrs=TrialRecord().to_attrs())
    both.add_trial(searched)  # a configuration of the search's, slower
    answer = _answer(both, record)
    verdict = display.confirmation_text(display.TrialConfirmation.of(answer, 1), "s")
    assert "; it is the tuning checklist: the search found nothing better" in verdict


def test_loads_exactly_the_interference_share_apart_are_alike():
    """Two loads 15 points apart compared as 0.15000000000000002 apart: unlike."""
    from autotune.study import loads_alike

    assert loads_alike((0.5, 0.65)) and loads_alike((0.2, 0.35))
    assert not loads_alike((0.5, 0.66))
