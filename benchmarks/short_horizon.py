"""Does the short trials' answer still win at full length? (issue 43)

For each space file and seed: runs the study (``autotune.run``, its confirmation round
included), then ``autotune verify --runner-up`` at ``--epochs`` (the answer, the runner-up and
the two references trained for the full run in the trials' worker), and counts the seeds where
the answer also wins at full length over the runner-up: it reaches the target no later and ends
no worse (``Verification.losses`` names none of them for the runner-up).

    python benchmarks/short_horizon.py search_spaces/quickstart.yaml \\
        search_spaces/text_classifier.yaml --seeds 3 --epochs 10

Paste the printed table into BENCHMARKS.md, with the machine and its load.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import optuna

import autotune
from autotune.spacefile import load_spec
from autotune.study import Verification, VerifyInputs, verify_study
from autotune.worker import WorkerExecutor


def one(space: Path, seed: int, epochs: float, folder: Path) -> tuple[str, Verification]:
    """The study of ``space`` at ``seed``, then its verification at ``epochs``: (whether the
    answer held over the runner-up, the runs)."""
    storage = f"sqlite:///{folder / f'{space.stem}-{seed}.db'}"
    report = autotune.run(space, storage=storage, seed=seed, study_name=f"{space.stem}-{seed}")
    study = optuna.load_study(study_name=report.study_name, storage=storage)
    spec = load_spec(space)
    goal = spec.objective
    target = goal.goal
    executor = WorkerExecutor(spec.workload, space.parent, score=goal.score)
    try:
        verified = verify_study(VerifyInputs(study, executor, epochs, target, runner_up=True))
    finally:
        executor.close()
    if not verified.of_role("runner_up"):
        return "no runner-up", verified
    lost = [name for name, _ in verified.losses(goal.score_higher_is_better, goal.per_second)]
    return ("lost" if "the runner-up" in lost else "held"), verified


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spaces", type=Path, nargs="+")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=float, default=10)
    args = parser.parse_args()
    print(
        "| space | seed | the answer over the runner-up at full length | s to the target "
        "(answer, runner-up) | final score (answer, runner-up) |"
    )
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for space in args.spaces:
            held = 0
            for seed in range(args.seeds):
                verdict, verified = one(space, seed, args.epochs, Path(folder))
                spec = load_spec(space)
                higher = spec.objective.score_higher_is_better
                rows = {row.role: row for row in verified.rows(higher)}
                answer, second = rows.get("answer"), rows.get("runner_up")
                times = ", ".join(
                    "-" if r is None or r.to_target is None else f"{r.to_target:.3g}"
                    for r in (answer, second)
                )
                scores = ", ".join(
                    "-" if r is None or r.final_score is None else f"{r.final_score:.4g}"
                    for r in (answer, second)
                )
                print(f"| {space.name} | {seed} | {verdict} | {times} | {scores} |", flush=True)
                held += verdict == "held"
            print(f"| {space.name} | all | held in {held} of {args.seeds} seeds | | |", flush=True)


if __name__ == "__main__":
    main()
