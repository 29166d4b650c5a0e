"""What this machine can do: the training device, its precisions, torch.compile, CPU cores."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from autotune.errors import UserError
from autotune.machine.interference import usable_cores


class DeviceError(UserError):
    """The requested device does not exist on this machine (a user error)."""


@dataclass(frozen=True)
class Hardware:
    """The training device and what it supports. Plain data: tests build one for any machine."""

    device: str  # "cpu" or "cuda:N"
    device_name: str  # e.g. "NVIDIA H100 80GB HBM3" or "AMD EPYC (2 cores)"
    cpu_count: int  # cores this process may use
    cuda_capability: tuple[int, int] | None  # (major, minor) on CUDA, None on CPU
    bf16: bool  # bfloat16 autocast runs (natively or emulated)
    fp16: bool  # float16 autocast with GradScaler runs
    tf32: bool  # TensorFloat-32 matmul/convolution (NVIDIA Ampere and newer)
    cuda_graphs: bool  # CUDA graphs (compile modes reduce-overhead and max-autotune)
    compile_problem: str | None  # why torch.compile cannot run here; None when it can
    torch_version: str
    memory_bytes: int | None = None  # the GPU's memory; None on the CPU
    cpu_share: bool = False  # cpu_count is this worker's share of the machine (--workers, --gpus)
    gpu_count: int = 0  # CUDA GPUs this process sees (its CUDA_VISIBLE_DEVICES)
    gpu_names: tuple[str, ...] = ()  # the model of each of them, by index
    bf16_native: bool = False  # bfloat16 in hardware (a GPU from Ampere on, a CPU with
    # AVX512-BF16, AMX or Arm's BF16): where the tuning checklist turns it on

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")


def _cpuinfo(*keys: str) -> list[str]:
    """The values of the kernel's /proc/cpuinfo lines named ``keys`` ([] where unreadable)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith(keys)]


def _cpu_native_bf16() -> bool:
    """Whether this CPU computes in bfloat16 in hardware (x86 AVX512-BF16 or AMX, Arm BF16)."""
    flags = {flag for line in _cpuinfo("flags", "Features") for flag in line.split()}
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def _compile_problem(device_type: str) -> str | None:
    """Why Inductor (torch.compile's default backend) cannot build kernels here, or None."""
    if device_type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "torch.compile on CUDA needs Triton, which is not installed"
        named = os.environ.get("CC")
        compilers = [named] if named else ["cc", "gcc", "clang"]
        if not any(shutil.which(c) for c in compilers):
            return (
                "torch.compile on CUDA needs a C compiler (gcc or clang, or $CC) on PATH: "
                "Triton builds its kernel launchers with it"
            )
        include = sysconfig.get_paths().get("include")  # this Python's headers, Python.h
        if include is None or not (Path(include) / "Python.h").is_file():
            return (
                "torch.compile on CUDA needs this Python's headers (Python.h; the python3-dev "
                "package on Debian and Ubuntu): Triton builds its kernel launchers with them"
            )
        return None
    compiler = os.environ.get("CXX") or next(
        (c for c in ("g++", "c++", "clang++") if shutil.which(c)), None
    )
    if compiler is None or shutil.which(compiler) is None:
        return "torch.compile on CPU needs a C++ compiler (g++ or clang++) on PATH"
    return None


def device_name(device: str) -> str:
    """A person-readable name of a device: the GPU model, or the CPU model and core count."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    named = _cpuinfo("model name")
    cpu = named[0] if named else platform.processor() or platform.machine() or "CPU"
    cores = usable_cores()
    return f"{cpu} ({cores} core{'' if cores == 1 else 's'})"


def detect(device: str = "auto") -> Hardware:
    """Describe the device ``device`` (auto, cpu, cuda, cuda:N); DeviceError if it is absent."""
    cores = usable_cores()
    if device == "auto":
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return Hardware(
            device="cpu",
            device_name=device_name("cpu"),
            cpu_count=cores,
            cuda_capability=None,
            bf16=True,  # autocast to bfloat16 runs on every CPU, emulated where not native
            fp16=False,  # the study would only measure emulation: fp16 is a GPU technique
            tf32=False,
            cuda_graphs=False,
            compile_problem=_compile_problem("cpu"),
            torch_version=torch.__version__,
            bf16_native=_cpu_native_bf16(),
        )
    if not torch.cuda.is_available():
        raise DeviceError(
            f"device '{device}' was asked for, but this machine has no usable CUDA GPU "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False)"
        )
    index = 0 if device == "cuda" else int(device.split(":", 1)[1])
    if index >= torch.cuda.device_count():
        raise DeviceError(
            f"device '{device}' was asked for, but only {torch.cuda.device_count()} CUDA "
            f"device(s) are visible"
        )
    capability = torch.cuda.get_device_capability(index)
    bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    return Hardware(
        device=f"cuda:{index}",
        device_name=torch.cuda.get_device_name(index),
        cpu_count=cores,
        cuda_capability=capability,
        bf16=bf16,
        fp16=True,
        tf32=capability >= (8, 0),
        cuda_graphs=True,
        compile_problem=_compile_problem("cuda"),
        torch_version=torch.__version__,
        memory_bytes=torch.cuda.get_device_properties(index).total_memory,
        gpu_count=torch.cuda.device_count(),
        gpu_names=tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())),
        bf16_native=bf16,
    )
