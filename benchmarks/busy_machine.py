"""The README quickstart on a machine that is busy on purpose (issue 39).

Starts ``--busy`` processes that spin on the cores for the whole run (0: a quiet machine), then
``--runs`` quickstarts together, each on a storage of its own, and prints for each: its exit
status, stage 1's seconds against the "at most" its plan line promised, the trials it counted,
and its answer line (a ratio with its interval, or "too noisy to quote a ratio").

    python benchmarks/busy_machine.py --busy 2 --runs 2
    python benchmarks/busy_machine.py --busy 0 --runs 1

Paste the printed table into BENCHMARKS.md with the date and the machine.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPACE = Path(__file__).resolve().parents[1] / "search_spaces" / "quickstart.yaml"


def _found(pattern: str, text: str) -> str:
    match = re.search(pattern, text, re.S)
    return " ".join(match.group(1).split()) if match else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside the runs")
    parser.add_argument("--runs", type=int, default=2, help="quickstarts started together")
    parser.add_argument("--keep", type=Path, help="a folder to keep each run's output in")
    args = parser.parse_args()
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)
    ]
    try:
        with tempfile.TemporaryDirectory() as folder:
            env = {**os.environ, "COLUMNS": "200"}
            started = time.monotonic()
            command = [sys.executable, "-m", "autotune", "run", str(SPACE), "--storage"]
            runs = [
                subprocess.Popen(
                    [*command, f"sqlite:///{folder}/q{index}.db"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=env,
                )
                for index in range(args.runs)
            ]
            outputs = [run.communicate()[0] for run in runs]
            took = time.monotonic() - started
    finally:
        for spinner in spinners:
            spinner.kill()
    print(f"{args.busy} busy processes, {args.runs} quickstarts together, {took:.0f} s in all")
    print("| run | exit | stage 1 s (at most) | trials | answer |")
    print("|---|---|---|---|---|")
    for index, (run, out) in enumerate(zip(runs, outputs, strict=True)):
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            (args.keep / f"run{index + 1}.log").write_text(out)
        stage = _found(r"stage 1: .*? in (\d+) s;", out)
        most = _found(r"at most (\d+) s", out)
        trials = _found(r"the study has ([^.]*)\.", out)
        answer = _found(r"(Accuracy per second[^\n]*(?:\n[^\n]+){0,2}?\.)\n", out)
        print(f"| {index + 1} | {run.returncode} | {stage} ({most}) | {trials} | {answer} |")


if __name__ == "__main__":
    main()
