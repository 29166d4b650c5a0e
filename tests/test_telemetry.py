"""Telemetry: GPU utilization from NVML, FLOPs per sample and peak FLOPs, and what a study
records of them."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest
import torch
from torch import nn

from autotune.training.telemetry import GpuSampler, flops_per_sample, peak_flops


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
    inputs, targets = torch.randn(4, 10), torch.tensor([0, 1, 2, 3])

    def loss() -> torch.Tensor:
        return nn.functional.cross_entropy(model(inputs), targets)

    flops = flops_per_sample(model, loss, samples=4)
    # forward 2*10*5 per sample, backward of the weights as much again (the input needs none)
    assert flops == pytest.approx(200, rel=0.1)
    assert torch.equal(model[2].running_mean, before) and model.training
    assert all(p.grad is None for p in model.parameters())

    def unfollowable() -> torch.Tensor:
        raise RuntimeError("a model the counter cannot follow")

    assert flops_per_sample(model, unfollowable, samples=4) is None


def test_peak_flops_only_for_gpus_we_know():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.5e12
    assert peak_flops("NVIDIA H100 PCIe", "tf32") == 378e12
    assert peak_flops("NVIDIA H100 NVL", "bf16") == 835.5e12  # not the SXM part's 989.5
    # a MIG slice has a share of the SMs: no MFU against the whole GPU's peak
    assert peak_flops("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "bf16") is None
    assert peak_flops("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "fp16") is None
    assert peak_flops("NVIDIA H200", "fp32-strict") == 67e12  # plain FP32, no TF32
    # fp32 is PyTorch's defaults: its convolutions may run at the TF32 rate, so an MFU against
    # plain FP32 could pass 100%; against TF32 it cannot
    assert peak_flops("NVIDIA H200", "fp32") == 494.5e12
    assert peak_flops("Tesla V100-SXM2-16GB", "fp32") == 15.7e12  # no TF32 there
    assert peak_flops("NVIDIA A100-SXM4-40GB", "fp16") == 312e12
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None
    assert peak_flops("NVIDIA GeForce RTX 4090", "bf16") is None
    assert peak_flops("NVIDIA L4", "bf16") == 121e12
    assert peak_flops("NVIDIA L40S", "bf16") is None  # not an L4
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
