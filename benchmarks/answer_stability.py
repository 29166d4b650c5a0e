"""Is the study's answer the real best? Runs a study several times, then re-measures.

For each seed: runs the study a space file describes (its own confirmation round included, as
`autotune run` does), then, independently of the study's measurements, re-measures its five best
configurations and its untuned baseline in one fresh worker, interleaved (A B C ... then
... C B A), ``--repeats`` runs each with new seeds, and compares:

- whether the study's answer is the re-measured best, or within 3% of it;
- the Spearman correlation of the study's confirmed order with the re-measured order;
- the speed-up over the baseline the study reported against the re-measured one;
- the baseline's samples/s in the study (its trial 0, the first of a fresh worker) against its
  re-measured median: the first trial of a process must not be measured slow;
- whether the re-measured best was among the configurations the round confirmed (it cannot
  name one it did not measure), and the re-measurement's own spread (the median half-range
  over median of its configurations): differences under it are not resolved by it either.

    python benchmarks/answer_stability.py search_spaces/quickstart.yaml --seeds 10

Paste the printed table into BENCHMARKS.md. Goals on the quickstart: the answer within 3% of the
re-measured best in at least 9 of 10 seeds; the reported speed-up within 5% of the re-measured.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import optuna
from _stats import spearman  # benchmarks/_stats.py, beside this script

from autotune.executor import InProcessExecutor
from autotune.machine.hardware import detect
from autotune.machine.interference import interfered
from autotune.search import objective
from autotune.search.space import restrict
from autotune.spacefile import Spec, load_spec
from autotune.study import (
    Answer,
    ConfirmationInputs,
    StudyInputs,
    StudyRecord,
    TrialRecord,
    answer_trial,
    confirm_study,
    feasible_trials,
    open_storage,
    open_study,
    reference_trial,
    run_study,
    trial_config,
)
from autotune.training.telemetry import fingerprint
from autotune.worker import WorkerExecutor
from autotune.workloads import load

REMEASURED = 5  # configurations re-measured per seed, besides the baseline
SEED_OFFSET = 7_777_777  # re-measuring seeds: apart from the study's and its confirmation's


def study_once(spec: Spec, seed: int, directory: Path, isolation: str) -> optuna.Study:
    """The study with ``seed``, run and confirmed as `autotune run` does."""
    spec = spec.with_overrides(
        study={"seed": seed, "name": f"{spec.study_name}-seed{seed}"},
    )
    hardware = detect(spec.workload.device)
    workload = load(spec.workload, spec.path.parent if spec.path else None, spec.objective.score)
    spec = restrict(spec, hardware, workload).spec
    storage = open_storage(f"sqlite:///{directory / 'stability.db'}")
    study = open_study(spec, storage, hardware, workload)
    executor = (
        WorkerExecutor(
            spec.workload, spec.path.parent if spec.path else None, score=spec.objective.score
        )
        if isolation == "worker"
        else InProcessExecutor(workload)
    )
    try:
        run_study(StudyInputs(study, spec, hardware, executor))
        plan = spec.study.confirm
        if plan.enabled:
            goal = spec.objective
            confirm_study(ConfirmationInputs(study, goal, executor, plan.top, plan.repeats))
    finally:
        executor.close()
    return study


def remeasure(
    spec: Spec, study: optuna.Study, repeats: int, isolation: str
) -> tuple[dict[int, list[float]], dict[int, list[float]], int]:
    """trial -> its re-measured values (the objective's), and samples/s, interleaved, in a
    fresh worker; runs measured under interference are left out where a trial has clean ones
    (their number is the third element)."""
    trials = [t for t in feasible_trials(study)[:REMEASURED]]
    baseline = reference_trial(study, "baseline")
    if baseline is not None and baseline not in trials:
        trials.append(baseline)
    workload = load(spec.workload, spec.path.parent if spec.path else None, spec.objective.score)
    executor = (
        WorkerExecutor(
            spec.workload, spec.path.parent if spec.path else None, score=spec.objective.score
        )
        if isolation == "worker"
        else InProcessExecutor(workload)
    )
    values: dict[int, list[float]] = {t.number: [] for t in trials}
    speeds: dict[int, list[float]] = {t.number: [] for t in trials}
    flagged_values: dict[int, list[float]] = {t.number: [] for t in trials}
    flagged_speeds: dict[int, list[float]] = {t.number: [] for t in trials}
    try:
        for repeat in range(repeats):
            order = trials if repeat % 2 == 0 else list(reversed(trials))
            for trial in order:
                config = trial_config(trial)
                config = config.replace(seed=config.seed + SEED_OFFSET + repeat)
                result = executor.train(
                    config, lambda e: objective.target_reached(e, spec.objective)
                )
                value = objective.score(result, spec.objective).value
                quiet = not interfered(result.other_cpu_share)
                (values if quiet else flagged_values)[trial.number].append(value)
                (speeds if quiet else flagged_speeds)[trial.number].append(
                    result.samples_per_second
                )
    finally:
        executor.close()
    for number in values:
        if not values[number]:  # never quiet: the flagged runs are all there is
            values[number], speeds[number] = flagged_values[number], flagged_speeds[number]
    return values, speeds, sum(len(v) for v in flagged_values.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("space", type=Path)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5, help="re-measured runs per config")
    parser.add_argument("--isolation", default="worker", choices=("worker", "none"))
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_spec(args.space)
    maximize = spec.objective.direction == "maximize"
    sign = 1.0 if maximize else -1.0
    directory = Path(tempfile.mkdtemp(prefix="autotune-stability-"))
    rows = []
    print(
        "| seed | answer | re-measured best | answer / best | Spearman | reported speed-up | "
        "re-measured speed-up | baseline samples/s in study / re-measured | "
        "flagged: study / round / re-measure | best in the round? | re-measure spread | minutes |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        started = time.monotonic()
        study = study_once(spec, seed, directory, args.isolation)
        values, speeds, flagged = remeasure(spec, study, args.repeats, args.isolation)
        medians = {n: statistics.median(v) for n, v in values.items()}
        answer = answer_trial(study)
        baseline = reference_trial(study, "baseline")
        confirmation = StudyRecord.of(study).confirmation
        verdict = Answer.of_round(confirmation, study.trials[0]) if confirmation else None
        flagged_in_study = sum(1 for t in study.trials if TrialRecord.of(t).interference)
        flagged_in_round = sum(1 for r in confirmation.runs if r.interfered) if confirmation else 0
        leaders = [n for n in medians if baseline is None or n != baseline.number]
        best = max(leaders, key=lambda n: sign * medians[n])
        ratio = (
            medians[answer.number] / medians[best]
            if answer is not None and answer.number in medians
            else float("nan")
        )
        within = ratio if maximize else 1 / ratio
        # the study's order of the re-measured leaders: confirmed medians where confirmed
        ranked = [c for c in verdict.configurations if c.eligible and c.values] if verdict else []
        confirmed = {c.trial: c.median for c in ranked}
        trial_values = {t.number: t.value for t in study.trials if t.value is not None}
        study_values = [confirmed.get(n, trial_values[n]) for n in leaders]
        rho = spearman([sign * v for v in study_values], [sign * medians[n] for n in leaders])
        reported = (
            verdict.measured_ratio(verdict.configuration_of("baseline")) if verdict else None
        )
        measured = None
        if baseline is not None and answer is not None and answer.number in medians:
            measured = medians[answer.number] / medians[baseline.number]
            measured = measured if maximize else 1 / measured
        baseline_speed = "-"
        if baseline is not None:
            in_study = TrialRecord.of(baseline).samples_per_second or 0.0
            again = statistics.median(speeds[baseline.number])
            baseline_speed = f"{in_study:,.0f} / {again:,.0f} ({in_study / again:.2f})"
        rows.append((within, reported, measured))
        # could the round have named it? and how far apart the re-measurement itself can tell
        in_round = "yes" if confirmation and best in confirmation.candidates else "no"
        halves = [
            (max(v) - min(v)) / 2 / statistics.median(v) for v in values.values() if len(v) > 1
        ]
        noise = f"±{statistics.median(halves):.0%}" if halves else "-"
        print(
            f"| {seed} | {answer.number if answer else '-'} | {best} | {within:.3f} | "
            f"{rho:.2f} | {f'{reported:.2f}x' if reported else '-'} | "
            f"{f'{measured:.2f}x' if measured else '-'} | {baseline_speed} | "
            f"{flagged_in_study} / {flagged_in_round} / {flagged} | {in_round} | {noise} | "
            f"{(time.monotonic() - started) / 60:.1f} |",
            flush=True,
        )
    close = sum(1 for within, _, _ in rows if within >= 0.97)
    errors = [abs(r / m - 1) for _, r, m in rows if r and m]
    print(f"\nanswer within 3% of the re-measured best: {close} of {len(rows)} seeds")
    if errors:
        print(f"reported speed-up vs re-measured: median error {statistics.median(errors):.1%}")
    print(f"machine: {fingerprint(detect(spec.workload.device))}")


if __name__ == "__main__":
    main()
