"""Does stage 1 predict what a trial then measures? Bursts against whole trials, side by side.

A two-stage study chooses each trial's execution settings from stage 1's timed bursts
(``bursts.measure``) and flags a trial that trains more than 10% off the prediction. This
benchmark checks the prediction itself: for a few configurations of a space file's workload it
alternates, in one process, a stage 1 measurement and a whole trial of the same configuration
(B T T B B T ...), and compares stage 1's predicted samples/s (epoch starts included, at the
trial's accumulation) with the trial's steady-state samples/s. Medians and their ratio; the
per-pair ratios show the spread. Goal: the ratio of medians within 0.90 .. 1.10.

    python benchmarks/speed_prediction.py search_spaces/quickstart.yaml --pairs 7

Paste the printed table into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from autotune.machine.hardware import detect
from autotune.search.references import untuned_config
from autotune.search.space import restrict
from autotune.spacefile import load_spec
from autotune.speed import BurstPlan
from autotune.testing import never_stop
from autotune.training import bursts, runner
from autotune.training.warmup import Warmth
from autotune.workloads import load

# (batch_size, accumulation_steps, precision, data_pipeline, num_workers)
CONFIGURATIONS = [
    (32, 1, "fp32", "dataloader", 0),
    (128, 1, "fp32", "device", 0),
    (64, 2, "fp32", "device", 0),
    (64, 1, "fp32", "dataloader", 2),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("space", type=Path)
    parser.add_argument("--pairs", type=int, default=7, help="measurement/trial pairs each")
    args = parser.parse_args()
    spec = load_spec(args.space)
    hardware = detect(spec.workload.device)
    workload = load(spec.workload, args.space.parent, spec.objective.score)
    spec = restrict(spec, hardware, workload).spec
    plan = BurstPlan(bursts=spec.study.speed.bursts, burst_seconds=spec.study.speed.burst_seconds)
    base = untuned_config(spec, hardware)
    print(
        f"{hardware.device_name}, torch {hardware.torch_version}; {spec.workload.model} on "
        f"{spec.workload.data}, {spec.workload.epochs:g} epochs a trial"
    )
    print()
    print(
        "| configuration | stage 1 samples/s | trial samples/s | trial / stage 1 "
        "(ratio of medians) | per-pair ratios |"
    )
    print("|---|---|---|---|---|")
    warmth = Warmth()
    for batch, steps, precision, pipeline, workers in CONFIGURATIONS:
        config = base.replace(
            batch_size=batch,
            accumulation_steps=steps,
            precision=precision,
            data_pipeline=pipeline,
            num_workers=workers,
            prefetch_factor=2 if workers else None,
        )
        warmth.warm_for(config, workload)
        predicted: list[float] = []
        trained: list[float] = []
        for pair in range(args.pairs):
            order = ("burst", "trial") if pair % 2 == 0 else ("trial", "burst")
            for what in order:
                if what == "burst":
                    measured = bursts.measure(config, workload, plan)
                    predicted.append(measured.samples_per_second(steps))
                else:
                    trained.append(runner.train(config, workload, never_stop).samples_per_second)
        ratios = sorted(t / p for t, p in zip(trained, predicted, strict=True))
        label = f"batch {batch} x {steps}, {precision}, {pipeline}" + (
            f", {workers} workers" if workers else ""
        )
        print(
            f"| {label} | {statistics.median(predicted):,.0f} | {statistics.median(trained):,.0f} "
            f"| {statistics.median(trained) / statistics.median(predicted):.3f} | "
            f"{ratios[0]:.2f} .. {ratios[-1]:.2f} |"
        )


if __name__ == "__main__":
    main()
