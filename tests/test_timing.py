"""Where the time goes: the phase probe, a trial's time breakdown and the bottleneck it
implies."""

from __future__ import annotations

import time

import torch

from autotune.spacefile import WorkloadSpec
from autotune.study import TrialRecord
from autotune.testing import make_config, never_stop
from autotune.training.runner import train
from autotune.training.timing import PHASES, PhaseProbe, bottleneck
from autotune.workloads import load


def test_the_probe_charges_each_phase_its_own_time():
    """Each phase is charged its own span, back to back from the micro-batch's start (sleeps
    are lower bounds that no load can shorten), only inside the probe's window: the first phase
    of each begins the next micro-batch."""
    spans = {"data_wait": 0.03, "host_to_device": 0.0, "forward_backward": 0.06, "optimizer": 0.02}
    probe = PhaseProbe(torch.device("cpu"), first_micro_batch=2, micro_batches=2)
    started = time.perf_counter()
    for micro_batch in (1, 2, 3, 4):
        for phase in PHASES:
            with probe.phase(phase):
                time.sleep(spans[phase])
        if micro_batch == 3:
            window_ended = time.perf_counter()
        if micro_batch == 1:
            window_started = time.perf_counter()
    assert probe.completed
    seconds = probe.result()
    assert seconds is not None and set(seconds) == set(PHASES)
    for phase, span in spans.items():
        assert seconds[phase] >= 2 * span, (phase, seconds)  # two micro-batches in the window
    # nothing outside micro-batches 2 and 3 was counted
    assert sum(seconds.values()) <= window_ended - window_started
    assert window_started > started


def test_a_trial_records_its_breakdown_and_the_bottleneck_it_implies():
    # every training sample takes 2 ms to load: a micro-batch of 32 waits at least 64 ms
    slow_data = load(
        WorkloadSpec(
            model="autotune.testing:tiny_mlp",
            data="autotune.testing:blobs",
            data_args={"train_delay_seconds": 0.002},
        )
    )
    result = train(make_config(epochs=1, batch_size=32), slow_data, never_stop)
    seconds = result.time_breakdown
    assert seconds is not None and set(seconds) == set(PHASES)
    assert all(s >= 0 for s in seconds.values())
    assert seconds["data_wait"] >= 32 * 0.002
    record = TrialRecord.from_result(result, "fp32")
    assert record.time_breakdown is not None
    assert abs(sum(record.time_breakdown.values()) - 1) < 1e-3  # stored as shares
    total = sum(seconds.values())
    assert record.bottleneck == bottleneck({p: s / total for p, s in seconds.items()})


def test_bottleneck_rule():
    def shares(data, h2d, fwd, opt):
        return dict(zip(PHASES, (data, h2d, fwd, opt), strict=True))

    assert bottleneck(shares(0.5, 0.0, 0.4, 0.1)) == "data"
    assert bottleneck(shares(0.05, 0.05, 0.8, 0.1)) == "compute"
    assert bottleneck(shares(0.15, 0.05, 0.7, 0.1)) == "compute"  # unmeasured: not starved
    # a measured utilization decides busy-ness where there is one
    assert bottleneck(shares(0.05, 0.05, 0.8, 0.1), busy=0.4) == "overhead"
    assert bottleneck(shares(0.3, 0.05, 0.55, 0.1), busy=0.4) == "data"
    assert bottleneck(shares(0.05, 0.05, 0.8, 0.1), busy=0.9) == "compute"
