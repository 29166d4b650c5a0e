"""Studies in-process: trials recorded with their measurements, resume, guards and faults."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import signal
import statistics
import time
from pathlib import Path
from typing import ClassVar

import optuna
import pytest
from optuna.trial import TrialState
from rich.console import Console

from autotune import display, stops
from autotune.config import TrialConfig
from autotune.errors import WorkerError
from autotune.executor import InProcessExecutor
from autotune.faults import FaultKind
from autotune.machine.interference import CpuShare
from autotune.machine.turns import DeviceLockTimeout
from autotune.results import Evaluation, TrialResult
from autotune.search.space import restrict
from autotune.spacefile import parse_spec
from autotune.storage import adapter
from autotune.study import (
    METRIC_FIELDS,
    NOISY_SPREAD,
    Answer,
    ConfirmationInputs,
    ConfirmationRecord,
    ConfirmRun,
    StorageOutage,
    StudyError,
    StudyInputs,
    StudyObserver,
    StudyRecord,
    Terminated,
    TrialRecord,
    answer_trial,
    best_trial,
    confirm_study,
    confirmation_plan,
    counted_trials,
    feasible_trials,
    make_sampler,
    open_storage,
    open_study,
    run_study,
    trial_config,
    with_study_strategy,
)
from autotune.testing import AMPERE, CPU, TINY_SPACE, make_config, make_evaluation, make_result
from autotune.workloads import load

RESULT_ATTRS = {
    "score",
    "train_seconds",
    "overhead_seconds",
    "charged_seconds",
    "samples_per_second",
    "effective_batch_size",
    "peak_memory_bytes",
    "device_name",
    "torch_version",
    "config",
}


# the tiny space in one stage: stage 1 is test_speed.py's subject (a test here asks for it)
TINY = TINY_SPACE.replace("  seed: 0\n", "  seed: 0\n  strategy: joint\n")
assert TINY != TINY_SPACE


def tiny_spec(n_trials: int = 4, pruner: str = "none", text: str | None = None, **overrides):
    spec = parse_spec(text or TINY.format(n_trials=n_trials, pruner=pruner), "tiny.yaml")
    if overrides:
        spec = spec.with_overrides(**overrides)
    return restrict(spec, CPU).spec


def test_a_study_records_every_trial_with_its_measurements(tmp_path: Path, prepare_study):
    spec = tiny_spec(n_trials=5)
    study, _, outcome, _ = prepare_study(spec, tmp_path)
    trials = study.get_trials()
    assert outcome.trials_run == 5 and len(trials) == 5
    assert {t.state for t in trials} <= {TrialState.COMPLETE, TrialState.PRUNED}
    for trial in trials:
        if trial.state == TrialState.COMPLETE:
            assert set(trial.user_attrs) >= RESULT_ATTRS
            assert trial.value == pytest.approx(
                trial.user_attrs["score"] / trial.user_attrs["charged_seconds"]
            )
            assert "min_accuracy" in trial.constraints
        else:
            assert trial.user_attrs["fail_kind"] and trial.user_attrs["fail_msg"]
        config = trial_config(trial)
        assert isinstance(config, TrialConfig)
        assert config.precision in ("fp32", "bf16")  # fp16 was dropped on the CPU
        assert config.seed == trial.number
        for name, value in trial.params.items():
            assert getattr(config, "base_lr" if name == "lr" else name) == value
    best = best_trial(study)
    assert best is not None and all(v <= 0 for v in best.constraints.values())
    attrs = study.user_attrs
    assert attrs["space_file"] == spec.text and attrs["metric"] == "accuracy_per_second"
    assert attrs["search_fingerprint"] == spec.search_fingerprint()
    assert study.metric_names == ["accuracy_per_second"]


def test_trial_zero_is_the_untuned_baseline(seen):
    study, _ = seen
    first = study.trials[0]
    assert first.user_attrs["baseline"] is True
    config = trial_config(first)
    assert config.precision == "fp32" and config.num_workers == 0
    assert config.batch_size == 64  # autotune's documented default, in the space
    assert 0.005 <= first.params["lr"] <= 0.1
    # a two-stage study's references sample what its other trials sample (the dashboard
    # plots every trial's parameters together), and keep their own execution knobs
    assert first.params["effective_batch_size"] == 64 and first.params["precision"] == "fp32"
    assert {k for t in study.trials for k in t.params} == set(first.params)
    assert not any(t.user_attrs.get("baseline") for t in study.trials[1:])


def test_n_trials_is_the_study_total_and_a_rerun_resumes(tmp_path: Path, prepare_study):
    study, _, outcome, _ = prepare_study(tiny_spec(n_trials=2), tmp_path)
    assert outcome.trials_run == 2
    first = [(t.number, t.params, t.value) for t in study.get_trials()]

    study, _, outcome, _ = prepare_study(tiny_spec(n_trials=4), tmp_path)
    assert outcome.trials_run == 2 and counted_trials(study) == 4
    assert [(t.number, t.params, t.value) for t in study.get_trials()][:2] == first
    # the resumed sampler does not redraw the first run's configurations
    params = [tuple(sorted(t.params.items())) for t in study.get_trials()]
    assert len(set(params)) == 4

    study, _, outcome, _ = prepare_study(tiny_spec(n_trials=4), tmp_path)
    assert outcome.trials_run == 0
    assert outcome.stopped_reason.startswith("nothing to run: the study already has 4 trials;")
    assert "--n-trials (study.n_trials, now 4) is the study's total" in outcome.stopped_reason


def test_an_edited_space_is_refused_with_a_diff(tmp_path: Path, prepare_study):
    url = prepare_study(tiny_spec(n_trials=1), tmp_path).url
    edited = TINY.format(n_trials=1, pruner="none").replace("[16, 32]", "[16, 64]")
    with pytest.raises(StudyError) as caught:
        prepare_study(tiny_spec(text=edited), tmp_path, run=False)
    message = str(caught.value)
    assert "the space file changed since the study was created" in message
    assert "-  batch_size: [16, 32]" in message and "+  batch_size: [16, 64]" in message
    assert "--new-study" in message

    fresh = prepare_study(tiny_spec(text=edited), tmp_path, run=False, new_study=True).study
    assert fresh.study_name == "tiny-2"
    assert [t.state for t in fresh.trials] == [TrialState.WAITING]  # its untuned baseline, queued
    # the original study is untouched
    original = optuna.load_study(study_name="tiny", storage=url)
    assert len(original.trials) == 1
    # --new-study on an unchanged space: a new study as asked, never a silent resume
    again = prepare_study(tiny_spec(n_trials=1), tmp_path, run=False, new_study=True).study
    assert again.study_name == "tiny-3"


def test_a_machine_that_filters_the_space_differently_is_refused(tmp_path: Path, prepare_study):
    text = TINY.format(n_trials=1, pruner="none")
    gpu_spec = restrict(parse_spec(text, "tiny.yaml"), AMPERE).spec
    prepare_study(gpu_spec, tmp_path, run=False, hardware=AMPERE)
    with pytest.raises(StudyError, match="a machine that can run other values") as caught:
        prepare_study(tiny_spec(text=text), tmp_path, run=False)
    # each value by its name (a diff of the JSON lines showed "-    2" without its knob)
    said = str(caught.value)
    assert "workload.device cuda in the study, cpu now" in said.splitlines()[0]
    assert "a --workers or --gpus share" in said


def test_the_same_device_spelled_differently_resumes(tmp_path: Path, prepare_study):
    text = TINY.format(n_trials=1, pruner="none")

    def spec_for(device: str, hardware):
        spec = parse_spec(text, "tiny.yaml").with_overrides(workload={"device": device})
        return restrict(spec, hardware).spec

    # cuda and cuda:1 on the same kind of GPU continue one study
    second_gpu = dataclasses.replace(AMPERE, device="cuda:1")
    prepare_study(spec_for("cuda", AMPERE), tmp_path / "gpu", run=False, hardware=AMPERE)
    resumed = prepare_study(
        spec_for("cuda:1", second_gpu), tmp_path / "gpu", run=False, hardware=second_gpu
    ).study
    assert resumed.study_name == "tiny"
    # auto is resolved to the device it finds before it is compared
    prepare_study(spec_for("cpu", CPU), tmp_path / "cpu")
    assert prepare_study(spec_for("auto", CPU), tmp_path / "cpu", run=False).study.study_name == (
        "tiny"
    )


def test_a_study_labelled_by_an_earlier_autotune_resumes(
    tmp_path: Path, prepare_study, monkeypatch: pytest.MonkeyPatch
):
    """Until 2026-11-22 the search fingerprint was compact JSON with the device as written."""
    # an old label has no learning_knobs: each open waits PEER_CREATION_SECONDS for a creator
    # that may still be labelling it (5 s); briefly here
    monkeypatch.setattr("autotune.study._open.PEER_CREATION_SECONDS", 0.2)
    spec = tiny_spec(n_trials=2)
    payload = spec.model_dump(mode="json", include={"workload", "objective", "space"})
    payload["workload"]["device"] = "auto"
    for added_since in ("inputs", "target", "loss", "batch_fn", "gpus_per_trial", "class_dim"):
        del payload["workload"][added_since]
    for added_since in ("score", "higher_is_better", "min_score", "target_score"):
        del payload["objective"][added_since]
    for added_since in ("ddp_bucket_cap_mb", "gradient_as_bucket_view", "static_graph"):
        del payload["space"][added_since]
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    storage = f"sqlite:///{tmp_path / 's.db'}"
    old = optuna.create_study(study_name="tiny", storage=storage, direction="maximize")
    old.set_user_attr("search_fingerprint", hashlib.sha256(canonical.encode()).hexdigest()[:16])
    old.set_user_attr("space_file", spec.text)
    assert prepare_study(spec, tmp_path, run=False, storage=storage).study.study_name == "tiny"
    # a label that matches nothing is refused with a message, not an empty diff
    other = optuna.create_study(study_name="other", storage=storage)
    other.set_user_attr("search_fingerprint", "0123456789abcdef")
    other.set_user_attr("space_file", spec.text)
    effective = json.dumps(spec.space.model_dump(mode="json"), indent=1, sort_keys=True)
    other.set_user_attr("effective_space", effective)
    with pytest.raises(StudyError, match="records no difference autotune can show"):
        prepare_study(
            spec.with_overrides(study={"name": "other"}), tmp_path, run=False, storage=storage
        )


def test_a_study_not_made_by_autotune_is_refused(
    tmp_path: Path, prepare_study, monkeypatch: pytest.MonkeyPatch
):
    # a study with no trials and no label may be one another `autotune run` is creating: it
    # is waited for (PEER_CREATION_SECONDS) before it is judged; briefly here
    monkeypatch.setattr("autotune.study._open.PEER_CREATION_SECONDS", 0.2)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    optuna.create_study(study_name="tiny", storage=storage)
    with pytest.raises(StudyError, match="was not created by autotune"):
        prepare_study(tiny_spec(), tmp_path, run=False, storage=storage)


def test_configuration_faults_are_pruned_with_a_violated_constraint(tmp_path: Path, prepare_study):
    spec = tiny_spec(
        n_trials=2,
        workload={"model_args": {"nan_after_steps": 2}},
    )
    study = prepare_study(spec, tmp_path).study
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.PRUNED, TrialState.PRUNED]
    for trial in trials:
        assert trial.user_attrs["fail_kind"] == "nonfinite_loss"
        assert "training loss is nan" in trial.user_attrs["fail_msg"]
        assert trial.constraints == {"fault": 1.0}
    assert best_trial(study) is None


@pytest.mark.parametrize("strategy", ["joint", "two_stage"])
def test_the_same_bug_in_every_trial_stops_the_study(tmp_path: Path, prepare_study, strategy: str):
    text = TINY.format(n_trials=10, pruner="none").replace(
        "autotune.testing:tiny_mlp", "autotune.testing:broken_model"
    )
    spec = tiny_spec(text=text, study={"strategy": strategy})
    study, url, outcome, _ = prepare_study(spec, tmp_path)
    assert outcome.repeated_error == "ValueError: a bug in forward"
    if strategy == "two_stage":  # stage 1 found it: every setting failed, no trial ran
        speed = optuna.load_study(study_name="tiny.speed", storage=url)
        assert speed.trials and all(t.state == TrialState.FAIL for t in speed.trials)
        assert {t.user_attrs["fail_kind"] for t in speed.trials} == {"error"}
        assert counted_trials(study) == 0
        return
    trials = study.get_trials()
    assert len(trials) == 3
    for trial in trials:
        assert trial.state == TrialState.FAIL
        assert trial.user_attrs["fail_kind"] == "error"
        assert "raise ValueError(self.message)" in trial.user_attrs["fail_traceback"]


def test_trials_that_fail_differently_stop_the_run_once_as_many_failed_as_wanted(
    tmp_path: Path, prepare_study
):
    class Failing(InProcessExecutor):
        def train(self, config: TrialConfig, report) -> TrialResult:
            raise RuntimeError(f"a bug at seed {config.seed}")  # another message each time

    spec = tiny_spec(n_trials=3)
    outcome = prepare_study(spec, tmp_path, executor=Failing(load(spec.workload))).outcome
    assert outcome.failed_out and not outcome.repeated_error and not outcome.interrupted
    assert outcome.stopped_reason.startswith(
        "3 trials failed in this run; each its own way, the last with RuntimeError: a bug at seed "
    )

    class Flaky(InProcessExecutor):  # the first trial trains; then the model breaks
        def train(self, config: TrialConfig, report) -> TrialResult:
            if self.calls:
                raise ValueError("a bug after 50 batches")
            self.calls += 1
            return super().train(config, report)

    flaky = Flaky(load(spec.workload))
    flaky.calls = 0
    outcome = prepare_study(spec, tmp_path / "flaky", executor=flaky).outcome
    # a trial completed, so not "every trial failed the same way": the reason names the error
    assert outcome.failed_out and not outcome.repeated_error
    assert outcome.stopped_reason.startswith(
        "3 trials failed in this run; 3 of them with ValueError: a bug after 50 batches (at "
    )


def test_pruned_trials_say_why_and_nothing_is_left_running(tmp_path: Path, prepare_study):
    spec = tiny_spec(n_trials=8, pruner="median", workload={"epochs": 3})
    study = prepare_study(spec, tmp_path).study
    for trial in study.get_trials():
        assert trial.state in (TrialState.COMPLETE, TrialState.PRUNED)
        if trial.state == TrialState.PRUNED:  # by the pruner, or as one that cannot win
            kind, message = trial.user_attrs["fail_kind"], trial.user_attrs["fail_msg"]
            assert kind in ("pruned", "cannot_win")
            said = "by the median pruner" if kind == "pruned" else "even at accuracy 1"
            assert said in message
            assert len(trial.intermediate_values) < 3  # never pruned after its last evaluation


CANNOT_WIN_SPACE = """\
study:
  name: losing
  n_trials: 3
  pruner: median
  strategy: joint
  confirm: false
  baseline: {batch_size: 16}  # half trial 1's pace: it leads clearly, however busy the machine
workload:
  model: autotune.testing:tiny_mlp
  model_args: {step_delay_seconds: 0.02}  # the steps, not the arithmetic, set each one's pace
  data: autotune.testing:blobs
  epochs: 3
objective: {min_accuracy: 0.5}
space:
  lr: 0.05
  batch_size: [32, 8, 16]
"""


def test_a_runs_trials_are_counted_in_the_study_every_worker_included(
    tmp_path: Path, prepare_study
):
    """``--workers``: the summary said "7 trials this run" where worker 2 ran 23 more, and
    "1 running" after they had stopped (issue 44 item 5): the count is read from the study."""
    from autotune.study import RunOutcome, count_states

    before = time.time()
    study, _, outcome, _ = prepare_study(tiny_spec(n_trials=3), tmp_path)
    elsewhere = RunOutcome(study.study_name, trials_run=1, states={"running": 1})  # one worker
    count_states(study, elsewhere, before)
    assert elsewhere.trials_run == 3 == outcome.trials_run
    assert elsewhere.states == outcome.states and "running" not in elsewhere.states
    count_states(study, elsewhere, time.time())
    assert elsewhere.trials_run == 0  # none started since


def test_a_reference_is_never_pruned_even_behind_the_median(tmp_path: Path, prepare_study):
    """Under --workers the untuned baseline may start after other trials finished (issue 44:
    Hyperband pruned it, and the round ran without it). Here it is queued again after five
    trials four times its pace: the median pruner would stop it at its first evaluation."""
    from autotune.study._open import queue_reference

    space = (
        CANNOT_WIN_SPACE.replace("n_trials: 3", "n_trials: 6")
        .replace("{step_delay_seconds: 0.02}", "{step_delay_seconds: 0.005}")
        .replace("  confirm: false\n", "  confirm: false\n  checklist: false\n")
    )
    study = prepare_study(space, tmp_path, run=False).study
    for _ in range(5):
        study.enqueue_trial({"batch_size": 32})
    study, _, _, _ = prepare_study(space, tmp_path)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    assert queue_reference(study, spec, CPU, "baseline")
    study, _, _, _ = prepare_study(space.replace("n_trials: 6", "n_trials: 7"), tmp_path)
    late = study.trials[-1]
    assert TrialRecord.of(late).baseline and late.params["batch_size"] == 16
    assert late.state == TrialState.COMPLETE and len(late.intermediate_values) == 3


def test_a_trial_that_cannot_win_even_with_a_perfect_score_is_stopped(
    tmp_path: Path, prepare_study, monkeypatch
):
    monkeypatch.setattr("autotune.study._reporter.CpuMeter", Meter)  # a quiet machine
    # trial 1 takes 8 steps an epoch (the baseline 16); trial 2 takes 32, four times as long: at
    # its first evaluation, even accuracy 1 at its pace ends below half the leader's acc/s
    study = prepare_study(CANNOT_WIN_SPACE, tmp_path, run=False).study
    study.enqueue_trial({"batch_size": 32})
    study.enqueue_trial({"batch_size": 8})
    study, _, outcome, _ = prepare_study(CANNOT_WIN_SPACE, tmp_path)
    baseline, fast, slow = study.get_trials()
    assert TrialRecord.of(baseline).baseline and baseline.state == TrialState.COMPLETE
    assert fast.state == TrialState.COMPLETE and best_trial(study) is not None
    assert slow.state == TrialState.PRUNED and len(slow.intermediate_values) == 1
    record = TrialRecord.of(slow)
    assert record.fail_kind == FaultKind.CANNOT_WIN
    # Optuna keeps its last reported value as its value: on a 3-epoch trial's scale, what it
    # ends at at its pace and score, not the score over its first epoch's seconds (issue 44)
    assert (
        record.score is not None and record.train_seconds and record.overhead_seconds is not None
    )
    steady = record.train_seconds - record.overhead_seconds
    assert slow.value == pytest.approx(
        record.score / (3 * steady + record.overhead_seconds), rel=0.02
    )
    leader = best_trial(study)
    assert leader is not None and leader.number < 2
    assert record.fail_msg is not None
    assert record.fail_msg.startswith("stopped at evaluation 1 (epoch 1.00): even at accuracy 1")
    assert f"and trial {leader.number} has {leader.value:.4g}" in record.fail_msg
    console = Console(record=True, width=100)
    spec = restrict(parse_spec(CANNOT_WIN_SPACE, tmp_path / "space.yaml"), CPU).spec
    display.print_summary(console, study, spec, outcome)
    said = console.export_text()
    assert "the study has 2 complete, 1 pruned (1 of them could not win)." in said, said

    # without a pruner every trial trains to its end, however far behind (over 2 epochs: its
    # first evaluation still leaves one to stop, and the slowest trains 64 steps, not 96)
    unpruned = CANNOT_WIN_SPACE.replace("pruner: median", "pruner: none")
    unpruned = unpruned.replace("epochs: 3", "epochs: 2")
    study = prepare_study(unpruned, tmp_path / "unpruned", run=False).study
    study.enqueue_trial({"batch_size": 32})
    study.enqueue_trial({"batch_size": 8})
    study = prepare_study(unpruned, tmp_path / "unpruned").study
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 3


class Paced:
    """An executor whose trials train at a given pace, epoch by epoch (no training: the
    measurements are made up): ``seconds_per_epoch[batch_size]`` lists each epoch's seconds."""

    def __init__(self, seconds_per_epoch: dict[int, list[float]]) -> None:
        self.seconds_per_epoch = seconds_per_epoch

    def train(self, config: TrialConfig, report) -> TrialResult:
        evaluations, seconds = [], 0.0
        for index, epoch_seconds in enumerate(self.seconds_per_epoch[config.batch_size], 1):
            seconds += epoch_seconds
            at = make_evaluation(index, float(index), 0.9, seconds)
            evaluations.append(dataclasses.replace(at, final=index == config.epochs))
            if report(evaluations[-1]):
                break
        return dataclasses.replace(make_result(*evaluations), other_cpu_share=0.52)

    def measure(self, config, plan):
        raise AssertionError("no stage 1 here")

    def close(self) -> None:
        pass


class Meter:
    """``CpuMeter`` as the study reads it between a trial's evaluations: the others' share of
    the cores in each window, in turn, from ``shares`` (none left: a quiet machine)."""

    shares: ClassVar[list[float]] = []

    def __enter__(self) -> Meter:
        return self

    def so_far(self) -> CpuShare:
        other = Meter.shares.pop(0) if Meter.shares else 0.0
        return CpuShare(
            wall_seconds=1.0, cores=2, own_cpu_seconds=1.0, other_cpu_seconds=2 * other
        )


def test_cannot_win_is_never_decided_on_a_pace_measured_under_interference(
    tmp_path: Path, prepare_study, monkeypatch
):
    """Measured once: a trial with 52% of its cores taken by others ran 180 samples/s against
    43.7k predicted and was stopped as one that cannot win; a later trial of the same pipeline
    completed at 11.5k. Here an epoch of 1,000 samples: the leader (the baseline) at 5k/s."""
    monkeypatch.setattr("autotune.study._reporter.CpuMeter", Meter)
    monkeypatch.setattr(Meter, "shares", [0.52, 0.0, 0.52, 0.0])  # two trials' first windows
    leader, busy, quiet = [0.2] * 3, 1000 / 180, 1000 / 11_500
    space = CANNOT_WIN_SPACE.replace("n_trials: 3", "n_trials: 2")
    study = prepare_study(space, tmp_path, run=False).study
    study.enqueue_trial({"batch_size": 32})
    paced = Paced({16: leader, 32: [busy, quiet, quiet]})
    study = prepare_study(space, tmp_path, executor=paced).study
    baseline, busy_start = study.get_trials()
    assert TrialRecord.of(baseline).baseline and baseline.state == TrialState.COMPLETE
    # busy in its first window only: judged at its second on its own pace since the first
    assert busy_start.state == TrialState.COMPLETE, TrialRecord.of(busy_start).fail_msg
    assert len(busy_start.intermediate_values) == 3
    # slow on a quiet machine too: stopped at the first quiet window, and the message says so
    study.enqueue_trial({"batch_size": 32})
    paced.seconds_per_epoch[32] = [busy, busy, busy]
    study = prepare_study(space.replace("n_trials: 2", "n_trials: 3"), tmp_path, executor=paced)
    slow = study.study.get_trials()[-1]
    assert slow.state == TrialState.PRUNED and len(slow.intermediate_values) == 2
    record = TrialRecord.of(slow)
    assert record.fail_kind == FaultKind.CANNOT_WIN and record.fail_msg is not None
    assert record.fail_msg.startswith("stopped at evaluation 2 (epoch 2.00): even at accuracy 1")
    assert record.fail_msg.endswith(
        "(at its pace since evaluation 1; before it, other processes took its cores)"
    )


def test_a_trial_slowed_by_interference_is_never_said_to_be_off_stage_one():
    """Measured once: "+4198%" and "+10,761%" off stage 1, from trials others' processes
    slowed. The trial's interference flag says that; its distance from stage 1 says nothing."""
    from autotune.study._trial import off_stage_one

    predicted = TrialRecord(predicted_samples_per_second=43_700.0, speed_tolerance=0.1)
    slowed = dataclasses.replace(
        make_result(make_evaluation(1, 1.0, 0.9, 5.0)), samples_per_second=180.0
    )
    assert off_stage_one(slowed, predicted)  # on a quiet machine: a stale speed cache, say
    assert not off_stage_one(dataclasses.replace(slowed, other_cpu_share=0.52), predicted)
    within = dataclasses.replace(slowed, samples_per_second=41_000.0)
    assert not off_stage_one(within, predicted)
    assert not off_stage_one(slowed, TrialRecord())  # a trial stage 1 predicted nothing for


def test_a_bug_outside_training_leaves_no_trial_running(tmp_path: Path, prepare_study):
    class BrokenObserver(StudyObserver):
        def trial_started(self, number: int, config: TrialConfig) -> None:
            raise RuntimeError("a bug in the display")

    spec = tiny_spec(n_trials=2)
    study = prepare_study(spec, tmp_path, run=False).study
    executor = InProcessExecutor(load(spec.workload))
    with pytest.raises(RuntimeError, match="a bug in the display"):
        run_study(StudyInputs(study, spec, CPU, executor, observer=BrokenObserver()))
    (trial,) = [t for t in study.get_trials() if t.state != TrialState.WAITING]  # the checklist
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs["fail_kind"] == "error"
    assert "a bug in the display" in trial.user_attrs["fail_msg"]


# ---------------------------------------------------------------------------------------------
# What a trial and a study record (study/_records.py)
# ---------------------------------------------------------------------------------------------


def _result(**changes) -> TrialResult:
    """A TrialResult with constructed measurements (no training, no timing)."""
    evaluation = Evaluation(
        index=1,
        epoch=2.0,
        optimizer_steps=20,
        samples_seen=640,
        score=0.75,
        val_loss=0.7,
        train_loss=0.6,
        train_seconds=4.0,
        overhead_seconds=1.0,
        eval_seconds=0.1,
        final=True,
    )
    fields = {
        "evaluations": (evaluation,),
        "score": 0.75,
        "train_seconds": 4.0,
        "overhead_seconds": 1.0,
        "warmup_seconds": 1.5,
        "samples_per_second": 200.0,
        "samples_seen": 640,
        "optimizer_steps": 20,
        "effective_batch_size": 32,
        "peak_memory_bytes": 2**20,
        "compiled_graphs": 0,
        "loss_scale": None,
        "skipped_steps": 0,
        "time_breakdown": {
            "data_wait": 3.0,
            "host_to_device": 0.0,
            "forward_backward": 1.0,
            "optimizer": 0.0,
        },
        "compile_seconds": None,
        "flops_per_sample": 1e6,
        "gpu": {},
        "device_name": "NVIDIA H100 80GB HBM3",
        "torch_version": "2.14.1",
    }
    return TrialResult(**{**fields, **changes})


def test_a_trial_record_round_trips_through_user_attributes():
    config = make_config(batch_size=16)
    record = TrialRecord(
        config=config,
        baseline=True,
        score=0.5,
        fail_kind=FaultKind.OOM,
        fail_msg="out of memory",
    )
    attrs = record.to_attrs()
    # JSON as Optuna stores it: the configuration as a dict, the fault kind as its string
    assert attrs == {
        "config": config.to_dict(),
        "baseline": True,
        "score": 0.5,
        "fail_kind": "oom",
        "fail_msg": "out of memory",
    }
    assert json.loads(json.dumps(attrs)) == attrs
    back = TrialRecord.from_attrs({**attrs, "someone_elses": 1})  # unknown attributes: ignored
    assert back == record
    assert back.fail_kind is FaultKind.OOM and back.fail_kind.is_configuration_fault
    assert TrialRecord().to_attrs() == {}  # defaults are not written
    # a trial stored before scores other than accuracy: its accuracy is its score
    older = TrialRecord.from_attrs({"accuracy": 0.8, "accuracy_curve": [[1.0, 0.8]]})
    assert older.score == 0.8 and older.score_curve == [[1.0, 0.8]]


def test_a_trained_trial_records_its_measurements_with_derived_ones():
    record = TrialRecord.from_result(_result(), precision="bf16")
    assert record.time_breakdown == {
        "data_wait": 0.75,
        "host_to_device": 0.0,
        "forward_backward": 0.25,
        "optimizer": 0.0,
    }
    assert record.data_wait_fraction == 0.75 and record.bottleneck == "data"
    assert record.achieved_flops == 1e6 * 200.0
    assert record.mfu is not None and 0 < record.mfu < 1  # H100's bf16 peak is known
    assert record.epochs_trained == 2.0 and record.score_curve == [[2.0, 0.75]]
    assert record.skipped_steps is None and record.loss_scale is None  # fp16 only
    on_a_cpu = TrialRecord.from_result(_result(device_name="AMD EPYC"), precision="fp32")
    assert on_a_cpu.mfu is None and "mfu" not in on_a_cpu.to_attrs()  # no peak: no guess
    # the metrics autotune best shows, in the schema's order, only those measured
    metrics = record.metrics()
    assert list(metrics) == [name for name in METRIC_FIELDS if name in metrics]
    assert "compile_seconds" not in metrics and metrics["samples_per_second"] == 200.0


def test_a_study_record_round_trips_and_ignores_other_attributes():
    record = StudyRecord(metric="accuracy_per_second", num_classes=10, input_shape=[3, 8, 8])
    assert StudyRecord.from_attrs({**record.to_attrs(), "note": "x"}) == record
    assert "space_file" not in record.to_attrs()  # unset fields are not written


# ---------------------------------------------------------------------------------------------
# The confirmation round (study/_confirm.py)
# ---------------------------------------------------------------------------------------------


def _round(values: dict[int, list[float]], score: dict[int, float] | None = None, **kw):
    """A ConfirmationRecord with constructed measurements: trial -> values (repeat 0 first)."""
    runs = tuple(
        ConfirmRun(
            trial=number,
            repeat=repeat,
            seed=repeat,
            value=value,
            score=(score or {}).get(number, 0.9),
            samples_per_second=100.0 * value,
            feasible=True,
            wall_seconds=1.0,
        )
        for number, series in values.items()
        for repeat, value in enumerate(series)
    )
    fields = {
        "top": 3,
        "repeats": 2,
        "maximize": True,
        "candidates": tuple(values),
        "baseline": None,
        "runs": runs,
        "complete": True,
        **kw,
    }
    return ConfirmationRecord(**fields)


def _judged(record: ConfirmationRecord) -> Answer:
    """What the round in ``record`` concludes (its trial a stand-in: the study's)."""
    return Answer.of_round(record, optuna.trial.create_trial(value=0.0))


def _speedup(answer: Answer) -> float | None:
    """The winner's measured ratio over the baseline, claimed or not."""
    return answer.measured_ratio(answer.configuration_of("baseline"))


def test_the_answer_is_the_best_median_and_a_tie_is_a_gap_within_the_noise():
    # trial 3 had the best single value (3.0) but its median is behind trial 5's, by more than
    # the round's noise (the typical half-range, here 0.05 / 1.05 = 4.8%): not tied
    clear = _judged(_round({3: [3.0, 2.0, 2.1], 5: [2.6, 2.7, 2.65], 0: [1.0, 1.1, 1.05]}))
    assert clear.winner.trial == 5 and clear.winner.median == 2.65
    assert clear.spread == pytest.approx(0.05 / 1.05)
    assert clear.tied == ()
    # noisier runs (a spread of 3.9%): 2.55 is 3.8% behind 2.65, within the noise, tied
    close = _judged(_round({3: [2.45, 2.55, 2.65], 5: [2.55, 2.65, 2.75], 0: [1.0, 1.1, 1.05]}))
    assert close.spread == pytest.approx(0.1 / 2.55)
    assert close.winner.trial == 5 and close.tied == (3,)


def test_one_slow_outlier_does_not_tie_a_slower_configuration_with_the_leader():
    # measured on the quickstart: one slow run gave the leader a range overlapping the
    # baseline's; ranges overlapping made them "tied" and the baseline won on accuracy
    record = _round(
        {21: [1.909, 1.846, 1.235], 0: [1.300, 1.364, 1.396]},
        score={21: 0.94, 0: 0.97},
        baseline=0,
    )
    verdict = _judged(record)
    assert verdict.winner.trial == 21 and verdict.tied == ()
    assert _speedup(verdict) == pytest.approx(statistics.median([1.846, 1.235]) / 1.38)


def test_among_tied_leaders_the_better_score_wins():
    record = _round({1: [2.0, 2.2, 2.1], 2: [2.05, 2.15, 2.12]}, score={1: 0.9, 2: 0.95})
    verdict = _judged(record)
    assert verdict.winner.trial == 2 and verdict.tied == (1,)
    assert verdict.tie_rule == "score"
    # a lower-is-better score (validation loss): the lower median wins the tie
    losses = _round(
        {1: [2.0, 2.2, 2.1], 2: [2.05, 2.15, 2.12]},
        score={1: 0.4, 2: 0.5},
        higher_score_better=False,
    )
    lowest = _judged(losses)
    assert lowest.winner.trial == 1 and lowest.tie_rule == "score"
    stored = ConfirmationRecord.from_attrs(losses.to_attrs())
    assert stored == losses and _judged(stored).winner.trial == 1


def test_a_round_too_noisy_to_rank_names_the_best_median_not_the_better_score():
    # measured on a disturbed machine (spread ±100%): trial 5's median was 1.8x trial 11's,
    # yet everything was "tied" and the tie went to trial 11 for its better accuracy
    record = _round(
        {11: [0.092, 0.02, 0.2], 5: [0.166, 0.05, 0.4], 0: [0.05, 0.01, 0.1]},
        score={11: 0.916, 5: 0.900, 0: 0.9},
        baseline=0,
    )
    verdict = _judged(record)
    assert verdict.spread is not None and verdict.spread > NOISY_SPREAD
    assert verdict.winner.trial == 5 and verdict.tie_rule == "noisy" and verdict.tied == ()


def test_infeasible_runs_do_not_count_and_a_mostly_infeasible_leader_cannot_win():
    record = _round({1: [3.0, 3.1, 2.9], 2: [2.0, 2.1, 2.05]})
    runs = tuple(
        dataclasses.replace(run, feasible=run.repeat == 0) if run.trial == 1 else run
        for run in record.runs
    )
    verdict = _judged(dataclasses.replace(record, runs=runs))
    assert verdict.winner.trial == 2
    assert [c.trial for c in verdict.configurations if c.eligible] == [2]


def test_the_speedup_is_against_the_baseline_measured_in_the_same_round():
    record = _round({4: [2.0, 2.2, 2.1], 0: [1.0, 1.2, 1.1]}, baseline=0)
    verdict = _judged(record)
    # the round's own runs (the originals left out): 2.15 against 1.15
    assert _speedup(verdict) == pytest.approx(2.15 / 1.15)
    # a leader picked for a lucky first measurement: its luck is not in the speed-up
    lucky = _judged(_round({5: [3.0, 2.0, 2.2], 0: [1.0, 1.0, 1.0]}, baseline=0))
    assert lucky.winner.median == pytest.approx(2.2) and _speedup(lucky) == pytest.approx(2.1)
    assert verdict.spread == pytest.approx(statistics.median([0.1 / 2.1, 0.1 / 1.1]))
    # a time to a target: lower is better, the speed-up is the baseline's time over ours
    timed = _judged(
        _round({4: [10.0, 11.0, 12.0], 0: [20.0, 22.0, 24.0]}, baseline=0, maximize=False)
    )
    assert timed.winner.trial == 4 and _speedup(timed) == pytest.approx(2.0)


@pytest.mark.slow
def test_a_confirmation_round_interleaves_reseeds_stores_and_resumes(
    tmp_path: Path, prepare_study, capsys: pytest.CaptureFixture[str]
):
    spec = tiny_spec(n_trials=5)
    study = prepare_study(spec, tmp_path).study
    executor = InProcessExecutor(load(spec.workload))
    seen: list[tuple[int, int, int]] = []

    class Stop(KeyboardInterrupt):
        pass

    def interrupt_after_three(run_, done, total):
        seen.append((run_.trial, run_.repeat, run_.seed))
        if len(seen) == 3:
            raise Stop()

    # remeasures=0: interference, a property of the machine, must not change the order here
    with pytest.raises(Stop):
        confirm_study(
            ConfirmationInputs(
                study,
                spec.objective,
                executor,
                top=2,
                repeats=2,
                on_run=interrupt_after_three,
                remeasures=0,
            )
        )
    stored = StudyRecord.of(study).confirmation
    assert stored is not None and not stored.complete
    assert len([r for r in stored.runs if r.repeat > 0]) == 3  # what ran is kept

    def record(run_, done, total):
        seen.append((run_.trial, run_.repeat, run_.seed))

    final = confirm_study(
        ConfirmationInputs(study, spec.objective, executor, 2, 2, on_run=record, remeasures=0)
    )
    assert final is not None and final.complete
    leaders = [t.number for t in feasible_trials(study)[:2]]
    kinds = [TrialRecord.of(t).reference for t in study.get_trials()]
    references = [kinds.index(kind) for kind in ("baseline", "checklist") if kind in kinds]
    candidates = (*leaders, *(n for n in references if n not in leaders))
    assert final.candidates == candidates and final.baseline == references[0]
    # A B C D, then D C B A; each run once, over the interruption
    order = [(number, 1) for number in candidates] + [(n, 2) for n in reversed(candidates)]
    assert [(trial, repeat) for trial, repeat, _ in seen] == order
    # every run with a new seed, reproducible from the trial's own
    originals = {t.number: trial_config(t).seed for t in study.get_trials()}
    assert all(seed == originals[trial] + repeat * 1_000_003 for trial, repeat, seed in seen)
    assert len(final.runs) == 3 * len(candidates)  # the originals count as one each
    # the study's answer is now the confirmed winner; where the round could not rank (a run
    # under interference, kept as measured here, or a leader infeasible at other seeds: seen
    # once in a CI-style run), the search's best, and the round says why
    verdict = _judged(final)
    if verdict.winner is None:
        assert verdict.round_state in ("few_runs", "no_winner"), verdict
        assert answer_trial(study).number == feasible_trials(study)[0].number
    else:
        assert answer_trial(study).number == verdict.winner.trial
    # a finished round is not run again
    again: list[object] = []
    for repeats in (2, 3):  # ... and a longer one adds its runs to it (issue 44 item 4)
        if repeats == 3:  # (a shorter one keeps it too)
            assert confirmation_plan(study, 2, 1) == final and again == []
            longer = confirmation_plan(study, 2, 3)
            assert longer is not None and longer.runs == final.runs
            assert longer.runs_left(remeasures=0) == len(candidates)  # as these rounds run
        on_run = lambda *a: again.append(a)  # noqa: E731
        confirm_study(
            ConfirmationInputs(study, spec.objective, executor, 2, repeats, on_run, remeasures=0)
        )
    added = StudyRecord.of(study).confirmation
    assert added is not None and added.complete and added.repeats == 3
    assert added.runs[: len(final.runs)] == final.runs and len(again) == len(candidates)
    assert {run.repeat for run in added.runs[len(final.runs) :]} == {3}
    from autotune.cli._confirm import confirm_round

    assert confirm_round(study, spec, executor, 2, 2)  # says it keeps the round, runs none
    said = " ".join(capsys.readouterr().out.split())
    kept = 3 * len(candidates)
    assert said.startswith("Nothing new to measure: the round of the "), said
    assert (
        f"has its {kept} runs (3 more of each); autotune confirm --study {study.study_name}"
        in said
    )
    assert "--repeats 4 adds one more of each." in said  # a command that has the flag
    # --again: a new round of the same leaders, measured anew, the stored one replaced
    assert confirm_round(study, spec, executor, 2, 2, again=True)
    assert "Nothing new to measure" not in capsys.readouterr().out
    anew = StudyRecord.of(study).confirmation
    assert anew is not None and anew.complete and anew.repeats == 2
    assert anew.candidates == candidates and {run.repeat for run in anew.runs} == {0, 1, 2}
    assert len(anew.runs) >= 3 * len(candidates)  # a busy run is measured again
    assert not set(anew.runs[len(candidates) :]) & set(added.runs)  # every run measured anew


def test_the_answer_is_the_confirmed_winner_over_a_higher_single_value(
    tmp_path: Path, prepare_study
):
    spec = tiny_spec(n_trials=3)
    study = prepare_study(spec, tmp_path).study
    ranked = feasible_trials(study)
    assert len(ranked) >= 2
    first, second = ranked[0].number, ranked[1].number
    # constructed measurements: the second-best single trial is confirmed clearly faster
    record = _round(
        {first: [ranked[0].value, 0.1, 0.1], second: [ranked[1].value, 9.0, 9.0]}, top=2
    )
    study.set_user_attr("confirmation", record.to_attrs())
    assert best_trial(study).number == first
    assert answer_trial(study).number == second
    # an unfinished round does not decide
    study.set_user_attr("confirmation", dataclasses.replace(record, complete=False).to_attrs())
    assert answer_trial(study).number == first


def test_a_process_that_joins_a_study_being_created_searches_as_its_creator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Issue 41: a process that opened a study another was still labelling waited for its
    search fingerprint alone, which was written before its strategy, read no strategy and ran a
    joint search in a two-stage study. The creator here writes each attribute slowly."""
    import threading

    spec = tiny_spec(text=TINY_SPACE.format(n_trials=4, pruner="none"))  # two-stage, implied
    url = f"sqlite:///{tmp_path / 's.db'}"
    creator_thread: list[threading.Thread] = []
    written = optuna.Study.set_user_attr

    def slowly(study: optuna.Study, key: str, value: object) -> None:
        if threading.current_thread() in creator_thread:
            time.sleep(0.05)  # a busy machine, a remote database
        written(study, key, value)

    monkeypatch.setattr(optuna.Study, "set_user_attr", slowly)
    creator = threading.Thread(target=open_study, args=(spec, open_storage(url), CPU))
    creator_thread.append(creator)
    creator.start()
    deadline = time.monotonic() + 30
    while "tiny" not in optuna.get_all_study_names(open_storage(url)):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    joined = open_study(spec, open_storage(url), CPU)  # while the creator labels it
    strategy = with_study_strategy(joined, spec).study.strategy  # as `autotune run` goes on
    creator.join()
    assert strategy == "two_stage"


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("sqlite://", "a SQLite study in memory is lost when the command ends"),
        ("sqlite:///:memory:", "a SQLite study in memory is lost"),
        ("http://x", "autotune keeps studies in sqlite:///PATH or postgresql://"),
    ],
)
def test_a_storage_that_cannot_keep_a_study_is_refused_in_one_line(url: str, said: str):
    """Issue 41: an in-memory study trained and vanished; http:// gave SQLAlchemy's error."""
    with pytest.raises(StudyError, match=re.escape(said)):
        open_storage(url)


def test_a_study_database_is_made_in_a_new_folder_but_not_in_a_missing_tree(tmp_path: Path):
    with pytest.raises(StudyError, match="there is no directory"):
        open_storage(f"sqlite:///{tmp_path / 'typo' / 'dir' / 'x.db'}")
    assert not (tmp_path / "typo").exists()
    open_storage(f"sqlite:///{tmp_path / 'studies' / 'x.db'}")  # `studies/`, made for it
    assert (tmp_path / "studies" / "x.db").is_file()


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")  # this test beats itself
def test_a_run_says_it_recovered_trials_a_stopped_process_left_running(
    tmp_path: Path, prepare_study
):
    """Issue 41: the re-run after a SIGKILL recovered the trial as interrupted and queued it
    again without a line saying so."""
    import sqlite3

    spec = tiny_spec(n_trials=2)
    prepared = prepare_study(spec, tmp_path, run=False, heartbeat_interval=1)
    study = prepared.study
    orphan = study.ask()  # the baseline, left RUNNING by a process that died
    adapter.storage_of(study).record_heartbeat(orphan._trial_id)
    with sqlite3.connect(tmp_path / "studies" / "autotune.db") as connection:  # silent 10 s
        connection.execute(
            "UPDATE trial_heartbeats SET heartbeat = datetime(heartbeat, '-10 seconds')"
        )

    counts: list[int] = []

    class Said(StudyObserver):
        def recovered(self, count: int) -> None:
            counts.append(count)

    run_study(StudyInputs(study, spec, CPU, InProcessExecutor(load(spec.workload)), None, Said()))
    assert counts == [1]
    first = study.get_trials()[0]
    assert first.state == TrialState.FAIL and first.user_attrs["fail_kind"] == "interrupted"


def test_the_first_trials_spread_over_every_knobs_range():
    """The TPE startup trials form a Latin hypercube: each knob's range (its log for lr) cut
    into n_startup_trials parts, one trial in each, a choice drawn as often as another; the
    same seed draws the same trials, another seed others. Independent draws put trial 1's lr
    next to the baseline's in five studies."""
    text = TINY_SPACE.format(n_trials=8, pruner="none")
    spec = parse_spec(text.replace("n_startup_trials: 3", "n_startup_trials: 8"))

    def draws(seed: int) -> list[tuple[float, int]]:
        sampler = make_sampler(spec.with_overrides(study={"seed": seed}))
        study = optuna.create_study(sampler=sampler, direction="maximize")
        trials = []
        for _ in range(8):
            trial = study.ask()
            lr = trial.suggest_float("lr", 1e-4, 3e-2, log=True)
            batch = trial.suggest_categorical("batch_size", [16, 32, 64, 128])
            study.tell(trial, 0.5)
            trials.append((lr, batch))
        return trials

    trials = draws(0)
    parts = sorted(int(8 * math.log(lr / 1e-4) / math.log(3e-2 / 1e-4)) for lr, _ in trials)
    assert parts == list(range(8))  # one lr in each eighth of the log range
    batches = [batch for _, batch in trials]
    assert all(batches.count(size) == 2 for size in (16, 32, 64, 128)), batches
    assert draws(0) == trials and draws(1) != trials


@pytest.mark.parametrize(
    ("stop", "kind", "message", "shown"),
    [
        (KeyboardInterrupt(), "interrupted", "the study was stopped by Ctrl-C (SIGINT)", True),
        (Terminated(), "interrupted", "the study was stopped by SIGTERM", True),
        (StorageOutage("gone"), "interrupted", "did not answer for longer than", True),
        (DeviceLockTimeout("busy", by_user=True), "interrupted", "the run stopped: busy", True),
        (WorkerError("cannot start"), "error", "cannot start", False),
        (RuntimeError("a bug"), "error", "RuntimeError: a bug", False),
    ],
)
def test_a_trial_that_an_exception_stops_is_recorded_and_told_as_failed(
    stop: BaseException, kind: str, message: str, shown: bool
):
    """No trial is left RUNNING, whatever stops it: why is recorded, the exception goes on,
    and the live display hears of an interruption (an error is said once the run stops)."""
    from autotune.study._trial import TrialRunner

    finished: list[int] = []

    class Heard(StudyObserver):
        def trial_finished(self, trial: optuna.trial.FrozenTrial) -> None:
            finished.append(trial.number)

    class Stopped(TrialRunner):
        def train(self, trial: optuna.Trial) -> tuple[TrialState, float | None]:
            raise stop

    study = optuna.create_study()
    inputs = StudyInputs(study, None, None, None, observer=Heard())  # type: ignore[arg-type]
    runner = Stopped(inputs, None)  # type: ignore[arg-type]
    with pytest.raises(type(stop)):
        runner.run(study, study.ask())
    (trial,) = study.trials
    assert trial.state == TrialState.FAIL and trial.user_attrs["fail_kind"] == kind
    assert message in trial.user_attrs["fail_msg"]
    assert finished == ([0] if shown else [])


def test_a_ctrl_c_while_a_trial_is_created_is_recorded_on_it():
    """A stop that lands as Optuna creates the trial waits until the run holds it, then is
    recorded on it: left RUNNING, it would be nobody's for good (no heartbeat yet)."""
    from autotune.study._trial import TrialRunner

    spec = restrict(parse_spec(TINY_SPACE.format(n_trials=4, pruner="none"), "t.yaml"), CPU).spec
    study = optuna.create_study(direction="maximize")
    create = study.ask

    def interrupted() -> optuna.Trial:
        trial = create()
        signal.raise_signal(signal.SIGINT)  # Ctrl-C as the new trial's row is written
        return trial

    study.ask = interrupted  # type: ignore[method-assign]
    runner = TrialRunner(StudyInputs(study, spec, CPU, None), None)  # type: ignore[arg-type]
    with stops.handled(), pytest.raises(KeyboardInterrupt) as stop:
        runner.ask(study)
    runner.stopped_unstarted(study, stop.value)
    (trial,) = study.get_trials(deepcopy=False)
    assert trial.state == TrialState.FAIL and trial.user_attrs["fail_kind"] == "interrupted"


def test_an_effective_batch_stage_one_could_not_run_teaches_the_sampler():
    """A trial that draws an effective batch stage 1 found no way to train (here: the model
    raised at batch 64, an ``error``) is refused as an infeasible configuration, PRUNED with a
    violated constraint as TPE learns from, never a FAIL that TPE ignores and draws again."""
    from autotune.speed import SpeedChoice, SpeedTable
    from autotune.study._trial import TrialRunner

    ran = SpeedChoice(32, 1, "fp32", (), (), 100.0, 1.0, 0.0, 0.04, 2, (1,))
    why = "batch 64: ValueError: my model cannot do batch 64"
    table = SpeedTable(choices=(ran,), unrunnable=(((64, 1, "fp32", ()), "error", why),))
    spec = restrict(parse_spec(TINY_SPACE.format(n_trials=4, pruner="none"), "t.yaml"), CPU).spec
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({"effective_batch_size": 64, "precision": "fp32"})
    runner = TrialRunner(StudyInputs(study, spec, CPU, None), None, table)  # type: ignore[arg-type]
    state, value = runner.train(study.ask())
    (trial,) = study.get_trials(deepcopy=False)
    assert (state, value) == (TrialState.PRUNED, None)
    assert trial.user_attrs["fail_kind"] == "error" and why in trial.user_attrs["fail_msg"]
    assert trial.constraints == {"fault": 1.0}


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_what_stage_one_ruled_out_is_drawn_by_no_trial(sampler: str):
    """Stage 1 ran effective batch 16 at fp32 and bf16 and 32 at bf16 only (32 at fp32 ran
    out of memory; nothing of 64 ran): of the 9 effective batches and precisions the space
    offers, the study's sampler draws those 3 alone, through its startup trials and after, so
    no trial of the budget is refused (before: a third or more of them were). The trials'
    distributions stay the space's: Optuna refuses choices that change within a study."""
    from autotune.search.space import draw_from_table, runnable_points, suggestions
    from autotune.speed import SpeedChoice, SpeedTable
    from autotune.study._sampling import TrialSeededSampler

    def ran(batch: int, accumulation: int, precision: str) -> SpeedChoice:
        return SpeedChoice(batch, accumulation, precision, (), (), 100.0, 1.0, 0.0, 0.04, 2)

    runs = (ran(16, 1, "fp32"), ran(16, 1, "bf16"), ran(16, 2, "bf16"))
    oom = [((32, 1, "fp32", ()), "oom", "batch 32: out of memory")]
    table = SpeedTable(choices=runs, unrunnable=tuple(oom))
    text = TINY_SPACE.format(n_trials=16, pruner="none").replace("seed: 0", f"sampler: {sampler}")
    spec = parse_spec(text.replace("n_startup_trials: 3", "n_startup_trials: 6"))
    study = optuna.create_study(sampler=make_sampler(spec), direction="maximize")
    assert isinstance(study.sampler, TrialSeededSampler)
    study.sampler.keep_to(runnable_points(spec, table))
    drawn = []
    for _ in range(16):
        trial = study.ask()
        config, _ = draw_from_table(suggestions(trial), spec, CPU, table, trial.number)
        drawn.append((trial.params["effective_batch_size"], config.precision))
        study.tell(trial, config.base_lr)  # something to learn from
    assert set(drawn) == {(16, "fp32"), (16, "bf16"), (32, "bf16")}, drawn
    choices = {t.distributions["effective_batch_size"].choices for t in study.trials}
    assert choices == {(16, 32, 64)}
