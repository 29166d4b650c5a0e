"""Trials in a supervised worker process: the same results as in the study process, and a worker
that cannot start says why and leaves nothing behind."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from autotune import distributed, supervision
from autotune.errors import WorkerError
from autotune.executor import InProcessExecutor
from autotune.faults import describe_exit
from autotune.spacefile import WorkloadSpec
from autotune.testing import (
    assert_trials_recorded,
    blobs_workload,
    live_group_members,
    make_config,
)
from autotune.worker import WorkerExecutor, _process, _protocol, remove_orphaned_scratch

SPACE = """\
study: {name: isolation, n_trials: 3, pruner: none, sampler: random, strategy: joint}
workload:
  model: autotune.testing:tiny_mlp
  model_args: {}
  data: autotune.testing:blobs
  data_args: {}
  epochs: 2
objective: {min_accuracy: 0.5}
space:
  lr: {low: 0.01, high: 0.1}
  batch_size: [16, 32]
"""


@pytest.mark.slow
def test_worker_and_in_process_isolation_give_the_same_results(tmp_path: Path, prepare_study):
    worker = prepare_study(SPACE, tmp_path / "worker", isolation="worker", heartbeat_interval=1)
    assert_trials_recorded(worker.study)
    local = prepare_study(SPACE, tmp_path / "local", isolation="none", heartbeat_interval=1)
    assert_trials_recorded(local.study)
    for a, b in zip(worker.study.trials, local.study.trials, strict=True):
        assert a.params == b.params
        assert a.user_attrs["score_curve"] == b.user_attrs["score_curve"]


@pytest.mark.slow
def test_a_fresh_workers_warm_up_is_timed_apart_from_the_trials_timeout():
    """A fresh worker first pays its one-time costs (torch's lazy imports, the first kernels:
    seconds, on a GPU its CUDA context), then trains: each against the trial's timeout on its
    own, so a timeout that fits the trial does not kill the first trial of every worker."""
    workload = WorkloadSpec(
        model="autotune.testing:tiny_mlp",
        data="autotune.testing:blobs",
        model_args={"step_delay_seconds": 0.7},  # the warm-up's 3 steps and the trial's 4
    )
    # 2.1 s and 2.8 s fit, with room for a busy machine's slower first steps (torch's lazy
    # imports and first kernels: over 2.9 s where other processes took 85% of the cores) and
    # for its slower steps (1.7 s, more than the 1.4 s that 8 steps under a 7 s timeout had)
    executor = WorkerExecutor(workload, None, trial_timeout=4.5)
    try:
        executor.start()  # imports and the workload: before any clock
        started = time.monotonic()
        result = executor.train(make_config(epochs=0.5), lambda evaluation: False)
        took = time.monotonic() - started
    finally:
        executor.close()
    assert result.evaluations[-1].final and result.optimizer_steps == 4
    assert took > 4.5  # the warm-up and the trial together (4.9 s and more): past it


@pytest.mark.slow
def test_a_worker_that_cannot_load_the_workload_says_why(tmp_path: Path):
    executor = WorkerExecutor(WorkloadSpec(model="tiny_mlp", data="no_such_data"), tmp_path)
    try:
        with pytest.raises(WorkerError, match="could not load the workload: unknown data set"):
            executor.train(make_config(), lambda evaluation: False)
    finally:
        executor.close()
    assert all(live_group_members(pid) == [] for pid in executor.started_pids)


def test_only_the_scratch_of_study_processes_that_are_gone_is_removed(tmp_path: Path):
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(gone.stdout)
    orphan = tmp_path / f"autotune-worker-{dead_pid}-abc"
    live = tmp_path / f"autotune-worker-{os.getpid()}-def"
    unrelated = tmp_path / "autotune-worker-xyz"  # not a name this version makes
    for folder in (orphan, live, unrelated):
        (folder / "inductor").mkdir(parents=True)
    assert remove_orphaned_scratch(str(tmp_path)) == [orphan]
    assert not orphan.exists() and live.exists() and unrelated.exists()


class _IllegalAccess(torch.nn.Module):
    """A model whose forward fails as an asynchronous CUDA kernel fault surfaces."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_broken_cuda_context_is_reported_before_anything_touches_it(monkeypatch):
    """After an illegal memory access every CUDA call raises the sticky error, freeing memory
    included: the worker tells the study the fault first, as an error with CUDA's message, and
    then exits without touching the device (not a crash that blames the configuration)."""
    plain = blobs_workload()
    workload = dataclasses.replace(plain, model_fn=_IllegalAccess)

    def sticky() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered (sticky)")

    monkeypatch.setattr(_process, "release_memory", sticky)
    study_end, worker_end = multiprocessing.Pipe()
    study_end.send(supervision.RunTrial(make_config()))
    source = distributed.WorkloadSource(WorkloadSpec(model="m", data="d"), None, "accuracy")
    executor = InProcessExecutor(
        workload, source=source, on_warmed=lambda: worker_end.send(_protocol.Warmed())
    )
    _process._serve(worker_end, executor, _process.PrintTally())
    faulted = study_end.recv()
    assert isinstance(faulted, supervision.Faulted)
    assert (faulted.kind, faulted.needs_fresh_process) == ("error", True)
    assert "illegal memory access" in faulted.message


def test_inductors_own_reports_are_kept_off_the_users_terminal(monkeypatch: pytest.MonkeyPatch):
    """max-autotune writes a table of the kernels it benchmarked to stderr at every tuned
    operation; a worker (not ``--verbose``) turns that off, whether Inductor's config is
    imported after it (the environment: the worker's own process, its compile workers) or was
    imported before (set where it lives), unless the user set Inductor's switches."""
    import warnings

    import torch._inductor.config as config

    quiet_then_import = (
        "from autotune.worker._process import _quiet_compiler; _quiet_compiler(); "
        "import torch._inductor.config as c; "
        "print(c.autotune_num_choices_displayed, c.max_autotune_report_choices_stats)"
    )
    names = _process._INDUCTOR_REPORTS
    env = {k: v for k, v in os.environ.items() if k not in names}
    done = subprocess.run(
        [sys.executable, "-c", quiet_then_import], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "False"]
    monkeypatch.setattr(config, "autotune_num_choices_displayed", 10)
    monkeypatch.setattr(config, "max_autotune_report_choices_stats", True)
    monkeypatch.setenv(names[0], "3")  # the user's choice: kept
    with warnings.catch_warnings():
        _process._quiet_compiler()
    assert config.autotune_num_choices_displayed == 10
    for name in names:  # restored to unset after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    with warnings.catch_warnings():
        _process._quiet_compiler()
    assert config.autotune_num_choices_displayed == 0
    assert config.max_autotune_report_choices_stats is False


CHATTY = """\
import math

from torch import nn


class Chatty(nn.Module):
    def __init__(self, num_classes, input_shape):
        super().__init__()
        self.head = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x):
        print("shape", tuple(x.shape))  # a user's debugging print, once a batch
        return self.head(x.flatten(1))


def chatty(num_classes, input_shape):
    return Chatty(num_classes, input_shape)
"""


@pytest.mark.slow
def test_what_the_users_code_prints_in_a_worker_is_counted_not_shown(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
):
    """A print in the user's forward would scroll the study's display away, once a batch: the
    worker counts the lines and keeps the first; none reach the study's terminal."""
    (tmp_path / "chatty_model.py").write_text(CHATTY)
    workload = WorkloadSpec(model="chatty_model:chatty", data="autotune.testing:blobs")
    executor = WorkerExecutor(workload, tmp_path)
    try:
        result = executor.train(make_config(epochs=1.0, batch_size=16), lambda evaluation: False)
        again = executor.train(make_config(epochs=1.0, batch_size=16), lambda evaluation: False)
    finally:
        executor.close()
    # every training and validation batch printed once: more lines than optimizer steps
    assert result.printed_lines > result.optimizer_steps
    assert result.first_printed is not None and result.first_printed.startswith("shape (")
    # each trial counts its own (the first's warm-up printed too; the second has none)
    assert again.optimizer_steps < again.printed_lines <= result.printed_lines
    assert "shape (" not in capfd.readouterr().out


@pytest.mark.slow
def test_a_worker_killed_from_outside_is_not_the_configurations_fault():
    """An operator's or a scheduler's SIGKILL (the OOM killer killed nobody meanwhile) says
    nothing of the configuration: KILLED, which the study records as failed, neither counted
    nor taught to the sampler; a segfault is the trial's own crash."""
    from autotune.faults import FaultKind, TrialFault

    workload = WorkloadSpec(
        model="autotune.testing:tiny_mlp",
        data="autotune.testing:blobs",
        model_args={"step_delay_seconds": 0.1},  # 3 warm-up steps and 8: killed mid-trial
    )
    executor = WorkerExecutor(workload, None)
    kinds = []
    try:
        for sent in (signal.SIGKILL, signal.SIGSEGV):
            executor.start()
            pid = executor.started_pids[-1]
            killer = threading.Timer(0.6, os.kill, (pid, sent))
            killer.start()
            with pytest.raises(TrialFault) as caught:
                executor.train(make_config(epochs=1.0), lambda evaluation: False)
            killer.join()
            kinds.append(caught.value.kind)
            said = str(caught.value)
            assert f"({describe_exit(-sent)})" in said, said
    finally:
        executor.close()
    assert kinds == [FaultKind.KILLED, FaultKind.WORKER_CRASHED]
    assert not FaultKind.KILLED.is_configuration_fault
