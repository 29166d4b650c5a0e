"""How long does ``autotune best`` take, from the command line to its answer?

In a scratch directory: a tiny study is run once; then ``autotune best`` on it is timed (wall
clock, a fresh interpreter each time) with this tree's autotune and with the autotune of an
earlier revision (``git archive REV autotune``, put first on PYTHONPATH), alternating. The
medians and their ratio are printed: the command reads a study, and whatever it imports beyond
that (torch, scikit-learn) is start-up time a user waits for.

    python benchmarks/query_startup.py --before REV [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autotune.testing import write_space

ROOT = Path(__file__).resolve().parent.parent


def autotune(*args: str, cwd: Path, tree: Path) -> float:
    """Run ``python -m autotune ARGS`` with the autotune under ``tree``; its wall seconds."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore"}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "autotune", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"autotune {' '.join(args)} failed:\n{done.stderr}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        before = directory / "before"
        before.mkdir()
        archive = subprocess.run(
            ["git", "archive", args.before, "autotune"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
        autotune("run", str(write_space(directory, n_trials=2)), cwd=directory, tree=ROOT)
        times: dict[str, list[float]] = {"before": [], "now": []}
        for _ in range(args.repeats):  # alternating: the machine's load hits both alike
            for label, tree in (("before", before), ("now", ROOT)):
                times[label].append(autotune("best", "--study", "tiny", cwd=directory, tree=tree))
    for label, seconds in times.items():
        runs = " ".join(f"{s:.2f}" for s in seconds)
        print(f"{label:>6}: median {statistics.median(seconds):.2f} s  ({runs})")
    ratio = statistics.median(times["before"]) / statistics.median(times["now"])
    print(f"before / now: {ratio:.2f}x (ratio of medians)")


if __name__ == "__main__":
    main()
