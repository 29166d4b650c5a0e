"""Study throughput with one worker and with ``--workers 2``: trials per minute of stage 2.

Both arms train the same study (a small CNN on the bundled digits, only ``lr`` searched, so
every trial is the same amount of work) from a fresh folder, each worker on one core:

- one worker: ``autotune run`` pinned to one core (``taskset``-style affinity, so that it uses
  one thread as each of the two workers does);
- two workers: ``autotune run --workers 2``, a core each.

The rate counts stage 2 only, from the first trial's start to the last trial's end, as the study
recorded them (stage 1 before it and the confirmation after are left out), and again in steady
state: the trials started once every worker had started its first (a worker's start-up, which
a short study feels and a long one does not, left out).
Arms alternate (A B, then B A, ...) so that the machine's drift falls on both; the medians and
their ratio are printed.

    python benchmarks/workers_throughput.py --rounds 2

Goal on a 2-core machine: two workers at least 1.7x the trials per minute of one.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

SPACE = """\
study:
  name: throughput
  n_trials: {n_trials}
  n_startup_trials: 4
  pruner: none
  seed: 0
  confirm: false
  baseline: false
workload:
  model: digits_cnn
  data: digits
  epochs: 2
  device: cpu
space:
  lr: {{low: 1.0e-3, high: 3.0e-2, log: true}}
  batch_size: [64]
"""


def trials_per_minute(folder: Path) -> tuple[float, float]:
    """Stage 2's rate in ``folder``'s study, in trials per minute: over the whole of it (first
    trial's start to last trial's end), and in steady state (the trials started once every
    worker had started its first, over that span: a worker's own start-up left out)."""
    storage = f"sqlite:///{folder / 'studies' / 'autotune.db'}"
    study = optuna.load_study(study_name="throughput", storage=storage)
    trials = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    first = min(t.datetime_start for t in trials if t.datetime_start)
    last = max(t.datetime_complete for t in trials if t.datetime_complete)
    firsts: dict[str, datetime.datetime] = {}
    for trial in trials:
        worker = str(trial.user_attrs.get("worker", "1/1"))
        if trial.datetime_start and (
            worker not in firsts or trial.datetime_start < firsts[worker]
        ):
            firsts[worker] = trial.datetime_start
    everyone = max(firsts.values())
    steady = [t for t in trials if t.datetime_start and t.datetime_start >= everyone]
    whole = len(trials) / ((last - first).total_seconds() / 60)
    return whole, len(steady) / ((last - everyone).total_seconds() / 60)


def run_arm(workers: int, n_trials: int, root: Path, index: int) -> tuple[float, float]:
    """One study with ``workers`` workers (a core each) in a fresh folder; its trials/minute,
    whole and steady state."""
    folder = root / f"w{workers}-{index}"
    folder.mkdir()
    (folder / "space.yaml").write_text(SPACE.format(n_trials=n_trials))
    command = [sys.executable, "-m", "autotune", "run", "space.yaml"]
    cores = sorted(os.sched_getaffinity(0))
    if workers > 1:
        command += ["--workers", str(workers)]
    pin = set(cores[:workers])  # a core per worker, on a machine of any size

    def pinned() -> None:  # the one-worker arm runs on one core, as each of the two does
        os.sched_setaffinity(0, pin)

    done = subprocess.run(
        command,
        cwd=folder,
        capture_output=True,
        text=True,
        preexec_fn=pinned,  # no threads in this process
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=1800,
    )
    if done.returncode != 0:
        raise SystemExit(f"workers={workers} failed:\n{done.stdout}\n{done.stderr}")
    return trials_per_minute(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="A B pairs, alternating order")
    parser.add_argument("--n-trials", type=int, default=80)
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs 2 cores")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rates: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="autotune-throughput-") as directory:
        root = Path(directory)
        for round_index in range(args.rounds):
            order = (1, 2) if round_index % 2 == 0 else (2, 1)
            for workers in order:
                started = time.monotonic()
                whole, steady = run_arm(workers, args.n_trials, root, round_index)
                rates[workers].append((whole, steady))
                print(
                    f"round {round_index + 1}, {workers} worker(s): {whole:.1f} trials/min "
                    f"in all, {steady:.1f} in steady state ({time.monotonic() - started:.0f} s)",
                    flush=True,
                )
    one = [statistics.median(r[k] for r in rates[1]) for k in (0, 1)]
    two = [statistics.median(r[k] for r in rates[2]) for k in (0, 1)]
    print("\n| workers | trials/min in all | in steady state |\n|---|---|---|")
    print(f"| 1 | {one[0]:.1f} | {one[1]:.1f} |\n| 2 | {two[0]:.1f} | {two[1]:.1f} |")
    print(
        f"\n2 workers / 1: {two[0] / one[0]:.2f}x in all, {two[1] / one[1]:.2f}x in steady "
        f"state (medians of {args.rounds}; goal: at least 1.7x on 2 cores)"
    )


if __name__ == "__main__":
    main()
