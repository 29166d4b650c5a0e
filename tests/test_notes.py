"""The study's note in optuna-dashboard and its artifacts, and the comparisons they make."""

from __future__ import annotations

from pathlib import Path

import optuna
import optuna_dashboard
from optuna.artifacts import FileSystemArtifactStore, download_artifact, get_all_artifact_meta

from autotune import notes
from autotune.study import StudyRecord


def test_note_and_artifacts_are_readable_back(seen, tmp_path: Path):
    study, url = seen
    notes.write_note(study, url)
    note = optuna_dashboard.get_note(study)
    summary = notes.summarize(study)
    assert f"**Best: trial {summary.best.number}**" in note
    assert "the untuned baseline" in note or summary.best.number == 0
    assert f"autotune export --study seen --storage {url}" in note
    assert "study `seen.speed`" in note  # a two-stage study says where stage 1 is
    speed = optuna.load_study(study_name="seen.speed", storage=url)
    assert "stage 1 of study `seen`" in optuna_dashboard.get_note(speed)
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    artifact_id = notes.upload(study, script, url)
    store = FileSystemArtifactStore(str(notes.artifact_dir(url)))
    assert notes.artifact_dir(url) == Path(url.removeprefix("sqlite:///")).parent / "artifacts"
    metas = get_all_artifact_meta(study)
    assert any(m.artifact_id == artifact_id and m.filename == "train.py" for m in metas)
    copy = tmp_path / "copy.py"
    download_artifact(artifact_store=store, artifact_id=artifact_id, file_path=str(copy))
    assert copy.read_text() == "print('hello')\n"


def test_comparisons_name_each_other_trial_once():
    def trial(number: int, samples_per_second: float, value: float) -> optuna.trial.FrozenTrial:
        made = optuna.trial.create_trial(
            value=value, user_attrs={"samples_per_second": samples_per_second}
        )
        made.number = number
        return made

    best, baseline, other = trial(5, 900.0, 3.0), trial(0, 300.0, 1.0), trial(2, 450.0, 1.5)
    summary = notes.Summary(
        study="s",
        metric="accuracy_per_second",
        best=best,
        baseline=baseline,
        feasible=[best, other, baseline],
        states={"COMPLETE": 3},
        bottlenecks={},
    )
    # the baseline is also the slowest feasible trial: it is listed once, as the baseline
    rows = [(label, t.number, speed, value) for label, t, speed, value in summary.comparisons()]
    assert rows == [
        ("the untuned baseline", 0, 3.0, 3.0),
        ("the median feasible trial", 2, 2.0, 2.0),
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
