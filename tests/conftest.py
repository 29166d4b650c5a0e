"""Shared helpers: tiny space files and a way to run the real ``autotune`` command."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from autotune.config import TrialConfig

TINY_SPACE = """\
study:
  name: tiny
  n_trials: {n_trials}
  n_startup_trials: 3
  pruner: {pruner}
  seed: 0
workload:
  model: autotune.testing:tiny_mlp
  data: autotune.testing:blobs
  epochs: 2
  eval_every: 1
  device: cpu
objective:
  min_accuracy: 0.5
space:
  lr: {{low: 1.0e-3, high: 1.0e-1, log: true}}
  batch_size: [16, 32]
  accumulation_steps: [1, 2]
  precision: [fp32, bf16, fp16]
  pin_memory: [false, true]
"""


def write_space(directory: Path, text: str | None = None, name: str = "tiny.yaml", **fields):
    """Write a space file (the tiny one by default, formatted with ``fields``)."""
    values = {"n_trials": 4, "pruner": "none", **fields}
    path = directory / name
    path.write_text(textwrap.dedent(text) if text is not None else TINY_SPACE.format(**values))
    return path


def run_cli(
    *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m autotune ARGS`` in ``cwd`` as a user would, capturing its output;
    ``env`` adds to the environment."""
    env = {**os.environ, "COLUMNS": "160", "PYTHONWARNINGS": "ignore", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def make_config(**changes) -> TrialConfig:
    """A plain CPU configuration: fp32, eager, AdamW, constant lr, no workers."""
    base = {
        "lr": 1e-2,
        "base_lr": 1e-2,
        "lr_scaling": "none",
        "base_batch_size": 256,
        "batch_size": 32,
        "accumulation_steps": 1,
        "optimizer": "adamw",
        "weight_decay": 0.0,
        "momentum": None,
        "nesterov": False,
        "schedule": "constant",
        "warmup_fraction": 0.0,
        "num_workers": 0,
        "pin_memory": False,
        "prefetch_factor": None,
        "persistent_workers": False,
        "precision": "fp32",
        "compile": "none",
        "channels_last": False,
        "cudnn_benchmark": False,
        "device": "cpu",
        "epochs": 2.0,
        "eval_every": 1.0,
        "val_batch_size": 256,
        "seed": 0,
    }
    return TrialConfig(**{**base, **changes})


def never_stop(evaluation: object) -> bool:
    """A reporter that lets every trial train to its end."""
    return False


def cuda_flags() -> tuple[str, bool, bool, bool]:
    """The process-wide TF32 and cuDNN settings a trial changes and must restore."""
    cudnn = torch.backends.cudnn
    return (
        torch.get_float32_matmul_precision(),  # raises if legacy and new TF32 APIs were mixed
        torch.backends.cuda.matmul.allow_tf32,
        cudnn.allow_tf32,
        cudnn.benchmark,
    )


@pytest.fixture
def tiny_space(tmp_path: Path) -> Path:
    return write_space(tmp_path)
