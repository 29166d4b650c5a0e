"""Interference is detected, not averaged in: the CPU meter's accounting, the trial's explicit
threads, the flag on a trial, and the confirmation round measuring a flagged run again."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import torch
from torch import nn

from autotune.config import TrialConfig
from autotune.executor import InProcessExecutor
from autotune.machine.interference import INTERFERENCE_SHARE, CpuMeter, trial_threads, usable_cores
from autotune.results import Reporter, TrialResult
from autotune.search.space import restrict
from autotune.spacefile import parse_spec
from autotune.study import (
    Answer,
    ConfirmationInputs,
    ConfirmationRecord,
    ConfirmRun,
    StudyInputs,
    TrialRecord,
    confirm_study,
    open_storage,
    open_study,
    run_study,
)
from autotune.study._confirm import REMEASURES
from autotune.testing import CPU, blobs, make_config
from autotune.training.runner import train
from autotune.workloads import Workload, load

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc")

BURN = 0.4  # CPU seconds a helper process spends (its own CPU time: no load can shorten it)
BURNER = f"import time\nt = time.process_time()\nwhile time.process_time() - t < {BURN}: pass\n"


def test_the_meter_charges_the_trials_own_children_to_the_trial():
    with CpuMeter() as meter:
        subprocess.run([sys.executable, "-c", BURNER], check=True)
    share = meter.share
    assert share is not None and share.cores == len(os.sched_getaffinity(0))
    assert share.own_cpu_seconds >= BURN * 0.8  # ticks are 10 ms; the child is reaped: cutime


def test_the_meter_charges_a_process_outside_the_tree_to_others(tmp_path: Path):
    done = tmp_path / "done"
    # a double fork: the burner's parent exits at once, so it is no descendant of ours
    burner = BURNER + f"open({str(done)!r}, 'w').close()\n"
    orphan = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {burner!r}], start_new_session=True)\n"
    )
    with CpuMeter() as meter:
        subprocess.run([sys.executable, "-c", orphan], check=True)
        deadline = time.monotonic() + 60
        while not done.exists():
            assert time.monotonic() < deadline, "the burner never finished"
            time.sleep(0.02)
    share = meter.share
    assert share is not None
    assert share.other_cpu_seconds >= BURN * 0.8
    # the launcher's start-up (an interpreter, ~0.05 s) and our polling are ours, not the burn
    assert share.own_cpu_seconds < BURN * 0.8
    assert share.other_share == pytest.approx(
        share.other_cpu_seconds / (share.wall_seconds * share.cores)
    )


# a rank of a distributed trial: meters its cores from "ready" until "done" exists twice over
# the same interval, counting its own tree and then (as every rank does) its launcher's; prints
# the others' CPU seconds of each, and the CPU seconds charged to the launcher's tree
RANK = """\
import os, sys, time
from collections import Counter
from pathlib import Path
from autotune.machine.interference import CpuMeter, count_tree_as_own
folder = Path(sys.argv[1])
own = CpuMeter()
count_tree_as_own(os.getppid())
with own, CpuMeter() as tree:
    (folder / "ready").touch()
    while not (folder / "done").exists():
        time.sleep(0.02)
print(own.share.other_cpu_seconds, tree.share.other_cpu_seconds, tree.share.own_cpu_seconds)
"""


def test_ranks_on_the_same_cores_count_each_other_as_the_trial(tmp_path: Path):
    """With fewer cores than ranks every rank runs on all of them: a rank that meters its own
    tree sees its busy peer as interference; one that meters the launcher's tree does not.
    Both meters read the same interval, so whatever else the machine ran falls on both alike
    and their difference is the peer's burn."""
    rank = subprocess.Popen(
        [sys.executable, "-c", RANK, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline and rank.poll() is None, "the rank never metered"
        time.sleep(0.02)
    peer = BURNER + f"open({str(tmp_path / 'done')!r}, 'w').close()\n"
    subprocess.run([sys.executable, "-c", peer], check=True)  # a sibling of the rank
    out, _ = rank.communicate(timeout=60)
    others_own, others_tree, tree_own = (float(word) for word in out.split())
    assert tree_own >= BURN * 0.8  # the peer is the trial's
    assert others_own - others_tree >= BURN * 0.8  # ... and only the own-tree meter blames it


class ThreadsSeen(nn.Module):
    """A linear classifier that records torch's intra-op threads at every forward."""

    def __init__(self, features: int, classes: int, seen: list[int]) -> None:
        super().__init__()
        self.linear = nn.Linear(features, classes)
        self.seen = seen

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.seen.append(torch.get_num_threads())
        return self.linear(inputs.flatten(1))


def test_a_trial_trains_with_explicit_threads_and_records_what_others_took():
    splits = blobs()
    shape = tuple(splits.train[0][0].shape)
    seen: list[int] = []
    workload = Workload(
        "threads", splits.train, splits.val, 4, shape, lambda: ThreadsSeen(shape[0], 4, seen)
    )
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as a library or an earlier trial might have left it
    try:
        config = make_config(epochs=1, batch_size=32)
        result = train(config, workload, lambda evaluation: False)
        assert torch.get_num_threads() == 1  # restored after the trial
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {result.intra_op_threads}  # the threads it recorded
    assert 1 <= result.intra_op_threads <= usable_cores()
    assert result.other_cpu_share is not None and 0.0 <= result.other_cpu_share <= 1.0


@pytest.mark.skipif(usable_cores() < 2, reason="one core: one thread either way")
def test_a_trial_leaves_the_cores_others_keep_busy_to_them():
    """An intra-op pool larger than the idle cores waits at every parallel region for a thread
    the scheduler gave to another process (the quickstart's CNN: 156-611 samples/s on 2 threads
    beside two spinning processes, 4.7-5.1k on 1): the trial takes the cores left."""
    cores = usable_cores()
    # spinners outside this process's tree (a double fork): another user's processes
    spin = "while True: pass"
    launch = (
        "import subprocess, sys\n"
        f"for _ in range({cores}):\n"
        f"    print(subprocess.Popen([sys.executable, '-c', {spin!r}], start_new_session=True,\n"
        "                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"
    )
    launched = subprocess.run([sys.executable, "-c", launch], capture_output=True, text=True)
    pids = [int(pid) for pid in launched.stdout.split()]
    try:
        time.sleep(0.3)  # running
        busy = trial_threads()
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    assert len(pids) == cores and busy < cores  # what it would take on a quiet machine


def test_a_trial_measured_under_interference_is_flagged():
    splits = blobs()
    shape = tuple(splits.train[0][0].shape)
    workload = Workload("flag", splits.train, splits.val, 4, shape, lambda: nn.Linear(shape[0], 4))
    result = train(make_config(epochs=1, batch_size=32), workload, lambda e: False)
    busy = TrialRecord.from_result(dataclasses.replace(result, other_cpu_share=0.6), "fp32")
    assert busy.interference and busy.to_attrs()["interference"] is True
    assert busy.metrics()["other_cpu_share"] == 0.6
    quiet = dataclasses.replace(result, other_cpu_share=INTERFERENCE_SHARE / 2)
    assert "interference" not in TrialRecord.from_result(quiet, "fp32").to_attrs()


def _run(trial: int, repeat: int, value: float, other: float | None = None) -> ConfirmRun:
    return ConfirmRun(trial, repeat, repeat, value, 0.9, 100 * value, True, 1.0, None, other)


def test_the_verdict_leaves_out_flagged_measurements_where_clean_ones_exist():
    # interference only slows a run down, so a flagged baseline inflates every speed-up
    runs = (
        _run(1, 0, 3.0),
        _run(1, 1, 3.1),
        _run(1, 2, 2.9),
        _run(0, 0, 0.5, other=0.7),  # the baseline, measured slow while others ran
        _run(0, 1, 1.0),
        _run(0, 2, 1.1),
        _run(0, 2, 0.4, other=0.5),
    )
    record = ConfirmationRecord(2, 2, True, (1, 0), 0, runs, complete=True)
    verdict = Answer.of_round(record, optuna.trial.create_trial(value=0.0))
    baseline = verdict.configuration_of("baseline")
    assert baseline is not None and baseline.values == (1.0, 1.1)
    assert verdict.measured_ratio(baseline) == pytest.approx(3.0 / 1.05)
    assert not baseline.interfered
    # where every measurement was flagged, the round's own count (its trial's was the
    # search's, under another load), and the verdict says so
    flagged = tuple(dataclasses.replace(run, other_cpu_share=0.9) for run in runs)
    worst = Answer.of_round(dataclasses.replace(record, runs=flagged), verdict.trial)
    assert worst.winner is not None and worst.winner.interfered
    assert worst.winner.values == (3.1, 2.9)


class Interfering(InProcessExecutor):
    """Trains for real, and reports the first ``flagged`` runs as measured under interference
    (and the rest as quiet), as the meter would on a busy machine."""

    def __init__(self, workload: Workload, flagged: int) -> None:
        super().__init__(workload)
        self.flagged = flagged

    def train(self, config: TrialConfig, report: Reporter) -> TrialResult:
        result = super().train(config, report)
        share = 0.8 if self.flagged > 0 else 0.0
        self.flagged -= 1
        return dataclasses.replace(result, other_cpu_share=share)


SPACE = """\
study: {name: flagged, n_trials: 3, seed: 0, confirm: false}
workload: {model: autotune.testing:tiny_mlp, data: autotune.testing:blobs, epochs: 1, device: cpu}
space:
  lr: {low: 0.01, high: 0.1, log: true}
"""


@pytest.mark.slow
def test_runs_left_count_a_run_measured_again_once():
    """A round whose runs were measured again said "Confirming ...: -8 runs" when resumed."""
    runs = (_run(1, 0, 3.0), _run(1, 1, 3.1, other=0.7), _run(1, 1, 3.0), _run(0, 1, 1.0))
    record = ConfirmationRecord(1, 2, True, (1, 0), 0, runs)
    assert record.runs_left() == 2  # (1, 2) and (0, 2)
    again = (*runs, _run(1, 2, 3.0), _run(0, 2, 1.0, other=0.7), _run(0, 2, 1.0))
    assert dataclasses.replace(record, runs=again).runs_left() == 0
    # a run measured under interference whose retake was interrupted (Ctrl-C): the resumed
    # round said "Nothing new to measure" and then measured "confirm 12/12 trial 0 run 3"
    busy = (*again, _run(0, 3, 1.0, other=0.7))
    interrupted = dataclasses.replace(record, repeats=3, runs=(*busy, _run(1, 3, 3.0)))
    assert interrupted.runs_left() == 1 and interrupted.needs_run(0, 3, REMEASURES)
    assert interrupted.runs_left(remeasures=0) == 0  # a round that measures none again
    retaken = (*interrupted.runs, *[_run(0, 3, 1.0, other=0.7)] * REMEASURES)
    assert dataclasses.replace(interrupted, runs=retaken).runs_left() == 0  # retakes used up
    # a finished round is not run again: what it kept of a busy machine stays as measured
    assert dataclasses.replace(interrupted, complete=True).runs_left() == 0
    # a busy run that ended below the bar is not taken again: the same seed learns the same
    # (a new user's round took "acc 0.795 ... infeasible" three times under load)
    infeasible = dataclasses.replace(busy[-1], feasible=False)
    below = dataclasses.replace(interrupted, runs=(*busy[:-1], infeasible, _run(1, 3, 3.0)))
    assert not below.needs_run(0, 3, REMEASURES) and below.runs_left() == 0


def test_the_confirmation_round_measures_a_flagged_run_again(tmp_path: Path):
    spec = restrict(parse_spec(SPACE, tmp_path / "space.yaml"), CPU).spec
    workload = load(spec.workload)
    study = open_study(spec, open_storage(f"sqlite:///{tmp_path / 's.db'}"), CPU, workload)
    run_study(StudyInputs(study, spec, CPU, Interfering(workload, flagged=0)))
    heard: list[tuple[int, int, bool]] = []
    record = confirm_study(
        ConfirmationInputs(
            study,
            spec.objective,
            Interfering(workload, flagged=2),  # the first run, and its first re-measure
            top=1,
            repeats=1,
            on_run=lambda run, done, total: heard.append((run.trial, run.repeat, run.interfered)),
        )
    )
    assert record is not None and record.complete
    first = record.candidates[0]
    # flagged, measured again (flagged), measured again (clean); then the next candidate
    assert heard[:3] == [(first, 1, True), (first, 1, True), (first, 1, False)]
    assert len(heard) == 3 + len(record.candidates) - 1
    confirmed = next(
        c
        for c in Answer.of_round(record, optuna.trial.create_trial(value=0.0)).configurations
        if c.trial == first
    )
    assert len(confirmed.values) == 2 and not confirmed.interfered  # original + clean run

    # a machine that never quiets down: the first run is measured 1 + REMEASURES times; its
    # retakes all busy, the machine stays busy: the later runs are kept as measured
    flagged = Interfering(workload, flagged=100)
    again = confirm_study(ConfirmationInputs(study, spec.objective, flagged, top=2, repeats=2))
    assert again is not None
    new = [run for run in again.runs if run.repeat and run not in record.runs]  # 0: the trial
    assert all(run.interfered for run in new)
    measured = list(Counter((run.trial, run.repeat) for run in new).values())
    assert len(measured) >= 2 and measured == [1 + REMEASURES] + [1] * (len(measured) - 1)
    # another process (or a resume) reading the round decides alike: nothing left to retake
    read = confirm_study(ConfirmationInputs(study, spec.objective, flagged, top=2, repeats=2))
    assert read is not None and read.runs == again.runs
