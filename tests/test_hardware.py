"""What this machine can do, as autotune detects it."""

from __future__ import annotations

from autotune.hardware import detect


def test_detect_cpu_describes_this_machine():
    hardware = detect("cpu")
    assert hardware.device == "cpu" and not hardware.is_cuda
    assert hardware.cpu_count >= 1 and "cores" in hardware.device_name
    assert hardware.bf16 and not hardware.fp16 and not hardware.tf32
