"""Where the time goes: time breakdown and bottleneck, telemetry, the untuned baseline, the
optuna-dashboard note and artifacts, and the HTML report."""

from __future__ import annotations

import html.parser
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import optuna_dashboard
import pytest
import torch
from optuna.artifacts import FileSystemArtifactStore, download_artifact, get_all_artifact_meta
from torch import nn

from autotune import notes, report
from autotune.runner import train
from autotune.spec import WorkloadSpec
from autotune.study import TrialRecord
from autotune.telemetry import GpuSampler, flops_per_sample, peak_flops
from autotune.testing import make_config, never_stop
from autotune.timing import PHASES, PhaseProbe, bottleneck
from autotune.workloads import load


def test_the_probe_charges_each_phase_its_own_time():
    """Each phase is charged the span that ends at its mark (sleeps are lower bounds that no
    load can shorten), only inside the probe's window."""
    spans = {"data_wait": 0.03, "host_to_device": 0.0, "forward_backward": 0.06, "optimizer": 0.02}
    probe = PhaseProbe(torch.device("cpu"), first_micro_batch=2, micro_batches=2)
    started = time.perf_counter()
    for micro_batch in (1, 2, 3, 4):
        probe.begin(micro_batch)
        for phase in PHASES:
            time.sleep(spans[phase])
            probe.mark(phase)
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


class FakeNVML:
    """The functions of pynvml that GpuSampler calls, answering like a busy GPU."""

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.calls: list[str] = []
        self.readings = iter([90, 70, 80] * 1000)

    def nvmlInit(self):
        self.calls.append("init")
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        raise RuntimeError("no such GPU")

    def nvmlDeviceGetHandleByIndex(self, index):
        self.calls.append(f"handle {index}")
        return ("handle", index)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=next(self.readings), memory=30)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=2 * 2**30, total=80 * 2**30)

    def nvmlShutdown(self):
        self.calls.append("shutdown")


def test_nvml_sampler_with_a_fake_handle():
    nvml = FakeNVML()
    sampler = GpuSampler(torch.device("cuda", 0), nvml=nvml, interval_seconds=0.01)
    with sampler:
        deadline = 0
        while len(sampler.utilization) < 6 and deadline < 500:
            torch.zeros(1)  # something to do
            deadline += 1
            import time

            time.sleep(0.01)
    summary = sampler.summary()
    assert 0.7 <= summary["gpu_utilization"] <= 0.9
    assert summary["gpu_memory_used_bytes"] == 2 * 2**30
    assert nvml.calls[:2] == ["init", "handle 0"] and nvml.calls[-1] == "shutdown"
    broken = GpuSampler(torch.device("cuda", 0), nvml=FakeNVML(fail_init=True))
    with broken:
        pass
    assert broken.summary() == {}  # telemetry never fails a trial
    assert GpuSampler(torch.device("cpu")).summary() == {}


def test_flops_are_counted_without_touching_the_training():
    model = nn.Sequential(nn.Flatten(), nn.Linear(10, 5), nn.BatchNorm1d(5))
    before = model[2].running_mean.clone()
    flops = flops_per_sample(model, (10,), torch.device("cpu"), nn.functional.cross_entropy)
    # forward 2*10*5 per sample, backward of the weights as much again (the input needs none)
    assert flops == pytest.approx(200, rel=0.1)
    assert torch.equal(model[2].running_mean, before) and model.training
    assert all(p.grad is None for p in model.parameters())
    assert flops_per_sample(model, (), torch.device("cpu"), nn.functional.cross_entropy) is None


def test_peak_flops_only_for_gpus_we_know():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.5e12
    assert peak_flops("NVIDIA H100 PCIe", "tf32") == 378e12
    assert peak_flops("NVIDIA H200", "fp32") == 67e12
    assert peak_flops("NVIDIA A100-SXM4-40GB", "fp16") == 312e12
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None
    assert peak_flops("NVIDIA GeForce RTX 4090", "bf16") is None
    assert peak_flops("AMD EPYC (2 cores)", "fp32") is None


def test_trials_and_study_say_where_the_time_went(seen):
    study, _ = seen
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete
    for trial in complete:
        attrs = trial.user_attrs
        assert abs(sum(attrs["time_breakdown"].values()) - 1) < 0.01
        assert attrs["bottleneck"] in ("data", "compute", "overhead")
        assert 0 <= attrs["data_wait_fraction"] <= 1
        assert attrs["achieved_flops"] > 0 and attrs["flops_per_sample"] > 0
        assert "mfu" not in attrs  # no peak for a CPU: nothing is guessed
    hardware = study.user_attrs["hardware"]
    assert hardware["device"] == "cpu" and hardware["cpu_cores"] >= 1 and hardware["torch"]


def test_trial_zero_is_the_untuned_baseline(seen):
    study, _ = seen
    first = study.trials[0]
    assert first.user_attrs["baseline"] is True
    assert first.params["precision"] == "fp32" and first.params["num_workers"] == 0
    assert first.params["batch_size"] == 64  # autotune's documented default, in the space
    assert 0.005 <= first.params["lr"] <= 0.1
    assert not any(t.user_attrs.get("baseline") for t in study.trials[1:])


def test_note_and_artifacts_are_readable_back(seen, tmp_path: Path):
    study, url = seen
    notes.write_note(study, url)
    note = optuna_dashboard.get_note(study)
    summary = notes.summarize(study)
    assert f"**Best: trial {summary.best.number}**" in note
    assert "the untuned baseline" in note or summary.best.number == 0
    assert f"autotune export --study seen --storage {url}" in note
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


class _Structure(html.parser.HTMLParser):
    """Checks that elements close in order and collects the text."""

    VOID = frozenset({"meta", "br", "img", "input", "link", "hr", "col", "area", "base", "wbr"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.text: list[str] = []
        self.seen: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.seen.add(tag)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def test_the_report_is_one_valid_offline_html_file(seen):
    study, url = seen
    page = report.render_html(study, url)
    parser = _Structure()
    parser.feed(page)
    parser.close()
    assert parser.problems == [] and parser.stack == []
    assert page.startswith("<!DOCTYPE html>") and {"html", "head", "body", "table"} <= parser.seen
    best = notes.summarize(study).best
    assert f"Best: trial {best.number}" in " ".join("".join(parser.text).split())
    assert "Plotly" in page and 'src="http' not in page  # plotly is inlined: opens offline
    for heading in ("Where the time goes", "Accuracy and speed", "Optimization history"):
        assert heading in page


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
