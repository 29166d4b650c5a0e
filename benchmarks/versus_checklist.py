"""The study's answer against both references, measured side by side in one process.

Runs the study a space file describes (``autotune run``), then trains three configurations in
rotating order (A B C, then C B A, ...), ``--repeats`` times each, in this process: the untuned
baseline (what a script that sets no flag gets), the tuning checklist (what PyTorch's performance
tuning guide sets: ``autotune.search.references.checklist_rules``) and the study's answer. Prints
samples/s, the score and the score per second of each (medians), the answer's ratios over both
references, the knobs where they differ, optionally the compile seconds of compile modes, and the
machine:

    python benchmarks/versus_checklist.py search_spaces/quickstart.yaml --repeats 3
    python benchmarks/versus_checklist.py search_spaces/cifar10_resnet18.yaml --timeout 180

The references are the study's own trials (its baseline and checklist) where it has them, else
built here from the space file. Paste the printed tables into BENCHMARKS.md.
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
from optuna.trial import TrialState

from autotune.config import TrialConfig
from autotune.faults import release_memory
from autotune.machine.hardware import detect
from autotune.results import TrialResult
from autotune.search.objective import charged_seconds
from autotune.search.references import checklist_params, untuned_config
from autotune.search.space import restrict, sample
from autotune.spacefile import Choice, Spec, load_spec
from autotune.study import TrialRecord, answer_trial, reference_trial, trial_config
from autotune.training.runner import train
from autotune.training.telemetry import fingerprint
from autotune.training.warmup import warm_process
from autotune.workloads import Workload, load

NAMES = ("baseline", "checklist", "answer")


def measure(config: TrialConfig, workload: Workload, spec: Spec) -> dict[str, float]:
    """One trial's figures; each run is warmed, compiles cold and returns its memory, as
    trials do (unwarmed, the checklist's first bf16 run paid its first kernels: 4.15 acc/s
    against 4.95 at the same samples/s on an H200)."""
    warm_process(config, workload)
    try:
        result: TrialResult = train(config, workload, lambda evaluation: False)
    finally:
        release_memory()
    last = result.evaluations[-1]
    seconds = charged_seconds(
        last.train_seconds, last.overhead_seconds, last.epoch, spec.objective.full_run_epochs
    )
    return {
        "samples_per_second": result.samples_per_second,
        "score": result.score,
        "score_per_second": result.score / seconds,
        "compile_seconds": result.compile_seconds or 0.0,
    }


def run_study(args: argparse.Namespace, spec: Spec, storage: str) -> None:
    """``autotune run`` on the space file, in its own process, as a user runs it."""
    command = [sys.executable, "-m", "autotune", "run", str(args.space), "--storage", storage]
    for flag, value in (("--n-trials", args.n_trials), ("--timeout", args.timeout)):
        if value:
            command += [flag, str(value)]
    if args.device:
        command += ["--device", args.device]
    subprocess.run(command, check=True)


def print_prediction(study: optuna.Study) -> None:
    """Stage 1 against the trials (issue 38 item 3): the median over the study's complete
    trials of each trial's steady samples/s over what stage 1 predicted for its settings."""
    ratios = sorted(
        record.samples_per_second / record.predicted_samples_per_second
        for record in map(TrialRecord.of, study.get_trials(states=[TrialState.COMPLETE]))
        if record.samples_per_second and record.predicted_samples_per_second
    )
    if ratios:
        print(
            f"stage 1 against the trials: trial / predicted samples/s, median "
            f"{statistics.median(ratios):.3f} over {len(ratios)} complete trials "
            f"({ratios[0]:.2f} .. {ratios[-1]:.2f})"
        )


def configurations(study: optuna.Study, spec: Spec, device: str) -> dict[str, TrialConfig]:
    """The baseline, the checklist and the answer: the study's trials where it has them."""
    answer = answer_trial(study)
    if answer is None:
        sys.exit("the study has no feasible answer to compare")
    hardware = detect(device)
    restricted = restrict(spec, hardware).spec
    found = {name: reference_trial(study, name) for name in NAMES[:2]}
    built = {"baseline": untuned_config(restricted, hardware)}
    params = checklist_params(restricted, hardware)
    if params is not None:
        built["checklist"] = sample(optuna.trial.FixedTrial(params), restricted, hardware)
    chosen = {
        name: trial_config(trial) if trial is not None else built.get(name)
        for name, trial in found.items()
    }
    return {**{k: v for k, v in chosen.items() if v is not None}, "answer": trial_config(answer)}


def print_table(runs: dict[str, list[dict[str, float]]], score: str) -> None:
    """Medians of each configuration, then the answer's ratios over each reference."""

    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[name])

    keys = ("samples_per_second", "score", "score_per_second")
    print(f"\n| | samples/s | {score} | {score}/s |\n|---|---|---|---|")
    for name in runs:
        shown = [f"{median(name, 'samples_per_second'):,.0f}"]
        shown += [f"{median(name, key):.4g}" for key in keys[1:]]
        print(f"| {name} | {' | '.join(shown)} |")
    for reference in [name for name in runs if name != "answer"]:
        ratios = [median("answer", key) / median(reference, key) for key in keys]
        print(f"| answer / {reference} | {' | '.join(f'{r:.2f}x' for r in ratios)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("space", type=Path)
    parser.add_argument("--n-trials", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=None, help="seconds for the study")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N")
    parser.add_argument(
        "--storage", default=None, help="a study already run there (default: run one afresh)"
    )
    parser.add_argument(
        "--compile-modes", default="", help="comma-separated modes to time on the answer"
    )
    parser.add_argument(
        "--checklist-lr-scales",
        default="",
        help="comma-separated factors: the checklist again at its learning rate times each",
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    spec = load_spec(args.space)
    storage = args.storage or f"sqlite:///{Path(tempfile.mkdtemp()) / 'versus.db'}"
    if args.storage is None:
        run_study(args, spec, storage)
    study = optuna.load_study(study_name=spec.study_name, storage=storage)
    device = args.device or spec.workload.device
    chosen = configurations(study, spec, device)
    for factor in map(float, filter(None, args.checklist_lr_scales.split(","))):
        checklist = chosen["checklist"]
        chosen[f"checklist lr x{factor:g}"] = checklist.replace(
            lr=checklist.lr * factor, base_lr=checklist.base_lr * factor
        )
    workload = load(spec.workload, args.space.parent, spec.objective.score)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in chosen}
    for repeat in range(args.repeats):
        order = list(chosen.items())
        for name, config in order if repeat % 2 == 0 else reversed(order):
            runs[name].append(measure(config, workload, spec))
            print(f"  {name} run {repeat + 1}: {runs[name][-1]}", flush=True)

    answer = answer_trial(study)
    print(f"\nstudy {spec.study_name} ({args.space}), answer trial {answer and answer.number}")
    print_prediction(study)
    print_table(runs, spec.objective.score_name)
    print("\n| knob | " + " | ".join(chosen) + " |\n|---|" + "---|" * len(chosen))
    knobs = {name: config.to_dict() for name, config in chosen.items()}
    for knob in knobs["answer"]:
        values = [knobs[name][knob] for name in chosen]
        if len({str(v) for v in values}) > 1:
            print(f"| {knob} | " + " | ".join(str(v) for v in values) + " |")
    modes = [m for m in args.compile_modes.split(",") if m and m != "none"]
    if isinstance(spec.space.compile, Choice) and modes:
        print("\n| compile mode | compile seconds | samples/s |\n|---|---|---|")
    for mode in modes:
        try:
            result = measure(chosen["answer"].replace(compile=mode), workload, spec)
        except Exception as error:  # a mode this machine cannot run is a finding too
            print(f"| {mode} | failed: {type(error).__name__}: {str(error)[:80]} | |")
            continue
        print(
            f"| {mode} | {result['compile_seconds']:.1f} | {result['samples_per_second']:,.0f} |"
        )
    print(f"\nmachine: {fingerprint(detect(device))}")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")


if __name__ == "__main__":
    main()
