"""The run as a library call (``autotune.run``): a study run from Python as ``autotune run`` runs
it, without printing, its ending said in the command's terms, and its errors one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import optuna
import optuna_dashboard
import pytest
from optuna.trial import TrialState

import autotune
from autotune import session
from autotune.ending import ending
from autotune.errors import UserError
from autotune.session import RunOptions, load_run_spec
from autotune.study import StudyObserver, TrialRecord
from autotune.testing import write_space

SPACE = """\
study:
  name: library
  n_trials: 3
  n_startup_trials: 2
  pruner: none
  seed: 0
  isolation: none
  strategy: joint
  confirm: {{top: 1, repeats: 2}}  # a confirmed median counts 2 runs: one busy run is not
workload:
  model: autotune.testing:tiny_mlp
  data: autotune.testing:blobs
  epochs: 1
  device: cpu
space:
  lr: {{low: 1.0e-3, high: 1.0e-1, log: true}}
  batch_size: [32]
  precision: [{precision}]
"""


class Heard(StudyObserver):
    def __init__(self) -> None:
        self.finished: list[int] = []

    def trial_finished(self, trial: optuna.trial.FrozenTrial) -> None:
        self.finished.append(trial.number)


def test_a_study_runs_from_python_and_its_report_holds_the_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    space = write_space(tmp_path, SPACE.format(precision="fp32"), name="library.yaml")
    storage = f"sqlite:///{tmp_path / 'lib.db'}"
    heard = Heard()
    report = autotune.run(space, storage=storage, observer=heard)
    assert (report.ok, report.ending.status, report.ending.lines) == (True, "ok", ())
    assert report.study_name == "library" and report.storage == storage
    assert report.outcome.trials_run == 3 and sorted(heard.finished) == [0, 1, 2]
    assert report.confirmed  # the space file's confirmation round ran
    best = report.best()
    assert best.study == "library" and best.config.precision == "fp32" and best.confirmation
    study = optuna.load_study(study_name="library", storage=storage)
    assert study.user_attrs.get("confirmation")  # the same record the command leaves
    assert "library" in optuna_dashboard.get_note(study)  # and the same note (session.end_run)
    assert capsys.readouterr().out == ""  # a library call prints nothing
    # printed, it says its study, how it ended and the answer (it was a 4,000-character repr)
    head, answer = str(report).splitlines()
    assert head == f"study library ({storage}): ok, 3 trials this run, confirmed", head
    # a reference that won is named ("best: trial 1, ..." hid that it was the checklist)
    kind = TrialRecord.of(study.trials[best.trial]).reference
    named = {None: "", "baseline": " (untuned baseline)", "checklist": " (tuning checklist)"}
    assert answer.startswith(f"best: trial {best.trial}{named[kind]}, "), answer
    assert " acc/s (median of " in answer
    assert repr(report) == f"<RunReport {head}; {answer}>"
    again = autotune.run(space, storage=storage, n_trials=4, confirm=False)
    assert again.outcome.trials_run == 1 and not again.confirmed  # resumed: one more trial


class CtrlC(StudyObserver):
    """Presses Ctrl-C (a real SIGINT to this process) once the first trial has finished."""

    def trial_finished(self, trial: optuna.trial.FrozenTrial) -> None:
        import signal

        signal.raise_signal(signal.SIGINT)


def test_ctrl_c_is_raised_on_once_the_run_has_recorded_what_it_did(tmp_path: Path):
    """Ctrl-C in a script's ``autotune.run``: the call returned a report with status
    "interrupted" and no line on how to resume, and the script went on to exit 0. As
    ``autotune run`` exits 130, the call raises KeyboardInterrupt once the study has recorded
    the trials and written its note, saying how to resume; called again, it resumes."""
    space = write_space(tmp_path, SPACE.format(precision="fp32"), name="stopped.yaml")
    storage = f"sqlite:///{tmp_path / 'stopped.db'}"
    with pytest.raises(KeyboardInterrupt) as stopped:
        autotune.run(space, storage=storage, observer=CtrlC())
    said = str(stopped.value)
    assert said.startswith("Interrupted. The running trial (or confirmation run) is recorded")
    assert said.endswith("; call autotune.run again with the same arguments to resume.")
    study = optuna.load_study(study_name="library", storage=storage)
    assert [t.state for t in study.trials][:1] == [TrialState.COMPLETE]
    assert "library" in optuna_dashboard.get_note(study)  # the note of what it trained
    new = r"resume with study_name='library-2', without new_study=True\.$"  # its new study
    with pytest.raises(KeyboardInterrupt, match=new):
        autotune.run(space, storage=storage, observer=CtrlC(), new_study=True)
    resumed = autotune.run(space, storage=storage)
    assert resumed.ok and resumed.outcome.trials_run >= 1


def test_user_errors_are_one_line_and_the_environment_names_the_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    with pytest.raises(UserError, match=r"no-such\.yaml"):
        autotune.run(tmp_path / "no-such.yaml")
    space = write_space(tmp_path, SPACE.format(precision="fp32"), name="env.yaml")
    monkeypatch.setenv("AUTOTUNE_STORAGE", f"sqlite:///{tmp_path / 'env.db'}")
    assert load_run_spec(space).study.storage == f"sqlite:///{tmp_path / 'env.db'}"
    named = load_run_spec(space, RunOptions(storage="sqlite:///other.db", n_trials=9))
    assert (named.study.storage, named.study.n_trials) == ("sqlite:///other.db", 9)
    nobody = "postgresql+psycopg://user:secret@127.0.0.1:1/none"  # no server answers there
    with pytest.raises(UserError, match=r"cannot open storage .*\*\*\*.*no server answers"):
        autotune.run(space, storage=nobody)


def test_trials_that_all_fail_end_the_run_failed_with_the_commands_line(tmp_path: Path):
    space = write_space(tmp_path, SPACE.format(precision="fp32"), name="nan.yaml")
    huge = "lr: {low: 1.0e+29, high: 1.0e+30, log: true}"  # each trial's message differs in lr
    text = space.read_text().replace("lr: {low: 1.0e-3, high: 1.0e-1, log: true}", huge)
    text = text.replace("  seed: 0\n", "  seed: 0\n  baseline: false\n")
    space.write_text(text)
    report = autotune.run(space, storage=f"sqlite:///{tmp_path / 'n.db'}")
    assert report.ending.status == "failed" and not report.ok
    said = report.ending.lines[0]  # the failures grouped by kind, not by message
    assert said.startswith("no trial of the study trained to its end; all 3 of its trials: ")
    assert "training loss is nan" in said and said.endswith("; lower the lr range")
    # where the loss is the user's own, it is named as a suspect
    study = optuna.load_study(study_name="library", storage=f"sqlite:///{tmp_path / 'n.db'}")
    theirs = load_run_spec(space).with_overrides(workload={"loss": "mine:loss"})
    assert (
        ending(study, theirs, report.outcome)
        .lines[0]
        .endswith("; check that the loss (mine:loss) stays finite, or lower the lr range")
    )
    assert all(TrialRecord.of(t).fail_kind for t in study.get_trials(states=(TrialState.FAIL,)))


def test_the_worker_starts_before_the_study_process_imports_torch(tmp_path: Path):
    """The worker's imports and its copy of the workload overlap the study process's own: it is
    launched before this process imports torch, and ``executor_for`` trains in it."""
    import subprocess
    import sys

    space = write_space(tmp_path, n_trials=1)
    program = f"""
import sys
from pathlib import Path
from autotune import session

spec = session.load_run_spec(Path({str(space)!r}))
prepared = session.prepare(spec, Path.cwd(), meanwhile=lambda: print("torch" in sys.modules))
worker = prepared.launched
executor = session.executor_for(prepared.spec, Path.cwd(), launched=worker)
worker.start()  # ready: it imported and loaded the workload meanwhile
print(executor is worker, len(worker.started_pids))
executor.close()
"""
    found = subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines() == ["False", "True 1"]


def test_the_api_example_runs_as_a_script_and_an_unguarded_one_is_told_the_fix(tmp_path: Path):
    """A worker process re-imports the main script: a call at its top level would start the
    study again inside the worker. It is refused in one line before any study exists; under
    the ``__main__`` guard the same script runs."""
    import subprocess
    import sys

    space = write_space(tmp_path, SPACE.format(precision="fp32"), name="api.yaml")
    storage = f"sqlite:///{tmp_path / 'api.db'}"
    call = (
        f"report = autotune.run({str(space)!r}, storage={storage!r}, n_trials=1, "
        f'isolation="worker", confirm=False)\n'
        "print(report.ending.status, report.outcome.trials_run)\n"
    )
    scripts = {
        "unguarded": call,
        "guarded": 'if __name__ == "__main__":\n    ' + call.replace("\n", "\n    "),
    }
    ran = {}
    for name, body in scripts.items():
        (tmp_path / f"{name}.py").write_text("import autotune\n\n" + body)
        ran[name] = subprocess.run(
            [sys.executable, f"{name}.py"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if name == "unguarded":
            assert not optuna.get_all_study_summaries(storage)  # refused before the study
    refused = ran["unguarded"]
    assert refused.returncode == 1 and "bootstrapping" not in refused.stderr
    # its traceback: the script's line and autotune.run's, not the six frames below it
    assert refused.stderr.count('  File "') == 2, refused.stderr
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "unguarded.py:3 runs autotune at the top level of the script: its worker process "
            'imports the script again; put the call under if __name__ == "__main__":'
        )
    )
    assert ran["guarded"].returncode == 0, ran["guarded"].stderr
    assert ran["guarded"].stdout.split() == ["ok", "1"]
    assert ran["guarded"].stderr == ""  # no Optuna INFO lines: a library call prints nothing


def test_a_run_confirms_when_the_study_is_full_or_timed_out_and_was_not_stopped(tmp_path: Path):
    """``confirm_after_run``, the one rule ``autotune.run`` and ``autotune run`` share: the round
    runs with the space file's top and repeats once the study holds its total or the timeout
    ended its search, not after a run that was stopped; an interruption of the round is
    recorded, not raised."""
    from autotune.session import confirm_after_run
    from autotune.study import RunOutcome, Terminated

    spec = load_run_spec(write_space(tmp_path, SPACE.format(precision="fp32")))  # 3 trials
    study = optuna.create_study()
    asked: list[tuple[int, int]] = []

    def confirm(top: int, repeats: int) -> bool:
        asked.append((top, repeats))
        return True

    def stopped(top: int, repeats: int) -> bool:
        raise Terminated

    for _ in range(2):
        study.add_trial(optuna.trial.create_trial(value=1.0))
    assert not confirm_after_run(study, spec, RunOutcome("x"), confirm)  # 2 of 3: not full
    # the timeout ended the search: the answer is confirmed all the same
    assert confirm_after_run(study, spec, RunOutcome("x", timed_out=True), confirm)
    assert asked == [(1, 2)]
    asked.clear()
    study.add_trial(optuna.trial.create_trial(state=TrialState.PRUNED))
    for ended in (
        RunOutcome("x", interrupted=True),
        RunOutcome("x", repeated_error="boom"),
        RunOutcome("x", stage_failed="nothing fits"),
    ):
        assert not confirm_after_run(study, spec, ended, confirm)
    assert not asked
    assert confirm_after_run(study, spec, RunOutcome("x"), confirm) and asked == [(1, 2)]
    off = spec.with_overrides(study={"confirm": {"enabled": False}})
    assert not confirm_after_run(study, off, RunOutcome("x"), confirm) and len(asked) == 1
    outcome = RunOutcome("x")
    assert not confirm_after_run(study, spec, outcome, stopped)
    assert outcome.interrupted and outcome.terminated


def test_the_library_and_the_command_pass_each_run_option(monkeypatch):
    from autotune.cli._run import run as command

    given = RunOptions(
        n_trials=9,
        timeout=60.0,
        storage="sqlite:///given.db",
        study_name="given",
        device="cpu",
        seed=3,
        isolation="none",
    )
    heard: list[RunOptions | None] = []

    class Read(Exception):
        pass

    def load_run_spec(space: object, options: RunOptions | None = None) -> None:
        heard.append(options)
        raise Read

    monkeypatch.setattr(session, "load_run_spec", load_run_spec)
    for takes in (autotune.run, command):
        with pytest.raises(Read):
            takes(Path("space.yaml"), **dataclasses.asdict(given))
    assert heard == [given, given]
