"""A model under one configuration: the learning-rate schedules, and the TF32 and cuDNN flags a
trial sets and restores."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from autotune.testing import cuda_flags, learning_rates, make_config
from autotune.training.trainer import Trainer, backend_flags


def _lrs(config, total_steps: int) -> list[float]:
    trainer = Trainer(nn.Linear(2, 2), config, total_steps)
    return learning_rates(trainer.optimizer, trainer.scheduler, total_steps)


def test_schedules_follow_the_trial_steps():
    assert _lrs(make_config(lr=0.1, schedule="constant"), 10) == [0.1] * 10
    warm = _lrs(make_config(lr=0.1, schedule="constant", warmup_fraction=0.4), 10)
    assert warm[:4] == pytest.approx([0.025, 0.05, 0.075, 0.1]) and warm[4:] == [0.1] * 6
    cosine = _lrs(make_config(lr=0.1, schedule="cosine", warmup_fraction=0.2), 10)
    assert cosine[1] == pytest.approx(0.1) and max(cosine) == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(cosine[1:]))
    assert cosine[-1] < 0.01
    onecycle = _lrs(make_config(lr=0.1, schedule="onecycle", warmup_fraction=0.3), 20)
    peak = onecycle.index(max(onecycle))
    assert 4 <= peak <= 7 and max(onecycle) == pytest.approx(0.1, rel=0.05)
    assert onecycle[0] < 0.01 and onecycle[-1] < 0.001


def test_cuda_flags_are_set_for_the_trial_and_restored():
    """TF32 and cudnn.benchmark flags (settable without a GPU) follow the trial, then revert."""
    before = cuda_flags()
    with backend_flags(make_config(precision="tf32", cudnn_benchmark=True, device="cuda")):
        assert cuda_flags() == ("high", True, True, True)
    assert cuda_flags() == before
    with backend_flags(make_config(precision="fp32", device="cuda")):
        assert cuda_flags() == ("highest", False, True, False)  # PyTorch's defaults
    with backend_flags(make_config(precision="fp32-strict", device="cuda")):
        assert cuda_flags() == ("highest", False, False, False)
    with pytest.raises(RuntimeError), backend_flags(make_config(precision="tf32", device="cuda")):
        raise RuntimeError("trial failed")
    assert cuda_flags() == before


def test_flags_set_through_the_per_backend_tf32_api_are_worked_with_and_put_back():
    """Code before the trial (the user's, Lightning) set TF32 through the per-backend
    ``fp32_precision`` API, after which torch.get_float32_matmul_precision() raises: the trial
    still sets its own flags, and the user's are there again after it."""
    matmul = torch.backends.cuda.matmul
    try:
        matmul.fp32_precision = "tf32"
        with pytest.raises(RuntimeError):
            torch.get_float32_matmul_precision()  # what the trial's flags used to read
        with backend_flags(make_config(precision="fp32", device="cuda")):
            assert torch.get_float32_matmul_precision() == "highest"
        assert matmul.fp32_precision == "tf32"
    finally:
        torch.set_float32_matmul_precision("highest")  # PyTorch's default, for the next test
    assert torch.get_float32_matmul_precision() == "highest"


def test_tf32_flags_leave_compile_working():
    """Inductor reads the matmul precision while compiling: the TF32 setting must not break it."""
    model = nn.Linear(8, 4)
    with backend_flags(make_config(precision="tf32", device="cuda")):
        compiled = torch.compile(model)
        out = compiled(torch.randn(2, 8))
    assert out.shape == (2, 4)


def test_cudnn_benchmark_on_and_off_need_processes_of_their_own_on_cuda():
    from autotune.training.trainer import cudnn_plans_differ

    off = make_config(device="cuda:0", cudnn_benchmark=False)
    on = off.replace(cudnn_benchmark=True)
    assert cudnn_plans_differ(off, on) and cudnn_plans_differ(on, off)
    assert not cudnn_plans_differ(off, off.replace(batch_size=off.batch_size * 2))
    cpu = make_config(device="cpu", cudnn_benchmark=False)  # no cuDNN: nothing to share
    assert not cudnn_plans_differ(cpu, cpu.replace(cudnn_benchmark=True))


def test_the_untuned_baseline_trains_with_the_flags_of_a_script_that_sets_none():
    """The baseline is what a script that sets no flag gets: TF32 convolutions included on a
    GPU, or every speed-up over it is inflated. Compared with a fresh interpreter's."""
    import subprocess
    import sys

    from autotune.knobs import KNOBS

    fresh = subprocess.run(
        [sys.executable, "-c", "from autotune.testing import cuda_flags; print(*cuda_flags())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    with backend_flags(make_config(device="cuda", **{k: i.default for k, i in KNOBS.items()})):
        assert [str(flag) for flag in cuda_flags()] == fresh


def test_fp16_steps_never_read_the_overflow_check_back_and_still_count_skips(monkeypatch):
    """Under fp16 the optimizer is fused: GradScaler hands it the overflow flag on the device
    instead of reading it back each step (a synchronization on a GPU: 1.4 ms a step of a
    ResNet-18 at batch 512 on an H200, against 0.2 ms under bf16). Skipped steps are counted
    on the device and read at evaluations."""
    from autotune.training.trainer import Trainer

    def read_back(*_args, **_kwargs):
        raise AssertionError("GradScaler read its overflow check back (an unfused step)")

    monkeypatch.setattr(torch.amp.GradScaler, "_maybe_opt_step", read_back)
    # what uninitialised memory may hold (what earlier tests left there): fused SGD's skipped
    # first step leaves its momentum buffers so, which the next step applied (weights NaN)
    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: empty_like(*a, **k).fill_(math.nan))
    for optimizer in ("sgd", "adamw"):
        config = make_config(precision="fp16", optimizer=optimizer, lr=0.01, momentum=0.9)
        trainer = Trainer(nn.Linear(4, 3), config, total_steps=10)
        assert trainer.optimizer.defaults["fused"] is True
        torch.manual_seed(0)  # small inputs: no fp16 overflow but the ones put in below
        inputs, targets = 0.1 * torch.randn(8, 4), torch.randint(0, 3, (8,))
        outcomes = []
        for overflow in (True, True, False, True):
            before = [p.detach().clone() for p in trainer.model.parameters()]
            trainer.forward_backward(inputs, targets)
            if overflow:  # an fp16 gradient that overflowed
                next(trainer.model.parameters()).grad[0, 0] = float("inf")
            trainer.optimizer_step()
            after = list(trainer.model.parameters())
            changed = any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
            outcomes.append((changed, trainer.skipped_steps, trainer.skipped_in_a_row))
        # an overflowing step leaves the weights as they were; a run of them is counted, and
        # an applied step ends the run
        assert [changed for changed, _, _ in outcomes] == [False, False, True, False]
        assert [(total, run) for _, total, run in outcomes] == [(1, 1), (2, 2), (2, 0), (3, 1)]


def test_other_precisions_keep_pytorchs_default_optimizer_and_count_no_skips():
    from autotune.training.trainer import Trainer

    trainer = Trainer(nn.Linear(4, 3), make_config(precision="fp32"), total_steps=10)
    assert not trainer.optimizer.defaults.get("fused")  # the untuned baseline's own
    trainer.forward_backward(torch.randn(8, 4), torch.randint(0, 3, (8,)))
    trainer.optimizer_step()
    assert (trainer.skipped_steps, trainer.skipped_in_a_row) == (0, 0)
