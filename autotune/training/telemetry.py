"""What the hardware did during a trial: GPU utilization and memory (NVML), FLOPs and model FLOP
utilization, and the fingerprint of the machine a study ran on."""

from __future__ import annotations

import contextlib
import platform
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from autotune._imports import optional
from autotune.machine.hardware import Hardware, device_name

# Dense peak FLOP/s by GPU and precision, from the vendors' data sheets (no sparsity).
# fp32 is plain FP32 (TF32 off: autotune's fp32-strict); tf32 the tensor-core TF32 rate;
# bf16/fp16 tensor-core rates. autotune's fp32, PyTorch's defaults, runs convolutions at the
# TF32 rate and matmuls at the FP32 one: its MFU is against the TF32 peak (``peak_flops``).
# A GPU that is not listed gets no MFU: a guessed peak would be a made-up number. A device's row
# is the first whose words are all in its name (upper case, a space either side).
PEAK_FLOPS: dict[tuple[str, ...], dict[str, float]] = {
    ("H200",): {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12},
    ("H100", "NVL"): {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12},
    ("H100", "PCIE"): {"fp32": 51.2e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12},
    # the SXM part, "NVIDIA H100 80GB HBM3": the PCIe and NVL cards say so in their names
    ("H100",): {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12},
    ("A100",): {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    (" L4 ",): {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12},
    ("V100",): {"fp32": 15.7e12, "fp16": 125e12},
}


def peak_flops(device_name: str, precision: str) -> float | None:
    """The device's dense peak FLOP/s at ``precision``, or None when it is not known. fp32,
    PyTorch's defaults, may run its convolutions at the TF32 rate: its peak is that rate where
    the device has one (an MFU that cannot pass 100%); fp32-strict's is plain FP32."""
    name = f" {device_name.upper()} "
    # a MIG slice ("NVIDIA H100 80GB HBM3 MIG 1g.10gb") has a share of the GPU's SMs: an MFU
    # against the whole GPU's peak would be wrong by that share, so there is none
    rows = (peaks for words, peaks in PEAK_FLOPS.items() if all(w in name for w in words))
    peaks = None if " MIG " in name else next(rows, None)
    if peaks is None:
        return None
    if precision == "fp32":
        return peaks.get("tf32", peaks.get("fp32"))
    return peaks.get("fp32" if precision == "fp32-strict" else precision)


def flops_per_sample(
    model: nn.Module, training_loss: Callable[[], torch.Tensor], samples: int
) -> float | None:
    """FLOPs of one training step per sample, counted while ``training_loss()`` computes the
    loss of a batch of ``samples`` samples, back-propagated. The model runs in eval mode (batch
    norm statistics left alone) and its gradients are cleared afterwards (those allocated up
    front, under CUDA graphs, zeroed in place): the trial trains as it would without the count.
    """
    allocated = {id(p) for p in model.parameters() if p.grad is not None}
    was_training = model.training
    model.eval()
    try:
        with FlopCounterMode(display=False) as counter:
            training_loss().backward()
    except Exception:  # a model the counter cannot follow: no FLOPs rather than no trial
        return None
    finally:
        for parameter in model.parameters():
            if parameter.grad is None:
                continue
            if id(parameter) in allocated:
                parameter.grad.zero_()
            else:
                parameter.grad = None
        model.train(was_training)
    return counter.get_total_flops() / samples


class GpuSampler:
    """Samples a GPU's utilization and memory through NVML (``nvml``: pynvml, or a stand-in) in
    a background thread; where NVML is missing or fails, nothing: telemetry never fails a trial.
    """

    def __init__(
        self, device: torch.device, nvml: Any | None = None, interval_seconds: float = 0.1
    ) -> None:
        self.device = device
        # pynvml, or None where there is none; Any: nvml-ml-py ships no type information
        self.nvml: Any = (
            nvml if nvml is not None else (optional("pynvml") if device.type == "cuda" else None)
        )
        self.interval_seconds = interval_seconds
        self.utilization: list[float] = []  # percent of time a kernel ran, per sample
        self.memory_used: list[int] = []  # bytes
        self.paused = False  # set while the trial evaluates: training time only
        self._handle: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _open(self) -> Any:
        nvml = self.nvml
        nvml.nvmlInit()
        index = self.device.index or 0
        with contextlib.suppress(Exception):  # match by UUID: NVML numbers GPUs its own way
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            return nvml.nvmlDeviceGetHandleByUUID(
                uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
            )
        return nvml.nvmlDeviceGetHandleByIndex(index)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            if self.paused:
                continue
            try:
                rates = self.nvml.nvmlDeviceGetUtilizationRates(self._handle)
                memory = self.nvml.nvmlDeviceGetMemoryInfo(self._handle)
                self.utilization.append(float(rates.gpu))
                self.memory_used.append(int(memory.used))
            except Exception:
                return

    def __enter__(self) -> GpuSampler:
        if self.nvml is None:
            return self
        try:
            self._handle = self._open()
        except Exception:
            self.nvml = None
            return self
        self._thread = threading.Thread(target=self._run, name="autotune-nvml", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()

    def summary(self) -> dict[str, float]:
        """Mean utilization (0..1) and peak memory used (bytes), when anything was sampled."""
        if not self.utilization:
            return {}
        return {
            "gpu_utilization": sum(self.utilization) / len(self.utilization) / 100,
            "gpu_memory_used_bytes": float(max(self.memory_used)),
        }


def fingerprint(hardware: Hardware) -> dict[str, Any]:
    """The machine a study ran on: CPU, cores, GPU, driver, torch, CUDA and cuDNN versions."""
    facts: dict[str, Any] = {
        "device": hardware.device,
        "device_name": hardware.device_name,
        "cpu": device_name("cpu").rsplit(" (", 1)[0],
        "cpu_cores": hardware.cpu_count,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
    }
    if hardware.is_cuda:
        facts["gpu_capability"] = ".".join(map(str, hardware.cuda_capability or ()))
        facts["gpu_memory_bytes"] = hardware.memory_bytes
        nvml = optional("pynvml")
        if nvml is not None:
            with contextlib.suppress(Exception):
                nvml.nvmlInit()
                driver = nvml.nvmlSystemGetDriverVersion()
                facts["driver"] = driver.decode() if isinstance(driver, bytes) else driver
                nvml.nvmlShutdown()
    return {key: value for key, value in facts.items() if value is not None}
