"""The study's note in optuna-dashboard and its artifacts, and the comparisons they make."""

from __future__ import annotations

import html
import importlib.util
import io
import re
from pathlib import Path

import optuna
import optuna_dashboard
import pytest
from optuna.artifacts import FileSystemArtifactStore, download_artifact, get_all_artifact_meta
from rich.console import Console

from autotune import display
from autotune.errors import UserError
from autotune.outputs import artifacts, notes
from autotune.study import StudyRecord, TrialRecord, answer_of, answer_trial
from autotune.testing import make_config


def test_note_and_artifacts_are_readable_back(seen, tmp_path: Path):
    study, url = seen
    notes.write_note(study, url)
    note = optuna_dashboard.get_note(study)
    best = answer_trial(study)
    assert best is not None and f"**Best: trial {best.number}**" in note
    assert "the untuned baseline" in note or best.number == 0
    assert f"autotune export --study seen --storage {url}" in note
    assert "study `seen.speed`" in note  # a two-stage study says where stage 1 is
    speed = optuna.load_study(study_name="seen.speed", storage=url)
    assert "stage 1 of study `seen`" in optuna_dashboard.get_note(speed)
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    location = artifacts.locate(url, None)
    assert location is not None
    assert location.folder == Path(url.removeprefix("sqlite:///")).parent / "artifacts"
    artifact_id = artifacts.upload(study, script, location)
    store = FileSystemArtifactStore(str(location.folder))
    metas = get_all_artifact_meta(study)
    assert any(m.artifact_id == artifact_id and m.filename == "train.py" for m in metas)
    copy = tmp_path / "copy.py"
    download_artifact(artifact_store=store, artifact_id=artifact_id, file_path=str(copy))
    assert copy.read_text() == "print('hello')\n"


def test_the_note_shows_the_configuration_as_the_terminal_does(seen):
    """Once, the note said base_batch_size 256 where the lr is not scaled (none per batch) and
    ``best`` said -."""
    study, url = seen
    best = answer_trial(study)
    assert best is not None
    console = Console(file=io.StringIO(), width=200)
    console.print(display.config_table(best))
    assert isinstance(console.file, io.StringIO)
    terminal = [line.split()[:2] for line in console.file.getvalue().splitlines() if line]
    rows = dict(re.findall(r"^\| (\w+) \| (\S+)", notes.study_note(study, url), re.MULTILINE))
    assert rows.pop("knob") == "value" and rows["base_batch_size"] == "-"  # lr_scaling: none
    assert list(rows.items()) == [(name, value) for name, value in terminal if name in rows]


def test_comparisons_name_each_other_trial_once():
    study = optuna.create_study(direction="maximize")
    for value, speed in ((1.0, 300.0), (1.5, 450.0), (3.0, 900.0)):
        record = TrialRecord(samples_per_second=speed, baseline=value == 1.0)
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs=record.to_attrs()))
    answer = answer_of(study)
    assert answer is not None and answer.number == 2
    # the baseline is also the slowest feasible trial: it is listed once, as the baseline; the
    # value's ratio over a reference is the confirmation round's to state, not one trial's
    found = notes.comparisons(study, answer)
    rows = [(label, t.number, speed, value) for label, t, speed, value in found]
    assert rows == [
        ("the untuned baseline", 0, 3.0, None),
        ("the median feasible trial", 1, 2.0, 2.0),
    ]


def test_the_note_shows_the_space_file_as_a_code_block(seen):
    study, url = seen
    space = StudyRecord.of(study).space_file
    note = notes.study_note(study, url)
    assert "### The space file" in note
    assert f"```yaml\n{space.rstrip()}\n```" in note  # line by line, as written


def test_a_space_file_with_backticks_stays_inside_its_code_block():
    study = optuna.create_study(study_name="fenced")
    space = "# a ``` in a comment\nspace:\n  lr: {low: 0.001, high: 0.1}\n"
    study.set_user_attr("space_file", space)
    study.set_user_attr("space_file_path", "space.yaml")
    note = notes.study_note(study)
    assert f"### The space file (space.yaml)\n\n````yaml\n{space.rstrip()}\n````" in note


def test_artifacts_go_only_where_they_are_named(tmp_path: Path):
    """A SQLite study keeps its files beside the database; a shared storage only where the user
    says (a folder, or an S3 bucket); a location that cannot be is one line."""
    sqlite = artifacts.locate(f"sqlite:///{tmp_path}/a.db", None)
    assert sqlite is not None and sqlite.folder == tmp_path / "artifacts"
    assert artifacts.locate("postgresql+psycopg://u@db/autotune", None) is None
    named = artifacts.locate("postgresql+psycopg://u@db/autotune", str(tmp_path / "shared"))
    assert named is not None and named.folder == tmp_path / "shared"
    assert artifacts.open_store(named, create=False) is None  # reading makes nothing
    assert not (tmp_path / "shared").exists()
    if importlib.util.find_spec("boto3") is None:  # said when the location is read: first
        with pytest.raises(UserError, match=re.escape("needs boto3 (pip install boto3)")):
            artifacts.locate("sqlite:///x.db", "s3://team-studies")
    else:
        bucket = artifacts.locate("sqlite:///x.db", "s3://team-studies")
        assert bucket is not None and bucket.bucket == "team-studies"
        assert str(bucket) == "s3://team-studies"
    for bad, said in (
        ("ftp://host/dir", "unknown scheme 'ftp://'"),
        ("s3://team-studies/autotune", "no key prefix; give s3://team-studies"),
        ("s3://No_Such", "'No_Such' is not an S3 bucket name"),
        ("  ", "empty"),
    ):
        with pytest.raises(UserError, match=re.escape(said)):
            artifacts.locate("sqlite:///x.db", bad)
    if importlib.util.find_spec("boto3") is None:
        with pytest.raises(UserError, match=re.escape("needs boto3 (pip install boto3)")):
            artifacts.open_store(artifacts.ArtifactLocation(bucket="team-studies"), create=True)
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(UserError, match="cannot make the folder"):
        artifacts.open_store(artifacts.ArtifactLocation(folder=blocked / "sub"), create=True)


def test_the_note_is_written_by_optuna_dashboards_own_code_without_its_web_app(tmp_path: Path):
    """``autotune run`` ends by writing the note: optuna-dashboard's ``save_note``, loaded
    from its module without the package's web app and scikit-learn (1.6 s of imports), and
    read back by the dashboard's public ``get_note`` as written."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path}/note.db"
    optuna.create_study(study_name="noted", storage=url)
    code = (
        "import sys, optuna\n"
        "from autotune.outputs.notes import dashboard_save_note\n"
        f"study = optuna.load_study(study_name='noted', storage='{url}')\n"
        "dashboard_save_note()(study, '# A note\\n\\nwith **two** lines')\n"
        "print(sorted(m for m in ('optuna_dashboard', 'sklearn') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # neither imported
    study = optuna.load_study(study_name="noted", storage=url)
    assert optuna_dashboard.get_note(study) == "# A note\n\nwith **two** lines"


def test_the_headline_says_what_its_figure_is_in_words_that_agree(seen):
    """The note's first figure is the round's median where one confirmed it, "median of 1
    confirmed run" for one (not "1 confirmed runs"), else the trial's one measurement."""
    import dataclasses

    from autotune.study import Confirmed, best_trial

    study, _ = seen
    trial = best_trial(study)
    assert trial is not None
    plain = answer_of(study)
    assert plain is not None and plain.headline[1] == "one measurement"
    for runs, words in ((1, "median of 1 confirmed run"), (3, "median of 3 confirmed runs")):
        winner = Confirmed(trial.number, False, (2.0,) * runs, (), (), runs, runs)
        assert dataclasses.replace(plain, winner=winner).headline == (2.0, words)


def test_a_time_to_a_target_compares_the_right_way_and_the_note_leads_with_the_verdict():
    """Measured once (tab.yaml, time_to_rmse): "slowest feasible trial | 8 | 1.22x | 41,405 |
    1.50x" meant the answer took 1.5x longer (0.1586 s against 0.1056 s); and the note opened
    with one measurement's "2.79x the samples/s" above the round's confirmed ratio."""
    study = optuna.create_study(direction="minimize")
    study.set_user_attr("metric", "time_to_rmse")
    for value, speed in ((0.1056, 41_405.0), (0.1586, 50_330.0), (0.2198, 53_222.0)):
        record = TrialRecord(samples_per_second=speed, feasible=True, config=make_config())
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs=record.to_attrs()))
    answer = answer_of(study)
    assert answer is not None and answer.number == 0
    found = {label: value for label, _, _, value in notes.comparisons(study, answer)}
    assert found["the median feasible trial"] == pytest.approx(0.1586 / 0.1056)  # 1.50x faster
    note = notes.study_note(study)
    assert note.index("**Not confirmed**") < note.index("One measurement each (trial 0's own")
    assert "(trial 1), 1.50x faster to the target" in note and "its time_to_rmse" not in note


def test_one_measurement_each_says_when_the_two_were_taken_under_unlike_loads(seen):
    """On a busy 2-core VM the search's own measurements were taken at 69-76% of the cores and
    beyond: the note's "one measurement each" ratios set a trial at a quiet moment beside one
    at a busy one and said nothing of it."""
    from autotune.outputs import report

    real, _ = seen

    def loaded(answer_share: float) -> optuna.Study:
        """The real study's trials, their loads fabricated: 72% but the answer's."""
        study = optuna.create_study(direction=real.direction)
        best = answer_trial(real)
        assert best is not None
        for trial in real.get_trials():
            share = answer_share if trial.number == best.number else 0.72
            trial.set_user_attr("other_cpu_share", share)
            study.add_trial(trial)
        return study

    study = loaded(0.05)  # a quiet moment, the rest flagged: 67 points apart
    answer = answer_of(study)
    assert answer is not None
    found = notes.comparisons(study, answer)
    assert found
    page = " ".join(html.unescape(report.render_html(study)).split())
    note = notes.study_note(study)
    for label, other, _, _ in found:
        said = (
            f"measured under unlike loads: others took 5% of the cores in trial "
            f"{answer.number}'s run, 72% in trial {other.number}'s"
        )
        assert f"(trial {other.number})" in note and said in note
        assert f"{label.removeprefix('the ')}: {said}" in page
    # alike loads (both flagged, 10 points apart): nothing to say
    assert "unlike loads" not in notes.study_note(loaded(0.62))
