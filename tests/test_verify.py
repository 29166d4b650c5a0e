"""``autotune verify``: the answer and the references trained for the full run, the time each
takes to the target, where the short trials' ranking does not hold, and a verify that resumes."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import optuna
import pytest
from rich.console import Console

from autotune import display
from autotune.executor import InProcessExecutor
from autotune.outputs import notes, report
from autotune.spacefile import parse_spec
from autotune.study import (
    Verification,
    VerifyInputs,
    VerifyRun,
    verify_candidates,
    verify_study,
)
from autotune.workloads import load

SPACE = """\
study: {name: verified, n_trials: 5, seed: 0, strategy: joint, pruner: none,
        confirm: {top: 1, repeats: 1}}
workload: {model: autotune.testing:tiny_mlp, data: autotune.testing:blobs, epochs: 1,
           device: cpu}
objective: {min_accuracy: 0.9, full_run_epochs: 3}
space:
  lr: {low: 2.0e-2, high: 1.0e-1, log: true}
  batch_size: [16, 32]
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory, prepare_study) -> tuple[Path, str]:
    """A finished tiny study: its folder and storage URL (copied by each test that writes)."""
    folder = tmp_path_factory.mktemp("verified")
    prepared = prepare_study(SPACE, folder)
    return folder, prepared.url


@pytest.fixture
def study(made, tmp_path: Path) -> optuna.Study:
    _, url = made
    copy = tmp_path / "copy.db"
    with sqlite3.connect(url.removeprefix("sqlite:///")) as source, sqlite3.connect(copy) as to:
        source.backup(to)  # the write-ahead log's pages too
    return optuna.load_study(study_name="verified", storage=f"sqlite:///{copy}")


def test_the_time_to_a_target_is_interpolated_between_evaluations():
    run = VerifyRun(3, "answer", 1, ((1.0, 0.5), (2.0, 0.8), (3.0, 0.95)))
    assert run.time_to(0.9, higher_is_better=True) == pytest.approx(2 + 0.1 / 0.15)
    assert run.time_to(0.4, higher_is_better=True) == 1.0  # at the first evaluation
    assert run.time_to(0.99, higher_is_better=True) is None  # never
    losses = VerifyRun(3, "answer", 1, ((1.0, 2.0), (3.0, 1.0)))
    assert losses.time_to(1.5, higher_is_better=False) == pytest.approx(2.0)
    failed = VerifyRun(3, "answer", 1, ((1.0, 0.5),), fault="oom: out of memory")
    assert failed.final_score is None and failed.seconds is None


def test_a_reference_that_wins_at_full_length_is_named_with_the_next_step():
    """A reference that beats the answer at full length on the study's metric (more score per
    second of training, or the target sooner) breaks the short trials' ranking: said, with what
    to do. One that only ends with a better score (short-horizon bias) is said apart, as the
    trade it is: a new user read "does not hold" of an answer 1.6x ahead per second that ended
    0.0056 lower, one run each."""
    runs = (
        VerifyRun(5, "answer", 1, ((1.0, 0.80), (2.0, 0.90), (3.0, 0.91))),
        VerifyRun(0, "baseline", 1, ((2.0, 0.70), (4.0, 0.92), (6.0, 0.97))),
        VerifyRun(1, "checklist", 1, ((2.0, 0.50), (4.0, 0.85), (6.0, 0.90))),
    )
    verified = Verification(30, 0.9, runs)
    assert verified.losses(higher_is_better=True, per_second=True) == []  # 0.303 per s, 0.162
    assert verified.ends_better(higher_is_better=True) == [
        ("the untuned baseline", "0.97 against the answer's 0.91 (one run each)")
    ]
    faster = VerifyRun(0, "baseline", 1, ((0.5, 0.92), (1.0, 0.95), (1.5, 0.97)))
    beaten = Verification(30, 0.9, (runs[0], faster))
    assert beaten.losses(higher_is_better=True, per_second=True) == [
        ("the untuned baseline", "scores 0.6467 per second of training, the answer 0.3033")
    ]
    assert beaten.losses(higher_is_better=True, per_second=False) == [
        ("the untuned baseline", "reaches 0.9 in 0.5 s, the answer in 2 s")
    ]
    # one run each cannot tell noise: a final score 0.2% better, the target 5% sooner, count not
    close = VerifyRun(0, "baseline", 1, ((1.0, 0.85), (1.9, 0.9), (3.0, 0.912)))
    assert Verification(30, 0.9, (runs[0], close)).losses(True, per_second=True) == []
    assert Verification(30, 0.9, (runs[0], close)).ends_better(True) == []
    # several runs each: a better median whose runs overlap the answer's is noise
    again = [dataclasses.replace(run, repeat=2) for run in runs]
    high = VerifyRun(5, "answer", 2, ((1.0, 0.80), (2.0, 0.90), (3.0, 0.975)))
    overlapping = Verification(30, 0.9, (*runs[:2], high, again[1]))
    assert overlapping.ends_better(True) == []
    apart = Verification(30, 0.9, (*runs[:2], again[0], again[1]))
    assert apart.ends_better(True) == [
        ("the untuned baseline", "0.97 against the answer's 0.91 (2 runs each)")
    ]
    spec = parse_spec(SPACE)
    console = Console(record=True, width=100)
    display.print_verification(console, beaten, spec)
    said = " ".join(console.export_text().split())
    assert "The short trials' ranking does not hold: the untuned baseline scores 0.6467" in said
    assert "Lengthen the trials (workload.epochs) toward the real run" in said
    console = Console(record=True, width=100)
    display.print_verification(console, verified, spec)
    said = " ".join(console.export_text().split())
    assert "The short trials' ranking holds at full length: the answer trains the most" in said
    assert "The untuned baseline ends with a better accuracy, 0.97 against the answer's" in said
    assert "the answer trades it for speed" in said
    # the answer first to the target over both: the speed-up in time to it
    faster = Verification(30, 0.9, (runs[0], runs[2]))
    console = Console(record=True, width=100)
    display.print_verification(console, faster, spec)
    said = " ".join(console.export_text().split())
    assert "The short trials' ranking holds at full length: the answer trains the most" in said
    assert "The answer reaches 0.9 3.00x sooner than the tuning checklist" in said
    # under unlike loads the times compare the loads: no "sooner" after the line saying so
    quiet, busy = (dataclasses.replace(runs[0], other_cpu_share=0.05),
                   dataclasses.replace(runs[2], other_cpu_share=0.72))  # fmt: skip
    console = Console(record=True, width=100)
    display.print_verification(console, Verification(30, 0.9, (quiet, busy)), spec)
    said = " ".join(console.export_text().split())
    assert "measured under unlike loads" in said and "sooner" not in said


def test_verify_trains_each_configuration_stores_every_run_and_resumes(study: optuna.Study):
    spec = parse_spec(SPACE)
    chosen = verify_candidates(study)  # the answer first, then the references it is not
    assert chosen[0][0] == "answer" and len(chosen) >= 2
    assert {role for role, _ in chosen[1:]} <= {"baseline", "checklist"}
    assert len({trial.number for _, trial in chosen}) == len(chosen)
    executor = InProcessExecutor(load(spec.workload))
    heard: list[tuple[str, float]] = []

    def stop_at_the_second(role: str, trial: int, evaluation) -> None:
        heard.append((role, evaluation.epoch))
        if role != "answer":
            raise KeyboardInterrupt  # Ctrl-C during the second run

    with pytest.raises(KeyboardInterrupt):
        verify_study(VerifyInputs(study, executor, 3, 0.9, on_evaluation=stop_at_the_second))
    kept = Verification.of(study)
    assert kept is not None and [run.role for run in kept.runs] == ["answer"]
    assert [epoch for _, epoch in heard[:3]] == [1.0, 2.0, 3.0]  # every evaluation, 3 epochs
    assert len(kept.runs[0].curve) == 3 and kept.runs[0].final_score is not None

    heard.clear()
    done = verify_study(
        VerifyInputs(
            study, executor, 3, 0.9, on_evaluation=lambda r, _, e: heard.append((r, e.epoch))
        )
    )
    assert {role for role, _ in heard} == {role for role, _ in chosen} - {"answer"}  # resumed
    assert sorted(run.role for run in done.runs) == sorted(role for role, _ in chosen)
    assert Verification.of(study) == done  # stored
    again = verify_study(VerifyInputs(study, executor, 2, 0.9))  # another length: a new one
    assert again.epochs == 2 and all(len(run.curve) == 2 for run in again.runs)


def test_the_command_prints_the_table_and_refuses_what_it_cannot_verify(
    study: optuna.Study, invoke_cli, tmp_path: Path
):
    url = f"sqlite:///{tmp_path / 'copy.db'}"
    done = invoke_cli("verify", "--storage", str(url), "--isolation", "none", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())
    assert "Verifying at 3 epochs: the answer (trial" in said and "At 3 epochs" in said
    stored = optuna.load_study(study_name="verified", storage=url)
    names = [row.name for row in Verification.of(stored).rows(True)]  # type: ignore[union-attr]
    assert len(names) >= 2 and all(name in said for name in names) and "s to 0.9" in said
    # the runs show in the dashboard's note and the HTML report
    note = notes.study_note(stored, url)
    assert "**At full length** (`autotune verify`, 3 epochs):" in note
    assert "| configuration | final accuracy | training s | s to 0.9 |" in note
    assert all(f"| {name} |" in note for name in names)
    assert "At full length: 3 epochs (autotune verify)" in report.render_html(stored, url)
    # the runner-up too, on request: one more run at the same length, the others kept
    kept = len(Verification.of(stored).runs)  # type: ignore[union-attr]
    more = invoke_cli(
        "verify", "--storage", url, "--isolation", "none", "--runner-up", cwd=tmp_path
    )
    assert more.returncode == 0, more.stderr
    said = " ".join(more.stdout.split())
    assert "Verifying at 3 epochs: the runner-up (trial" in said and ", 1 run one after" in said
    assert f"one after another, beside the {kept} stored at 3 epochs; about" in said
    assert "| the runner-up (trial" in notes.study_note(stored, url)
    bad = invoke_cli("verify", "--storage", str(url), "--repeats", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "--repeats 0: it must be from 1 to 1000" in bad.stderr


def test_a_verify_that_cannot_run_is_refused_before_a_worker_starts(
    study: optuna.Study, invoke_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A user's mistake is said at once: starting the worker first cost seconds (8 s seen)."""
    from autotune import session

    space_file = study.user_attrs["space_file"]
    study.set_user_attr("space_file", space_file.replace(", full_run_epochs: 3", ""))

    def started(*args: object, **kwargs: object) -> None:
        pytest.fail("a worker was started for a verify that is refused")

    monkeypatch.setattr(session, "executor_for", started)
    url = f"sqlite:///{tmp_path / 'copy.db'}"
    refused = invoke_cli("verify", "--storage", url, cwd=tmp_path)
    assert refused.returncode == 1, refused.stderr
    assert "study 'verified' sets no objective.full_run_epochs" in refused.stderr


def test_runs_at_full_length_under_unlike_loads_are_said_so_with_the_loads(study: optuna.Study):
    """Full-length runs are compared for the time to the target: one taken while others held
    most of the cores beside one on a quiet machine compares the loads as much as the
    configurations."""
    spec = parse_spec(SPACE)
    executor = InProcessExecutor(load(spec.workload))
    real = verify_study(VerifyInputs(study, executor, 1, 0.9))  # real runs, loads recorded
    assert len(real.runs) >= 2 and all(run.other_cpu_share is not None for run in real.runs)

    def loaded(answer_share: float) -> Verification:
        """The stored runs, others' share of the cores fabricated: 72% but the answer's."""
        stored = study.user_attrs["verify"]
        for run in stored["runs"]:
            run["other_cpu_share"] = answer_share if run["role"] == "answer" else 0.72
        study.set_user_attr("verify", stored)
        verified = Verification.of(study)
        assert verified is not None
        return verified

    _, said = display.verification_rows(loaded(0.05), "accuracy", True, True)
    others = ", ".join(f"{display_name}'s 72%" for display_name in _references(real))
    assert said[-1] == (
        f"The runs were measured under unlike loads (others' share of the cores: the answer's "
        f"5%, {others}): their times compare the loads as much as the configurations; verify "
        "again on a quiet machine."
    )
    assert "unlike loads" in "\n".join(notes.verify_block(study))
    _, alike = display.verification_rows(loaded(0.65), "accuracy", True, True)  # 7 apart
    assert not any("unlike loads" in line for line in alike)


def _references(verified: Verification) -> list[str]:
    """The names of the references verified beside the answer, in the table's order."""
    from autotune.study import role_name

    roles = {run.role for run in verified.runs} - {"answer"}
    return [role_name(role) for role in ("runner_up", "baseline", "checklist") if role in roles]
