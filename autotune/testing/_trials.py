"""What tests of a study share: this machine and described ones, a plain TrialConfig, made
evaluations and results, the CUDA flags, learning rates, the records of a study, and the
processes of a group."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from autotune.config import TrialConfig
from autotune.faults import FaultKind
from autotune.knobs import KNOBS
from autotune.machine.hardware import Hardware, detect
from autotune.results import Evaluation, TrialResult

if TYPE_CHECKING:
    import optuna  # for a type only: a worker loading the tiny workloads need not import it


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
    bf16_native=True,
)
VOLTA = dataclasses.replace(
    AMPERE, cuda_capability=(7, 0), bf16=False, bf16_native=False, tf32=False
)


# -- trials -----------------------------------------------------------------------------------


def make_config(**changes: Any) -> TrialConfig:
    """A plain CPU configuration: fp32, eager, AdamW, constant lr, no workers."""
    base: dict[str, Any] = {name: info.default for name, info in KNOBS.items()}
    base.update(lr=1e-2, base_lr=1e-2, batch_size=32, momentum=None, prefetch_factor=None)
    base.update(device="cpu", epochs=2.0, eval_every=1.0, val_batch_size=256, seed=0)
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
            assert trial.user_attrs.get("fail_kind") in tuple(FaultKind), trial.number
            assert trial.user_attrs.get("fail_msg"), trial.number


def beat_long_ago(database: Path, seconds: int = 10) -> None:
    """Move every trial's last heartbeat in the SQLite file ``database`` ``seconds`` into the
    past, on the storage's own clock: as if its process had been silent that long (longer
    than three heartbeat intervals of a second), without waiting for it."""
    import sqlite3

    with sqlite3.connect(database) as connection:
        connection.execute(
            "UPDATE trial_heartbeats SET heartbeat = datetime(heartbeat, ?)",
            (f"-{seconds} seconds",),
        )


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
