"""The exported script trains with the trainer's semantics, not a look-alike of them.

The optimizer, the learning-rate schedule, the CUDA flags, how micro-batches become optimizer
steps (autocast, GradScaler, accumulation, DDP's no_sync) and the built-in scores are
``autotune.semantics``' in both: the script carries them pasted, and calls them with its
constants. So these tests check that the script calls them as the trainer does. Each renders
the real template through the real export code from a real (tiny) study, loads the script as a
module (its ``main()`` runs only under ``__main__``) and compares what the script does with
what the trainer does, step by step.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import math
import os
import random
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import ClassVar

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import autotune
from autotune import pipeline, semantics
from autotune.config import TrialConfig
from autotune.display import TrialConfirmation
from autotune.export import best_config, render_script, select_trial
from autotune.machine import interference
from autotune.pipeline import make_train_loader, make_val_loader
from autotune.study import load_study
from autotune.testing import blobs, cuda_flags, learning_rates, write_space
from autotune.training import clocks, runner
from autotune.training.timing import TrainClock
from autotune.training.trainer import Trainer, backend_flags, seed_everything
from autotune.workloads import Workload

# 148 training samples in micro-batches of 4: one epoch is 37 optimizer steps
SPACE = """\
study: {name: parity, n_trials: 1, pruner: none, isolation: none}
workload:
  model: autotune.testing:tiny_mlp
  data: autotune.testing:blobs
  data_args: {n_train: 148, n_val: 32}
  epochs: 1
  device: cpu
space:
  lr: 0.05
  batch_size: 4
"""
TOTAL_STEPS = 37  # optimizer steps the schedules span

PRECISIONS = ("fp32", "fp32-strict", "tf32", "bf16", "fp16")
# fp32-strict differs from fp32 only in its CUDA flags: its loop and schedule are fp32's
TRAINING_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
OPTIMIZERS = {
    "sgd": {"optimizer": "sgd", "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4},
    "adamw": {"optimizer": "adamw", "momentum": None, "nesterov": False, "weight_decay": 0.05},
}
# (schedule, warmup_fraction); onecycle with 0 rises for its default 0.3 of the steps
SCHEDULES = [
    ("constant", 0.0),
    ("constant", 0.2),
    ("cosine", 0.0),
    ("cosine", 0.2),
    ("onecycle", 0.0),
    ("onecycle", 0.2),
]

Loaded = tuple[ModuleType, TrialConfig]
Export = Callable[..., Loaded]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A real one-trial study of the tiny workload, its stages and confirmation round run as
    `autotune run` runs them, in this process (``autotune.run``, the same session)."""
    directory = tmp_path_factory.mktemp("parity")
    space = write_space(directory, SPACE, name="space.yaml")
    url = f"sqlite:///{directory / 'studies.db'}"
    report = autotune.run(space, storage=url)
    assert report.ok and report.confirmed, report.ending
    return load_study("parity", url)


@pytest.fixture
def export(study, tmp_path: Path) -> Iterator[Export]:
    """``export(**changes)``: the study's best configuration with ``changes`` (and a round's
    ``confirmation`` where given), rendered into a script by the real export code and loaded
    as a module; returns (module, config)."""
    best = best_config(study, select_trial(study))
    saved_sys_path = list(sys.path)  # the script puts the workload's directory on sys.path
    count = 0

    def load(confirmation: TrialConfirmation | None = None, **changes) -> Loaded:
        nonlocal count
        count += 1
        config = best.config.replace(**changes)
        path = tmp_path / f"train_{count}.py"
        chosen = dataclasses.replace(best, config=config)
        if confirmation is not None:  # a round's verdict (a one-configuration study has none)
            chosen = dataclasses.replace(chosen, confirmation=confirmation)
        path.write_text(render_script(study, chosen))
        spec = importlib.util.spec_from_file_location(f"exported_train_{count}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # not __main__: defines everything, trains nothing
        return module, config

    threads = torch.get_num_threads()  # main() sets them, for the process
    yield load
    sys.path[:] = saved_sys_path
    torch.set_num_threads(threads)


@pytest.fixture
def restore_flags() -> Iterator[None]:
    """Put the process-wide TF32 and cuDNN settings back as they were."""
    matmul_precision = torch.get_float32_matmul_precision()
    cudnn = torch.backends.cudnn
    conv_tf32, benchmark = cudnn.allow_tf32, cudnn.benchmark
    yield
    torch.set_float32_matmul_precision(matmul_precision)
    cudnn.allow_tf32, cudnn.benchmark = conv_tf32, benchmark


def set_flags(matmul_precision: str, conv_tf32: bool, benchmark: bool) -> None:
    torch.set_float32_matmul_precision(matmul_precision)
    torch.backends.cudnn.allow_tf32 = conv_tf32
    torch.backends.cudnn.benchmark = benchmark


# torch's defaults, and their opposite: a setting left alone shows up against one of them
START_FLAGS = [("highest", True, False), ("high", False, True)]


def settings(optimizer: torch.optim.Optimizer) -> dict[str, object]:
    """Everything of the param group but its parameters: lr, momentum, betas, decay, ..."""
    return {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}


def assert_same_rates(script: list[float], trainer: list[float]) -> None:
    assert len(script) == len(trainer)
    for step, (ours, theirs) in enumerate(zip(script, trainer, strict=True)):
        assert math.isclose(ours, theirs, rel_tol=1e-12, abs_tol=0.0), (
            f"step {step}: the script's learning rate is {ours!r}, the trainer's {theirs!r}"
        )


def script_optimizer(script: ModuleType, model: nn.Module) -> torch.optim.Optimizer:
    """The script's optimizer over ``model``, made as its main() makes it: its constants."""
    extra = (script.MOMENTUM, script.NESTEROV) if script.OPTIMIZER == "sgd" else ()
    return script.make_optimizer(
        model, script.OPTIMIZER, script.LEARNING_RATE, script.WEIGHT_DECAY, *extra
    )


def script_scheduler(script: ModuleType, optimizer: torch.optim.Optimizer) -> object | None:
    """The script's schedule over TOTAL_STEPS, made as its main() makes it (None: it has none)."""
    if not hasattr(script, "make_scheduler"):
        return None
    return script.make_scheduler(optimizer, script.SCHEDULE, script.WARMUP_FRACTION, TOTAL_STEPS)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize(("schedule", "warmup_fraction"), SCHEDULES)
def test_the_script_schedules_the_learning_rate_with_the_trainers_own_functions(
    export: Export, schedule: str, warmup_fraction: float, optimizer: str
):
    script, config = export(
        schedule=schedule, warmup_fraction=warmup_fraction, **OPTIMIZERS[optimizer]
    )
    # the very functions the trials call, pasted: one source
    pasted = (
        "make_optimizer",
        "make_scheduler",
        "lr_factor",
        "set_cuda_flags",
        "TrainingSteps",
        "autocast",
        "validation_sums",
        "classification_sums",
        "builtin_score",
        "logits_of",
    )
    text = Path(script.__file__).read_text()
    for name in pasted:
        if hasattr(script, name):
            assert inspect.getsource(getattr(semantics, name)) in text, name
    model = script.make_model()
    ours = script_optimizer(script, model)
    trainer = Trainer(script.make_model(), config, TOTAL_STEPS)
    theirs, trainer_scheduler = trainer.optimizer, trainer.scheduler
    script_schedule = script_scheduler(script, ours)
    assert type(ours) is type(theirs)
    # a constant learning rate: the script has no schedule (and pastes none)
    assert type(script_schedule) is type(trainer_scheduler)
    assert settings(ours) == settings(theirs)  # OneCycleLR rewrites lr and adds its own keys

    expected = learning_rates(theirs, trainer_scheduler, TOTAL_STEPS)
    assert_same_rates(learning_rates(ours, script_schedule, TOTAL_STEPS), expected)
    # the comparison means something: a schedule changes the rate, a constant one does not
    assert (len(set(expected)) > 1) == (trainer_scheduler is not None)
    assert trainer_scheduler is not None or set(expected) == {config.lr}


class _Stop(Exception):
    """Ends the script's main() once it has set the CUDA flags."""


@pytest.mark.usefixtures("restore_flags")
@pytest.mark.parametrize("cudnn_benchmark", [False, True])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_on_cuda_the_script_sets_the_trainers_tf32_and_cudnn_flags(
    export: Export, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, precision, cudnn_benchmark
):
    script, config = export(precision=precision, cudnn_benchmark=cudnn_benchmark, device="cuda:0")
    set_cuda_flags = script.set_cuda_flags

    def set_then_stop(*args: object) -> None:  # setting them needs no GPU; training would
        set_cuda_flags(*args)
        raise _Stop

    monkeypatch.setattr(script, "set_cuda_flags", set_then_stop)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # --device cuda:0 is checked
    monkeypatch.setattr(sys, "argv", ["train.py", "--run-dir", str(tmp_path / "run")])
    for start in START_FLAGS:
        set_flags(*start)
        with pytest.raises(_Stop):
            script.main()  # DEVICE is cuda:0: main() sets the flags before anything else
        ours = cuda_flags()
        set_flags(*start)
        with backend_flags(config):
            theirs = cuda_flags()
        # (matmul precision, cuda.matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark)
        assert ours == theirs, f"starting from {start}"
    # TF32 matmuls only for tf32; TF32 convolutions, PyTorch's default, unless fp32-strict
    assert theirs[1:3] == (precision == "tf32", precision != "fp32-strict")
    assert theirs[3] is cudnn_benchmark


class Recorder(nn.Module):
    """Wraps a model; notes, at every forward, training or not, the autocast dtype (None
    without autocast) and the learning rate of the optimizer watching it (None before one)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.optimizer: torch.optim.Optimizer | None = None
        self.calls: list[tuple[bool, torch.dtype | None, float | None]] = []

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        kind = inputs.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
        lr = self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else None
        self.calls.append((self.training, dtype, lr))
        return self.inner(inputs)


class RecordingScaler(torch.amp.GradScaler):
    """A GradScaler that counts its instances and its scale() and step() calls."""

    made: ClassVar[list[RecordingScaler]] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scaled = self.stepped = 0
        RecordingScaler.made.append(self)

    def scale(self, outputs):
        self.scaled += 1
        return super().scale(outputs)

    def step(self, optimizer, *args, **kwargs):
        self.stepped += 1
        return super().step(optimizer, *args, **kwargs)


# one real epoch of the script's main() per precision, each with another schedule and optimizer
LOOPS = {
    "fp32": {"schedule": "cosine", "warmup_fraction": 0.2, **OPTIMIZERS["sgd"]},
    "tf32": {
        "schedule": "onecycle",
        "warmup_fraction": 0.0,
        "accumulation_steps": 2,
        **OPTIMIZERS["adamw"],
    },
    "bf16": {"schedule": "constant", "warmup_fraction": 0.2, **OPTIMIZERS["adamw"]},
    "fp16": {
        "schedule": "onecycle",
        "warmup_fraction": 0.1,
        "accumulation_steps": 2,
        **OPTIMIZERS["sgd"],
    },
}


@pytest.mark.usefixtures("restore_flags")
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")  # fp16 skipped steps
@pytest.mark.parametrize("precision", TRAINING_PRECISIONS)
def test_the_scripts_training_loop_matches_the_trainer(
    export: Export, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, precision: str
):
    """Autocast, GradScaler and the learning rate of every optimizer step in the script's own
    loop (one epoch on the CPU) against a Trainer of the same configuration."""
    script, config = export(precision=precision, **LOOPS[precision])
    accumulation = config.accumulation_steps
    train_set, _, _ = script.make_datasets()
    steps = len(train_set) // config.batch_size // accumulation  # the script's optimizer steps

    # the script, as `python train.py --epochs 1` runs it, with a recording model and scaler
    recorder = Recorder(script.make_model())
    make_script_optimizer = script.make_optimizer

    def watched_optimizer(*args: object, **kwargs: object) -> torch.optim.Optimizer:
        recorder.optimizer = make_script_optimizer(*args, **kwargs)
        return recorder.optimizer

    RecordingScaler.made.clear()
    set_flags(*START_FLAGS[1])
    with monkeypatch.context() as patch:
        patch.setattr(script, "make_model", lambda: recorder)
        patch.setattr(script, "make_optimizer", watched_optimizer)
        patch.setattr(torch.amp, "GradScaler", RecordingScaler)
        patch.setattr(
            sys, "argv", ["train.py", "--epochs", "1", "--run-dir", str(tmp_path / "run")]
        )
        script.main()
    matmul_precision, _, conv_tf32, benchmark = cuda_flags()
    assert (matmul_precision, conv_tf32, benchmark) == START_FLAGS[1], "the CPU sets no flags"
    training = [call for call in recorder.calls if call[0]]
    evaluation = [call for call in recorder.calls if not call[0]]
    assert len(training) == steps * accumulation and evaluation
    assert not recorder.calls[0][0]  # the process warmed first, as a trial's: in eval mode

    # a Trainer of the same configuration, over as many optimizer steps
    trainer_model = Recorder(script.make_model())
    trainer = Trainer(trainer_model, config, total_steps=steps)
    batch = [train_set[i] for i in range(8)]
    inputs, targets = (torch.stack(column) for column in zip(*batch, strict=True))
    for _ in range(accumulation):
        trainer.train_step(inputs[:4], targets[:4])
    with torch.no_grad(), trainer.autocast():
        trainer_model.eval()
        trainer_model(inputs)
    trainer_dtypes = [dtype for _, dtype, _ in trainer_model.calls]
    assert trainer.steps == 1 and len(trainer_dtypes) == accumulation + 1

    # autocast: the same dtype (or none) in training and in evaluation
    assert {dtype for _, dtype, _ in training} == set(trainer_dtypes[:-1])
    assert {dtype for _, dtype, _ in evaluation} == {trainer_dtypes[-1]}
    # GradScaler where the precision scales the loss (fp16), scaling every micro-batch's loss
    # and making every optimizer step
    scalers = [scaler for scaler in RecordingScaler.made if scaler.is_enabled()]
    assert bool(scalers) == trainer.scaler.is_enabled() == semantics.scales_loss(precision)
    if scalers:
        assert len(scalers) == 1
        assert (scalers[0].scaled, scalers[0].stepped) == (steps * accumulation, steps)
    # the same implementation of the optimizer: fused where the loss is scaled (the overflow
    # check stays on the device), PyTorch's default otherwise
    fused = recorder.optimizer.defaults.get("fused")
    assert (
        bool(fused)
        == bool(trainer.optimizer.defaults.get("fused"))
        == semantics.scales_loss(precision)
    )
    # the learning rate of every micro-batch is its optimizer step's, as the trainer schedules it
    fresh = Trainer(script.make_model(), config, total_steps=steps)
    expected = learning_rates(fresh.optimizer, fresh.scheduler, steps)
    per_micro_batch = [lr for lr in expected for _ in range(accumulation)]
    assert_same_rates([lr for _, _, lr in training], per_micro_batch)


def _script_weights(script: ModuleType, run_dir: Path, *args: str) -> dict[str, torch.Tensor]:
    """The final weights of ``python train.py --run-dir RUN_DIR ARGS``, run in this process."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            sys, "argv", ["train.py", "--threads", "1", "--run-dir", str(run_dir), *args]
        )
        script.main()
    return torch.load(run_dir / "model.pt")


# how the training batches reach the device: the device pipeline, and a DataLoader whose
# sampler draws each epoch's order from the generator lazily
PIPELINES = {
    "device": {"data_pipeline": "device"},
    "dataloader": {"data_pipeline": "dataloader", "num_workers": 0},
}
# the same in worker processes, started every epoch or once (their seed drawn from the
# generator only then): processes to start, so slow
WORKERS = {"data_pipeline": "dataloader", "num_workers": 1, "prefetch_factor": 2}
PIPELINES |= {
    "dataloader-workers": WORKERS | {"persistent_workers": False},
    "dataloader-persistent-workers": WORKERS | {"persistent_workers": True},
}


def _interrupted_at(script: ModuleType, micro_batch: int, run_dir: Path, *args: str) -> int:
    """``python train.py --run-dir RUN_DIR ARGS`` stopped by Ctrl-C as it begins the
    ``micro_batch``-th micro-batch of this process (counting from 1): the epochs its checkpoint
    then holds."""
    training_loss, calls = script.training_loss, 0

    def interrupted(*loss_args: object) -> object:
        nonlocal calls
        calls += 1
        if calls == micro_batch:
            raise KeyboardInterrupt
        return training_loss(*loss_args)

    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit):
        patch.setattr(script, "training_loss", interrupted)
        _script_weights(script, run_dir, *args)
    return torch.load(run_dir / "checkpoint.pt")["epoch"]


@pytest.mark.parametrize(
    "pipeline",
    [
        pytest.param(name, marks=[pytest.mark.slow] if "workers" in name else [])
        for name in PIPELINES
    ],
)
def test_an_interrupted_run_resumes_on_the_straight_runs_batches_to_the_bit(
    export: Export, tmp_path: Path, pipeline: str
):
    """37 micro-batches an epoch, 2 to an optimizer step: a trial counts its micro-batches on
    across epochs (``runner._train``: epoch 1's last one begins a step that epoch 2's first
    ends; 3 epochs are 55 steps), and so does the script; a checkpoint keeps the open step.
    Three epochs straight, and the same stopped by Ctrl-C at an epoch's first micro-batch, then
    resumed and stopped again mid-epoch, then resumed to the end: the same weights, bit for bit,
    as a Trainer's fed as a trial feeds it. The DataLoader's sampler draws an epoch's order from
    the generator lazily, and the trailing draw of its end at the next epoch's first batch: the
    script ends each epoch's pass before its checkpoint keeps the generator's state (it once
    kept the state before that draw, and a resumed run trained on other batches); persistent
    workers draw their seed from it once, as the first epoch begins (a resumed run's did again,
    and drew another order)."""
    script, config = export(
        **PIPELINES[pipeline],
        accumulation_steps=2,
        schedule="cosine",
        warmup_fraction=0.2,
        **OPTIMIZERS["sgd"],
    )
    seed, epochs = script.SEED, 3
    total_steps = epochs * TOTAL_STEPS // 2
    torch.set_num_threads(1)  # as the script's runs: sums in one order
    torch.manual_seed(seed)  # as main() seeds, then makes the loaders and the model
    loader = script.make_loaders(seed, torch.device("cpu"))[0]
    trainer = Trainer(script.make_model(), config.replace(epochs=epochs), total_steps)
    assert len(loader) == TOTAL_STEPS and len(loader) % 2  # odd: a step spans the epochs
    batches = clocks.Epochs(loader)  # the trial's loop, micro-batch after micro-batch
    while trainer.steps < total_steps:
        trainer.train_step(*next(batches))

    straight = _script_weights(script, tmp_path / "a", "--epochs", str(epochs))
    run = tmp_path / "b"
    # Ctrl-C as epoch 2 begins (its checkpoint just written), then in the middle of epoch 3
    assert _interrupted_at(script, TOTAL_STEPS + 1, run, "--epochs", str(epochs)) == 1
    assert _interrupted_at(script, TOTAL_STEPS + 18, run, "--resume") == 2
    resumed = _script_weights(script, run, "--resume")
    for name, weights in trainer.model.state_dict().items():
        assert torch.equal(straight[name], weights), name
        assert torch.equal(resumed[name], weights), name


class NoisyBlobs(Dataset):
    """The blobs' samples, each with noise from torch's, NumPy's and Python's random streams
    drawn as it is loaded (as an augmentation draws): batches show where each stream was seeded,
    in the main process and in every worker."""

    def __init__(self, samples: Dataset) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)  # type: ignore[arg-type]  # a TensorDataset: sized

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, target = self.samples[index]
        return inputs + torch.rand(()) + np.random.rand() + random.random(), target


def _drawing_dropout(script: ModuleType) -> None:
    make_model = script.make_model
    script.make_model = lambda: nn.Sequential(nn.Dropout(0.2), make_model())


def _drawing_data(script: ModuleType) -> None:
    splits = blobs(n_train=148, n_val=32)
    datasets = NoisyBlobs(splits.train), NoisyBlobs(splits.val), None
    script.make_datasets = lambda: datasets


@pytest.mark.parametrize("drawing", [_drawing_dropout, _drawing_data], ids=["dropout", "data"])
def test_a_resumed_run_draws_from_the_random_streams_where_the_straight_run_did(
    export: Export, tmp_path: Path, drawing: Callable[[ModuleType], None]
):
    """Dropout draws from torch's global random stream, and a data set's augmentation in the
    main process (the built-in CIFAR-10's crop and flip through a DataLoader without workers;
    here torch's, Python's and NumPy's) too: the checkpoint keeps their states, and the warm-up
    batch before the clock draws from none, so a run stopped mid-epoch and resumed ends with
    the straight run's weights (it once started torch's stream again from the seed, then
    Python's and NumPy's)."""
    script, _ = export(data_pipeline="dataloader", num_workers=0)
    drawing(script)
    straight = _script_weights(script, tmp_path / "a", "--epochs", "2")
    run = tmp_path / "b"
    assert _interrupted_at(script, TOTAL_STEPS + 18, run, "--epochs", "2") == 1
    resumed = _script_weights(script, run, "--resume")
    for name, weights in straight.items():
        assert torch.equal(resumed[name], weights), name


# the trial's loaders: no workers, workers started every epoch (with a timeout) or once
LOADERS = {
    "no-workers": {"data_pipeline": "dataloader", "num_workers": 0},
    "workers": WORKERS | {"persistent_workers": False, "dataloader_timeout": 30.0},
    "persistent-workers": WORKERS | {"persistent_workers": True},
}


def _drawn(train: Iterable[object], val: Iterable[object]) -> list[object]:
    """Two epochs of training batches with the validation batches between them, as a trial and
    the script read them (each pass over the training loader is the next epoch)."""
    return [*train, *val, *train]


def _assert_same_batches(script: list[object], trial: list[object]) -> None:
    assert len(script) == len(trial)
    for ours, theirs in zip(script, trial, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize(
    "loader",
    [
        pytest.param(name, marks=[pytest.mark.slow] if "workers" in name else [])
        for name in LOADERS
    ],
)
def test_the_script_loads_its_data_as_the_trial_did(export: Export, loader: str):
    """The script's DataLoaders are the trials' (``pipeline.train_batches`` and ``val_batches``,
    pasted) with its constants, seeded as the trials seed: the same batches in the same order,
    each sample's random draws included, in the main process and in the workers (the script
    seeded no NumPy nor Python stream, and its workers none: other noise), and the same
    timeout for a worker's batch (it had none: a hung worker waited forever)."""
    script, config = export(**LOADERS[loader])
    text = Path(script.__file__).read_text()
    for pasted in (pipeline.train_batches, pipeline.val_batches, seed_everything):
        assert inspect.getsource(pasted) in text, pasted.__name__
    splits = blobs(n_train=148, n_val=32)  # the study's data
    train_set, val_set = NoisyBlobs(splits.train), NoisyBlobs(splits.val)
    workload = Workload("noisy blobs", train_set, val_set, 4, (16,), script.make_model)
    trial_train = runner.train_loader(config, workload)  # seeded as a trial seeds
    trial_val = make_val_loader(val_set, config)
    trials = _drawn(trial_train, trial_val)

    script.make_datasets = lambda: (train_set, val_set, None)
    script.seed_everything(script.SEED)  # as main() seeds, then makes the loaders
    train, val, generator = script.make_loaders(script.SEED, torch.device("cpu"))
    _assert_same_batches(_drawn(train, val), trials)
    assert generator is train.generator  # the checkpoint keeps the order's generator
    assert train.timeout == trial_train.timeout == config.dataloader_timeout


def test_a_ddp_scripts_processes_load_the_trials_shares(export: Export):
    """Each torchrun process of a distributed script draws what the trial's process of its rank
    drew (``EpochSampler``, the next epoch's order at every pass; the script also sets the
    epoch, where a resumed run goes on), the NumPy and Python streams seeded as the trials'."""
    script, config = export(data_pipeline="dataloader", num_workers=0, world_size=2)
    assert inspect.getsource(pipeline.EpochSampler) in Path(script.__file__).read_text()
    splits = blobs(n_train=148, n_val=32)
    train_set, val_set = NoisyBlobs(splits.train), NoisyBlobs(splits.val)
    script.make_datasets = lambda: (train_set, val_set, None)
    for rank in (0, 1):
        seed_everything(config.seed)
        trial_train = make_train_loader(train_set, config, config.seed, rank=rank)
        trials = _drawn(trial_train, make_val_loader(val_set, config))

        script.seed_everything(script.SEED)
        train, val, _ = script.make_loaders(script.SEED, torch.device("cpu"), rank, 2)
        drawn = []
        for epoch in range(2):  # as main() trains them
            train.sampler.set_epoch(epoch)
            drawn += [*train, *(val if epoch == 0 else ())]
        _assert_same_batches(drawn, trials)
        # the trials' sampler, pasted (the script's own DistributedSampler was another class)
        assert type(train.sampler).__name__ == type(trial_train.sampler).__name__
        assert len(train) == 148 // 2 // 4  # micro-batches of its own half of every epoch


def test_a_device_scripts_validation_set_not_in_memory_is_loaded_as_the_trials(export: Export):
    """With the device pipeline, a validation set that is not in memory is read by a DataLoader,
    as the trials read it (``pipeline.device_val_batches``, pasted: the script's own
    DeviceBatches refused it with a TypeError); the training batches are the trials'."""
    script, config = export(data_pipeline="device")
    splits = blobs(n_train=148, n_val=32)
    val_set = NoisyBlobs(splits.val)
    script.make_datasets = lambda: (splits.train, val_set, None)
    device = torch.device("cpu")
    seed_everything(config.seed)
    trials = _drawn(
        make_train_loader(splits.train, config, config.seed), make_val_loader(val_set, config)
    )
    script.seed_everything(script.SEED)
    train, val, generator = script.make_loaders(script.SEED, device)
    assert isinstance(val, DataLoader) and generator is train.generator
    _assert_same_batches(_drawn(train, val), trials)


def test_the_script_trains_with_the_tuned_values_to_the_last_digit(export: Export):
    """A sampled learning rate and warm-up fraction have more digits than six: the script must
    apply the trial's, not a neighbour's (the warm-up here is 0.5000000067 of a step: one
    step in the trainer, none when rounded to 0.0135135)."""
    script, config = export(
        lr=0.0031622776601683794,
        schedule="cosine",
        warmup_fraction=0.5000000067 / TOTAL_STEPS,
        **OPTIMIZERS["adamw"],
    )
    ours = script_optimizer(script, script.make_model())
    theirs = Trainer(script.make_model(), config, TOTAL_STEPS)
    assert_same_rates(
        learning_rates(ours, script_scheduler(script, ours), TOTAL_STEPS),
        learning_rates(theirs.optimizer, theirs.scheduler, TOTAL_STEPS),
    )


class BusyProc:
    """A /proc in which other processes keep ``others`` of this process's cores busy: each
    ``sleep`` advances ``perf_counter`` by its seconds and charges them to the cores."""

    def __init__(self, folder: Path, others: int) -> None:
        self.folder, self.others, self.busy, self.offset = folder, others, 0, 0.0
        self.perf_counter = time.perf_counter
        for process in ("self", str(os.getpid())):  # utime stime cutime cstime: 0
            (folder / process).mkdir(parents=True, exist_ok=True)
            (folder / process / "stat").write_text(f"1 (python) S 1 {'0 ' * 20}\n")
        self.write()

    def write(self) -> None:
        cores = interference.own_cores()
        lines = [
            f"cpu{core} {self.busy if core == cores[0] else 0} 0 0 9 0 0 0 0 0 0" for core in cores
        ]
        (self.folder / "stat").write_text("cpu  0 0 0 0 0 0 0 0 0 0\n" + "\n".join(lines) + "\n")

    def sleep(self, seconds: float) -> None:
        self.offset += seconds
        self.busy += round(self.others * seconds * interference._TICKS_PER_SECOND)
        self.write()

    def clock(self) -> float:
        return self.perf_counter() + self.offset

    def install(self, patch: pytest.MonkeyPatch, *modules: ModuleType) -> None:
        """This /proc and its clock for ``modules`` (the trials' and the script's)."""
        for module in modules:
            patch.setattr(module, "_PROC", self.folder)
        patch.setattr(time, "sleep", self.sleep)
        patch.setattr(time, "perf_counter", self.clock)


@pytest.mark.parametrize("others", [0, 1, 64])
def test_the_script_trains_on_the_threads_the_trials_rule_chooses(
    export: Export, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys, others: int
):
    """The script chooses its intra-op threads by the trials' rule (``idle_cores``, pasted):
    beside the same busy processes it chooses what a trial would, trains on them and says so;
    ``--threads`` overrides it."""
    script, _ = export()
    cores = interference.usable_cores()
    expected = max(1, cores - others)
    with monkeypatch.context() as patch:
        BusyProc(tmp_path / "proc", others).install(patch, interference, script)
        assert interference.trial_threads() == expected
        assert script.idle_cores(script.process_ticks) == expected
    assert inspect.getsource(interference.idle_cores) in Path(script.__file__).read_text()

    def threads_seen(*given: str) -> set[int]:
        seen: set[int] = set()
        recorder = Recorder(script.make_model())
        recorder.register_forward_pre_hook(lambda *_: seen.add(torch.get_num_threads()))
        with monkeypatch.context() as patch:
            BusyProc(tmp_path / "proc", others).install(patch, script)
            patch.setattr(script, "make_model", lambda: recorder)
            run_dir = str(tmp_path / f"run-{len(given)}")
            patch.setattr(sys, "argv", ["train.py", "--epochs", "1", "--run-dir", run_dir, *given])
            torch.set_num_threads(cores + 1)  # neither torch's default nor the rule's
            script.main()
        return seen

    assert threads_seen() == {expected}
    said = f"training on cpu with {expected} intra-op thread"
    assert said in capsys.readouterr().out
    assert threads_seen("--threads", "3") == {3}
    assert "with 3 intra-op threads (--threads; the trial trained on" in capsys.readouterr().out


# seconds on a fake clock
WARMUP_STEP = 0.01  # an optimizer step of the warm-up
FIRST_EPOCH_STEP = 0.001  # a step of the first epoch after it
LATER_STEP = 0.002  # a step of a later epoch
EPOCH_START = 0.005  # the training batches' start, every epoch
EPOCH_END = 0.003  # their end (a DataLoader's workers stopping), every epoch
OFF_THE_CLOCK = 1.0  # an evaluation, a checkpoint: not training time


@pytest.mark.parametrize("epochs", [1, 2])
def test_the_script_reports_its_steady_speed_by_the_trials_rule(
    study, export: Export, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys, epochs: int
):
    """The script's clocks and its steady-speed rule are the trials' (``SteadyPace``, pasted),
    and it feeds them as a trial does: on a fake clock where every step, epoch start,
    evaluation and checkpoint takes a known time, its steady speed leaves out the first
    ``warmup_steps`` steps (not its whole first epoch), evaluations and checkpoints, and counts
    one epoch start per epoch, the end of the epoch before it included (a trial pays an
    epoch's end as the next begins; the script ends an epoch's pass before its checkpoint, on
    the clock, and pays the last one too)."""
    # the study has one configuration, so no round: the done line compares with a round's
    confirmed = TrialConfirmation(median=1.0, runs=3, median_samples_per_second=12345.0)
    script, config = export(confirmation=confirmed)
    text = Path(script.__file__).read_text()
    for shared in (clocks.SteadyPace, clocks.Epochs, clocks.warmup_steps, TrainClock):
        assert inspect.getsource(shared) in text, shared.__name__
    per_epoch = len(script.make_datasets()[0]) // config.batch_size  # micro-batches: steps
    warmup = min(5, per_epoch // 2)  # runner.make_plan's, for an evaluation every epoch
    now = [0.0]

    class Costly(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner, self.steps = inner, 0

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            if self.training:
                self.steps += 1
                first = self.steps <= per_epoch
                now[0] += (
                    WARMUP_STEP
                    if self.steps <= warmup
                    else FIRST_EPOCH_STEP
                    if first
                    else LATER_STEP
                )
            return self.inner(inputs)

    class Starting:  # the training batches, each epoch's start and end taking their time
        def __init__(self, loader: object) -> None:
            self.loader = loader

        def __len__(self) -> int:
            return len(self.loader)

        def __iter__(self) -> Iterator[object]:
            now[0] += EPOCH_START
            yield from self.loader
            now[0] += EPOCH_END

    def off_the_clock(function: Callable) -> Callable:
        def slow(*args: object) -> object:
            now[0] += OFF_THE_CLOCK
            return function(*args)

        return slow

    make_model, make_loaders = script.make_model, script.make_loaders

    def starting_loaders(*args: object) -> tuple[object, ...]:
        train_loader, *others = make_loaders(*args)
        return Starting(train_loader), *others

    with monkeypatch.context() as patch:
        patch.setattr(time, "perf_counter", lambda: now[0])
        patch.setattr(script, "make_model", lambda: Costly(make_model()))
        patch.setattr(script, "make_loaders", starting_loaders)
        patch.setattr(script, "evaluate", off_the_clock(script.evaluate))
        patch.setattr(script, "save", off_the_clock(script.save))
        # others' share of the cores on this fake clock: said where a trial would be flagged
        # busy (1.2 of 2 cores' second: 60%), not where it would not
        share = script.CpuShare(1.0, 2, 0.5, 1.2 if epochs == 2 else 0.1)
        patch.setattr(script.CpuMeter, "so_far", lambda self: share)
        run_dir = str(tmp_path / "run")
        argv = ["train.py", "--epochs", str(epochs), "--threads", "1", "--run-dir", run_dir]
        patch.setattr(sys, "argv", argv)
        script.main()
    out = capsys.readouterr().out
    said = re.search(r"steady state ([\d,]+) samples/s", out)
    # after the warm-up: the rest of epoch 1 and the later epochs, each of those epochs' start
    steady = epochs * per_epoch - warmup
    step_seconds = (per_epoch - warmup) * FIRST_EPOCH_STEP + (epochs - 1) * per_epoch * LATER_STEP
    # one start per epoch, at what a start costs after the first, the end before it included
    # (none seen in a 1-epoch run), and the last epoch's end
    starts = steady / per_epoch * (EPOCH_START + EPOCH_END if epochs > 1 else 0.0)
    expected = steady * config.batch_size / (step_seconds + starts + EPOCH_END)
    assert said is not None and float(said[1].replace(",", "")) == round(expected)
    # beside the confirmation round's median for the trial, not its single search-time figure
    found = best_config(study, select_trial(study))
    busy = "; other processes took 60% of its cores meanwhile" if epochs == 2 else ""
    assert (
        f"(the median of trial {found.trial}'s 3 confirmation runs, timed alike: 12,345){busy}\n"
        in out
    )
