"""How much does autotune's trial loop cost over a minimal hand-written training loop?

Both loops train the same model on the same data with the same DataLoader, optimizer and batch
size; each is timed in steady state (after the same warm-up steps, device synchronized at the
boundaries only). They run alternately, several times, in one process, and the ratio of the
median step times is printed: 1.00 means no overhead. The goal is a ratio within 1.02.

    python benchmarks/harness_overhead.py                      # CPU, digits_cnn
    python benchmarks/harness_overhead.py --device cuda --batch-size 512
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
from torch import nn

from autotune.config import TrialConfig
from autotune.machine.hardware import detect
from autotune.pipeline import make_train_loader
from autotune.results import Evaluation
from autotune.spacefile import WorkloadSpec
from autotune.training.clocks import MAX_WARMUP_STEPS
from autotune.training.runner import train
from autotune.training.timing import synchronize
from autotune.training.trainer import backend_flags
from autotune.workloads import Workload, load


def config_for(args: argparse.Namespace, device: str) -> TrialConfig:
    return TrialConfig(
        lr=1e-3,
        base_lr=1e-3,
        lr_scaling="none",
        base_batch_size=256,
        batch_size=args.batch_size,
        accumulation_steps=1,
        optimizer="adamw",
        weight_decay=0.0,
        momentum=None,
        nesterov=False,
        schedule="constant",
        warmup_fraction=0.0,
        num_workers=args.num_workers,
        pin_memory=device.startswith("cuda"),
        prefetch_factor=2 if args.num_workers else None,
        persistent_workers=bool(args.num_workers),
        precision="fp32",
        compile="none",
        channels_last=False,
        cudnn_benchmark=False,
        device=device,
        epochs=args.epochs,
        eval_every=args.epochs,  # one evaluation, at the end: nothing interrupts the steps
        val_batch_size=1024,
        seed=0,
    )


def autotune_step_seconds(config: TrialConfig, workload: Workload) -> float:
    """Steady-state seconds per optimizer step of autotune's runner."""

    def report(evaluation: Evaluation) -> bool:
        return False

    result = train(config, workload, report)
    return config.effective_batch_size / result.samples_per_second


def minimal_step_seconds(config: TrialConfig, workload: Workload) -> float:
    """Steady-state seconds per step of the shortest correct loop one would write by hand,
    under the same TF32 and cuDNN settings as the trial (fp32: PyTorch's defaults)."""
    with backend_flags(config):
        return _minimal_loop(config, workload)


def _minimal_loop(config: TrialConfig, workload: Workload) -> float:
    device = torch.device(config.device)
    torch.manual_seed(config.seed)
    model = workload.build_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    loader = make_train_loader(workload.train_set, config, config.seed)
    total_steps = int(config.epochs * len(loader))
    warmup = min(MAX_WARMUP_STEPS, max(1, total_steps // 2))
    step = 0
    started = 0.0
    while step < total_steps:
        for inputs, targets in loader:
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            loss = nn.functional.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step == warmup:
                synchronize(device)
                started = time.perf_counter()
            if step == total_steps:
                break
    synchronize(device)
    return (time.perf_counter() - started) / (total_steps - warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="digits_cnn")
    parser.add_argument("--data", default="digits")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--epochs", type=float, default=4.0)
    parser.add_argument(
        "--min-steps",
        type=int,
        default=300,
        help="timed steps per run at least (more epochs where --epochs gives fewer)",
    )
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    hardware = detect(args.device)
    workload = load(WorkloadSpec(model=args.model, data=args.data))
    # a window of a few steps measures the epoch boundaries and the clock, not the loop: on a
    # GPU, digits at batch 512 makes 4 steps an epoch, and 4 epochs time 11 of them
    steps_per_epoch = max(1, len(workload.train_set) // args.batch_size)  # type: ignore[arg-type]
    wanted = (args.min_steps + MAX_WARMUP_STEPS) / steps_per_epoch
    args.epochs = max(args.epochs, math.ceil(wanted))
    config = config_for(args, hardware.device)
    print(
        f"{workload.name}, batch {args.batch_size}, {args.num_workers} workers, fp32 eager, "
        f"{args.epochs:g} epochs per run, on {hardware.device_name} (torch "
        f"{hardware.torch_version}, {torch.get_num_threads()} threads)"
    )
    autotune_steps: list[float] = []
    minimal_steps: list[float] = []
    autotune_step_seconds(config, workload)  # warm the process (allocator, thread pool)
    for repeat in range(args.repeats):
        # alternate which goes first so drift on a shared machine hits both alike
        order = [autotune_step_seconds, minimal_step_seconds]
        if repeat % 2:
            order.reverse()
        for measure in order:
            seconds = measure(config, workload)
            (autotune_steps if measure is autotune_step_seconds else minimal_steps).append(seconds)
        print(
            f"  run {repeat + 1}: autotune {autotune_steps[-1] * 1e3:.3f} ms/step, "
            f"minimal {minimal_steps[-1] * 1e3:.3f} ms/step"
        )
    autotune_median = statistics.median(autotune_steps)
    minimal_median = statistics.median(minimal_steps)
    ratios = sorted(a / m for a, m in zip(autotune_steps, minimal_steps, strict=True))
    print(
        f"median step: autotune {autotune_median * 1e3:.3f} ms, minimal "
        f"{minimal_median * 1e3:.3f} ms; ratio of medians {autotune_median / minimal_median:.3f} "
        f"(per-run ratios {ratios[0]:.3f} .. {ratios[-1]:.3f}, median "
        f"{statistics.median(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
