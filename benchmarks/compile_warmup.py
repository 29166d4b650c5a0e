"""Does the first compiled trial of a fresh worker pay for loading the compiler? It must not.

In a fresh process the first cold ``torch.compile`` also loads Dynamo, AOTAutograd, Inductor and
the C++ toolchain (18.8 s against 2.8 s for the next, measured once on a 2-core CPU). A worker
warms the compiler's own machinery before its first compiled trial (autotune.training.warmup),
while the trial's own graphs stay cold. This benchmark trains the same compiled configuration three
times in each of ``--rounds`` fresh worker processes and compares the compile time charged to the
first trial with the later ones; as a control it does the same in fresh processes that skip the
warm-up (runner.train called directly).

    python benchmarks/compile_warmup.py [SPACE] [--rounds 3]   (SPACE: the quickstart)

Goal: the first compiled trial charged within 15% of the later ones (warmed); the control
shows what the warm-up removes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import optuna

from autotune.config import TrialConfig
from autotune.machine.hardware import detect
from autotune.search.references import baseline_params
from autotune.search.space import restrict, sample
from autotune.spacefile import WorkloadSpec, load_spec
from autotune.training.telemetry import fingerprint
from autotune.worker import WorkerExecutor

TRIALS = 3  # compiled trials per fresh process
QUICKSTART = Path(__file__).parent.parent / "search_spaces" / "quickstart.yaml"

COLD = """\
import json, sys
from pathlib import Path
from autotune.config import TrialConfig
from autotune.training.runner import train
from autotune.spacefile import WorkloadSpec
from autotune.workloads import load
workload = load(WorkloadSpec.model_validate_json(sys.argv[1]), base_dir=Path(sys.argv[2]))
config = TrialConfig.from_dict(json.loads(sys.argv[3]))
seconds = [train(config, workload, lambda e: False).compile_seconds for _ in range({trials})]
print(json.dumps(seconds))
"""


def config_for(space: Path) -> tuple[WorkloadSpec, TrialConfig]:
    """The space file's workload and its untuned baseline, compiled, for one epoch."""
    spec = load_spec(space)
    hardware = detect(spec.workload.device)
    spec = restrict(spec, hardware).spec
    baseline = sample(optuna.trial.FixedTrial(baseline_params(spec, hardware)), spec, hardware)
    return spec.workload, baseline.replace(compile="default", epochs=1, eval_every=1.0)


def warmed(workload: WorkloadSpec, base_dir: Path, config: TrialConfig) -> list[float]:
    """Compile seconds of TRIALS compiled trials in one fresh worker (warm-up on)."""
    executor = WorkerExecutor(workload, base_dir)
    try:
        return [
            executor.train(config, lambda e: False).compile_seconds or 0.0 for _ in range(TRIALS)
        ]
    finally:
        executor.close()


def cold(workload: WorkloadSpec, base_dir: Path, config: TrialConfig) -> list[float]:
    """The same in a fresh process that calls the training loop directly (no warm-up)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            COLD.format(trials=TRIALS),
            workload.model_dump_json(),
            str(base_dir),
            json.dumps(config.to_dict()),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        sys.exit(f"the control process failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("space", type=Path, nargs="?", default=Path(QUICKSTART))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    workload, config = config_for(args.space)
    base_dir = args.space.parent.resolve()
    print("| round | process | compile s: first, then later trials | first / later median |")
    print("|---|---|---|---|")
    ratios: dict[str, list[float]] = {"warmed": [], "cold": []}
    for round_number in range(args.rounds):
        # alternate which kind goes first, so that drift falls on both alike
        kinds = ("warmed", "cold") if round_number % 2 == 0 else ("cold", "warmed")
        for kind in kinds:
            measure = warmed if kind == "warmed" else cold
            seconds = measure(workload, base_dir, config)
            ratio = seconds[0] / statistics.median(seconds[1:])
            ratios[kind].append(ratio)
            listed = ", ".join(f"{s:.2f}" for s in seconds)
            print(f"| {round_number} | {kind} | {listed} | {ratio:.2f} |", flush=True)
    for kind, values in ratios.items():
        print(f"{kind}: first / later, median over rounds {statistics.median(values):.2f}")
    print(f"machine: {fingerprint(detect(workload.device))}")


if __name__ == "__main__":
    main()
