"""``batch_size: auto`` (``autotune.stage1._probe``): after the doubling's memory wall, the sizes
between the last that ran and the wall (Lightning's "binsearch"), in a study and under
``--workers``. The doubling's own stops are tested in test_speed."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config import TrialConfig
from autotune.executor import InProcessExecutor
from autotune.faults import FaultKind, TrialFault
from autotune.spacefile import parse_spec
from autotune.speed import BurstPlan, SpeedMeasurement
from autotune.stage1._probe import WAITING, Speed, doubled
from autotune.study import (
    SpeedRecord,
    StudyRecord,
    TrialRecord,
    speed_study_name,
    study_lock,
    trial_config,
)
from autotune.testing import start_cli
from autotune.workloads import Workload, load

OOM: Speed = ("oom", "CUDA out of memory")


def _probe(speeds: dict[int, float], again: dict[int, float] | None = None, start: int = 32):
    """``doubled`` from ``start`` on recorded samples/s (a size not listed runs out of memory),
    ``again`` the pooled figures of a second measurement; what it found, and each size timed."""
    timed: list[int] = []

    def speed_of(batch: int, figures: dict[int, float] = speeds) -> Speed:
        timed.append(batch)
        return figures.get(batch, OOM)

    pooled = (lambda batch: speed_of(batch, again)) if again is not None else None
    return *doubled(start, None, speed_of, pooled), timed


DOUBLING = {32: 1000.0, 64: 1900.0, 128: 3500.0, 256: 6000.0, 512: 9000.0}


def test_after_the_wall_the_probe_tries_halfway_in_multiples_of_8_while_each_gains():
    sizes, line, timed = _probe({**DOUBLING, 768: 11000.0})
    assert sizes == [32, 64, 128, 256, 512, 768]
    assert line == "batch_size auto: 32 to 768 (1024 ran out of memory; 896, 832 too)"
    # halfway to the wall, then halfway again, until the gap is an eighth of what ran: 3 at most
    assert timed == [32, 64, 128, 256, 512, 1024, 768, 896, 832]
    sizes, line, timed = _probe({**DOUBLING, 768: 11000.0, 896: 12500.0})
    assert sizes[-2:] == [768, 896] and timed[-4:] == [1024, 768, 896, 960]
    assert line == "batch_size auto: 32 to 896 (1024 ran out of memory; 960 too)"
    sizes, line, timed = _probe({**DOUBLING, 768: 11000.0, 896: 12500.0, 960: 14000.0})
    assert sizes[-1] == 960 and timed[-1] == 960  # 1024 - 960: within an eighth of 960
    assert line == "batch_size auto: 32 to 960 (1024 ran out of memory)"
    # from a batch that is not a multiple of 8: halfway between 24 and 48 is 36, tried as 32
    sizes, line, timed = _probe({12: 900.0, 24: 1700.0}, start=12)
    assert timed == [12, 24, 48, 32] and sizes == [12, 24]
    assert line == "batch_size auto: 12 to 24 (48 ran out of memory; 32 too)"


def test_a_wall_right_above_the_last_size_ends_the_bisection_after_three_sizes():
    sizes, line, timed = _probe(DOUBLING)
    assert sizes == [32, 64, 128, 256, 512]
    assert timed[-4:] == [1024, 768, 640, 576]  # 576 - 512 = an eighth of 512: no more
    assert line == "batch_size auto: 32 to 512 (1024 ran out of memory; 768, 640, 576 too)"


def test_a_bisected_size_that_does_not_gain_stops_it_as_a_doubling_would():
    # 768 seems to gain 5% over 512: both measured once more, and on the pooled figures it
    # still gains under the 5.7% that 1.5 times the batch needs (10% a doubling), so it is not
    # kept and nothing larger is tried
    again = {512: 9000.0, 768: 9450.0}
    sizes, line, timed = _probe({**DOUBLING, 768: 9400.0}, again)
    assert sizes == [32, 64, 128, 256, 512]
    assert line == "batch_size auto: 32 to 512 (1024 ran out of memory; 768 gained 5%)"
    assert timed[-3:] == [768, 512, 768]
    # pooled, it gains: kept, and the bisection goes on
    sizes, _, _ = _probe({**DOUBLING, 768: 9400.0}, {512: 9000.0, 768: 11000.0})
    assert sizes[-1] == 768
    # 6% for 1.5 times the batch pays as 10% for twice would: kept, though under 10%
    sizes, _, _ = _probe({**DOUBLING, 768: 9550.0})
    assert sizes[-1] == 768


# stage 1 timed by the sleep in each step: samples/s grows with the batch, as on a GPU
AUTO_SPACE = """\
study:
  name: auto
  n_trials: {n_trials}
  n_startup_trials: 2
  pruner: none
  seed: 0
  confirm: false
  baseline: {{batch_size: 8}}
  speed: {{max_seconds: 1, bursts: 2, burst_seconds: 0.02}}
workload:
  model: autotune.testing:tiny_mlp
  model_args: {{oom_at_batch: 56, step_delay_seconds: {delay}}}
  data: autotune.testing:blobs
  epochs: 1
  device: cpu
space:
  lr: {{low: 1.0e-3, high: 1.0e-1, log: true}}
  batch_size: auto
"""
FOUND = "batch_size auto: 8 to 48 (64 ran out of memory; 56 too)"  # 48: 50% over 32


class _StoppedOnce(InProcessExecutor):
    """In this process, but the first measurement of a micro-batch of ``batch`` is stopped, as
    a worker's is on a machine that others keep busy."""

    def __init__(self, workload: Workload, batch: int) -> None:
        super().__init__(workload)
        self.batch, self.stopped = batch, 0

    def measure(self, config: TrialConfig, plan: BurstPlan) -> SpeedMeasurement:
        if config.batch_size == self.batch and not self.stopped:
            self.stopped += 1
            busy = "no result after 15 s; other processes took 80% of its cores meanwhile"
            raise TrialFault(FaultKind.TIMEOUT_UNDER_LOAD, busy)
        return super().measure(config, plan)


def test_a_study_searches_the_largest_batch_the_bisection_found_under_the_wall(
    tmp_path: Path, prepare_study
):
    space = AUTO_SPACE.format(n_trials=2, delay=0.005)
    # a measurement the machine's load stopped says nothing of its size: timed again
    executor = _StoppedOnce(load(parse_spec(space).workload, tmp_path), batch=16)
    study, url, outcome, _ = prepare_study(space, tmp_path, executor=executor)
    assert executor.stopped == 1
    assert outcome.speed_table is not None and outcome.speed_table.batch_size_auto == FOUND
    assert StudyRecord.of(study).batch_sizes == [8, 16, 32, 48]
    # the probe's sizes stored (each round once): stage 1 took them, its table has 48
    speed = optuna.load_study(study_name=speed_study_name("auto"), storage=url)
    records = [r for r in map(SpeedRecord.of, speed.trials) if r is not None]
    assert {r.cell for r in records} == {f"batch {b}, fp32" for b in (8, 16, 32, 64, 48, 56)}
    timed = [r for r in records if r.fail_kind != "interrupted"]
    assert len({(r.cell, r.round) for r in timed}) == len(timed) == len(records) - 1
    assert outcome.speed_table is not None
    assert {c.batch_size for c in outcome.speed_table} == {8, 16, 32, 48}
    (checklist,) = [t for t in study.trials if TrialRecord.of(t).checklist]
    assert trial_config(checklist).batch_size == 48  # the largest that fits, not 32
    assert checklist.state == TrialState.COMPLETE


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="2 workers need 2 cores")
@pytest.mark.slow
def test_under_workers_one_process_probes_while_the_other_waits_saying_so_and_both_search_it(
    tmp_path: Path, prepare_study
):
    space = AUTO_SPACE.format(n_trials=2, delay=0.005)
    # trials and measurements in the workers' own processes: two processes start torch, not four
    space = space.replace("  confirm: false\n", "  confirm: false\n  isolation: none\n")
    study = prepare_study(space, tmp_path, run=False).study  # where `run` finds it
    # the study's probe lock held here until both workers wait for it: then one of them probes
    with study_lock(study, purpose="batch_size", held_long=True):
        run = start_cli("run", "space.yaml", "--workers", "2", cwd=tmp_path)
        (lock,) = (tmp_path / "studies").glob("*.batch_size-*.lock")
        deadline = time.monotonic() + 120
        while _waiting_for(lock) < 2:
            assert time.monotonic() < deadline and run.poll() is None, run.communicate()
            time.sleep(0.1)
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, out + err
    log = (tmp_path / "studies" / "auto.workers" / "worker-2.log").read_text()
    outputs = [" ".join(said.split()) for said in (out, log)]
    assert all(FOUND in said for said in outputs)  # the same list, read by both
    # each said once that it waited (for this test, then one of them for the other), piped
    assert [said.count(WAITING) for said in outputs] == [1, 1], outputs
    url = f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}"
    record = StudyRecord.of(optuna.load_study(study_name="auto", storage=url))
    assert record.batch_sizes == [8, 16, 32, 48]
    # one of them timed the probe's six sizes (the stage's budget spent by then: nothing more),
    # the other waited for its list and timed none
    timed = sorted(int(re.findall(r"(\d+) settings? timed", said)[0]) for said in outputs)
    assert timed == [0, 6], outputs


def _waiting_for(lock: Path) -> int:
    """How many processes wait for ``lock``'s flock (Linux's /proc/locks: "->" marks one)."""
    inode = f":{lock.stat().st_ino} "
    return sum(
        "->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines()
    )
