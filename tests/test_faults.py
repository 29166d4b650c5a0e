"""Reliability: every fault injected into a real study ends as a named, recorded trial.

Each test injects one fault through ``autotune.testing``'s hooks, runs a real study, and checks
the invariants: no trial is left RUNNING, every trial that did not complete says why
(``fail_kind`` and ``fail_msg``), no COMPLETE trial has a non-finite value, and what completed
before the fault is unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.faults import FaultKind, TrialFault, classify
from autotune.study import MemoryWalls, TrialRecord, open_storage, recover_stale_trials
from autotune.testing import (
    CPU,
    assert_trials_recorded,
    beat_long_ago,
    live_group_members,
    make_config,
    start_cli,
)

CPU_WITH_FP16 = dataclasses.replace(CPU, fp16=True)  # fp16 autocast + GradScaler run on CPUs


def space(
    model_args: str = "{}", data_args: str = "{}", knobs: dict[str, str] | None = None, **study
) -> str:
    """A tiny study's space file; ``knobs`` add to or replace the default lr and batch sizes."""
    settings = {
        "name": "faults",
        "n_trials": 3,
        "pruner": "none",
        "sampler": "random",
        "confirm": "false",  # these tests are about faults; the round is tested on its own
        # faults injected into trials: with two stages they would strike stage 1 first
        # (tests/test_speed.py covers that)
        "strategy": "joint",
        **study,
    }
    study_yaml = ", ".join(f"{k}: {v}" for k, v in settings.items())
    knob_lines = "".join(
        f"  {name}: {value}\n"
        for name, value in {"lr": "0.05", "batch_size": "[16, 32]", **(knobs or {})}.items()
    )
    return (
        textwrap.dedent(
            f"""\
        study: {{{study_yaml}}}
        workload:
          model: autotune.testing:tiny_mlp
          model_args: {model_args}
          data: autotune.testing:blobs
          data_args: {data_args}
          epochs: 2
        objective: {{min_accuracy: 0.5}}
        space:
        """
        )
        + knob_lines
    )


@pytest.fixture
def run(prepare_study):
    """``run(text, directory, isolation="none", hardware=CPU, timeout=None)``: the study of
    ``text`` run to its end, every trial checked to be recorded; (study, outcome, executor)."""

    def run(text: str, directory: Path, isolation: str = "none", hardware=CPU, timeout=None):
        study, _, outcome, executor = prepare_study(
            text,
            directory,
            hardware=hardware,
            isolation=isolation,
            trial_timeout=timeout,
            heartbeat_interval=1,
        )
        assert_trials_recorded(study)
        return study, outcome, executor

    return run


def kinds(study: optuna.Study) -> list[str | None]:
    return [t.user_attrs.get("fail_kind") for t in study.get_trials()]


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_out_of_memory_is_pruned_and_no_trial_is_spent_on_the_wall(
    tmp_path: Path, run, sampler: str
):
    """A joint study (no stage 1) of a model that runs out of memory from batch 32: a trial
    that does is PRUNED as oom, and its wall teaches the sampler, so that no later trial
    draws a batch at or above it at that precision (before: they were drawn, and refused at
    the wall as oom_skipped, each a counted trial of the budget). A precision's wall costs at
    most two trials (64, then 32), and the trials' distributions stay the space's."""
    text = space(
        model_args="{oom_at_batch: 32}",
        knobs={"batch_size": "[16, 32, 64]", "precision": "[fp32, bf16]"},
        n_trials=12,
        sampler=sampler,
        n_startup_trials=4,
    )
    study, _, _ = run(text, tmp_path)
    walls: dict[str, int] = {}
    for trial in study.get_trials():
        config = trial.user_attrs["config"]
        precision, batch = config["precision"], config["batch_size"]
        assert batch < walls.get(precision, 10**9), "drawn at a wall found before it"
        assert "oom_skipped" not in trial.user_attrs
        if batch < 32:
            assert trial.state == TrialState.COMPLETE
            continue
        assert trial.state == TrialState.PRUNED
        assert trial.user_attrs["fail_kind"] == "oom" and trial.constraints == {"fault": 1.0}
        assert "out of memory" in trial.user_attrs["fail_msg"]
        walls[precision] = batch
    assert walls
    assert {t.distributions["batch_size"].choices for t in study.trials} == {(16, 32, 64)}


def test_a_memory_wall_of_an_earlier_run_is_tried_once_more_and_kept_only_if_it_holds():
    """A wall read back from the study's trials may be false (another process held the
    device's memory, a worker leaked): the first configuration at it trains again; the wall
    blocks again only once that one runs out of memory too."""
    study = optuna.create_study()
    for batch_size in (64, 32):  # the smallest that ran out of memory is the wall
        record = TrialRecord(fail_kind=FaultKind.OOM, config=make_config(batch_size=batch_size))
        study.add_trial(
            optuna.trial.create_trial(state=TrialState.PRUNED, user_attrs=record.to_attrs())
        )
    skipped = TrialRecord(
        fail_kind=FaultKind.OOM, oom_skipped=True, config=make_config(batch_size=16)
    )  # skipped at a wall: not a wall itself
    study.add_trial(
        optuna.trial.create_trial(state=TrialState.PRUNED, user_attrs=skipped.to_attrs())
    )
    at_wall, below = make_config(batch_size=48), make_config(batch_size=16)
    other = make_config(batch_size=64, precision="bf16")  # another wall key: never blocked

    held = MemoryWalls.from_study(study)
    assert held.blocks(below) is None and held.blocks(other) is None
    assert held.blocks(at_wall) is None  # the retry
    held.add(at_wall, "trial 7")  # it ran out of memory again: the wall holds from now on
    assert "ran out of memory in trial 7" in (held.blocks(make_config(batch_size=64)) or "")

    false = MemoryWalls.from_study(study)
    assert false.blocks(make_config(batch_size=128)) is None  # the retry trains and fits
    assert false.blocks(make_config(batch_size=256)) is None  # no wall left to block


def test_device_memory_that_does_not_come_back_after_a_trial_is_a_leak(monkeypatch):
    """The worker's check after each request (the counts are CUDA's allocator's, played here;
    tests/test_gpu.py leaks real device memory): the first sets the baseline, a little more
    is caches, more than LEAK_BYTES is a leak. The CPU has no such count: never a leak."""
    from autotune import faults

    mib = 2**20
    counts = iter([300 * mib, 310 * mib, 300 * mib + faults.LEAK_BYTES + mib])
    monkeypatch.setattr(faults, "device_memory_in_use", lambda device: next(counts))
    watch = faults.MemoryWatch()
    assert watch.left_after("cuda:0") is None  # what warm caches and workspaces hold
    assert watch.left_after("cuda:0") is None  # 10 MiB more: not a leak
    assert watch.left_after("cuda:0") == faults.LEAK_BYTES + mib
    monkeypatch.undo()
    cpu = faults.MemoryWatch()
    assert cpu.left_after("cpu") is None and cpu.left_after("cpu") is None
    assert TrialRecord.from_attrs(TrialRecord(memory_left_bytes=5 * mib).to_attrs()) == (
        TrialRecord(memory_left_bytes=5 * mib)
    )


def test_nan_loss_from_step_k_is_pruned(tmp_path: Path, run):
    study, _, _ = run(space(model_args="{nan_after_steps: 5}"), tmp_path)
    assert kinds(study) == ["nonfinite_loss"] * 3
    assert all(t.state == TrialState.PRUNED for t in study.get_trials())


def test_a_diverging_loss_is_pruned_as_diverged(tmp_path: Path, run):
    # 16 steps an epoch: the first evaluation sees a healthy loss, the second one ~50
    study, _, _ = run(
        space(model_args="{diverge_after_steps: 20}", knobs={"batch_size": "16"}, n_trials=2),
        tmp_path,
    )
    assert kinds(study) == ["diverged"] * 2
    assert all(t.state == TrialState.PRUNED for t in study.get_trials())
    assert "its lowest" in study.trials[0].user_attrs["fail_msg"]


@pytest.mark.slow
def test_a_broken_cuda_context_gets_a_fresh_worker_and_blames_no_other_trial(tmp_path: Path, run):
    # batches of 32 raise the error a broken CUDA context gives; batches of 16 train normally:
    # seed 2 draws 16 (the baseline), 32, then 16 again in the fresh worker
    text = space(model_args="{cuda_error_at_batch: 32}", n_trials=2, seed=2)
    study, _, executor = run(text, tmp_path, isolation="worker")
    broken = [t for t in study.trials if t.params["batch_size"] == 32]
    healthy = [t for t in study.trials if t.params["batch_size"] == 16]
    assert broken and healthy
    for trial in broken:
        assert trial.user_attrs["fail_kind"] == "error"
        assert "CUDA error" in trial.user_attrs["fail_msg"]
    assert all(t.state == TrialState.COMPLETE for t in healthy), kinds(study)
    # every broken context cost its worker; the trial after it ran in a new one
    followed = sum(1 for t in broken if t.number < len(study.trials) - 1)
    assert len(executor.started_pids) == 1 + followed


def test_transient_fp16_overflow_does_not_prune_but_a_lasting_one_does(tmp_path: Path, run):
    clean = space(knobs={"precision": "fp16"}, n_trials=2)
    control, _, _ = run(clean, tmp_path / "control", hardware=CPU_WITH_FP16)
    transient = space(
        model_args="{overflow_at_steps: [3]}", knobs={"precision": "fp16"}, n_trials=2
    )
    study, _, _ = run(transient, tmp_path / "transient", hardware=CPU_WITH_FP16)
    for trial, plain in zip(study.get_trials(), control.get_trials(), strict=True):
        assert trial.state == TrialState.COMPLETE, trial.user_attrs.get("fail_msg")
        # GradScaler skipped the overflowing step (and whatever its first steps skip anyway)
        assert trial.user_attrs["skipped_steps"] == plain.user_attrs["skipped_steps"] + 1
    lasting = space(
        model_args=f"{{overflow_at_steps: {list(range(1, 200))}}}",
        knobs={"precision": "fp16"},
        n_trials=2,
    )
    study, _, _ = run(lasting, tmp_path / "lasting", hardware=CPU_WITH_FP16)
    assert kinds(study) == ["nonfinite_loss"] * 2
    assert "in a row" in study.trials[0].user_attrs["fail_msg"]


def test_dataloader_worker_killed(tmp_path: Path, run):
    text = space(data_args="{kill_worker_at_item: 40}", knobs={"num_workers": "1"}, n_trials=1)
    study, _, _ = run(text, tmp_path)
    assert kinds(study) == ["dataloader_worker_died"]
    message = study.trials[0].user_attrs["fail_msg"]
    assert "DataLoader worker" in message and ("killed" in message or "unexpectedly" in message)


def _raised_in(filename: str, error: BaseException) -> BaseException:
    """``error`` with a real traceback through a frame of ``filename``."""
    code = compile("def read(error):\n    raise error\n", filename, "exec")
    scope: dict = {}
    exec(code, scope)
    try:
        scope["read"](error)
    except BaseException as raised:
        return raised
    raise AssertionError("not raised")


def test_a_broken_pipe_inside_the_dataloader_is_a_dead_worker():
    # when the worker dies before torch's own check names it, the main process's read fails
    dataloader = "/site-packages/torch/utils/data/dataloader.py"
    for error in (ConnectionResetError(104, "Connection reset by peer"), EOFError()):
        kind, message = classify(_raised_in(dataloader, error))
        assert kind == FaultKind.DATALOADER_WORKER_DIED, message
        assert "DataLoader worker exited unexpectedly" in message
    # the same error from the user's own code is a plain error
    kind, _ = classify(_raised_in("/home/me/my_data.py", ConnectionResetError("peer")))
    assert kind == FaultKind.ERROR


def test_what_cuda_libraries_raise_when_memory_runs_out_is_out_of_memory(
    monkeypatch: pytest.MonkeyPatch,
):
    import torch

    from autotune import faults

    for text in (
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    ):
        assert classify(RuntimeError(text))[0] == FaultKind.OOM
    # an allocation that failed during a CUDA-graph capture surfaces as the capture's failure
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except torch.OutOfMemoryError as oom:
            raise RuntimeError("CUDA graph capture invalidated by an allocation") from oom
    except RuntimeError as capture:
        assert classify(capture)[0] == FaultKind.OOM
    # failures memory pressure causes among others: out of memory only on a nearly full device
    internal = RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR")
    monkeypatch.setattr(faults, "_memory_pressure", lambda: True)
    assert classify(internal)[0] == FaultKind.OOM
    monkeypatch.setattr(faults, "_memory_pressure", lambda: False)
    assert classify(internal)[0] == FaultKind.ERROR


def test_an_error_is_read_with_everything_it_wraps_each_once():
    from autotune.faults import wrapped

    class DriverError(Exception):  # as SQLAlchemy's DBAPIError keeps the driver's in .orig
        orig = OSError("the driver's own")

    cause, context, outer = ValueError("cause"), KeyError("context"), DriverError("outer")
    outer.__cause__, outer.__context__ = cause, context
    cause.__context__ = outer  # a cycle is walked once
    assert sorted(map(str, wrapped(outer))) == sorted(
        ["outer", "cause", "'context'", "the driver's own"]
    )
    # out of memory said by an error another one was raised while handling (no ``from``)
    oom = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    cleanup = RuntimeError("the trial's cleanup failed")
    cleanup.__context__ = oom
    assert classify(cleanup)[0] == FaultKind.OOM


def test_fault_kinds_are_an_enum_stored_as_strings():
    assert FaultKind("trial_timeout") is FaultKind.TRIAL_TIMEOUT
    assert not FaultKind.INTERRUPTED.is_configuration_fault
    assert not FaultKind.ERROR.is_configuration_fault
    with pytest.raises(ValueError):
        TrialFault("no_such_kind", "message")


def test_slow_data_hits_the_dataloader_timeout(tmp_path: Path, run):
    # a batch of 16 samples takes 0.32 s to load, past the timeout of 0.2 s
    text = space(
        data_args="{train_delay_seconds: 0.02}", knobs={"num_workers": "1"}, n_trials=1
    ).replace("epochs: 2", "epochs: 2\n  dataloader_timeout: 0.2")
    study, _, _ = run(text, tmp_path)
    assert kinds(study) == ["dataloader_timeout"]
    assert study.trials[0].state == TrialState.PRUNED


def test_the_same_bug_everywhere_stops_the_study(tmp_path: Path, run):
    text = space(n_trials=10).replace("autotune.testing:tiny_mlp", "autotune.testing:broken_model")
    text = text.replace("model_args: {}", "model_args: {message: typo in forward}")
    study, outcome, _ = run(text, tmp_path)
    assert outcome.repeated_error == "ValueError: typo in forward"
    assert kinds(study) == ["error"] * 3
    assert all(t.state == TrialState.FAIL for t in study.trials)


@pytest.mark.slow
def test_a_hanging_trial_is_killed_with_its_dataloader_workers(tmp_path: Path, run):
    text = space(
        # the trial's 4th step, with its DataLoader worker running (the warm-up's 3 steps,
        # on a model of their own and without DataLoader workers, pass)
        model_args="{hang_at_step: 4}",
        knobs={"num_workers": "1", "persistent_workers": "true"},
        n_trials=2,
    )
    # the timeout counts from the end of the warm-up: the DataLoader worker starts (forked) and
    # the step hangs well within it; a kill while warming would say so in its message
    study, _, executor = run(text, tmp_path, isolation="worker", timeout=1.5)
    for trial in study.trials:
        message = trial.user_attrs["fail_msg"]
        # on a busy machine (other jobs on these cores) the timeout is not held against the
        # configuration (the next test checks that case on purpose), and the warm-up may take
        # the whole 1.5 s: the kill then says so
        under_load = "other processes took" in message
        expected = "timeout_under_load" if under_load else "trial_timeout"
        assert trial.user_attrs["fail_kind"] == expected
        warming = " (still warming up: the process's first steps)" if under_load else ""
        assert re.match(
            rf"no result after 1\.5 s({re.escape(warming)})?; the worker and its DataLoader "
            "workers were killed",
            message,
        ), message
    # a fresh worker for every trial (a timeout under load is not counted: one more trial runs)
    assert len(executor.started_pids) == len(study.trials) >= 2
    for pid in executor.started_pids:
        assert live_group_members(pid) == [], "a worker or one of its DataLoader workers survived"


@pytest.mark.slow
def test_a_timeout_while_other_processes_take_the_cores_is_not_held_against_the_trial(
    tmp_path: Path, run
):
    text = space(model_args="{hang_at_step: 4}", n_trials=1, timeout=1)  # one trial, then stop
    # busy loops outside this process tree (a child of the study would count as its own)
    burn = f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"
    burners = [
        int(subprocess.run(["sh", "-c", burn], capture_output=True, check=True).stdout)
        for _ in range(len(os.sched_getaffinity(0)))
    ]
    try:  # killed after 1 s, warming up or hanging: either way while the burners run
        study, _, _ = run(text, tmp_path, isolation="worker", timeout=1)
    finally:
        for pid in burners:
            os.kill(pid, signal.SIGKILL)
    assert_trials_recorded(study)
    assert kinds(study) == ["timeout_under_load"]
    (trial,) = study.get_trials()
    assert trial.state == TrialState.FAIL  # not counted, not a constraint the sampler learns
    assert "other processes took" in trial.user_attrs["fail_msg"]
    # the same hang on a quiet machine is the configuration's: see the test above


@pytest.mark.slow
def test_a_crashing_worker_is_recorded_and_replaced(tmp_path: Path, run):
    text = space(model_args="{crash_at_step: 2}", n_trials=2)
    study, _, executor = run(text, tmp_path, isolation="worker")
    assert kinds(study) == ["worker_crashed"] * 2
    assert "signal 11 (SIGSEGV)" in study.trials[0].user_attrs["fail_msg"]
    assert len(executor.started_pids) == 2
    # each killed worker's temporary directory went with it
    assert len(executor.scratch_dirs) == 2
    assert not any(Path(d).exists() for d in executor.scratch_dirs)


@pytest.mark.slow
def test_a_failing_compiler_is_a_compile_error_never_an_eager_run(tmp_path: Path, run):
    import torch._inductor.config as inductor

    text = space(model_args="{broken_compiler: true}", knobs={"compile": "default"}, n_trials=1)
    saved = (inductor.cpp.cxx, inductor.fx_graph_cache)
    try:  # the study process builds the model once too, to check it: keep ours working
        study, _, _ = run(text, tmp_path, isolation="worker")
    finally:
        inductor.cpp.cxx, inductor.fx_graph_cache = saved
    assert kinds(study) == ["compile_error"]
    assert "C++ compiler" in study.trials[0].user_attrs["fail_msg"]
    assert study.trials[0].state == TrialState.PRUNED


# ---------------------------------------------------------------------------------------------
# The real command, stopped and resumed
# ---------------------------------------------------------------------------------------------


def load_study(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(
        study_name="faults", storage=f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}"
    )


def _has_beat(database: Path, number: int) -> bool:
    """Whether trial ``number`` of the SQLite study in ``database`` has a heartbeat recorded."""
    with sqlite3.connect(database) as connection:
        found = connection.execute(
            "SELECT COUNT(*) FROM trial_heartbeats JOIN trials USING (trial_id) "
            "WHERE trials.number = ?",
            (number,),
        ).fetchone()
    return bool(found and found[0])


def wait_for(condition, timeout: float = 120.0, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        assert process is None or process.poll() is None, "the run ended first"
        time.sleep(0.05)


def wait_for_states(
    tmp_path: Path, states: list[TrialState], process: subprocess.Popen
) -> list[tuple[TrialState, float | None]]:
    """Wait until the study's first trials are in ``states``, the last RUNNING with its
    parameters sampled (polled fast enough to catch a trial of a second); their states and
    values then."""
    rows: list[tuple[TrialState, float | None, bool]] = []

    def reached() -> bool:
        rows[:] = trial_rows(tmp_path)[: len(states)]
        return [state for state, _, _ in rows] == states and rows[-1][2]

    try:
        wait_for(reached, process=process)
    except AssertionError as failed:  # what the run said, for whoever reads the failure
        process.kill()
        out, err = process.communicate(timeout=60)
        seen = trial_rows(tmp_path)
        raise AssertionError(f"{failed}; trials {seen}\n{out[-4000:]}\n{err[-4000:]}") from None
    return [(state, value) for state, value, _ in rows]


def trial_rows(tmp_path: Path) -> list[tuple[TrialState, float | None, bool]]:
    """The study's trials' states, values and whether they have parameters, read straight
    from its SQLite file: milliseconds on a busy machine, where loading the study takes
    seconds and a trial of a second can start and end between two loads."""
    db = tmp_path / "studies" / "autotune.db"
    if not db.exists():
        return []
    query = (
        "SELECT t.state, v.value, EXISTS (SELECT 1 FROM trial_params p WHERE p.trial_id = "
        "t.trial_id) FROM trials t JOIN studies s ON s.study_id = t.study_id "
        "LEFT JOIN trial_values v ON v.trial_id = t.trial_id "
        "WHERE s.study_name = 'faults' ORDER BY t.number"
    )
    try:
        with contextlib.closing(sqlite3.connect(db, timeout=10)) as connection:
            rows = connection.execute(query).fetchall()
    except sqlite3.OperationalError:  # the tables are still being created
        return []
    return [(TrialState[state], value, bool(sampled)) for state, value, sampled in rows]


def slow_space(n_trials: int) -> str:
    """A study of ``n_trials`` trials of about a second each, beating every second."""
    return space(model_args="{step_delay_seconds: 0.05}", n_trials=n_trials, heartbeat_interval=1)


def baselines(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials() if t.user_attrs.get("baseline")]


def assert_one_baseline_counted(study: optuna.Study) -> None:
    """Every study keeps exactly one untuned baseline until one finishes."""
    counted = [t for t in baselines(study) if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(counted) == 1, [(t.number, t.state) for t in baselines(study)]


def interrupt(tmp_path: Path, sig: signal.Signals, code: int, states: list[TrialState]) -> None:
    """Start the study of tmp_path/space.yaml, send ``sig`` once its trials are in ``states``
    (the last RUNNING), and check that it ended with ``code``, that trial as interrupted and
    what completed before it intact."""
    process = start_cli("run", "space.yaml", cwd=tmp_path)
    before = wait_for_states(tmp_path, states, process)  # as they were when the signal went
    process.send_signal(sig)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr
    assert "run the same command to resume" in stdout and "Traceback" not in stderr
    study = load_study(tmp_path)
    assert_trials_recorded(study)
    stopped = len(states) - 1
    assert study.trials[stopped].state == TrialState.FAIL
    assert study.trials[stopped].user_attrs["fail_kind"] == "interrupted"
    for number in range(stopped):  # what completed (or failed) before is intact
        assert (study.trials[number].state, study.trials[number].value) == before[number]


@pytest.mark.slow
def test_interrupting_records_the_running_trial_and_a_rerun_resumes(tmp_path: Path):
    """SIGTERM while the untuned baseline (the first trial) runs; the rerun queues it again
    after the checklist, and is SIGKILLed while that retry runs: nobody records it, nor
    removes its worker's temporary directory. The next run recovers it as interrupted, its
    retry keeps its parameters and stays the baseline, the directory goes; Ctrl-C stops that
    run while its last trial runs, after two completed; the fourth run finishes the study.
    (One study for what two tests checked with five runs: the killed run is the rerun.)"""
    (tmp_path / "space.yaml").write_text(slow_space(n_trials=3))
    interrupt(tmp_path, signal.SIGTERM, 143, [TrialState.RUNNING])
    first = load_study(tmp_path).trials[0]

    process = start_cli("run", "space.yaml", cwd=tmp_path)
    running = [TrialState.FAIL, TrialState.COMPLETE, TrialState.RUNNING]
    wait_for_states(tmp_path, running, process)
    # and its first heartbeat recorded: killed between ask() and that beat, a trial has no beat
    # to go stale and stays RUNNING for good (a CI-style run at 7592f24 timed out so, trials
    # [FAIL, COMPLETE, RUNNING, COMPLETE]; left for the product to handle: the closing note)
    wait_for(lambda: _has_beat(tmp_path / "studies" / "autotune.db", 2), process=process)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    killed = load_study(tmp_path).trials[2]  # the untuned baseline, queued again
    assert killed.user_attrs.get("baseline") is True
    assert killed.state == TrialState.RUNNING  # nobody could record it
    # its heartbeat stops now: the next run finds it stale as it starts, and runs its retry
    # first (a run that started sooner would count it as running elsewhere and run a tuned
    # trial first, as it must: it cannot tell a dead process from a slow one)
    beat_long_ago(tmp_path / "studies" / "autotune.db")
    # nobody removed its worker's temporary directory either: the next run does
    orphans = list(Path(tempfile.gettempdir()).glob(f"autotune-worker-{process.pid}-*"))
    assert orphans

    interrupt(tmp_path, signal.SIGINT, 130, [*running[:2], TrialState.FAIL, TrialState.COMPLETE,
                                             TrialState.RUNNING])  # fmt: skip
    study = load_study(tmp_path)
    assert not study.trials[4].user_attrs.get("baseline")  # a tuned one
    stale = study.trials[2]
    assert stale.state == TrialState.FAIL and stale.user_attrs["fail_kind"] == "interrupted"
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retried) == 1 and retried[0].params == killed.params
    assert retried[0].state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert "fail_kind" not in retried[0].user_attrs or retried[0].state == TrialState.PRUNED
    assert retried[0].user_attrs.get("baseline") is True  # the retry is still the baseline
    assert not any(orphan.exists() for orphan in orphans)

    resumed = start_cli("run", "space.yaml", cwd=tmp_path)
    _, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    study = load_study(tmp_path)
    assert_trials_recorded(study)
    counted = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(counted) == 3
    assert_one_baseline_counted(study)  # an interrupted baseline is queued again
    assert baselines(study)[-1].params == first.params == killed.params


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")  # this test beats itself
def test_a_stale_trials_retry_keeps_its_parameters_and_baseline_mark_but_no_measurements(
    tmp_path: Path,
):
    storage = open_storage(f"sqlite:///{tmp_path / 'retry.db'}", heartbeat_interval=1)
    pruner = optuna.pruners.HyperbandPruner(min_resource=1, max_resource=9)
    study = optuna.create_study(study_name="retry", storage=storage, pruner=pruner)
    study.enqueue_trial({"lr": 0.1}, user_attrs={"baseline": True})
    trial = study.ask()
    trial.suggest_float("lr", 1e-3, 1.0, log=True)
    for step in range(1, 10):  # the pruner records its rungs in the trial's system attributes
        trial.report(0.5, step)
        trial.should_prune()
    trial.set_user_attr("samples_per_second", 1234.0)
    storage.record_heartbeat(trial._trial_id)
    stale = study.trials[0]
    assert any(key.startswith("completed_rung") for key in stale.system_attrs)
    beat_long_ago(tmp_path / "retry.db")  # silent for over three heartbeat intervals

    assert recover_stale_trials(study) == 1
    (retry,) = study.get_trials(states=(TrialState.WAITING,))
    assert retry.params == {"lr": 0.1}
    assert retry.user_attrs == {"baseline": True}
    assert retry.system_attrs["failed_trial"] == stale.number
    assert not any(key.startswith("completed_rung") for key in retry.system_attrs)


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")  # this test beats itself
def test_a_trial_whose_beat_comes_back_during_recovery_keeps_no_interrupted_label(
    tmp_path: Path,
):
    """The recovery reads the stale trials, labels them, then Optuna fails those still stale:
    a trial whose owner beats in between is not failed, and must not keep the label."""
    storage = open_storage(f"sqlite:///{tmp_path / 'race.db'}", heartbeat_interval=1)
    study = optuna.create_study(study_name="race", storage=storage)
    trial = study.ask()
    storage.record_heartbeat(trial._trial_id)
    beat_long_ago(tmp_path / "race.db")  # stale by the clock: silent for over three intervals
    read_stale = storage._get_stale_trial_ids

    def owner_beats_right_after(study_id: int) -> list[int]:
        found = read_stale(study_id)
        storage.record_heartbeat(trial._trial_id)  # the slow owner's beat lands now
        storage._get_stale_trial_ids = read_stale  # once: Optuna's own query is the real one
        return found

    storage._get_stale_trial_ids = owner_beats_right_after
    assert recover_stale_trials(study) == 0  # none failed
    (running,) = study.get_trials(states=(TrialState.RUNNING,))
    assert running.number == trial.number
    assert TrialRecord.of(running).fail_kind is None  # it trains on, unlabelled
    study.tell(trial, 1.0)
    assert TrialRecord.of(study.trials[0]).fail_kind is None


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")  # this test beats itself
def test_a_trial_finished_during_recovery_is_neither_counted_nor_labelled(tmp_path: Path):
    """The owner finishes its trial after the recovery labelled it and before Optuna fails the
    stale ones: the trial is COMPLETE, not failed, and its label (which a finished trial's
    attributes can no longer lose) is not read as how it ended."""
    storage = open_storage(f"sqlite:///{tmp_path / 'race.db'}", heartbeat_interval=1)
    study = optuna.create_study(study_name="race", storage=storage)
    trial = study.ask()
    storage.record_heartbeat(trial._trial_id)
    beat_long_ago(tmp_path / "race.db")  # stale by the clock
    read_stale = storage._get_stale_trial_ids
    calls: list[int] = []

    def owner_finishes_before_optunas_query(study_id: int) -> list[int]:
        calls.append(study_id)
        if len(calls) == 2:  # Optuna's own query, after the label was written
            assert study.trials[0].user_attrs["fail_kind"] == "interrupted"
            study.tell(trial, 1.0)
        return read_stale(study_id)

    storage._get_stale_trial_ids = owner_finishes_before_optunas_query
    assert recover_stale_trials(study) == 0  # none failed
    (done,) = study.trials
    assert done.state == TrialState.COMPLETE and len(calls) == 2
    record = TrialRecord.of(done)
    assert record.fail_kind is None and record.fail_msg is None


@pytest.mark.slow
def test_four_processes_share_one_sqlite_study_while_a_reader_polls(tmp_path: Path):
    """Four study processes on one SQLite file, two trials each (trials in the study process:
    its worker process touches no database), while a reader polls as optuna-dashboard does."""
    lr_range = {"lr": "{low: 0.01, high: 0.1, log: true}"}
    text = space(n_trials=8, heartbeat_interval=1, isolation="none", knobs=lr_range)
    (tmp_path / "space.yaml").write_text(text)
    reads: list[int] = []
    problems: list[BaseException] = []
    done = threading.Event()

    def poll() -> None:  # what optuna-dashboard does while a study runs
        while not done.is_set():
            if not (tmp_path / "studies" / "autotune.db").exists():
                time.sleep(0.05)
                continue
            try:
                reads.append(len(load_study(tmp_path).get_trials()))
            except KeyError:
                pass  # not created yet
            except BaseException as error:
                if reads:  # once the study exists, every read must work
                    problems.append(error)
            time.sleep(0.05)

    reader = threading.Thread(target=poll)
    reader.start()
    processes = [start_cli("run", "space.yaml", cwd=tmp_path) for _ in range(4)]
    outputs = [p.communicate(timeout=600) for p in processes]
    done.set()
    reader.join()
    for process, (stdout, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
        assert "database is locked" not in stdout + stderr
    assert not problems, problems
    assert reads and max(reads) >= 8
    study = load_study(tmp_path)
    assert_trials_recorded(study)
    counted = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(counted) == 8  # counted and started under the study's lock: never more
    assert len({t.number for t in study.trials}) == len(study.trials)
    # processes that start together still draw different configurations (a stale trial's
    # retry repeats its parameters on purpose, so retries are left out)
    drawn = [
        tuple(sorted(t.params.items()))
        for t in counted
        if "failed_trial" not in t.system_attrs and not t.user_attrs.get("baseline")
    ]
    assert len(set(drawn)) == len(drawn), drawn


# what another process's stale-trial recovery does to a running trial (recover_stale_trials,
# then Optuna's fail_stale_trials): record it as interrupted, fail it, queue it again
FAIL_RUNNING_AS_STALE = """
import copy, sys
import optuna
from optuna.trial import TrialState
from autotune.study import open_storage

storage = open_storage(sys.argv[1], "write", heartbeat_interval=60)
study = optuna.load_study(study_name=sys.argv[2], storage=storage)
for trial in study.get_trials(states=(TrialState.RUNNING,)):
    storage.set_trial_user_attr(trial._trial_id, "fail_kind", "interrupted")
    storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    retry = storage.get_heartbeat_stale_trial_callback()
    retry(study, copy.deepcopy(storage.get_trial(trial._trial_id)))
"""


class _FailedElsewhereAtFirstEvaluation:
    """Trains for real in this process; at the first evaluation of the first trial, before the
    study hears of it, another process fails that trial as stale would (its heartbeat late)."""

    def __init__(self, inner, url: str, study_name: str) -> None:
        self.inner, self.url, self.study_name = inner, url, study_name
        self.done = False

    def train(self, config, report):
        def first_evaluation_elsewhere(evaluation):
            if not self.done:
                self.done = True
                subprocess.run(
                    [sys.executable, "-c", FAIL_RUNNING_AS_STALE, self.url, self.study_name],
                    check=True,
                    timeout=120,
                )
            return report(evaluation)

        return self.inner.train(config, first_evaluation_elsewhere)

    def measure(self, config, plan):
        return self.inner.measure(config, plan)

    def close(self) -> None:
        self.inner.close()


def test_the_owner_of_a_trial_failed_as_stale_elsewhere_stops_it_and_goes_on(
    tmp_path: Path, prepare_study
):
    from autotune.executor import InProcessExecutor
    from autotune.search.space import restrict
    from autotune.spacefile import parse_spec
    from autotune.testing import TINY_SPACE
    from autotune.workloads import load

    text = TINY_SPACE.format(n_trials=3, pruner="none").replace(
        "  seed: 0\n", "  seed: 0\n  confirm: false\n"
    )
    spec = restrict(parse_spec(text, tmp_path / "tiny.yaml"), CPU).spec
    url = f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}"
    executor = _FailedElsewhereAtFirstEvaluation(
        InProcessExecutor(load(spec.workload, tmp_path)), url, spec.study_name
    )
    study, _, outcome, _ = prepare_study(
        spec, tmp_path, storage=url, executor=executor, heartbeat_interval=60
    )
    assert executor.done and outcome.taken_over == 1 and outcome.repeated_error is None
    first = study.trials[0]
    assert first.state == TrialState.FAIL and "score" not in first.user_attrs
    # queued again, with what the first attempt measured before it noticed; then trained
    (retry,) = [t for t in study.trials if t.system_attrs.get("failed_trial") == first.number]
    attempt = retry.user_attrs["earlier_attempt"]
    assert attempt["trial"] == first.number and 0.0 <= attempt["score"] <= 1.0
    assert attempt["epochs"] > 0 and attempt["samples_per_second"] > 0
    assert retry.state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert retry.user_attrs.get("baseline") is True  # the baseline is still the baseline
    counted = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(counted) == 3 and not study.get_trials(states=(TrialState.RUNNING,))


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")  # this test beats itself
def test_a_heartbeat_gives_up_behind_a_long_write_and_the_next_one_lands(tmp_path: Path):
    """Beats go through a storage of their own whose writes give up after one interval: one
    held up by another process's write must not land late (after the grace period)."""
    from autotune.storage._liveness import _beat_storage

    path = tmp_path / "beats.db"
    storage = open_storage(f"sqlite:///{path}", heartbeat_interval=1)
    study = optuna.create_study(study_name="beats", storage=storage)
    trial = study.ask()
    beats = _beat_storage(study._storage, 1)
    assert beats is not storage and beats.url == storage.url
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")  # another process's write, held past half an interval
    release = threading.Timer(2.0, writer.execute, args=("COMMIT",))
    release.start()
    try:
        with pytest.raises(optuna.exceptions.StorageInternalError) as caught:
            beats.record_heartbeat(trial._trial_id)  # gave up before the write ended
        assert "database is locked" in str(caught.value.__cause__)
    finally:
        release.join()
        writer.close()
    beats.record_heartbeat(trial._trial_id)  # the next beat lands
    assert beats._get_stale_trial_ids(study._study_id) == []


def test_an_unexpected_error_names_where_the_users_own_code_raised_it(tmp_path: Path):
    from autotune.faults import as_fault, user_frame

    source = "def check(x):\n    raise ValueError('bad shape')\n"
    mine = tmp_path / "my_model.py"
    mine.write_text(source)
    try:
        exec(compile(source + "check(1)\n", str(mine), "exec"), {})
    except ValueError as error:
        fault = as_fault(error)
    assert fault.kind == FaultKind.ERROR
    assert fault.message == f"ValueError: bad shape (at {mine}:2 in check)"
    # autotune's own frames, Python's and installed packages' are nobody's code to fix there
    import json

    import torch

    import autotune

    frames = "".join(
        f'  File "{path}", line 7, in f\n    x()\n'
        for path in (autotune.__file__, json.__file__, torch.__file__, "<string>")
    )
    assert user_frame(f"Traceback (most recent call last):\n{frames}ValueError: x") is None
