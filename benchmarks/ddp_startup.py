"""What a distributed (DDP) trial pays to start its processes, beside a one-process trial.

A trial of ``workload.gpus_per_trial`` N starts N fresh rank processes (spawn, imports, the
workload loaded from its spec, the process group joined, a warm-up and a first collective)
before any clock starts: that time is not in the trial's measurement, but it is in the study's
wall clock. This benchmark trains the same configuration of the bundled digits CNN, on this
machine's CPU, as one process (in this process, warmed) and as two processes (gloo, a core
each): on ranks kept from trial to trial (a ``RankPool``, as a worker keeps them) and on ranks
started for the trial alone. Arms rotate (A B C, then C B A, ...); printed per arm are the median
wall seconds of a trial, the median train_seconds inside it, and what the rest adds.

    python benchmarks/ddp_startup.py --rounds 4

No goal: the figures are what the README's "Multi-GPU trials" paragraph quotes.
"""

from __future__ import annotations

import argparse
import statistics
import time

from autotune import distributed, workloads
from autotune.config import TrialConfig
from autotune.executor import InProcessExecutor
from autotune.results import Evaluation, TrialResult
from autotune.spacefile import WorkloadSpec
from autotune.testing import make_config

SPEC = WorkloadSpec(model="digits_cnn", data="digits", epochs=1, eval_every=1, device="cpu")


def never_stop(evaluation: Evaluation) -> bool:
    return False


def _fresh(source: distributed.WorkloadSource, config: TrialConfig) -> TrialResult:
    """One trial on a pool started for it alone: its processes start and stop with it."""
    pool = distributed.RankPool(source)
    try:
        return pool.train(config, never_stop)
    finally:
        pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="trials per arm")
    args = parser.parse_args()
    config = make_config(batch_size=32, epochs=1.0, eval_every=1.0)
    one = InProcessExecutor(workloads.load(SPEC, None, "accuracy"))
    one.train(config, never_stop)  # this process's first work, paid before the rounds
    source = distributed.WorkloadSource(SPEC, None, "accuracy")
    two = config.replace(world_size=2)
    pool = distributed.RankPool(source)
    pool.train(two, never_stop)  # the kept ranks' start-up, paid before the rounds
    arms = {
        "1 process": lambda: one.train(config, never_stop),
        "2, kept": lambda: pool.train(two, never_stop),
        "2, fresh": lambda: _fresh(source, two),
    }
    wall: dict[str, list[float]] = {name: [] for name in arms}
    train: dict[str, list[float]] = {name: [] for name in arms}
    for round_index in range(args.rounds):
        order = list(arms) if round_index % 2 == 0 else list(reversed(arms))
        for name in order:
            started = time.perf_counter()
            result = arms[name]()
            wall[name].append(time.perf_counter() - started)
            train[name].append(result.train_seconds)
    print(
        f"{'arm':<12} {'wall s':>8} {'train s':>8} {'outside s':>10}   (medians of {args.rounds})"
    )
    for name in arms:
        median_wall, median_train = statistics.median(wall[name]), statistics.median(train[name])
        print(
            f"{name:<12} {median_wall:8.2f} {median_train:8.2f} {median_wall - median_train:10.2f}"
        )
    pool.close()
    for name in ("2, kept", "2, fresh"):
        extra = statistics.median(wall[name]) - statistics.median(wall["1 process"])
        print(f"a 2-process trial ({name}) takes {extra:.2f} s more wall clock (medians)")


if __name__ == "__main__":
    main()
