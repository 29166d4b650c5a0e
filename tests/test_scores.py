"""The score a study judges by: built-ins (accuracy, top5, val_loss, perplexity) and the user's
function, in either direction, from the space file to the trials, the answer and the outputs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from optuna.trial import TrialState

from autotune.export import best_config, render, select_trial
from autotune.files import write_new_file
from autotune.results import TrialResult
from autotune.search import objective
from autotune.spacefile import ObjectiveSpec, SpecError, WorkloadSpec, parse_spec
from autotune.study import StudyRecord, TrialRecord, load_study
from autotune.testing import import_blocker, make_evaluation, make_result, run_script
from autotune.workloads import WorkloadError, load

SCORE_MODULE = """\
import torch
from torch import nn
from torch.utils.data import TensorDataset


def regression(n_train=192, n_val=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0])

    def split(count):
        inputs = torch.randn(count, 4, generator=generator)
        return TensorDataset(inputs, (inputs @ weights)[:, None])  # float targets

    return split(n_train), split(n_val)


def regressor(input_shape):
    return nn.Linear(input_shape[0], 1)


def mse(output, target):
    return nn.functional.mse_loss(output, target)


@torch.no_grad()
def val_mse(model, val_loader, device):  # lower is better
    total, count = 0.0, 0
    for inputs, targets in val_loader:
        error = model(inputs.to(device)).float() - targets.to(device)
        total, count = total + float((error**2).sum()), count + len(targets)
    return total / count


@torch.no_grad()
def neg_mse(model, val_loader, device):  # higher is better, and below 0
    return -val_mse(model, val_loader, device)


def raises(model, val_loader, device):
    return {"f1": 1.0}["no_such_column"]


def a_list(model, val_loader, device):
    return [0.5, 0.6]


def on_small_batches_only(model, val_loader, device):
    # the check before the study gives batches of 2; a trial gives the whole split at once
    if max(len(targets) for _, targets in val_loader) > 2:
        raise ValueError("cannot score batches of more than 2")
    return 0.5
"""

REGRESSION_SPACE = """\
study:
  name: regression
  n_trials: 3
  n_startup_trials: 3
  seed: 0
  confirm: false
workload:
  model: scores:regressor
  data: scores:regression
  loss: scores:mse
  epochs: 4
  device: cpu
objective:
  metric: time_to_score
  score: scores:val_mse
  higher_is_better: false
  target_score: 2.0
space:
  lr: {low: 3.0e-2, high: 1.0e-1, log: true}
  batch_size: [16]
"""


@pytest.fixture
def score_dir(user_module) -> Path:
    return user_module("scores", SCORE_MODULE)


def spec_of(**objective: object) -> ObjectiveSpec:
    return ObjectiveSpec.model_validate(objective)


# -- the space file -------------------------------------------------------------------------


def test_the_score_and_its_direction_name_the_metric():
    default = spec_of()
    assert default.score == "accuracy" and default.score_higher_is_better
    assert default.metric_name == "accuracy_per_second" and default.direction == "maximize"
    top5 = spec_of(metric="score_per_second", score="top5", min_score=0.8)
    assert top5.metric_name == "top5_per_second" and top5.bar == 0.8
    loss = spec_of(metric="time_to_score", score="val_loss", target_score=0.3)
    assert not loss.score_higher_is_better and loss.metric_name == "time_to_val_loss"
    assert loss.direction == "minimize" and loss.reaches(0.29, 0.3) and not loss.reaches(0.4, 0.3)
    user = spec_of(score="my.metrics:macro_f1")
    assert user.score_name == "macro_f1" and user.score_short == "macro_f1"
    assert user.score_higher_is_better  # a user's score is higher-is-better unless told
    # the older names are the same settings
    older = spec_of(metric="time_to_accuracy", target_accuracy=0.9)
    assert older.target == 0.9 and older.target_name == "target_accuracy"


@pytest.mark.parametrize(
    ("objective", "problem"),
    [
        ({"score": "val_loss"}, "needs a score where higher is better, and val_loss is lower"),
        (
            {"score": "x:perplexity_of", "higher_is_better": False, "min_score": 3.0},
            "needs a score where higher is better",
        ),
        ({"score": "val_loss", "higher_is_better": True}, "val_loss is lower-is-better"),
        ({"score": "f1"}, "'f1' is not a score: use accuracy, top5, val_loss, perplexity or"),
        ({"score": "m:f1", "min_accuracy": 0.5}, "min_accuracy: bounds an accuracy; for score"),
        ({"min_score": 0.5, "min_accuracy": 0.5}, "give min_score or min_accuracy"),
        ({"metric": "time_to_score"}, "target_score: metric time_to_score needs a target"),
        ({"target_score": 0.5}, "target_score: applies only to metric time_to_score"),
    ],
)
def test_a_score_the_metric_cannot_use_is_one_line_against_the_file(objective, problem):
    lines = [f"  {key}: {value}" for key, value in objective.items()]
    text = "workload: {model: mlp, data: digits}\nobjective:\n" + "\n".join(lines) + "\n"
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "space.yaml")
    assert re.search(re.escape(problem), str(caught.value)), str(caught.value)
    assert str(caught.value).startswith("space.yaml:")


def test_a_space_file_without_a_score_is_the_same_search_as_before_scores_existed():
    text = "workload: {model: mlp, data: digits}\nobjective: {min_accuracy: 0.9}\n"
    payload = parse_spec(text, "space.yaml").search_payload()
    assert payload["objective"] == {
        "metric": "accuracy_per_second",
        "min_accuracy": 0.9,
        "target_accuracy": None,
        "full_run_epochs": None,
    }
    other = parse_spec(text.replace("min_accuracy: 0.9", "score: top5"), "space.yaml")
    assert other.search_payload()["objective"]["score"] == "top5"


# -- the objective, in the score's direction --------------------------------------------------


def _result(*scores: float) -> TrialResult:
    """A trial that scored ``scores`` at evaluations 2 s of training apart."""
    return make_result(*(make_evaluation(i, i, v, 2.0 * i) for i, v in enumerate(scores, 1)))


def test_time_to_a_lower_is_better_target_counts_down_to_it():
    goal = spec_of(metric="time_to_score", score="val_loss", target_score=0.5)
    reached = objective.score(_result(2.0, 0.8, 0.45, 0.3), goal)
    # reached at the third evaluation (6 s), not the best one; the constraint is how far within
    assert reached.value == 6.0 and reached.score == 0.45 and reached.feasible
    assert reached.constraint == pytest.approx(-0.05) and reached.constraint_name == "target_score"
    missed = objective.score(_result(2.0, 0.9), goal)
    assert not missed.feasible and missed.score == 0.9  # its best, the lowest
    assert missed.reason == "best val_loss 0.9 never reached target_score 0.5"
    # the pruner's extrapolation: a loss twice the target is twice the way to go
    halfway = _result(1.0).evaluations[0]
    assert objective.intermediate_value(halfway, goal) == pytest.approx(2.0 * 1.0 / 0.5)
    assert objective.target_reached(_result(0.4).evaluations[0], goal)


def test_a_negative_score_per_second_is_no_answer():
    goal = spec_of(score="m:r_squared")
    negative = objective.score(_result(-0.2), goal)
    assert not negative.feasible and "r_squared -0.2 is below 0" in negative.reason
    assert objective.score(_result(0.5), goal).value == pytest.approx(0.25)


# -- the workload, checked before the study ---------------------------------------------------


def test_float_targets_train_with_the_users_loss_and_score(score_dir):
    spec = WorkloadSpec(model="scores:regressor", data="scores:regression", loss="scores:mse")
    workload = load(spec, score_dir, score="scores:val_mse")
    assert workload.score_fn is not None  # float labels passed: nothing reads class indices
    with pytest.raises(WorkloadError, match=r"labels are float32; the loss \(cross_entropy\)"):
        load(spec.model_copy(update={"loss": "cross_entropy"}), score_dir, "scores:val_mse")
    with pytest.raises(WorkloadError, match=r"labels are float32; the score \(accuracy\) need"):
        load(spec, score_dir)  # the user's loss, but accuracy reads class indices


@pytest.mark.parametrize(
    ("score", "problem"),
    [
        (
            "scores:raises",
            r"^score 'scores:raises' fails on the validation split: KeyError: 'no_such_column' "
            r"\(at .*scores\.py:\d+ in raises\)$",
        ),
        ("scores:a_list", r"^score 'scores:a_list' returned list; it must return one number$"),
        ("scores:missing", r"score 'scores:missing'.*no .*missing"),
        ("top5", r"^score top5: model 'mlp' outputs 10 classes"),
    ],
)
def test_a_score_that_cannot_score_is_one_line_before_any_trial(score_dir, score, problem):
    spec = WorkloadSpec(model="mlp", data="digits", model_args={"hidden": 8})
    if score == "top5":
        load(spec, score_dir, score="top5")  # 10 classes: top5 means something
        spec = WorkloadSpec(model="autotune.testing:tiny_mlp", data="autotune.testing:blobs")
        problem = r"^score top5: model 'autotune.testing:tiny_mlp' outputs 4 classes"
    with pytest.raises(WorkloadError, match=problem):
        load(spec, score_dir, score=score)


# -- studies ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_study_minimizes_time_to_a_lower_is_better_score_of_its_own(
    score_dir, invoke_cli, tmp_path
):
    """One run of the command asserts what two tests ran the same study for: the study
    minimizes the time to the user's lower-is-better score, ``run`` and ``best`` name that
    score (never accuracy), and the exported script scores with the user's function outside
    the repository."""
    (score_dir / "space.yaml").write_text(REGRESSION_SPACE)
    done = invoke_cli("run", "space.yaml", cwd=score_dir)
    assert done.returncode == 0, done.stderr
    assert "val_mse" in done.stdout and "s to target" in done.stdout
    assert " acc " not in done.stdout and "accuracy" not in done.stdout
    study = load_study("regression", f"sqlite:///{score_dir / 'studies' / 'autotune.db'}")
    assert study.direction.name == "MINIMIZE"
    record = StudyRecord.of(study)
    assert record.metric == "time_to_val_mse" and record.score_name == "val_mse"
    assert record.score_higher_is_better is False
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert complete, [t.user_attrs.get("fail_msg") for t in study.get_trials()]
    for trial in complete:
        stored = TrialRecord.of(trial)
        assert stored.score is not None and stored.score >= 0
        curve = [score for _, score in stored.score_curve or []]
        if trial.constraints["target_score"] <= 0:  # reached: its time is the first under 2.0
            assert stored.score <= 2.0 and stored.score == next(s for s in curve if s <= 2.0)
    best = invoke_cli("best", "--study", "regression", cwd=score_dir)
    assert best.returncode == 0, best.stderr
    assert re.search(r"validation val_mse: \d", best.stdout), best.stdout
    # the score function is the user's code too: said with the rest
    assert "scores:regression, scores:mse, scores:val_mse" in best.stdout
    # the exported script scores with the user's function, outside the repository
    answer = best_config(study, select_trial(study))
    assert answer.score_name == "val_mse" and "score" in answer.metrics
    script = tmp_path / "elsewhere" / "train.py"
    script.parent.mkdir()
    write_new_file(script, render(answer, "script", study))
    text = script.read_text()
    assert "from scores import val_mse" in text and "val loss" not in text
    done = run_script(script, "--epochs", "1", block_autotune=import_blocker(tmp_path, "autotune"))
    assert done.returncode == 0, done.stderr
    assert re.search(r"epoch 1/1 .* val val_mse \d+\.\d+", done.stdout), done.stdout


@pytest.mark.slow
def test_a_score_that_fails_in_every_trial_stops_the_study_naming_it(score_dir, prepare_study):
    space = REGRESSION_SPACE.replace("scores:val_mse", "scores:on_small_batches_only")
    space = space.replace("n_trials: 3", "n_trials: 6")
    study, _, outcome, _ = prepare_study(space, score_dir)
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert outcome.repeated_error is not None and len(failed) < 6
    message = TrialRecord.of(failed[0]).fail_msg or ""
    assert message.startswith(
        "score 'scores:on_small_batches_only' raised ValueError: cannot score batches of more "
        "than 2 (at "
    ), message


@pytest.mark.slow
def test_a_score_below_0_under_a_per_second_metric_is_said_before_the_study(score_dir, invoke_cli):
    """A negated MSE under score_per_second makes every trial infeasible: the check before the
    study says so in one line, with the fix."""
    space = REGRESSION_SPACE.replace("n_trials: 3", "n_trials: 1").replace(
        """  metric: time_to_score
  score: scores:val_mse
  higher_is_better: false
  target_score: 2.0
""",
        "  score: scores:neg_mse\n",
    )
    (score_dir / "space.yaml").write_text(space)
    done = invoke_cli("run", "space.yaml", cwd=score_dir, columns=80)
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "warning: score neg_mse is -" in said
    assert "neg_mse_per_second needs a score of 0 or more" in said
    assert "use objective.metric time_to_score with a target_score" in said
