"""What people see, rendered at 80 and 100 columns (a pipe and a small terminal): the knobs and
the commands to copy are intact. Not snapshots: each test asserts what must survive."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from rich.console import Console
from rich.live import Live
from rich.text import Text

from autotune import display, export
from autotune import study as studies
from autotune.faults import FaultKind
from autotune.outputs import report
from autotune.spacefile import Choice, Spec
from autotune.speed import SpeedChoice, SpeedTable
from autotune.testing import CPU


def _console(width: int) -> Console:
    return Console(file=io.StringIO(), width=width, emoji=False)


def _text(console: Console) -> str:
    file = console.file
    assert isinstance(file, io.StringIO)
    return file.getvalue()


def _spec(study: optuna.Study, **changes: object) -> Spec:
    spec = export.study_spec(study)
    assert spec is not None
    return spec.with_overrides(study=changes) if changes else spec


@pytest.mark.parametrize("width", [80, 100])
def test_the_plan_puts_each_item_and_the_whole_storage_url_on_a_line(seen, width):
    study, url = seen
    spec = _spec(study, storage=url)
    console = _console(width)
    display.print_plan(console, spec, CPU, study, [])
    lines = _text(console).splitlines()
    assert url in lines or f"  {url}" in lines or f"storage {url}" in lines, lines
    starts = [line.split(" ")[0] for line in lines if not line.startswith(" ")]
    for item in ("study", "storage", "device", "workload", "searching"):
        assert item in starts, lines
    assert "processes" not in starts  # one process per trial: nothing to say
    assert "relative to this folder" not in _text(console)  # an absolute path: as it is
    distributed = spec.with_overrides(workload={"gpus_per_trial": 2})
    console = _console(width)
    display.print_plan(console, distributed, CPU, study, [])
    said = " ".join(_text(console).split())
    assert "processes 2 per trial under DDP, a share of the cores each (gloo)" in said


def test_a_study_made_on_another_device_is_said_once_where_it_trains(seen):
    """``run``'s plan and ``confirm``/``verify`` (``cli._confirm.open_to_train``) say it alike."""
    study, _ = seen
    for hardware, warned in ((CPU, False), (replace(CPU, device_name="a slower CPU"), True)):
        console = _console(200)
        display.print_plan(console, _spec(study), hardware, study, [])
        said = f"created on {CPU.device_name}; what is measured on {hardware.device_name} will"
        assert (said in " ".join(_text(console).split())) is warned
    # only the core count differs: the run's own line says it (cli._run), not this one too
    fewer = replace(CPU, device_name=re.sub(r"\(\d+ cores\)", "(1 core)", CPU.device_name))
    assert fewer.device_name != CPU.device_name
    console = _console(200)
    display.print_plan(console, _spec(study), fewer, study, [])
    assert "this study was created on" not in _text(console)
    console = _console(200)  # confirm and verify, which print no such line, still say it
    display.print_other_device(console, study, fewer.device_name)
    assert "this study was created on" in _text(console)


def test_the_plan_says_a_batch_split_only_where_there_is_one_and_what_a_short_budget_does(seen):
    study, _ = seen  # its space searches batch_size but no accumulation
    console = _console(80)
    display.print_plan(console, _spec(study), CPU, study, [])
    said = " ".join(_text(console).split())
    assert "split" not in said and "effective_batch_size" in said, said
    assert "each cell timed first with the tuning checklist's" in said, said
    assert "then the fastest cells' other settings" in said, said
    from autotune.spacefile import parse_spec
    from tests.conftest import SEEN_SPACE

    split = parse_spec(SEEN_SPACE + "  accumulation_steps: [1, 2]\n")
    console = _console(80)
    display.print_plan(console, split, CPU, study, [])
    said = " ".join(_text(console).split())
    assert "the split of each effective batch into batch_size x accumulation_steps" in said


def test_the_plan_of_a_resumed_two_stage_study_says_what_stage_one_reuses(seen):
    """A resumed run's plan said "30 measurements of 6 cells ... about 38 s", and stage 1
    then timed nothing in 0 s: it says the study's speed study holds measurements already,
    read from the storage before the workload loads; a new study's plan does not."""
    study, url = seen
    speed = optuna.load_study(study_name=f"{study.study_name}.speed", storage=url)
    stored = len(speed.get_trials(states=(TrialState.COMPLETE,)))
    assert stored
    said = "measured before: settings covered by its {} stored measurements are reused"
    for shown, expected in ((study, said.format(stored)), (optuna.create_study(), None)):
        console = _console(200)
        display.print_plan(console, _spec(study), CPU, shown, [])
        plan = " ".join(_text(console).split())
        assert ("measured before" in plan) is (expected is not None), plan
        assert expected is None or f"({expected}, unless --remeasure); at most" in plan, plan


def test_the_plan_says_when_no_configuration_besides_the_references_will_be_tried(seen):
    """Found by a new user: n_trials 2 (the two references), or a space file with nothing to
    search, and the answer said "the search found nothing better" with nothing said before."""
    study, _ = seen
    for n_trials, warned in ((2, True), (10, False)):
        console = _console(200)
        display.print_plan(console, _spec(study, n_trials=n_trials), CPU, study, [])
        said = " ".join(_text(console).split())
        note = f"note: study.n_trials {n_trials} leaves no trial beside the 2 references: no "
        assert (note in said) is warned, said
    from autotune.spacefile import parse_spec

    nothing = parse_spec("workload: {model: digits_cnn, data: digits}\n")
    console = _console(200)
    display.print_plan(console, nothing, CPU, study, [])
    assert "note: nothing to search: every trial trains the same configuration" in " ".join(
        _text(console).split()
    )


def test_the_plan_names_the_references_and_why_the_checklist_is_not_one(seen):
    """custom_workload.yaml trained no checklist trial and said "Confirming the 3 best and the
    untuned baseline" with no line saying why; its plan said "timing nothing" and then timed
    8 measurements, "each cell timed first with the tuning checklist's no workers"."""
    from autotune.spacefile import parse_spec
    from tests.conftest import SEEN_SPACE

    study, _ = seen
    learning_only = SEEN_SPACE.replace("  precision: [bf16, fp32]\n  num_workers: [1, 0]\n", "")
    plans = {}
    for text, said in (
        (SEEN_SPACE, "references the untuned baseline and the tuning checklist"),
        (
            learning_only,
            "references the untuned baseline; no tuning checklist: this space leaves it nothing "
            "to set beyond the untuned baseline",
        ),
        (
            SEEN_SPACE.replace("n_startup_trials: 2", "n_startup_trials: 2, checklist: false"),
            "references the untuned baseline; no tuning checklist: switched off in the space file",
        ),
    ):
        console = _console(80)
        display.print_plan(console, parse_spec(text), CPU, study, [])
        plans[text] = shown = " ".join(_text(console).split())
        assert said in shown, shown
    shown = plans[learning_only]
    assert "timing each micro-batch's speed: no execution knob to choose (stage 1: speed)" in shown
    assert "nothing" not in shown.split("searching")[0]
    assert "each cell timed with the tuning checklist's settings (no workers), from batch 64" in (
        shown
    )
    assert "other settings" not in shown  # a cell has no other to time


def test_the_plan_says_what_batch_size_auto_will_do_then_what_it_found():
    from autotune.spacefile import parse_spec
    from tests.conftest import SEEN_SPACE

    spec = parse_spec(SEEN_SPACE.replace("batch_size: [16, 32, 64]", "batch_size: auto"))
    study = optuna.create_study()

    def plan() -> str:
        console = _console(100)
        display.print_plan(console, spec, CPU, study, [])
        return " ".join(_text(console).split())

    said = plan()
    assert "batch_size auto: doubled from 64 before stage 1 until out of memory" in said
    assert "(the estimate below counts 64 and 128; the budget counts the whole probe)" in said
    assert "effective_batch_size" in said
    found = "batch_size auto: 64 to 256 (512 gained 3%)"
    studies.StudyRecord(batch_sizes=[64, 128, 256], batch_size_auto=found).store(study)
    said = plan()
    assert "batch_size auto: 64 to 256 (512 gained 3%)" in said and "doubled" not in said
    assert "from batch 256, bf16 down" in said  # stage 1 starts at the largest found


@pytest.mark.parametrize("width", [80, 100])
def test_trial_lines_show_every_knob_precision_first_never_cut(seen, width):
    study, _ = seen
    spec = _spec(study)
    console = _console(width)
    progress = display.live_progress(console)
    observer = display.LiveObserver(study, spec, Live(progress, console=console), progress)
    for trial in study.get_trials():
        observer.trial_finished(trial)
    text = _text(console)
    assert "…" not in text
    for trial in study.get_trials():
        knobs = [f"{name}={display.fmt(value)}" for name, value in trial.params.items()]
        shown = [line for line in text.splitlines() if f"trial {trial.number:>3} " in line]
        assert shown, text
        after = text[text.index(shown[0]) :].split()
        first = next(word for word in after if "=" in word)
        assert first.startswith("precision="), after  # the knob that changes speed the most
        for knob in knobs:
            assert knob in after, (knob, text)
    # the untuned baseline keeps its own pipeline, and says so beside the study's parameters
    baseline = text[text.index("(untuned baseline)") :].split("trial")[0].split()
    assert "batch_size=64" in baseline and "num_workers=0" in baseline, baseline


def test_flags_that_do_not_fit_the_trial_line_go_with_its_knobs(seen):
    study, _ = seen
    done = next(t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE)
    flagged = optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE,
        value=done.value,
        params=done.params,
        distributions=done.distributions,
        user_attrs={**done.user_attrs, "interference": True, "other_cpu_share": 0.37},
        system_attrs={"constraints:min_accuracy": 0.5},  # infeasible: below min_accuracy
    )
    console = _console(80)
    progress = display.live_progress(console)
    observer = display.LiveObserver(study, _spec(study), Live(progress, console=console), progress)
    observer.trial_finished(flagged)
    lines = [line.rstrip() for line in _text(console).splitlines() if line.strip()]
    assert lines[0].startswith("trial ") and len(lines) >= 2, lines
    assert all(line.startswith(" ") for line in lines[1:]), lines  # nothing at column 0
    text = " ".join(lines)
    assert "infeasible" in text and "interference 37%" in text
    # the report's trial table says it in the same words (it once said nothing of it)
    copy = optuna.create_study(study_name="seen")
    copy.add_trial(flagged)
    (row,) = report.trial_rows(copy)[1]
    assert row.flags == "interference 37%"


def test_a_long_turn_wait_is_a_line_of_its_own_in_piped_output(seen):
    """Piped output shows no status line: a wait said again ("still waiting", a long one) is
    printed on a line of its own; the first, routine one (a second between two runs' trials)
    is not."""
    study, _ = seen
    console = _console(80)  # a StringIO: not a terminal, as a pipe or a CI log
    progress = display.live_progress(console)
    observer = display.LiveObserver(study, _spec(study), Live(progress, console=console), progress)
    observer.trial_started(7, studies.trial_config(study.trials[0]))
    observer.turn_waiting("waiting for its turn (0 s so far, gives up after 30 min): x")
    assert "waiting for its turn" not in _text(console)
    observer.turn_waiting("still waiting for its turn (10 s so far, gives up after 30 min): x")
    said = [line.strip() for line in _text(console).splitlines() if "its turn" in line]
    assert said == ["trial 7: still waiting for its turn (10 s so far, gives up after 30 min): x"]


def test_stage_one_is_heard_in_piped_output_and_kept_out_of_the_trials_clock(seen, monkeypatch):
    """A terminal shows stage 1's progress in the status line; piped output (a log, CI) had
    nothing between the plan and the table for the whole stage (99 s on an H200)."""
    from autotune.display import _live

    study, _ = seen
    console = _console(100)  # not a terminal
    progress = display.live_progress(console)
    observer = display.LiveObserver(study, _spec(study), Live(progress, console=console), progress)
    timed = studies.SpeedEvent(cell="batch 64, fp32", settings="x", samples_per_second=9_000.0)
    observer.speed_measured(timed)
    assert "stage 1" not in _text(console)  # not before its time
    monkeypatch.setattr(_live, "PIPED_PROGRESS_SECONDS", 0.0)
    observer.speed_measured(dataclasses.replace(timed, cell="batch 128, fp32", cached=True))
    said = [line.strip() for line in _text(console).splitlines() if "stage 1" in line]
    assert said == ["stage 1: 1 timed, 1 reused so far; now batch 128, fp32"]
    # the trials' bar counts its time from the first trial: it showed stage 1's 43 s in it
    assert progress.tasks[0].start_time is None
    observer.trial_started(0, studies.trial_config(study.trials[0]))
    assert progress.tasks[0].start_time is not None


def test_a_trial_off_stage_one_and_on_tokens_says_so(seen):
    study, _ = seen
    done = next(
        t
        for t in study.get_trials()
        if t.state == optuna.trial.TrialState.COMPLETE and not t.user_attrs.get("baseline")
    )
    speed = done.user_attrs["samples_per_second"]
    shown = optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE,
        value=done.value,
        params=done.params,
        distributions=done.distributions,
        user_attrs={
            **done.user_attrs,
            "tokens_per_second": 1_234_567.0,
            "predicted_samples_per_second": speed / 0.7,
            "speed_mismatch": True,
        },
    )
    console = _console(100)
    progress = display.live_progress(console)
    observer = display.LiveObserver(study, _spec(study), Live(progress, console=console), progress)
    observer.trial_finished(shown)
    text = " ".join(_text(console).split())
    assert "1.2M tokens/s" in text and "30% slower than stage 1" in text
    # the report's trial table: the same figure, from the same function
    assert display.off_stage_one(studies.TrialRecord.of(shown)) == pytest.approx(-0.3)
    copy = optuna.create_study(study_name="seen")
    copy.add_trial(shown)
    (row,) = report.trial_rows(copy)[1]
    assert row.fail_kind == "speed_mismatch" and row.fail_msg.startswith(
        "trained 30% slower than stage 1"
    )


def test_a_database_outage_is_said_alike_in_the_live_display_and_outside_it(seen, monkeypatch):
    import types

    from autotune.cli import _confirm

    study, _ = seen
    outside = _console(200)
    monkeypatch.setattr(_confirm, "console", outside)
    retry = types.SimpleNamespace()
    _confirm.say_storage_waits(retry)  # outside the live display: confirm, verify, run's ends
    retry.on_wait("no server answers", 180.0)
    retry.on_back(4.2)
    live = _console(200)
    progress = display.live_progress(live)
    observer = display.LiveObserver(study, _spec(study), Live(progress, console=live), progress)
    observer.storage_waiting("no server answers", 180.0)
    observer.storage_back(4.2)
    said = [
        "the study's database does not answer (no server answers); waiting up to 180 s for it "
        "(study.storage_outage)",
        "the study's database answers again after 4 s",
    ]
    assert _text(outside).splitlines() == said
    assert [line for line in _text(live).splitlines() if "database" in line] == said


def test_a_study_with_all_its_trials_shows_no_full_bar(seen):
    """``run --n-trials 5`` on a study of 5 showed a 5/5 bar for a run that ran nothing."""
    study, _ = seen
    console = _console(80)
    progress = display.live_progress(console)
    display.LiveObserver(
        study, _spec(study, n_trials=5), Live(progress, console=console), progress
    )
    console.print(progress)
    assert "5/5" not in _text(console)
    console = _console(80)
    progress = display.live_progress(console)
    display.LiveObserver(
        study, _spec(study, n_trials=8), Live(progress, console=console), progress
    )
    console.print(progress)
    assert "5/8" in _text(console)


@pytest.mark.parametrize("width", [80, 100])
def test_the_commands_to_copy_are_whole_lines(seen, width):
    study, url = seen
    spec = _spec(study, storage=url)
    console = _console(width)
    outcome = studies.RunOutcome(study_name=study.study_name, states={"complete": 5})
    display.print_summary(console, study, spec, outcome)
    lines = [line.strip() for line in _text(console).splitlines()]
    shown = studies.display_url(url)
    assert shlex.join(["autotune", "dashboard", "--storage", shown]) in lines, lines
    assert shlex.join(["autotune", "best", "--study", "seen", "--storage", shown]) in lines
    # not confirmed (the run stopped before its round): the command that confirms it
    assert shlex.join(["autotune", "confirm", "--study", "seen", "--storage", shown]) in lines
    console = _console(width)
    display.print_summary(console, study, spec.with_overrides(study={"confirm": False}), outcome)
    assert "autotune confirm" not in _text(console)  # no round asked for: none suggested


def test_exports_run_hint_wraps_indented_at_80_columns(invoke_cli, seen, tmp_path: Path):
    _, url = seen
    copy_url = f"sqlite:///{tmp_path / 'copy.db'}"  # export writes the study's note: a copy
    optuna.copy_study(from_study_name="seen", from_storage=url, to_storage=copy_url)
    done = invoke_cli("export", "--storage", copy_url, "-o", "t.py", cwd=tmp_path, columns=80)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = next(k for k, line in enumerate(lines) if "into run/;" in line)
    end = next(k for k in range(start, len(lines)) if lines[k].rstrip().endswith("--device"))
    hint = [line.rstrip() for line in lines[start : end + 1]]
    assert len(hint) == 2 and all(line.startswith("  ") and len(line) <= 80 for line in hint), (
        lines
    )
    assert hint[-1].endswith("--device") and " ".join(" ".join(hint).split()).startswith(
        "2 epochs"
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0.0002215, "0.0002215"),  # a learning rate: 4 significant digits, not 2.21e-04
        (2.78125, "2.781"),
        (0.0, "0"),
        (6872.4, "6,872"),  # samples/s from 1,000: whole, thousands separated
        (27712.3, "27,712"),
        (128, "128"),
        (True, "true"),
        (None, "-"),
    ],
)
def test_one_rule_writes_a_value_for_the_terminal_the_note_and_the_report(value, shown):
    assert display.fmt(value) == shown


def test_the_confirmation_line_writes_the_median_by_the_same_rule():
    """`autotune best`, the note, the report and the exports say how sure the answer is with
    export.confirmation_text: its median reads as the tables write it (seconds to a target
    can pass 10,000)."""
    said = export.confirmation_text(export.TrialConfirmation(median=27712.3, runs=3), "s")
    assert said.startswith("confirmed: median 27,712 over 3 runs")


def test_seconds_read_alike_in_best_the_summary_and_the_note(seen):
    """``best``'s charged_seconds, the summary's seconds column and the note's headline: once
    12.3 s, 12.35 and 12.35 s (3 and 4 significant digits, 2 decimals)."""
    assert display.fmt_metric("charged_seconds", 12.345) == "12.35 s"
    study, _ = seen
    best = studies.feasible_trials(study)[0]
    console = _console(200)
    display.print_summary(console, study, _spec(study), studies.RunOutcome(study_name="seen"))
    seconds = display.fmt(studies.TrialRecord.of(best).charged_seconds)
    assert f" {best.number} " in _text(console) and f" {seconds} " in _text(console)


def test_a_long_value_goes_on_a_line_of_its_own_and_is_never_broken():
    console = _console(80)
    long_url = "postgresql://autotune:***@db.example.org:5432/" + "x" * 60
    display.print_item(console, "storage", long_url, copy=True)
    display.print_item(console, "searching", ", ".join(["a_long_knob_name"] * 8))
    lines = _text(console).splitlines()
    assert lines[:2] == ["storage", f"  {long_url}"]  # one line: the terminal wraps it
    assert lines[2] == "searching" and all(len(line) <= 80 for line in lines[3:])
    assert all(line.startswith("  a_long_knob_name") for line in lines[3:])


def test_studies_fits_80_columns_with_whole_headers(seen, invoke_cli, tmp_path: Path):
    _, url = seen
    listed = invoke_cli("studies", "--storage", url, cwd=tmp_path, columns=80)
    assert listed.returncode == 0, listed.stderr
    assert "…" not in listed.stdout
    header = next(line for line in listed.stdout.splitlines() if "study" in line.split())
    assert header.split() == ["study", "complete", "pruned", "failed", "best", "trial"]
    # a URL too long for the header line gets a line of its own (indented), never broken
    shown = [line.strip() for line in listed.stdout.splitlines()]
    assert url in shown or f"Studies in {url}" in listed.stdout
    row = next(line for line in listed.stdout.splitlines() if line.split()[:1] == ["seen"])
    assert "acc/s" in row and all(len(line) <= 80 for line in listed.stdout.splitlines())
    # its speed study (stage 1) under it, in samples/s: not one of the user's studies
    lines = listed.stdout.splitlines()
    speed = lines[lines.index(row) + 1]
    assert speed.split()[:3] == ["└", "stage", "1"] and "seen.speed" not in listed.stdout, lines
    assert "samples/s" in speed and "e+" not in speed
    assert "└ stage 1: the speed measurements of the study above (its NAME.speed)" in lines
    # and for scripts, the same as JSON
    as_json = invoke_cli("studies", "--storage", url, "--json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    (entry,) = [e for e in json.loads(as_json.stdout) if e["study"] == "seen"]
    assert entry["metric"] == "accuracy_per_second" and entry["best_trial"] == int(row.split()[-1])
    assert entry["complete"] == int(row.split()[1]) and entry["failed"] == int(row.split()[3])
    # its best is the answer as read first: a confirmed median, else the trial's one value
    answer = studies.answer_of(seen[0])
    assert answer is not None and [entry["best_value"], entry["best_source"]] == list(
        answer.headline
    )
    # stage 1's best is its table's fastest row, not its fastest single measurement (a busy
    # burst of a setting that lost its cell showed 9,163 beside the table's 7,813)
    (speed,) = [e for e in json.loads(as_json.stdout) if e["study"] == "seen.speed"]
    table = studies.StudyRecord.of(seen[0]).speed_table
    assert table is not None and speed["best_source"] == "stage 1's table"
    assert speed["best_value"] == max(c.samples_per_second for c in table.choices if c.measured)


def test_an_interrupted_trial_is_counted_as_interrupted(seen, invoke_cli, tmp_path: Path):
    """A trial stopped by Ctrl-C is stored as FAIL with its interruption recorded: a new user's
    ``studies`` counted it under "failed" (the run's summary and the report as "fail"), which
    reads as a fault of its configuration."""
    study, url = seen
    copy = f"sqlite:///{tmp_path / 'copy.db'}"
    optuna.copy_study(from_study_name=study.study_name, from_storage=url, to_storage=copy)
    copied = optuna.load_study(study_name=study.study_name, storage=copy)
    for kind in ("interrupted", "interrupted", "error"):
        stopped = studies.TrialRecord(fail_kind=FaultKind(kind), fail_msg="stopped")
        copied.add_trial(optuna.create_trial(state=TrialState.FAIL, user_attrs=stopped.to_attrs()))
    as_json = invoke_cli("studies", "--storage", copy, "--json", cwd=tmp_path)
    (entry,) = [e for e in json.loads(as_json.stdout) if e["study"] == study.study_name]
    failed = sum(t.state == TrialState.FAIL for t in study.get_trials()) + 1  # the error
    assert (entry["failed"], entry["interrupted"], entry["running"]) == (failed, 2, 0)
    listed = invoke_cli("studies", "--storage", copy, cwd=tmp_path, columns=80)
    lines = listed.stdout.splitlines()
    header = next(line for line in lines if "study" in line.split())
    columns = ("study", "complete", "pruned", "failed", "interrupted", "best", "trial")
    assert tuple(header.split()) == columns
    row = next(line for line in lines if line.split()[:1] == [study.study_name])
    assert row.split()[3:5] == [str(failed), "2"]
    assert all(len(line) <= 80 for line in lines[lines.index(header) :]), lines
    # the run's summary and the report count them alike
    outcome = studies.RunOutcome(study_name=study.study_name)
    studies.count_states(copied, outcome)
    console = _console(200)
    display.print_summary(console, copied, _spec(copied), outcome)
    counts = f"{failed} failed, 2 interrupted."
    assert counts in _text(console) and counts[:-1] in report.render_html(copied, copy)


def _round(values: dict[int, tuple[float, ...]]):
    """A complete confirmation round of two leaders, no baseline: trial -> its run values."""
    from autotune.study import ConfirmationRecord, ConfirmRun

    runs = tuple(
        ConfirmRun(
            trial=number,
            repeat=r,
            seed=r,
            value=v,
            score=0.9,
            samples_per_second=1.0,
            feasible=True,
            wall_seconds=1.0,
        )
        for number, series in values.items()
        for r, v in enumerate(series)
    )
    return ConfirmationRecord(
        top=2,
        repeats=2,
        maximize=True,
        candidates=tuple(values),
        baseline=None,
        runs=runs,
        complete=True,
    )


def test_the_running_best_carries_the_noise_a_confirmation_measured(tmp_path: Path, seen):
    from autotune.study import StudyRecord

    study, url = seen
    optuna.copy_study(
        from_study_name="seen",
        from_storage=url,
        to_storage=f"sqlite:///{tmp_path / 'copy.db'}",
        to_study_name="noisy",
    )
    copy = optuna.load_study(study_name="noisy", storage=f"sqlite:///{tmp_path / 'copy.db'}")
    console = _console(100)

    def best_line() -> str:
        progress = display.live_progress(console)
        observer = display.LiveObserver(
            copy, _spec(study), Live(progress, console=console), progress
        )
        return observer._best_text()

    assert "±" not in best_line()  # no round yet: the spread is unknown
    StudyRecord(confirmation=_round({1: (2.0, 2.2, 2.4), 2: (1.8, 2.0, 1.9)})).store(copy)
    assert "acc/s ±" in best_line()


@pytest.mark.parametrize(
    ("timed", "reused", "where"),
    [
        (0, 12, ""),
        (3, 0, "; all in study seen.speed"),
        (3, 9, "; those timed in study seen.speed"),
    ],
)
def test_stage_one_names_its_speed_study_only_for_what_it_holds(seen, timed, reused, where):
    """ "0 settings timed, 12 reused ...; all in study second.speed": all twelve came from
    first.speed (stage 1's cache is shared per hardware, model and data)."""
    study, _ = seen
    console = _console(200)
    progress = display.live_progress(console)
    observer = display.LiveObserver(study, _spec(study), Live(progress, console=console), progress)
    for cached in [False] * timed + [True] * reused:
        observer.speed_measured(
            studies.SpeedEvent(cell="batch 64, fp32", settings="no workers", cached=cached)
        )
    # what it left out, by the rules that applied: it listed every rule there is
    for why in ("past the budget", "with a pipeline far behind", "with a pipeline far behind"):
        observer.speed_measured(studies.SpeedEvent.left_out("batch 8, fp32", "-", "...", why))
    row = SpeedChoice(64, 1, "fp32", (), (("num_workers", 0),), 1e4, interference=True)
    observer.speed_finished(SpeedTable(choices=(row,)), 3.0)
    said = " ".join(_text(console).split())
    left_out = "3 not tried (2 with a pipeline far behind, 1 past the budget)"
    # a busy figure an earlier run left is kept until asked: said, with how (a new user's
    # resumed study on a quiet machine reused 8 busy rows without a word)
    busy = "1 row of it rests on figures taken while other processes took the cores: --remeasure"
    assert (busy in said) == (reused > 0), said
    # the reused part only where any was: "0 reused (timed by earlier runs ...)" read as news
    by = "this run's other workers, other processes or earlier runs"  # --workers: not "earlier"
    earlier = f", {reused} reused (timed by {by})" if reused else ""
    assert f" timed{earlier}, {left_out}, in 3 s{where}. " in said, said
    assert "in study" not in said.replace(where, "")


def test_the_baselines_knobs_are_untuned_not_searched(seen):
    study, _ = seen
    baseline = studies.reference_trial(study, "baseline")
    assert baseline is not None
    console = _console(100)
    console.print(display.config_table(baseline))
    rows = {line.split()[0]: line for line in _text(console).splitlines() if line.strip()}
    assert "untuned" in rows["precision"] and "searched" not in _text(console)
    assert export.best_config(study, baseline).origin("precision") == "untuned"


def test_the_configuration_shows_ddp_settings_only_for_a_trial_of_several_processes(seen):
    study, _ = seen
    one = studies.reference_trial(study, "baseline")
    assert one is not None
    console = _console(100)
    console.print(display.config_table(one))
    names = {line.split()[0] for line in _text(console).splitlines() if line.strip()}
    assert "static_graph" not in names and "world_size" not in names and "precision" in names
    config = studies.TrialRecord.of(one).config
    assert config is not None
    two = optuna.trial.create_trial(
        value=1.0,
        user_attrs=studies.TrialRecord(
            config=config.replace(world_size=2, static_graph=True)
        ).to_attrs(),
    )
    console = _console(100)
    console.print(display.config_table(two))
    rows = {
        line.split()[0]: line.split()[1] for line in _text(console).splitlines() if line.strip()
    }
    assert rows["world_size"] == "2" and rows["static_graph"] == "true"
    assert rows["ddp_bucket_cap_mb"] == "25"


def _confirmed_copy(seen, folder: Path, name: str, values) -> tuple[optuna.Study, list[int]]:
    """A copy of the seen study named ``name``, its two leaders confirmed with ``values``
    (each leader's run values, best first); the copy and the leaders."""
    from autotune.study import StudyRecord

    _, url = seen
    copy_url = f"sqlite:///{folder / 'copy.db'}"
    optuna.copy_study(
        from_study_name="seen", from_storage=url, to_storage=copy_url, to_study_name=name
    )
    copy = optuna.load_study(study_name=name, storage=copy_url)
    leaders = [t.number for t in studies.feasible_trials(copy)[:2]]
    StudyRecord(confirmation=_round(dict(zip(leaders, values, strict=True)))).store(copy)
    return copy, leaders


def test_a_round_too_noisy_to_rank_says_so_and_how_to_confirm_again(tmp_path: Path, seen):
    study, _ = seen
    values = ((0.9, 0.2, 2.0), (1.6, 0.5, 4.0))
    copy, leaders = _confirmed_copy(seen, tmp_path, "loud", values)
    console = _console(200)
    display.print_confirmation(console, studies.answer_of(copy), _spec(study), "loud")
    said = " ".join(_text(console).split())
    assert f"Answer: trial {leaders[1]}," in said  # the best median, 1.6 against 0.9
    assert "The round was too noisy to rank the leaders (run-to-run spread" in said
    # no run was flagged: the runs vary by themselves, and a quieter machine cannot help
    assert "quiet machine" not in said and "longer trials (workload.epochs)" in said
    assert "autotune confirm --study loud" in said and "tied" not in said


def test_runs_used_tells_the_retakes_of_a_busy_machine_apart_from_runs(tmp_path: Path, seen):
    """ "runs used 7" under "Confirmation (2 more runs each, interleaved)" read as 7 runs: it
    was the trial's own measurement and 2 runs measured 3 times each on a busy machine."""
    import dataclasses

    from autotune.study import ConfirmRun, StudyRecord

    study, _ = seen
    copy, (first, second) = _confirmed_copy(seen, tmp_path, "busy", ((1.0,), (0.9,)))
    busy = {"score": 0.93, "samples_per_second": 1.0, "feasible": True, "wall_seconds": 1.0}
    repeats = {first: (0, 1, 1, 1, 2, 2, 2), second: (0, 1, 2)}
    runs = tuple(
        ConfirmRun(trial=n, repeat=r, seed=r, value=1.0 + i / 100, other_cpu_share=0.7, **busy)
        for n, series in repeats.items()
        for i, r in enumerate(series)
    )
    record = StudyRecord.of(copy).confirmation
    assert record is not None
    StudyRecord(confirmation=dataclasses.replace(record, runs=runs)).store(copy)
    console = _console(80)
    display.print_confirmation(console, studies.answer_of(copy), _spec(study), "busy")
    rows = {line.split()[1]: line for line in _text(console).splitlines() if "│" in line}
    assert rows[str(first)].rstrip(" │").endswith("7 (4 retakes)"), rows
    assert rows[str(second)].rstrip(" │").endswith(" 3"), rows
    said = " ".join(_text(console).split())
    retake = "a retake: a run measured again, the machine busy the first time"
    assert f"or the round's own under load); {retake}" in said


def test_the_round_and_best_wrap_at_the_consoles_width(tmp_path: Path, seen, invoke_cli):
    """At COLUMNS=100 the "runs used:" footnote wrapped at the table's 65 columns (a caption);
    ``best``'s "confirmed:" line, wrapped, went on at column 0 rather than under its label."""
    copy, _ = _confirmed_copy(seen, tmp_path, "tied", ((1.0, 1.1, 0.95), (0.99, 1.0, 1.02)))
    console = _console(100)
    display.print_confirmation(console, studies.answer_of(copy), _spec(seen[0]), "tied")
    footnote = next(line for line in _text(console).splitlines() if "runs used:" in line)
    assert len(footnote.rstrip()) > 80, _text(console)
    url = f"sqlite:///{tmp_path / 'copy.db'}"
    shown = invoke_cli("best", "--storage", url, cwd=tmp_path, columns=60).stdout.splitlines()
    at = next(i for i, line in enumerate(shown) if line.startswith("  confirmed: median"))
    assert "with trial" in shown[at + 1], shown  # it wraps: it goes on under its label
    assert shown[at + 1].startswith("    ") and shown[at + 1][4] != " ", shown


def test_an_answer_from_single_runs_says_run_not_runs(tmp_path: Path, seen):
    import dataclasses

    from autotune.study import Reference

    study, _ = seen
    copy, _ = _confirmed_copy(seen, tmp_path, "once", ((1.0, 1.02), (1.0, 1.02)))
    answer = studies.answer_of(copy)
    assert answer is not None and answer.winner is not None
    baseline = Reference("the untuned baseline", 0, 0.6, 1, 1.69, (1.38, 2.06))
    # (a median of 1 run is never confirmed: ``CONFIRMED_RUNS``, test_answer)
    for runs, said in ((2, "median 1 over 2 runs ("), (3, "median 1 over 3 runs (")):
        values = (1.0,) * runs
        winner = dataclasses.replace(answer.winner, values=values, round_values=values)
        mine = tuple(winner if c.trial == winner.trial else c for c in answer.configurations)
        shown = dataclasses.replace(
            answer, winner=winner, configurations=mine, references=(baseline,)
        )
        console = _console(200)
        display.print_confirmation(console, shown, _spec(study), "once")
        text = " ".join(_text(console).split())
        assert f"Answer: trial {answer.number}, confirmed: {said}" in text, text
        assert "; 1.69x the untuned baseline (1.38x to 2.06x);" in text, text


def test_a_confirmation_run_short_of_its_target_says_so_not_a_time(seen):
    from autotune.spacefile import ObjectiveSpec
    from autotune.study import ConfirmRun

    study, _ = seen
    objective = ObjectiveSpec.model_validate({"metric": "time_to_score", "target_score": 0.99})
    spec = _spec(study).model_copy(update={"objective": objective})
    console = _console(160)
    show = display.confirmation_progress(console, spec)
    common = {"seed": 1, "samples_per_second": 900.0, "wall_seconds": 1.0}
    show(ConfirmRun(trial=3, repeat=1, value=0.6974, score=0.93, feasible=False, **common), 1, 2)
    show(ConfirmRun(trial=4, repeat=1, value=0.41, score=0.99, feasible=True, **common), 2, 2)
    short, reached = _text(console).splitlines()
    assert "target not reached in 0.6974 s" in short and "s to target" not in short  # fmt's
    assert "0.41 s to target" in reached


def test_a_verify_line_writes_its_score_and_seconds_as_verifys_table(seen):
    """Once 0.9500 and 12.3 s, where the table under it writes 0.95 and 12.35."""
    from autotune.results import Evaluation

    study, _ = seen
    console = _console(160)
    heard = display.verify_progress(console, _spec(study), 2)
    rest = {"val_loss": None, "train_loss": 1.0, "overhead_seconds": 0.0, "eval_seconds": 0.1}
    heard("answer", 3, Evaluation(2, 2.0, 10, 640, 0.95, train_seconds=12.345, final=True, **rest))
    assert "epoch 2/2  accuracy 0.95  12.35 s" in _text(console)


def test_a_confirmation_runs_interference_note_wraps_indented_under_it(seen):
    from autotune.study import ConfirmRun

    study, _ = seen
    console = _console(80)
    show = display.confirmation_progress(console, _spec(study))
    common = {"seed": 1, "score": 0.9667, "feasible": True, "wall_seconds": 1.0}
    busy = ConfirmRun(
        trial=17, repeat=1, value=3.236, samples_per_second=14200.0, other_cpu_share=0.5, **common
    )
    show(busy, 1, 10)
    first, note = (line.rstrip() for line in _text(console).splitlines())
    assert first.startswith("confirm   1/10  trial  17 run 1  3.236 acc/s") and len(first) <= 80
    assert note == "        interference: others took 50% of the cores", note
    show(busy, 1, 10)  # measured again at the same place: the line says so
    assert _text(console).splitlines()[2].startswith("confirm   1/10  trial  17 run 1 again  3.")
    show(ConfirmRun(trial=17, repeat=2, value=3.2, samples_per_second=14000.0, **common), 2, 10)
    assert len(_text(console).splitlines()) == 5  # a quiet run: one line


@pytest.mark.parametrize(("scaling", "shown"), [("none", "-"), ("linear", "256")])
def test_the_base_batch_size_is_shown_only_where_the_lr_is_scaled_from_it(scaling, shown):
    from autotune.testing import make_config

    config = make_config(lr_scaling=scaling, base_batch_size=256)
    trial = optuna.trial.create_trial(value=1.0, user_attrs={"config": config.to_dict()})
    console = _console(100)
    console.print(display.config_table(trial))
    rows = {line.split()[0]: line.split()[1] for line in _text(console).splitlines() if line}
    assert rows["base_batch_size"] == shown and rows["lr_scaling"] == scaling
    per = f"per 256 examples, scaled linear to the effective batch of {config.batch_size}"
    assert (per in " ".join(_text(console).split())) is (scaling == "linear")  # as exports say


def _speed(batch: int, samples_per_second: float, precision: str) -> SpeedChoice:
    """Stage 1's fastest setting of one unaccumulated micro-batch."""
    return SpeedChoice(
        batch_size=batch,
        accumulation_steps=1,
        precision=precision,
        extras=(),
        settings=(("data_pipeline", "device"),),
        samples_per_second=samples_per_second,
        charged_seconds=1.0,
        one_time_seconds=0.0,
        spread=0.05,
        measurements=1,
        speed_trials=(0,),
        runner_up=None,
    )


def _offering(spec: Spec, *batch_sizes: int) -> Spec:
    """``spec`` with these values of space.batch_size."""
    space = spec.space.model_copy(update={"batch_size": Choice(values=batch_sizes)})
    return spec.model_copy(update={"space": space})


def test_an_answer_at_the_largest_batch_still_speeding_up_names_the_next_batch(seen):
    study, _ = seen
    answer = studies.answer_of(study)
    assert answer is not None
    config = studies.trial_config(answer.trial)
    batch, precision = config.batch_size, config.precision
    spec = _offering(_spec(study), batch // 2, batch)

    def said(speed_at_batch: float, busy: bool = False) -> str:
        smaller = dataclasses.replace(_speed(batch // 2, 1000.0, precision), interference=busy)
        table = SpeedTable(choices=(smaller, _speed(batch, speed_at_batch, precision)))
        outcome = studies.RunOutcome(study.study_name, states={"complete": 5}, speed_table=table)
        console = _console(200)
        display.print_summary(console, study, spec, outcome)
        return " ".join(_text(console).split())

    assert (
        f"The answer trains micro-batches of {batch}, the largest space.batch_size offers, and "
        f"stage 1 ran {batch} 30% faster than {batch // 2}: add {2 * batch} to "
        "space.batch_size to try larger ones (or batch_size: auto to find them)."
    ) in said(1300.0)
    assert "the largest space.batch_size offers" not in said(1050.0)  # flat: the space is enough
    # a gain read off a figure taken while other processes took the cores is the load's
    assert "the largest space.batch_size offers" not in said(1300.0, busy=True)
    spec = spec.with_batch_sizes((batch // 2, batch))  # batch_size: auto: its probe said why
    assert "the largest space.batch_size offers" not in said(1300.0)
    wider = _offering(_spec(study), batch // 2, batch, 2 * batch)
    outcome = studies.RunOutcome(study.study_name, speed_table=SpeedTable())
    console = _console(200)
    display.print_summary(console, study, wider, outcome)
    assert "the largest space.batch_size offers" not in _text(console)  # not at the edge


HOSTILE = "ok\x1b[2J\x1b]0;pwned\x07\nrm -rf ~\r\u202eexe.sh\x00"  # a name in a shared database


def test_control_characters_in_a_study_name_are_shown_never_obeyed(invoke_cli, tmp_path: Path):
    """Issue 41: anyone who can name a study in a shared PostgreSQL database could write
    escape sequences to other users' terminals through `studies`, `best` and the commands
    offered to copy."""
    shown = display.visible(HOSTILE)
    assert shown == "ok\\x1b[2J\\x1b]0;pwned\\x07\\nrm -rf ~\\r\\u202eexe.sh\\x00"
    assert display.visible("résumé-run 2") == "résumé-run 2"  # printable text is kept
    copy = display.command("autotune", "best", "--study", HOSTILE)
    assert copy.isprintable() and "\\x1b" in copy
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    optuna.create_study(study_name=HOSTILE, storage=url)
    listed = invoke_cli("studies", "--storage", url, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "ok\\x1b[2J" in listed.stdout
    assert not any(char in listed.stdout for char in "\x1b\x07\r\u202e\x00")


def test_lines_the_users_code_printed_are_said_once_a_run(seen):
    study, _ = seen
    done = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE][:2]
    console = _console(100)
    progress = display.live_progress(console)
    observer = display.LiveObserver(study, _spec(study), Live(progress, console=console), progress)
    for number, trial in enumerate(done, start=100):
        printed = {"printed_lines": 2900, "first_printed": "shape (16, 3)\x1b[31m"}
        chatty = optuna.trial.create_trial(
            state=trial.state,
            value=trial.value,
            params=trial.params,
            distributions=trial.distributions,
            user_attrs={**trial.user_attrs, **printed},
        )
        chatty.number = number
        observer.trial_finished(chatty)
    text = " ".join(_text(console).split())
    assert "trial 101 " in text  # both trials shown, the note once
    assert text.count("your code printed 2,900 lines in trial") == 1, text
    assert "(the first: shape (16, 3)\\x1b[31m); trials' prints are not shown: --verbose" in text


def test_trials_that_all_end_at_one_score_are_warned_about(seen):
    """Segmentation at 0.859375 in every trial, whatever its lr: every pixel predicted as the
    commonest class. The summary says so; trials that differ do not get the warning."""
    study, _ = seen
    spec = _spec(study)
    done = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) >= 3 and len({t.params["lr"] for t in done}) >= 2

    def summary(score: float | None) -> str:
        copy = optuna.create_study(direction="maximize")
        for trial in done:
            attrs = {**trial.user_attrs, **({"score": score} if score is not None else {})}
            copy.add_trial(
                optuna.trial.create_trial(
                    value=trial.value,
                    params=trial.params,
                    distributions=trial.distributions,
                    user_attrs=attrs,
                    system_attrs=trial.system_attrs,
                )
            )
        console = _console(100)
        display.print_summary(console, copy, spec, studies.RunOutcome(copy.study_name))
        return " ".join(_text(console).split())

    assert "Every trial ended at exactly accuracy 0.859375, whatever its lr" in summary(0.859375)
    assert "Every trial ended" not in summary(None)  # the seen study's own: every one right
    assert "Every trial ended" not in summary(1.0)  # an easy data set learnt by every trial


def test_samples_per_second_is_written_one_way_outside_the_live_lines():
    """best, the note, the report, the tables and studies write it as fmt does; only the live
    lines, which must fit 80 columns, in SI (7.8k)."""
    for value in (812.345, 7812.4, 221_900.0):
        assert display.fmt_metric("samples_per_second", value) == display.fmt(value)
    (row,), _ = display.speed_rows(SpeedTable(choices=(_speed(32, 7812.4, "fp32"),)))
    assert str(row[2]).startswith("7,812 ±")  # stage 1's table, in the terminal and the report
    # how far behind the next best setting was: one decimal under 1%, not "-0%"
    close = (replace(_speed(32, 7812.4, "fp32"), runner_up=r) for r in (7790.0, 6250.0))
    assert [row[3] for row in display.speed_rows(SpeedTable(choices=tuple(close)))[0]] == [
        "-0.3%",
        "-20%",
    ]


def test_stage_ones_table_marks_a_row_measured_only_on_a_busy_machine():
    """Issue 39: "8.6k ±3619%" was shown beside clean rows with nothing to tell them apart."""
    from dataclasses import replace

    from autotune.display._tables import print_speed_table

    busy = replace(_speed(64, 8600.0, "fp32"), spread=72.38, interference=True)
    console = _console(120)
    print_speed_table(console, SpeedTable(choices=(_speed(32, 5200.0, "fp32"), busy)))
    rows = {line.split()[1]: line for line in _text(console).splitlines() if "fp32" in line}
    assert "8,600 ±3619% busy" in rows["64"] and "busy" not in rows["32"]
    assert "busy: its choice rests on a figure taken while others took the cores" in _text(console)
    console = _console(120)
    unmeasured = replace(_speed(128, 0.0, "fp32"), measurements=0, speed_trials=())
    print_speed_table(console, SpeedTable(choices=(_speed(32, 5200.0, "fp32"), unmeasured)))
    assert "busy" not in _text(console)  # no note under a table without such a row
    rows = {line.split()[1]: line for line in _text(console).splitlines() if "fp32" in line}
    assert "not measured" in rows["128"] and "as the nearest micro-batch measured" in rows["128"]
    assert "not measured" not in rows["32"]
    assert "batch_size auto" not in _text(console)
    console = _console(120)
    found = "batch_size auto: 32 to 64 (128 ran out of memory)"  # what the probe found
    print_speed_table(console, SpeedTable(choices=(busy,), batch_size_auto=found))
    assert found in _text(console).splitlines()


def test_an_error_wraps_between_words_on_a_terminal_and_is_one_line_in_a_log(monkeypatch):
    from autotune.cli import _common

    url = "sqlite:////home/someone/projects/a-long-folder-name/studies/autotune.db"
    line = f"the study quickstart is not in {url}: the storage holds first, second and third"
    for terminal in (True, False):
        errors = Console(
            file=io.StringIO(), width=80, force_terminal=terminal, soft_wrap=True, emoji=False
        )
        monkeypatch.setattr(_common, "errors", errors)
        assert _common.fail(line).exit_code == 2
        shown = Text.from_ansi(_text(errors)).plain.splitlines()
        assert " ".join(" ".join(shown).split()) == f"error: {line}"  # every word whole
        if not terminal:  # a log or a pipe: one line, for grep
            assert len(shown) == 1
            continue
        assert len(shown) > 1 and all(len(row) <= 80 for row in shown), shown
        assert all(row.startswith("       ") for row in shown[1:]), shown  # under the message
        assert any(url in row for row in shown)  # a URL or a path is never broken


def test_printed_lines_end_without_the_spaces_rich_pads_them_with(seen, invoke_cli, tmp_path):
    """A copy of the output carries no trailing spaces (tables, titles, lines wrapped between
    words), on a terminal too; the words are those rich lays out, and a space with a background
    colour, which is seen, stays."""
    from rich.table import Table

    from autotune.cli import _common

    _, url = seen
    shown = invoke_cli("best", "--storage", url, cwd=tmp_path, columns=60)
    lines = shown.stdout.splitlines()
    assert shown.returncode == 0 and len(lines) > 20, shown.stderr
    assert [line for line in lines if line.endswith(" ")] == []
    for trimmed in (False, True):
        console = Console(file=io.StringIO(), width=40, force_terminal=True, emoji=False)
        if trimmed:
            console.push_render_hook(_common._TrimLines())
        table = Table(title="short", title_justify="left")
        table.add_column("knob")
        table.add_row("lr")
        console.print(table)
        console.print("a few words, wrapped " * 3, style="bold")
        console.print(Text("seen ", style="on red"))
        plain = Text.from_ansi(_text(console)).plain.splitlines()
        if not trimmed:
            assert plain[0].startswith("short ")  # rich pads the title to the table's width
            untrimmed = plain
    assert plain[:-1] == [line.rstrip() for line in untrimmed[:-1]]
    assert plain[-1] == "seen " and plain[0] == "short"


def test_verifys_table_is_built_once_for_the_terminal_and_the_note():
    """display.verification_rows: the header, a row per configuration (never: the target not
    reached; no target, no column) and a line per reference the answer loses to at full length,
    which the terminal prints and the note writes (test_verify shows both)."""
    from autotune.study import Verification, VerifyRun

    runs = (
        VerifyRun(5, "answer", 1, ((1.0, 0.80), (2.0, 0.90), (3.0, 0.91))),
        VerifyRun(0, "baseline", 1, ((2.0, 0.70), (4.0, 0.92), (6.0, 0.97))),
        VerifyRun(1, "checklist", 1, ((2.0, 0.50), (4.0, 0.85), (6.0, 0.88))),
    )
    (head, *rows), said = display.verification_rows(
        Verification(30, 0.9, runs), "acc", True, per_second=False
    )
    assert head == ["configuration", "final acc", "training s", "s to 0.9"]
    assert rows == [
        ["the answer (trial 5)", "0.91", "3", "2"],
        ["the untuned baseline (trial 0)", "0.97", "6", "3.818"],
        ["the tuning checklist (trial 1)", "0.88", "6", "never"],
    ]
    assert said == [
        "The short trials' ranking holds at full length: the answer reaches 0.9 first, within "
        "noise, against the untuned baseline and the tuning checklist.",
        "The untuned baseline ends with a better acc, 0.97 against the answer's 0.91 (one run "
        "each): the answer trades it for speed; where the final acc matters more, lengthen the "
        "trials (workload.epochs) toward the real run, or ask for a higher min_score.",
    ]
    late = VerifyRun(5, "answer", 1, ((1.0, 0.80), (5.0, 0.90), (6.0, 0.91)))
    _, losses = display.verification_rows(
        Verification(30, 0.9, (late, runs[1])), "acc", True, True
    )
    assert losses[0] == (  # 6.6% more per second: within noise; but the target 24% sooner
        "The short trials' ranking does not hold: the untuned baseline reaches 0.9 in 3.82 s, "
        "the answer in 5 s."
    )
    assert losses[1].startswith("The untuned baseline ends with a better acc, 0.97")
    (head, *rows), _ = display.verification_rows(Verification(30, None, runs), "acc", True, True)
    assert len(head) == 3 and all(len(row) == 3 for row in rows)


def test_durations_and_lists_are_written_one_way_everywhere():
    """One formatter for an estimate's seconds (the stage-1 plan's and verify's agreed once
    they shared it) and one for "a, b and c" (trials, the verify plan, the confirmation)."""
    from autotune.display._text import duration

    assert [duration(s) for s in (0.4, 95, 119, 120, 150, 1800)] == [
        "0 s",
        "95 s",
        "119 s",
        "2 min",
        "2 min",
        "30 min",
    ]
    assert studies.listed(["a"]) == "a"
    assert studies.listed(["a", "b"]) == "a and b"
    assert studies.listed(iter(["a", "b", "c"])) == "a, b and c"
    assert studies.trials_named([5]) == "trial 5"
    assert studies.trials_named([1, 3, 5]) == "trials 1, 3 and 5"


def test_the_plan_counts_in_the_singular_where_there_is_one(seen):
    """Seen: "1 epochs per trial" (buggy.yaml) and "2 measurements of 1 cells"."""
    from autotune.spacefile import parse_spec
    from tests.conftest import SEEN_SPACE

    study, _ = seen
    one = SEEN_SPACE.replace("  precision: [bf16, fp32]\n", "").replace("16, 32, 64", "64")
    spec = parse_spec(one.replace("epochs: 2", "epochs: 1"))
    console = _console(200)
    display.print_plan(console, spec, CPU, study, [])
    said = " ".join(_text(console).split())
    assert ", 1 epoch per trial" in said, said
    assert " of 1 cell (a micro-batch and a precision each)" in said, said


def test_the_plan_says_where_a_relative_sqlite_storage_is(
    seen, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """A relative ``sqlite:///studies/autotune.db`` is a new database in each folder a run
    starts from (``cd elsewhere && autotune run ../proj/space.yaml`` started a new study,
    silently): the plan says the file it is, from here."""
    study, _ = seen
    monkeypatch.chdir(tmp_path)
    console = _console(80)
    display.print_plan(
        console, _spec(study, storage="sqlite:///studies/autotune.db"), CPU, study, []
    )
    lines = _text(console).splitlines()
    assert "storage sqlite:///studies/autotune.db" in lines, lines
    assert f"  relative to this folder: {tmp_path / 'studies' / 'autotune.db'}" in lines, lines


def _lines(console: Console) -> list[str]:
    return [line.rstrip() for line in _text(console).splitlines()]


@pytest.mark.parametrize("width", [80, 60])
def test_confirmation_lines_keep_each_figure_with_its_unit_and_go_on_indented(seen, width):
    """Recorded at 80 columns (time to rmse 0.8): "... rmse 0.5626  59.6k" then "samples/s" at
    column 0, and a run with no interference mark followed by an empty line."""
    from autotune.spacefile import ObjectiveSpec
    from autotune.study import ConfirmRun

    study, _ = seen
    goal = {"metric": "time_to_score", "score": "val_loss", "target_score": 0.8}
    spec = _spec(study).model_copy(update={"objective": ObjectiveSpec.model_validate(goal)})
    console = _console(width)
    show = display.confirmation_progress(console, spec)
    common = {"seed": 1, "wall_seconds": 1.0, "feasible": True}
    recorded = (  # trial, repeat, value, score, samples/s, others' share of the cores
        (12, 1, 0.07654, 0.4955, 164_200.0, None),
        (8, 1, 0.1304, 0.5626, 59_600.0, 0.48),
        (1, 2, 0.06488, 1.503, 90_000.0, None),  # short of the target: time spent
    )
    for done, (trial, repeat, value, score, speed, share) in enumerate(recorded, 1):
        run = ConfirmRun(trial=trial, repeat=repeat, value=value, score=score, **common,
                         samples_per_second=speed, other_cpu_share=share)  # fmt: skip
        show(replace(run, feasible=trial != 1), done, 10)
    lines = _lines(console)
    assert "" not in lines and all(len(line) <= width for line in lines), lines
    assert all(line.startswith(("confirm ", " " * 8)) for line in lines), lines  # no column 0
    said = " ".join(lines)
    for figure in ("164.2k samples/s", "59.6k samples/s", "0.1304 s to target", "loss 1.503"):
        assert any(figure in line for line in lines), (figure, lines)  # whole, on one line
    assert "interference: others took 48% of the cores" in " ".join(said.split())


@pytest.mark.parametrize("width", [80, 60])
def test_a_failed_trials_message_goes_on_under_itself(seen, width):
    """Recorded at 80 columns: "trial 4 error no micro-batch split ..." then "ran in stage 1:
    batch 64: ..." at column 0, where ``fail`` indents an error's continuation under it."""
    study, _ = seen
    done = next(t for t in study.get_trials() if t.state == TrialState.COMPLETE)
    message = (
        "no micro-batch split of effective batch 64 at fp32 ran in stage 1: batch 64: "
        "ValueError: my model cannot do batch 64 after warm-up (at buggy.py:112 in forward)"
    )
    failed = optuna.trial.create_trial(
        state=TrialState.FAIL,
        params=done.params,
        distributions=done.distributions,
        user_attrs={"fail_kind": "error", "fail_msg": message},
    )
    console = _console(width)
    progress = display.live_progress(console)
    observer = display.LiveObserver(study, _spec(study), Live(progress, console=console), progress)
    observer.trial_finished(failed)
    lines = _lines(console)
    assert all(len(line) <= width for line in lines), lines
    first = lines[0]
    assert first.startswith("trial ") and first.split()[2] == "error", lines
    at = first.index(" no ") + 1  # where the message starts
    knob_at = next(i for i, line in enumerate(lines) if "=" in line)
    assert knob_at > 1, lines  # the message wrapped: this test is about its continuation
    assert all(line[:at] == " " * at and line[at] != " " for line in lines[1:knob_at]), lines
    assert " ".join(" ".join(lines[:knob_at]).split()).endswith(message), lines
    assert all(line.startswith(" " * 8) for line in lines[knob_at:]), lines


@pytest.mark.parametrize("width", [80, 60])
def test_the_round_and_best_tables_cut_no_figure(tmp_path: Path, seen, width):
    """Recorded at 80 columns after ``confirm --repeats 3`` (time to rmse): "│ 13 │ 0.03991 │
    0.03955-0.091… │", and "effective_batch_size=1…" in the best trials: rich shares a table
    too wide evenly and cuts, where the README promises the knobs "wrapped, never cut"."""
    from autotune.spacefile import ObjectiveSpec

    study, _ = seen
    values = ((0.07633, 0.07758, 0.07696), (0.03955, 0.09144, 0.03991))
    copy, _ = _confirmed_copy(seen, tmp_path, "cut", values)
    goal = {"metric": "time_to_score", "score": "val_loss", "target_score": 0.8}
    spec = _spec(study).model_copy(update={"objective": ObjectiveSpec.model_validate(goal)})
    console = _console(width)
    answer = studies.answer_of(copy)
    display.print_confirmation(console, answer, spec, "cut")
    display.print_summary(console, copy, spec, studies.RunOutcome(study_name="cut"))
    lines = _lines(console)
    assert "…" not in _text(console) and all(len(line) <= width for line in lines), lines

    cells = [row.replace("│", " ").split() for row in lines]
    for low, high in ((0.07633, 0.07758), (0.03955, 0.09144)):  # each figure whole
        shown = [display.fmt_within(value, answer.spread) for value in (low, high)]
        assert any("-".join(shown) in row for row in cells), lines
    knobs = [
        f"{n}={display.fmt(v)}" for t in studies.feasible_trials(copy) for n, v in t.params.items()
    ]
    folded = "".join(row[-1] for row in cells if row)  # the last column's, folded parts joined
    assert all(knob in folded for knob in knobs), lines
    # at 60 columns, spaces between columns, not borders: room for "precision=fp32" whole
    assert all(any(knob in row for row in cells) for knob in knobs if len(knob) <= 14), lines
