"""The HTML report: one valid file that opens offline."""

from __future__ import annotations

import html.parser
import io
import re

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from rich.console import Console

from autotune import display, export
from autotune.outputs import notes, report
from autotune.study import (
    ConfirmationRecord,
    ConfirmRun,
    RunOutcome,
    TrialRecord,
    answer_of,
    answer_trial,
)


class _Structure(html.parser.HTMLParser):
    """Checks that elements close in order and collects the text."""

    VOID = frozenset({"meta", "br", "img", "input", "link", "hr", "col", "area", "base", "wbr"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.text: list[str] = []
        self.seen: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.seen.add(tag)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def test_the_report_is_one_valid_offline_html_file(seen):
    study, url = seen
    page = report.render_html(study, url)
    parser = _Structure()
    parser.feed(page)
    parser.close()
    assert parser.problems == [] and parser.stack == []
    assert page.startswith("<!DOCTYPE html>") and {"html", "head", "body", "table"} <= parser.seen
    best = answer_trial(study)
    headline = notes.study_note(study, url).splitlines()[2].replace("**", "")
    assert headline.startswith(f"Best: trial {best.number}, ")  # the note's, word for word
    assert headline in " ".join("".join(parser.text).split())
    assert "Plotly" in page and 'src="http' not in page  # plotly is inlined: opens offline
    for heading in ("Where the time goes", "Accuracy and speed", "Optimization history"):
        assert heading in page


def _text(page: str) -> str:
    parser = _Structure()
    parser.feed(page)
    return " ".join(" ".join(parser.text).split())


def test_comparison_columns_are_labelled_as_ratios(seen):
    study, url = seen
    page = report.render_html(study, url)
    if notes.comparisons(study, answer_of(study)):
        start = page.index("<h2>Against the others</h2>")
        table = page[start : page.index("</table>", start)]
        assert "<th>samples/s</th>" not in table
        assert "<th>&times; samples/s</th>" in table
        assert "<th>&times; accuracy_per_second</th>" in table


def test_a_trial_measured_under_interference_is_marked_in_the_trial_table(seen):
    study, url = seen
    done = answer_trial(study)
    assert done is not None
    busy = {**done.user_attrs, "interference": True, "other_cpu_share": 0.81}
    copy = _copy_with(study, optuna.trial.create_trial(value=done.value, user_attrs=busy))
    page = _text(report.render_html(copy, url))
    assert "samples/s measured" in page and "interference 81%" in page


def test_hardware_shows_what_the_trials_used(seen):
    recorded = {"device": "cpu", "cpu_cores": 2, "torch": "2.9.0", "cuda": "13.0", "cudnn": 92400}
    assert report.hardware_rows(recorded) == [
        ("device", "cpu"),
        ("cpu_cores", "2"),
        ("torch", "2.9.0"),
        ("cuda, cudnn", "not used (the trials ran on the CPU)"),
    ]
    on_gpu = report.hardware_rows({**recorded, "device": "cuda"})
    assert ("cuda", "13.0") in on_gpu and ("cudnn", "9.24.0") in on_gpu
    assert report.hardware_rows({}) == []
    study, url = seen  # a CPU study: its report names no CUDA version
    text = _text(report.render_html(study, url))
    assert "cuda, cudnn not used (the trials ran on the CPU)" in text


def test_cudnn_versions_read_as_cudnn_writes_them():
    assert report.cudnn_version(92400) == "9.24.0"
    assert report.cudnn_version(90100) == "9.1.0"
    assert report.cudnn_version(8907) == "8.9.7"


def _copy_with(study, *trials):
    """An in-memory copy of ``study`` (its attributes and trials) with ``trials`` added."""
    copy = optuna.create_study(directions=study.directions, study_name=study.study_name)
    for key, value in study.user_attrs.items():
        copy.set_user_attr(key, value)
    copy.add_trials(study.get_trials(deepcopy=False))
    copy.add_trials(trials)
    return copy


def test_every_trial_is_in_the_table_with_why_it_failed_escaped(seen):
    study, url = seen
    precision = CategoricalDistribution(["bf16", "fp32"])
    failed = optuna.trial.create_trial(
        state=TrialState.FAIL,
        params={"precision": "fp32"},
        distributions={"precision": precision},
        user_attrs={"fail_kind": "oom", "fail_msg": "<script>alert('out of memory')</script>"},
    )
    pruned = optuna.trial.create_trial(
        state=TrialState.PRUNED,
        params={"precision": "bf16"},
        distributions={"precision": precision},
        user_attrs={"fail_kind": "pruned", "fail_msg": "below the median at epoch 1"},
    )
    copy = _copy_with(study, failed, pruned)
    page = report.render_html(copy, url)
    names, rows = report.trial_rows(copy)
    assert [row.number for row in rows] == [t.number for t in copy.trials]
    assert "precision" in names and "lr" in names
    assert (rows[-2].state, rows[-2].fail_kind) == ("FAIL", "oom")
    assert (rows[-1].state, rows[-1].fail_kind) == ("PRUNED", "pruned")
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&#39;out of memory&#39;)&lt;/script&gt;" in page
    table = _text(page[page.index('<table id="trials">') :])
    assert "fail kind why" in table and "below the median at epoch 1" in table
    for trial in study.trials:
        assert TrialRecord.of(trial).samples_per_second is None or (
            display.fmt(TrialRecord.of(trial).samples_per_second) in table
        )


def test_importances_say_what_they_measure_beside_each_knobs_speed(seen):
    study, url = seen
    precision = CategoricalDistribution(["bf16", "fp32"])
    trials = [
        optuna.trial.create_trial(
            value=1.0,
            params={"precision": value},
            distributions={"precision": precision},
            user_attrs={"samples_per_second": speed},
        )
        for value, speed in (("bf16", 100.0), ("bf16", 120.0), ("fp32", 1000.0), ("fp32", 1200.0))
    ]
    synthetic = optuna.create_study(direction="maximize")
    synthetic.add_trials(trials)
    assert report.knob_speeds(synthetic) == [
        report.KnobSpeed("precision", "fp32", 2, 1100.0, 10.0),
        report.KnobSpeed("precision", "bf16", 2, 110.0, 1.0),
    ]
    page = report.render_html(study, url)
    assert "PED-ANOVA" in _text(page)
    tried = {t.params["precision"] for t in study.get_trials(states=(TrialState.COMPLETE,))}
    if len(tried) == 2:  # the study tried both precisions: their speeds are side by side
        speeds = _text(page[page.index('<table id="knob-speeds">') :])
        assert "precision bf16" in speeds and "precision fp32" in speeds


def test_a_two_stage_report_shows_stage_one_and_where_each_knob_came_from(seen):
    study, url = seen  # a two-stage study: batch size and workers are timed in stage 1
    table = report.stored_speed_table(study)
    assert table is not None
    assert {(16, "fp32"), (64, "bf16")} <= {(c.batch_size, c.precision) for c in table}
    page = _text(report.render_html(study, url))
    assert "Stage 1: the fastest settings per micro-batch" in page
    assert "timed in stage 1" in page and "searched" in page


def test_the_reports_stage_one_table_is_the_one_the_run_printed(
    prepare_study, tmp_path, monkeypatch
):
    """The report shows stage 1's table as the run printed it, row for row, also in a second
    study of the same space and storage whose stage 1 reused every cell from the first's
    speed study (its own holds none)."""
    from tests.conftest import SEEN_SPACE

    monkeypatch.setattr("autotune.stage1._take.interfered", lambda share: False)  # reusable
    space = SEEN_SPACE.replace("n_trials: 5", "n_trials: 1") + "  accumulation_steps: [1, 2]\n"
    first = prepare_study(space, tmp_path)
    second = prepare_study(space.replace("name: seen", "name: again"), tmp_path)
    assert optuna.load_study(study_name="again.speed", storage=second.url).trials == []
    for run in (first, second):
        printed, _ = display.speed_rows(run.outcome.speed_table)
        stored = report.stored_speed_table(run.study)
        assert stored is not None
        assert [[str(c) for c in row] for row in display.speed_rows(stored)[0]] == [
            [str(c) for c in row] for row in printed
        ]
        page = report.render_html(run.study, run.url)
        shown = page[page.index('<table id="stage-1">') : page.index("Where the time goes")]
        for row in printed:
            assert " ".join(str(c) for c in row) in _text(shown)


def test_values_carry_the_run_to_run_spread_once_a_confirmation_round_measured_it(seen):
    study, _ = seen
    copy = optuna.create_study(direction=study.direction)  # in memory: the fixture stays as is
    for trial in study.get_trials():
        copy.add_trial(trial)
    for key, value in study.user_attrs.items():
        copy.set_user_attr(key, value)
    assert "run to run" not in _text(report.render_html(copy, "sqlite:///x.db"))
    best = answer_trial(copy)
    runs = tuple(
        ConfirmRun(best.number, repeat, repeat, value, 0.9, 100.0, True, 1.0)
        for repeat, value in enumerate((1.0, 1.2, 1.1))
    )
    record = ConfirmationRecord(1, 2, True, (best.number,), None, runs, complete=True)
    copy.set_user_attr("confirmation", record.to_attrs())
    text = _text(report.render_html(copy, "sqlite:///x.db"))
    # half the range over the median: 0.1 / 1.1, shown beside the best value and the column
    assert "±9% run to run" in text
    assert re.search(r"Best: trial \d+ ?, accuracy_per_second [\d.]+ ±9%", text), text[
        text.find("Best:") : text.find("Best:") + 200
    ]


def test_a_study_without_an_answer_is_said_so_in_one_sentence_everywhere(seen):
    """The terminal named the bar no trial reached; the note and the report, their own words
    without it. Of a study no trial of which has ended (a run stopped in stage 1), the
    terminal says nothing of trials (the run's ending says why), and the note and the report
    that none has finished, not that none reached the bar."""
    study, _ = seen
    empty = optuna.create_study(study_name=study.study_name, direction=study.direction)
    for key, value in study.user_attrs.items():
        empty.set_user_attr(key, value)
    spec = export.study_spec(empty)
    assert spec is not None
    console = Console(file=io.StringIO(), width=200)
    display.print_summary(console, empty, spec, RunOutcome(study_name="seen", states={}))
    assert isinstance(console.file, io.StringIO) and console.file.getvalue() == ""
    none_yet = "No trial has finished yet."  # the note and the report: no bar none reached
    assert none_yet in notes.study_note(empty) and "none reached" not in notes.study_note(empty)
    assert f'<p class="headline">{none_yet}</p>' in report.render_html(empty)
    empty.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))  # no feasible trial
    said = "No trial has completed feasibly yet (none reached accuracy 0.5)."
    display.print_summary(console, empty, spec, RunOutcome(study_name="seen", states={}))
    assert said in console.file.getvalue()
    assert said in notes.study_note(empty)
    assert f'<p class="headline">{said}</p>' in report.render_html(empty)
    # trials that completed below the bar: the terminal says the nearest miss and what to change
    for score in (0.31, 0.43):
        attrs = TrialRecord(feasible=False, score=score).to_attrs()
        below = {"constraints:min_accuracy": 0.5 - score}  # positive: the bar not met
        empty.add_trial(optuna.trial.create_trial(value=0.1, user_attrs=attrs, system_attrs=below))
    display.print_summary(console, empty, spec, RunOutcome(study_name="seen", states={}))
    missed = " ".join(console.file.getvalue().split())
    assert "The best accuracy reached was 0.43 (trial 2). To reach 0.5: more workload.epochs," in (
        missed
    )
    assert missed.endswith("(objective.min_accuracy).")


def test_a_time_to_a_target_is_shown_only_for_trials_that_reached_it():
    """Measured once (tab.yaml, time_to_rmse, target 0.8): the table filled time_to_rmse for
    trial 0, whose best rmse 1.379 never reached the target (0.311 s: the seconds it spent),
    and for pruned trial 7 (0.1334 s, a projection) below trial 6's real 0.2093 s."""
    study = optuna.create_study(direction="minimize")
    study.set_user_attr("metric", "time_to_rmse")
    missed = TrialRecord(feasible=False, infeasible_reason="best rmse 1.379 never reached 0.8")
    reached = TrialRecord(feasible=True)
    study.add_trial(optuna.trial.create_trial(value=0.311, user_attrs=missed.to_attrs()))
    study.add_trial(optuna.trial.create_trial(value=0.2093, user_attrs=reached.to_attrs()))
    pruned = optuna.trial.create_trial(state=TrialState.PRUNED, value=0.1334)
    study.add_trial(pruned)
    values = [row.value for row in report.trial_rows(study)[1]]
    assert values == ["target not reached in 0.311 s", "0.2093", "target not reached"]
    assert display.value_text(0.2928, "s to target", reached=False) == (
        "target not reached in 0.2928 s"  # the live display's words
    )
    assert display.value_text(0.311, "s to target") == "0.311 s to target"
    assert display.value_text(2.912, "acc/s", reached=False) == "2.912 acc/s"


def test_against_the_others_marks_the_confirmed_ratio_apart_from_one_measurements(seen):
    """Measured once: one row showed 2.79x under samples/s (one measurement each) and 1.56x
    under accuracy_per_second (the confirmation round's), alike."""
    study, url = seen
    answer = answer_of(study)
    page = report.render_html(study, url)
    start = page.index("<h2>Against the others</h2>")
    table = _text(page[start : page.index("</table>", start)])
    assert "from the two trials' one measurement each, except where marked confirmed" in table
    assert ("x confirmed" in table) == (answer is not None and answer.speedup is not None)


def test_a_one_measurement_ratio_taken_under_load_is_marked_busy(seen):
    """Found by a new user: "Against the others" showed the checklist's one measurement taken
    under load (15.05x, 710 samples/s against ~5,000 in its round) with no mark."""
    study, url = seen
    answer = answer_of(study)
    assert answer is not None

    def table(page: str) -> str:
        start = page.index("<h2>Against the others</h2>")
        return _text(page[start : page.index("</table>", start)])

    def loaded(share: float):  # every trial's own measurement at this load
        trials = []
        for trial in study.get_trials():
            attrs = {**trial.user_attrs, "other_cpu_share": share}
            trials.append(optuna.trial.create_trial(
                state=trial.state, value=trial.value, params=trial.params,
                distributions=trial.distributions, user_attrs=attrs,
            ))  # fmt: skip
        copy = optuna.create_study(directions=study.directions, study_name=study.study_name)
        for key, value in study.user_attrs.items():
            copy.set_user_attr(key, value)
        copy.add_trials(trials)
        return report.render_html(copy, url)

    busy, quiet = loaded(0.8), loaded(0.0)
    assert "x busy" in table(busy) and "x busy" not in table(quiet)
    note = "busy: one of the two trials' own measurements was taken while other processes took"
    assert note in _text(busy) and note not in _text(quiet)
