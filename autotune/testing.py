"""Tiny workloads and fault-injection hooks for autotune's own tests (and for trying it out).

Use them from a space file like any user's workload::

    workload:
      model: autotune.testing:tiny_mlp
      model_args: {nan_after_steps: 3}          # a fault to inject, if any
      data: autotune.testing:blobs
      data_args: {kill_worker_at_item: 20}

They train in a fraction of a second on a CPU, so a whole study fits in a test. Each fault hook
reproduces a real failure the way it happens in real training: the real exception type, a real
signal, a real sleep, a real broken compiler. The rest is what tests of a study share: this
machine and described ones, a plain TrialConfig, a tiny space file, the real ``autotune``
command in a subprocess.
"""

from __future__ import annotations

import ast
import dataclasses
import gc
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset, get_worker_info

from autotune import ranks
from autotune.config import TrialConfig
from autotune.faults import KINDS
from autotune.hardware import Hardware, detect
from autotune.results import Evaluation, TrialResult
from autotune.workloads import DataSplits, Workload

if TYPE_CHECKING:
    import optuna  # imported where it is used: a worker loading tiny_mlp need not import it

__all__ = [
    "AMPERE",
    "CPU",
    "TEST_CPU",
    "TINY_SPACE",
    "VOLTA",
    "FaultyDataset",
    "SlowDataset",
    "assert_trials_recorded",
    "blobs",
    "blobs_workload",
    "broken_model",
    "cuda_flags",
    "import_blocker",
    "learning_rates",
    "live_group_members",
    "make_config",
    "make_evaluation",
    "make_result",
    "never_stop",
    "run_cli",
    "run_script",
    "start_cli",
    "tiny_cnn",
    "tiny_mlp",
    "write_space",
]


def blobs(
    n_train: int = 256,
    n_val: int = 128,
    n_features: int = 16,
    n_classes: int = 4,
    spread: float = 1.0,
    seed: int = 0,
    image: bool = False,
    val_delay_seconds: float = 0.0,
    train_delay_seconds: float = 0.0,
    kill_worker_at_item: int | None = None,
) -> DataSplits:
    """Gaussian clusters, one per class: learnable in a few steps, deterministic from ``seed``.

    ``image`` shapes each sample as a (1, s, s) image (``n_features`` must be a square) so that
    channels_last applies. Fault hooks: every validation (``val_delay_seconds``) or training
    (``train_delay_seconds``) sample takes that long to load; ``kill_worker_at_item`` makes a
    DataLoader worker process SIGKILL itself when it loads its k-th training sample.
    """
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(n_classes, n_features, generator=generator) * 3.0

    def draw(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.arange(count) % n_classes
        points = centers[labels] + spread * torch.randn(count, n_features, generator=generator)
        if image:
            side = math.isqrt(n_features)
            if side * side != n_features:
                raise ValueError(f"image=True needs a square n_features, got {n_features}")
            points = points.reshape(count, 1, side, side)
        return points, labels

    train: Dataset = TensorDataset(*draw(n_train))
    val: Dataset = TensorDataset(*draw(n_val))
    if train_delay_seconds > 0:
        train = SlowDataset(train, train_delay_seconds)
    if kill_worker_at_item is not None:
        train = FaultyDataset(train, kill_worker_at_item)
    if val_delay_seconds > 0:
        val = SlowDataset(val, val_delay_seconds)
    return DataSplits(train=train, val=val, num_classes=n_classes)


class SlowDataset(Dataset):
    """Wraps a data set so that every item takes ``delay_seconds`` to load."""

    def __init__(self, inner: Dataset, delay_seconds: float) -> None:
        self.inner, self.delay_seconds = inner, delay_seconds

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]  # map-style: sized

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay_seconds)
        return self.inner[index]


class FaultyDataset(Dataset):
    """Wraps a data set so that a DataLoader worker SIGKILLs itself at its k-th item.

    In the main process (``num_workers: 0``) nothing happens: the fault is the worker's.
    """

    def __init__(self, inner: Dataset, kill_at_item: int) -> None:
        self.inner, self.kill_at_item = inner, kill_at_item
        self.loaded = 0

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]  # map-style: sized

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if get_worker_info() is not None:
            self.loaded += 1
            if self.loaded >= self.kill_at_item:
                os.kill(os.getpid(), signal.SIGKILL)
        return self.inner[index]


class _BlowUpGradient(torch.autograd.Function):
    """Identity forward; an infinite gradient backward (what an fp16 overflow produces)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


class _Faults(nn.Module):
    """Passes logits through, injecting faults at given training forward passes (1-based)."""

    def __init__(
        self,
        nan_after_steps: int | None,
        oom_at_batch: int | None,
        overflow_at_steps: tuple[int, ...],
        hang_at_step: int | None,
        crash_at_step: int | None,
        step_delay_seconds: float,
        diverge_after_steps: int | None = None,
        cuda_error_at_batch: int | None = None,
        fault_rank: int | None = None,
        hang_after_fault: bool = False,
    ) -> None:
        super().__init__()
        self.fault_rank = fault_rank
        self.hang_after_fault = hang_after_fault
        self.nan_after_steps = nan_after_steps
        self.oom_at_batch = oom_at_batch
        self.overflow_at_steps = overflow_at_steps
        self.hang_at_step = hang_at_step
        self.crash_at_step = crash_at_step
        self.step_delay_seconds = step_delay_seconds
        self.diverge_after_steps = diverge_after_steps
        self.cuda_error_at_batch = cuda_error_at_batch
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.fault_rank not in (None, ranks.rank()):
            return x
        self.calls += 1
        if self.step_delay_seconds:
            time.sleep(self.step_delay_seconds)
        if self.oom_at_batch is not None and x.shape[0] >= self.oom_at_batch:
            if self.hang_after_fault:
                _hang_in_teardown()
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {x.shape[0] * 4} MiB (injected at batch "
                f"{x.shape[0]} >= {self.oom_at_batch})"
            )
        if self.hang_at_step is not None and self.calls >= self.hang_at_step:
            while True:  # a deadlock, as far as anyone outside can tell
                time.sleep(3600)
        if self.crash_at_step is not None and self.calls >= self.crash_at_step:
            os.kill(os.getpid(), signal.SIGSEGV)  # what a crash in native code looks like
        if self.cuda_error_at_batch is not None and x.shape[0] >= self.cuda_error_at_batch:
            # the text torch gives an asynchronous kernel fault; the context is then unusable
            raise RuntimeError("CUDA error: an illegal memory access was encountered (injected)")
        if self.diverge_after_steps is not None and self.calls > self.diverge_after_steps:
            # confidently class 0, whatever the input: a loss of ~50 for every other class
            return 0 * x + torch.zeros_like(x).index_fill(1, torch.tensor([0]), 50.0)
        if self.nan_after_steps is not None and self.calls > self.nan_after_steps:
            return x * float("nan")
        if self.calls in self.overflow_at_steps:
            return _BlowUpGradient.apply(x)
        return x


class _HangsWhenCollected:
    """Cyclic garbage whose finalizer never returns."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        while True:
            time.sleep(3600)


def _hang_in_teardown() -> None:
    """Make this process hang in the cleanup after its fault (the next ``gc.collect()``, which
    a failing rank runs before leaving its process group), as NCCL's teardown can hang."""
    gc.disable()  # collected where the cleanup collects, not by chance earlier
    _HangsWhenCollected()


def _break_the_compiler() -> None:
    """Point Inductor at a C++ compiler that does not exist, with its caches off."""
    import torch._inductor.config as inductor

    # a search list of one compiler; Inductor annotates the field narrower than it reads it
    inductor.cpp.cxx = ("/nonexistent/c++",)  # type: ignore[assignment]
    inductor.fx_graph_cache = False


def _hang_the_compiler() -> None:
    """Make every torch.compile in this process compile forever: Inductor runs a pass over
    each graph it compiles that never returns (its caches bypassed: the pass has no uuid)."""
    import torch._inductor.config as inductor
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class _Forever(CustomGraphPass):
        def __call__(self, graph: torch.fx.graph.Graph) -> None:
            while True:
                time.sleep(3600)

        def uuid(self) -> None:
            return None

    inductor.post_grad_custom_post_pass = _Forever()


def tiny_mlp(
    num_classes: int,
    input_shape: tuple[int, ...],
    hidden: int = 32,
    nan_after_steps: int | None = None,
    oom_at_batch: int | None = None,
    overflow_at_steps: tuple[int, ...] | list[int] = (),
    hang_at_step: int | None = None,
    crash_at_step: int | None = None,
    step_delay_seconds: float = 0.0,
    broken_compiler: bool = False,
    endless_compile: bool = False,
    diverge_after_steps: int | None = None,
    cuda_error_at_batch: int | None = None,
    fault_rank: int | None = None,
    hang_after_fault: bool = False,
) -> nn.Module:
    """Flatten, one hidden ReLU layer, a linear classifier; plus optional injected faults.

    Fault hooks, counted in training forward passes: ``nan_after_steps`` (logits become NaN),
    ``oom_at_batch`` (torch.OutOfMemoryError for batches this large), ``overflow_at_steps``
    (infinite gradients at those steps, as an fp16 overflow), ``hang_at_step`` (sleep forever),
    ``crash_at_step`` (SIGSEGV), ``step_delay_seconds`` (every step that slow),
    ``diverge_after_steps`` (confident constant logits: a finite loss far above its lowest),
    ``cuda_error_at_batch`` (the RuntimeError a broken CUDA context raises, for batches this
    large),
    ``broken_compiler`` (torch.compile's C++ compiler is missing in this process) and
    ``endless_compile`` (a torch.compile in this process never finishes).
    ``fault_rank``: the faults happen in that process of a distributed trial only;
    ``hang_after_fault``: after its out of memory, the process hangs in its cleanup.
    """
    if broken_compiler:
        _break_the_compiler()
    if endless_compile:
        _hang_the_compiler()
    layers: list[nn.Module] = [
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    ]
    faults = (
        nan_after_steps,
        oom_at_batch,
        hang_at_step,
        crash_at_step,
        diverge_after_steps,
        cuda_error_at_batch,
    )
    if any(f is not None for f in faults) or overflow_at_steps or step_delay_seconds:
        layers.append(
            _Faults(
                nan_after_steps,
                oom_at_batch,
                tuple(overflow_at_steps),
                hang_at_step,
                crash_at_step,
                step_delay_seconds,
                diverge_after_steps,
                cuda_error_at_batch,
                fault_rank,
                hang_after_fault,
            )
        )
    return nn.Sequential(*layers)


def tiny_cnn(num_classes: int, input_shape: tuple[int, ...], width: int = 16) -> nn.Module:
    """Two 3x3 convolutions, global average pooling and a linear classifier: small images fast."""
    channels = input_shape[0]
    return nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, num_classes),
    )


_LEAKED: list[torch.Tensor] = []  # leaky_cnn's device memory, alive for the process's life


def leaky_cnn(num_classes: int, input_shape: tuple[int, ...], leak_mib: int = 512) -> nn.Module:
    """tiny_cnn whose first training forward keeps ``leak_mib`` MiB of the device's memory
    alive for good, as a cache held by a global does: a leak across trials, for the worker's
    check that its device memory comes back after each."""
    model = tiny_cnn(num_classes, input_shape)
    leaked: list[bool] = []

    def leak(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        if module.training and not leaked:
            leaked.append(True)
            _LEAKED.append(torch.empty(leak_mib * 2**20, dtype=torch.uint8, device=args[0].device))

    model.register_forward_pre_hook(leak)
    return model


class _Broken(nn.Module):
    def __init__(self, message: str, features: int, classes: int) -> None:
        super().__init__()
        self.message = message
        self.head = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            raise ValueError(self.message)
        return self.head(x.flatten(1))


def broken_model(
    num_classes: int, input_shape: tuple[int, ...], message: str = "a bug in forward"
) -> nn.Module:
    """A model whose forward raises ValueError(message) in training mode: a bug, not a
    configuration, and one the check before the study (an eval-mode forward) does not see, as a
    bug in a training-only branch (dropout, an auxiliary loss) would not be."""
    return _Broken(message, math.prod(input_shape), num_classes)


def blobs_workload(keep: list[nn.Module] | None = None, **data_args: Any) -> Workload:
    """The blobs data with tiny_mlp as a loaded Workload; every model built is appended to
    ``keep``, for tests that inspect them."""
    splits = blobs(**data_args)
    shape = tuple(splits.train[0][0].shape)
    num_classes = splits.num_classes
    assert num_classes is not None  # blobs says how many

    def build() -> nn.Module:
        model = tiny_mlp(num_classes=num_classes, input_shape=shape)
        if keep is not None:
            keep.append(model)
        return model

    return Workload("tiny_mlp on blobs", splits.train, splits.val, num_classes, shape, build)


# -- machines ---------------------------------------------------------------------------------

CPU = detect("cpu")  # this machine's CPU, as a study sees it
# described machines, for tests whose answer must not depend on the machine they run on
TEST_CPU = Hardware(
    device="cpu",
    device_name="test CPU (2 cores)",
    cpu_count=2,
    cuda_capability=None,
    bf16=True,
    fp16=False,
    tf32=False,
    cuda_graphs=False,
    compile_problem=None,
    torch_version="2.x",
)
AMPERE = dataclasses.replace(
    TEST_CPU,
    device="cuda:0",
    device_name="test GPU",
    cuda_capability=(8, 0),
    fp16=True,
    tf32=True,
    cuda_graphs=True,
)
VOLTA = dataclasses.replace(AMPERE, cuda_capability=(7, 0), bf16=False, tf32=False)


# -- trials -----------------------------------------------------------------------------------


def make_config(**changes: Any) -> TrialConfig:
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


def make_evaluation(
    index: int, epoch: float, score: float, seconds: float, overhead: float = 0.0
) -> Evaluation:
    """An evaluation with constructed measurements (no training, no timing): ``score`` after
    ``seconds`` of training (``overhead`` of them one-time), ``epoch`` epochs in."""
    return Evaluation(
        index=index,
        epoch=epoch,
        optimizer_steps=index * 10,
        samples_seen=index * 640,
        score=score,
        val_loss=1.0,
        train_loss=1.0,
        train_seconds=seconds,
        overhead_seconds=overhead,
        eval_seconds=0.1,
        final=False,
    )


def make_result(*evaluations: Evaluation) -> TrialResult:
    """A trial's result made of constructed ``evaluations`` (the last one is where it ended)."""
    last = evaluations[-1]
    return TrialResult(
        evaluations=evaluations,
        score=last.score,
        train_seconds=last.train_seconds,
        overhead_seconds=last.overhead_seconds,
        warmup_seconds=last.overhead_seconds,
        samples_per_second=1000.0,
        samples_seen=last.samples_seen,
        optimizer_steps=last.optimizer_steps,
        effective_batch_size=64,
        peak_memory_bytes=1,
        compiled_graphs=0,
        loss_scale=None,
        skipped_steps=0,
        time_breakdown=None,
        compile_seconds=None,
        flops_per_sample=None,
        gpu={},
        device_name="cpu",
        torch_version="2",
    )


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


def learning_rates(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    steps: int,
) -> list[float]:
    """The learning rate each of ``steps`` optimizer steps applies (one param group)."""
    assert len(optimizer.param_groups) == 1
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # no gradients: changes nothing, but counts as the step before
        if scheduler is not None:
            scheduler.step()
    return rates


def assert_trials_recorded(study: optuna.Study) -> None:
    """Every trial of a finished study is recorded: none is left RUNNING, a COMPLETE one has a
    finite value, and one that did not complete says why (``fail_kind`` and ``fail_msg``)."""
    from optuna.trial import TrialState

    for trial in study.get_trials():
        assert trial.state != TrialState.RUNNING, trial.number
        if trial.state == TrialState.COMPLETE:
            assert trial.value is not None and math.isfinite(trial.value)
        elif trial.state in (TrialState.PRUNED, TrialState.FAIL):
            assert trial.user_attrs.get("fail_kind") in KINDS, trial.number
            assert trial.user_attrs.get("fail_msg"), trial.number


def live_group_members(pgid: int) -> list[int]:
    """Processes in process group ``pgid`` that are not zombies (Linux /proc): what is left of a
    worker started as a group leader, and of the DataLoader workers it started."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, _, group = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except OSError:
            continue  # gone meanwhile
        if int(group) == pgid and state != "Z":
            members.append(int(entry.name))
    return members


# -- space files and the command --------------------------------------------------------------

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


def write_space(
    directory: Path, text: str | None = None, name: str = "tiny.yaml", **fields: Any
) -> Path:
    """Write a space file (the tiny one by default, formatted with ``fields``)."""
    values = {"n_trials": 4, "pruner": "none", **fields}
    path = directory / name
    path.write_text(textwrap.dedent(text) if text is not None else TINY_SPACE.format(**values))
    return path


def _environment(env: dict[str, str] | None) -> dict[str, str]:
    """This process's environment with a wide console and quiet warnings, ``env`` added."""
    return {**os.environ, "COLUMNS": "160", "PYTHONWARNINGS": "ignore", **(env or {})}


def run_cli(
    *args: str,
    cwd: Path,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    wrapper: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m autotune ARGS`` in ``cwd`` as a user would, capturing its output;
    ``env`` adds to the environment; ``wrapper`` is a command that runs it (``setpriv ...``)."""
    return subprocess.run(
        [*wrapper, sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env=_environment(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_script(
    script: Path, *args: str, block_autotune: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run an exported script as its user would (``python train.py ARGS`` in its folder);
    ``block_autotune`` (an ``import_blocker`` folder) makes importing autotune fail in it."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if block_autotune is not None:
        env["PYTHONPATH"] = str(block_autotune)
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def start_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start ``python -m autotune ARGS`` in ``cwd`` as run_cli runs it, without waiting: for tests
    that signal or kill it. Its output is piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env=_environment(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def import_blocker(directory: Path, package: str) -> Path:
    """A folder under ``directory`` to put on PYTHONPATH in which ``import package`` fails with
    ImportError('no PACKAGE here'): what a machine without that package does."""
    blocker = directory / "blocker"
    (blocker / package).mkdir(parents=True)
    (blocker / package / "__init__.py").write_text(f"raise ImportError('no {package} here')\n")
    return blocker


def imported_modules(source: str) -> set[str]:
    """The top-level packages a Python source imports (an exported file, say)."""
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    return modules


def provenance(source: str) -> dict[str, object]:
    """An exported file's PROVENANCE, read as data (ast.literal_eval: no code runs)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "PROVENANCE":
            found = ast.literal_eval(node.value)
            assert isinstance(found, dict)
            return found
    raise AssertionError("the file has no PROVENANCE")


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    """``ruff check`` of ``path`` with this project's configuration (pyproject.toml)."""
    config = Path(__file__).parents[1] / "pyproject.toml"
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(config), str(path)],
        capture_output=True,
        text=True,
    )
