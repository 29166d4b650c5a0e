"""What this machine can do, as autotune detects it."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import pytest

from autotune.machine.hardware import detect


def test_detect_cpu_describes_this_machine():
    hardware = detect("cpu")
    assert hardware.device == "cpu" and not hardware.is_cuda
    assert hardware.cpu_count >= 1 and "cores" in hardware.device_name
    assert hardware.bf16 and not hardware.fp16 and not hardware.tf32


def test_compile_on_cuda_needs_triton_a_c_compiler_and_pythons_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Triton builds a C launcher for every kernel: without a compiler or Python.h every
    compiled trial would fail, so the modes are left out of the plan with one line."""
    import importlib.util

    from autotune.machine import hardware

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # Triton is here
    assert hardware._compile_problem("cuda") is None  # and so are gcc and Python.h
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler on it
    problem = hardware._compile_problem("cuda")
    assert problem is not None and "needs a C compiler" in problem
    monkeypatch.setenv("CC", sys.executable)  # any program found on PATH or by path will do
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    problem = hardware._compile_problem("cuda")
    assert problem is not None and "Python.h" in problem
    (tmp_path / "Python.h").write_text("/* the headers */\n")
    assert hardware._compile_problem("cuda") is None
