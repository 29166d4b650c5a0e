"""What stage 1 costs when a space adds the knobs users add first, and what it would cost on a GPU.

(a) Times stage 1 of the quickstart as it ships (eager) and with ``compile: [none, default]``
and ``channels_last: [false, true]`` added, each in a fresh study and a fresh worker process,
one after the other, and prints for each: its wall time, the measurements taken, the cold
compiles against the distinct compiled graphs it timed, the compile seconds it charged, and the
spread of every cell's chosen measurement.

    python benchmarks/stage1_cost.py [SPACE]          (SPACE: the quickstart)

Goals (issue 25): stage 1 with the two knobs at most 2x the eager one; cold compiles equal to
the distinct graphs timed; every cell's spread under 15% on a quiet machine.

(b) ``--plan SPACE [--gpu]`` prints, without running anything, what the plan says before stage
1 starts: its measurements, cold compiles, and wall time from the compile-time guesses in
``autotune.stage1._plan.COMPILE_SECONDS_GUESS`` (``--gpu``: as on a CUDA GPU with bf16,
fp16 and TF32, 16 cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import optuna

from autotune.config import TrialConfig
from autotune.machine.hardware import Hardware, detect
from autotune.search.space import restrict
from autotune.spacefile import Spec, load_spec, parse_spec
from autotune.stage1._stage import run_speed_stage
from autotune.stage1._take import StageInputs
from autotune.study import SpeedEvent, SpeedRecord, open_storage, open_study, speed_study_name
from autotune.training.context import graph_key
from autotune.worker import WorkerExecutor
from autotune.workloads import load

QUICKSTART = Path(__file__).parent.parent / "search_spaces" / "quickstart.yaml"
ADDED = "  compile: [none, default]\n  channels_last: [false, true]\n"


def stage_one(spec: Spec, hardware: Hardware, directory: Path) -> dict[str, float]:
    """Run stage 1 of ``spec`` in a fresh study and worker; what it cost."""
    workload = load(spec.workload, directory, spec.objective.score)
    url = f"sqlite:///{directory / 'stage1.db'}"
    study = open_study(spec, open_storage(url), hardware, workload)
    executor = WorkerExecutor(spec.workload, directory, score=spec.objective.score)
    events: list[SpeedEvent] = []
    try:
        started = time.monotonic()
        table = run_speed_stage(
            StageInputs(study, spec, hardware, executor, workload, on_event=events.append)
        )
        seconds = time.monotonic() - started
    finally:
        executor.close()
    speed = optuna.load_study(study_name=speed_study_name(study.study_name), storage=url)
    measured = []
    for trial in speed.trials:
        record = SpeedRecord.of(trial)
        result = record.result() if record is not None else None
        if result is not None:
            measured.append((trial, result))
    compiled = [(t, m) for t, m in measured if m.compile_seconds is not None]
    graphs = {graph_key(dataclasses.replace(_config_of(t, spec, hardware))) for t, _ in compiled}
    spreads = [choice.spread for choice in table if choice.accumulation_steps == 1]
    return {
        "seconds": seconds,
        "measurements": len(speed.trials),
        "cold_compiles": sum(1 for _, m in compiled if not m.compile_warm),
        "graphs": len(graphs),
        "compile_seconds": sum(
            m.compile_seconds or 0.0 for _, m in compiled if not m.compile_warm
        ),
        "left_out_for_budget": sum(1 for e in events if "budget" in (e.fault or "")),
        "worst_spread": max(spreads, default=0.0),
        "median_spread": statistics.median(spreads) if spreads else 0.0,
    }


def _config_of(trial: optuna.trial.FrozenTrial, spec: Spec, hardware: Hardware) -> TrialConfig:
    """The configuration a speed trial timed: its parameters over the untuned baseline."""
    from autotune.search.references import untuned_config

    base = untuned_config(spec, hardware)
    fields = {f.name for f in dataclasses.fields(base)}
    params = {k: v for k, v in trial.params.items() if k in fields}
    return base.replace(accumulation_steps=1, **params)


def plan_only(space: Path, gpu: bool) -> None:
    from autotune.display._plan import stage_one_plan
    from autotune.testing import AMPERE

    hardware = dataclasses.replace(AMPERE, cpu_count=16) if gpu else detect("cpu")
    spec = restrict(load_spec(space), hardware).spec
    print(f"{space.name} on {hardware.device_name if gpu else 'this CPU'}:")
    print(f"  stage 1: {stage_one_plan(spec, hardware)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("space", nargs="?", type=Path, default=QUICKSTART)
    parser.add_argument("--plan", action="store_true", help="print the plan's estimate only")
    parser.add_argument("--gpu", action="store_true", help="the estimate on a described GPU")
    args = parser.parse_args()
    if args.plan:
        plan_only(args.space, args.gpu)
        return
    text = args.space.read_text()
    hardware = detect("cpu")
    rows = []
    for label, added in (("eager (as shipped)", ""), ("+ compile, channels_last", ADDED)):
        with tempfile.TemporaryDirectory() as scratch:
            directory = Path(scratch)
            marker = "space:\n"
            body = text.replace(marker, marker + added, 1) if added else text
            (directory / "space.yaml").write_text(body)
            spec = parse_spec(body, directory / "space.yaml")
            spec = restrict(spec, hardware).spec
            rows.append((label, stage_one(spec, hardware, directory)))
    budget = load_spec(args.space).study
    print(
        f"stage 1 of {args.space.name} on {hardware.device_name} (budget "
        f"{budget.speed.budget_seconds(budget.timeout):g} s):"
    )
    for label, row in rows:
        print(
            f"  {label:26s} {row['seconds']:6.1f} s  {row['measurements']:3.0f} measurements  "
            f"{row['cold_compiles']:.0f} cold compiles for {row['graphs']:.0f} graphs "
            f"({row['compile_seconds']:.1f} s)  spread median {row['median_spread']:.0%}, "
            f"worst {row['worst_spread']:.0%}; {row['left_out_for_budget']:.0f} left out for "
            f"the budget"
        )
    ratio = rows[1][1]["seconds"] / rows[0][1]["seconds"]
    print(f"  ratio {ratio:.2f}x (goal: at most 2x)")


if __name__ == "__main__":
    main()
