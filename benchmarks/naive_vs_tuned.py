"""The untuned configuration against the one a study finds, measured side by side.

Runs the study a space file describes (``autotune run``), then trains its untuned baseline
(trial 0: fp32 as PyTorch's defaults have it, TF32 convolutions included, eager, DataLoader
without workers, unless the space pins otherwise) and its best feasible configuration
alternately, ``--repeats`` times each, in one process, and prints samples/s, accuracy and
accuracy per second with their ratios (medians), the compile seconds of every compile mode the
space offers, and the machine. Meant for a CUDA GPU:

    python benchmarks/naive_vs_tuned.py search_spaces/cifar10_resnet18.yaml --timeout 300

(``--timeout`` and ``--compile-modes`` keep it inside a time budget: every compiled run compiles
cold, and max-autotune can take minutes.)

Paste the printed table into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import torch

from autotune.config import TrialConfig
from autotune.faults import release_memory
from autotune.hardware import detect
from autotune.objective import charged_seconds
from autotune.results import TrialResult
from autotune.runner import train
from autotune.spec import Choice, load_spec
from autotune.study import TrialRecord, answer_trial, trial_config
from autotune.telemetry import fingerprint
from autotune.workloads import load


def measure(config: TrialConfig, workload, full_run_epochs: float | None) -> dict[str, float]:
    """One trial's figures; each run compiles cold and returns its memory, as trials do."""
    try:
        result: TrialResult = train(config, workload, lambda evaluation: False)
    finally:
        release_memory()
    last = result.evaluations[-1]
    seconds = charged_seconds(
        last.train_seconds, last.overhead_seconds, last.epoch, full_run_epochs
    )
    return {
        "samples_per_second": result.samples_per_second,
        "accuracy": result.score,
        "accuracy_per_second": result.score / seconds,
        "compile_seconds": result.compile_seconds or 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("space", type=Path)
    parser.add_argument("--n-trials", type=int, default=None)
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds for the study (then it stops)"
    )
    parser.add_argument(
        "--compile-modes",
        default=None,
        help="comma-separated modes to time (default: every mode the space offers; '' for none)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--storage", default=None, help="default: a fresh SQLite file")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    spec = load_spec(args.space)
    scratch = Path(tempfile.mkdtemp(prefix="autotune-bench-"))
    storage = args.storage or f"sqlite:///{scratch / 'bench.db'}"
    command = [sys.executable, "-m", "autotune", "run", str(args.space), "--storage", storage]
    if args.n_trials:
        command += ["--n-trials", str(args.n_trials)]
    if args.timeout:
        command += ["--timeout", str(args.timeout)]
    if args.device:
        command += ["--device", args.device]
    subprocess.run(command, check=True)

    study = optuna.load_study(study_name=spec.study_name, storage=storage)
    best = answer_trial(study)  # the confirmed winner when the study confirmed one
    baseline = next((t for t in study.trials if TrialRecord.of(t).baseline), None)
    if best is None or baseline is None or TrialRecord.of(baseline).config is None:
        sys.exit("the study has no feasible best trial or no baseline trial to compare")
    tuned, naive = trial_config(best), trial_config(baseline)
    hardware = detect(args.device or spec.workload.device)
    workload = load(spec.workload, args.space.parent, spec.objective.score)
    full = spec.objective.full_run_epochs

    runs: dict[str, list[dict[str, float]]] = {"naive": [], "tuned": []}
    for repeat in range(args.repeats):
        order = [("naive", naive), ("tuned", tuned)]
        if repeat % 2:
            order.reverse()  # drift on a shared machine hits both alike
        for name, config in order:
            runs[name].append(measure(config, workload, full))
            print(f"  {name} run {repeat + 1}: {runs[name][-1]}", flush=True)

    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[name])

    print(f"\nstudy {spec.study_name}: best trial {best.number}, baseline trial {baseline.number}")
    if best.number == baseline.number:
        print("the untuned baseline is the study's best: the ratios below are run-to-run noise")
    print("| | samples/s | accuracy | accuracy/s |")
    print("|---|---|---|---|")
    for name in ("naive", "tuned"):
        print(
            f"| {name} | {median(name, 'samples_per_second'):,.0f} | "
            f"{median(name, 'accuracy'):.4f} | {median(name, 'accuracy_per_second'):.4f} |"
        )
    ratios = [
        median("tuned", key) / median("naive", key)
        for key in ("samples_per_second", "accuracy", "accuracy_per_second")
    ]
    print(f"| tuned / naive | {ratios[0]:.2f}x | {ratios[1]:.3f}x | {ratios[2]:.2f}x |")
    naive_knobs, tuned_knobs = naive.to_dict(), tuned.to_dict()
    print("\n| knob | naive | tuned |\n|---|---|---|")
    for knob, value in tuned_knobs.items():
        if naive_knobs[knob] != value:
            print(f"| {knob} | {naive_knobs[knob]} | {value} |")

    modes = spec.space.compile.values if isinstance(spec.space.compile, Choice) else ()
    if args.compile_modes is not None:
        modes = tuple(mode for mode in args.compile_modes.split(",") if mode)
    print("\n| compile mode | compile seconds | samples/s |")
    print("|---|---|---|")
    for mode in modes:
        if mode == "none":
            continue
        try:
            result = measure(tuned.replace(compile=mode), workload, full)
        except Exception as error:  # a mode this machine cannot run is a finding too
            print(f"| {mode} | failed: {type(error).__name__}: {str(error)[:80]} | |")
            continue
        print(
            f"| {mode} | {result['compile_seconds']:.1f} | {result['samples_per_second']:,.0f} |"
        )
    print(f"\nmachine: {fingerprint(hardware)}")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")


if __name__ == "__main__":
    main()
