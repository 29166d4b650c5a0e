"""The CUDA paths, on a real GPU: every precision and data pipeline, the compile modes, a study
in a worker process, and an exported script resumed there. Skipped where there is no CUDA GPU;
on one, run ``python -m pytest tests/test_gpu.py`` first (a few minutes).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import TrialState

from autotune.config import TrialConfig
from autotune.pipeline import DeviceBatches
from autotune.results import TrialResult
from autotune.spacefile import WorkloadSpec
from autotune.testing import cuda_flags, make_config, never_stop, run_cli, write_space
from autotune.training.runner import train
from autotune.training.timing import PHASES
from autotune.workloads import load

pytestmark = [
    pytest.mark.slow,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SHAPES = WorkloadSpec(
    model="autotune.testing:tiny_cnn",
    data="shapes",
    data_args={"n_train": 4096, "n_val": 1024},
)


def cuda_config(**changes):
    """A CUDA configuration: batch 128, 1 epoch, unless ``changes`` say otherwise."""
    return make_config(**{"device": "cuda:0", "batch_size": 128, "epochs": 1, **changes})


def nvml_available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    return True


@pytest.mark.parametrize("pipeline", ["dataloader", "device"])
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
def test_every_precision_and_pipeline_trains_on_cuda(precision: str, pipeline: str):
    workers = {"num_workers": 2, "prefetch_factor": 2} if pipeline == "dataloader" else {}
    config = cuda_config(
        precision=precision,
        data_pipeline=pipeline,
        pin_memory=pipeline == "dataloader",
        channels_last=True,
        cudnn_benchmark=True,
        **workers,
    )
    before = cuda_flags()
    result = train(config, load(SHAPES), never_stop)
    assert cuda_flags() == before  # TF32 and cuDNN flags restored after the trial
    assert 0.0 <= result.score <= 1.0
    assert all(math.isfinite(e.train_loss) for e in result.evaluations)
    assert result.samples_per_second > 0 and result.peak_memory_bytes > 0
    assert result.time_breakdown is not None
    assert set(result.time_breakdown) == set(PHASES)
    assert sum(result.time_breakdown.values()) > 0  # CUDA events were recorded and read
    if nvml_available():
        assert 0.0 <= result.gpu["gpu_utilization"] <= 1.0
        assert result.gpu["gpu_memory_used_bytes"] > 0


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_compile_modes_compile_on_cuda(mode: str):
    result = train(cuda_config(compile=mode, precision="bf16"), load(SHAPES), never_stop)
    assert result.compiled_graphs >= 1
    assert result.compile_seconds is not None and result.compile_seconds > 0
    assert 0.0 <= result.score <= 1.0


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_graph_modes_train_with_gradient_accumulation(mode: str):
    """A gradient autograd took as .grad from a CUDA graph's pool would be overwritten by the
    next micro-batch's replay ("accessing tensor output of CUDAGraphs that has been
    overwritten"): the trainer accumulates into gradients allocated outside the pool."""
    from torch._dynamo.utils import counters

    config = cuda_config(compile=mode, precision="bf16", accumulation_steps=2)
    result = train(config, load(SHAPES), never_stop)
    assert result.compiled_graphs >= 1 and 0.0 <= result.score <= 1.0
    assert math.isfinite(result.samples_per_second) and result.samples_per_second > 0
    assert not counters["inductor"].get("cudagraph_skips"), dict(counters["inductor"])


def test_device_batches_live_on_the_gpu():
    workload = load(SHAPES)
    generator = torch.Generator(device="cuda:0").manual_seed(0)
    batches = DeviceBatches(workload.train_set, 64, torch.device("cuda:0"), generator)
    inputs, targets = next(iter(batches))
    assert inputs.is_cuda and targets.is_cuda and inputs.is_contiguous()
    assert inputs.shape == (64, 3, 32, 32) and inputs.dtype == torch.float32


GPU_SPACE = """\
study: {name: gpu, n_trials: 4, pruner: none, trial_timeout: 300}
workload:
  model: autotune.testing:tiny_cnn
  data: shapes
  data_args: {n_train: 4096, n_val: 1024}
  epochs: 1
  device: cuda
space:
  lr: {low: 1.0e-3, high: 1.0e-2, log: true}
  batch_size: [128, 256]
  precision: [bf16, fp16]
  data_pipeline: [dataloader, device]
  pin_memory: [false, true]
"""


def test_a_study_runs_in_a_worker_on_cuda_and_exports(tmp_path: Path):
    space = write_space(tmp_path, GPU_SPACE, name="gpu.yaml")
    done = run_cli("run", str(space), cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(
        study_name="gpu", storage=f"sqlite:///{tmp_path}/studies/autotune.db"
    )
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert complete, [t.user_attrs.get("fail_msg") for t in study.trials]
    for trial in complete:
        assert trial.user_attrs["device_name"] == torch.cuda.get_device_name(0)
        assert trial.user_attrs["peak_memory_bytes"] > 0

    exported = run_cli("export", "--study", "gpu", "-o", "train.py", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for args in (["--epochs", "1"], ["--epochs", "2", "--resume"]):
        script = subprocess.run(
            [sys.executable, "train.py", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert script.returncode == 0, script.stderr
    assert "epoch 2/2" in script.stdout


def test_cudnn_benchmark_on_and_off_never_share_a_worker_process(tmp_path: Path):
    """cuDNN's plan cache outlives a run and its key leaves out the benchmark flag: a worker
    that ran cudnn_benchmark off is replaced before it runs it on, and back."""
    from autotune.speed import BurstPlan
    from autotune.worker import WorkerExecutor

    executor = WorkerExecutor(SHAPES, tmp_path)
    plan = BurstPlan(bursts=1, burst_seconds=0.1)
    try:
        for benchmark in (False, False, True, True, False):
            executor.measure(cuda_config(cudnn_benchmark=benchmark), plan)
    finally:
        executor.close()
    assert len(executor.started_pids) == 3  # a process per run of one value


def test_a_worker_whose_device_memory_does_not_come_back_is_replaced(tmp_path: Path):
    """Memory a trial leaves allocated (beyond what the worker held after its first trial)
    is said on the trial and not carried into the next: that one trains in a fresh worker."""
    from autotune.worker import WorkerExecutor

    leaky = WorkloadSpec(
        model="autotune.testing:leaky_cnn",
        model_args={"leak_mib": 512},
        data="shapes",
        data_args={"n_train": 4096, "n_val": 1024},
    )
    executor = WorkerExecutor(leaky, tmp_path)
    try:
        results = [executor.train(cuda_config(), never_stop) for _ in range(3)]
    finally:
        executor.close()
    left = [result.memory_left_bytes for result in results]
    # the first trial's leak is the first worker's baseline; the second's is a leak; the
    # third trains in a fresh worker, whose baseline it sets
    assert left[0] is None and left[2] is None, left
    assert left[1] is not None and left[1] >= 512 * 2**20, left
    assert len(executor.started_pids) == 2


RESNET18 = WorkloadSpec(
    model="torchvision:resnet18",
    model_args={"cifar_stem": True},
    data="shapes",
    data_args={"n_train": 2048, "n_val": 256},
)


def _steady_steps_never_wait(spec: WorkloadSpec, precision: str) -> None:
    from autotune.training.trainer import Trainer

    workload = load(spec)
    config = cuda_config(precision=precision, data_pipeline="device", channels_last=True)
    trainer = Trainer(workload.build_model(), config, total_steps=100, loss_fn=workload.loss_fn)
    generator = torch.Generator(device="cuda:0").manual_seed(0)
    batches = iter(DeviceBatches(workload.train_set, 128, torch.device("cuda:0"), generator))
    for _ in range(3):  # warm-up: the data set's copy, cuDNN's first choices, the allocator
        trainer.train_step(*trainer.to_device(*next(batches)))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        losses = [trainer.train_step(*trainer.to_device(*next(batches))) for _ in range(10)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(math.isfinite(float(loss)) for loss in losses)
    assert trainer.steps == 13 and trainer.skipped_steps <= 13


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
def test_the_steady_state_training_step_never_waits_for_the_gpu(precision: str):
    """A training step that synchronizes ties the GPU to the host: torch's sync debug mode
    raises at any synchronizing call (an .item(), a read-back, a blocking copy) in the steady
    steps of every precision, fp16's GradScaler included (its optimizer is fused)."""
    _steady_steps_never_wait(SHAPES, precision)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_resnet_with_batchnorm_steps_without_waiting_for_the_gpu(precision: str):
    """The same for a ResNet-18: BatchNorm's running statistics and its step counter are
    updated on the device, never read back."""
    _steady_steps_never_wait(RESNET18, precision)


def _a_fault_then_a_trial(
    spec: WorkloadSpec, folder: Path, failing: TrialConfig, healthy: TrialConfig
) -> tuple[BaseException, TrialResult, int]:
    """Two trials in one supervised worker executor: (the first's fault, the second's
    result, the worker processes it started)."""
    from autotune.worker import WorkerExecutor

    executor = WorkerExecutor(spec, folder)
    try:
        with pytest.raises(Exception) as raised:
            executor.train(failing, never_stop)
        result = executor.train(healthy, never_stop)
    finally:
        executor.close()
    return raised.value, result, len(executor.started_pids)


def test_a_device_side_assert_is_an_error_and_the_next_trial_trains_in_a_fresh_worker(
    tmp_path: Path,
):
    """Labels past the logits fire the loss kernel's device-side assert, after which the
    process's CUDA context is unusable: the trial is an error in CUDA's words (not a crash
    that blames the configuration, not a memory wall), its worker is replaced, and the next
    trial trains."""
    faulty = WorkloadSpec(
        model="autotune.testing:tiny_cnn",
        model_args={"one_logit_at_batch": 64},
        data="shapes",
        data_args={"n_train": 4096, "n_val": 1024},
    )
    fault, result, workers = _a_fault_then_a_trial(
        faulty, tmp_path, cuda_config(batch_size=64), cuda_config(batch_size=128)
    )
    assert getattr(fault, "kind", None) == "error", fault
    assert "CUDA error" in str(fault) or "device-side assert" in str(fault)
    assert 0.0 <= result.score <= 1.0
    assert workers == 2  # the broken context's worker is gone


STAGE1_SPACE = """\
study: {name: stage1, n_trials: 1, pruner: none, confirm: false, trial_timeout: 300}
workload:
  model: autotune.testing:tiny_cnn
  data: shapes
  data_args: {n_train: 4096, n_val: 1024}
  epochs: 2
  device: cuda
objective: {full_run_epochs: 100}
space:
  batch_size: [256]
  precision: [bf16]
  data_pipeline: [device]
  compile: [none, default, reduce-overhead]
  cudnn_benchmark: [false, true]
"""


def test_stage_one_times_compiled_and_cudnn_benchmarked_settings_on_the_gpu(tmp_path: Path):
    """Stage 1 on a GPU: the compile modes (CUDA graphs among them) compiled and timed, each
    charged its compile, and cudnn.benchmark on and off each in a process of its own; then a
    trial trains with what it found."""
    from autotune.study import SpeedRecord

    space = write_space(tmp_path, STAGE1_SPACE, name="stage1.yaml")
    done = run_cli("run", str(space), cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr
    url = f"sqlite:///{tmp_path}/studies/autotune.db"
    speed = optuna.load_study(study_name="stage1.speed", storage=url)
    records = [r for r in map(SpeedRecord.of, speed.trials) if r is not None]
    assert not [r.fail_msg for r in records if r.fail_kind], records
    timed = [(r.settings, r.result()) for r in records if r.result() is not None]
    modes = {"default", "reduce-overhead"}
    compiled = [(words, m) for words, m in timed if any(f"compile {x}" in words for x in modes)]
    assert {m for m in modes if any(f"compile {m}" in words for words, _ in compiled)} == modes
    assert all((m.compile_seconds or 0) > 0 for _, m in compiled), compiled
    assert any("cudnn.benchmark" in words for words, _ in timed), [w for w, _ in timed]
    assert all(m.samples_per_second() > 0 for _, m in timed)
    study = optuna.load_study(study_name="stage1", storage=url)
    assert [t.state for t in study.trials if t.state == TrialState.COMPLETE]


def test_a_real_out_of_memory_is_oom_and_the_next_trial_gets_its_memory_back(tmp_path: Path):
    """A batch the GPU cannot hold fails as oom (a memory wall, not an error), and the worker's
    next trial, at a batch that fits, trains in the same process with its memory back."""
    # 4,096 channels at 32x32: 64 GiB an activation at batch 4096 (several are kept for the
    # backward: past an H200's 140 GiB), about 1 GiB at batch 64
    wide = WorkloadSpec(
        model="autotune.testing:tiny_cnn",
        model_args={"width": 4096},
        data="shapes",
        data_args={"n_train": 4096, "n_val": 256},
    )
    fault, result, workers = _a_fault_then_a_trial(
        wide,
        tmp_path,
        cuda_config(batch_size=4096, precision="fp32"),
        cuda_config(batch_size=64, precision="bf16"),
    )
    assert getattr(fault, "kind", None) == "oom", fault
    assert result.memory_left_bytes is None and 0.0 <= result.score <= 1.0
    assert workers == 1


def test_a_dozen_trials_in_one_worker_give_their_device_memory_back(tmp_path: Path):
    from autotune.worker import WorkerExecutor

    executor = WorkerExecutor(SHAPES, tmp_path)
    configs = [
        cuda_config(precision=precision, compile=compile_mode, batch_size=batch_size)
        for precision in ("fp32", "bf16")
        for compile_mode in ("none", "default")
        for batch_size in (64, 256, 1024)
    ]
    try:
        results = [executor.train(config, never_stop) for config in configs]
    finally:
        executor.close()
    assert [r.memory_left_bytes for r in results] == [None] * len(configs)
    assert len(executor.started_pids) == 1  # no trial left memory that cost its worker
