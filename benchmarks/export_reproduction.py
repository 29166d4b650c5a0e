"""Does the exported training script train as fast as the trial it came from?

In a scratch directory: one fixed configuration (digits_cnn on digits, nothing searched) is
trained as a trial by ``autotune run`` and then by the script ``autotune export`` wrote, in
alternation, several times. The steady-state samples/s of each (both by the trials' rule,
``clocks.SteadyPace``, which the script pastes) are compared as a ratio of medians: 1.00 means
the script reproduces the trial. The goal is within 10%.

    python benchmarks/export_reproduction.py [--repeats 5] [--batch-size 64] [--device cpu]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna

SPACE = """\
study: {{name: reproduction, n_trials: 1, pruner: none}}
workload: {{model: digits_cnn, data: digits, epochs: {epochs}, device: {device}}}
space:
  lr: 0.002
  batch_size: {batch_size}
  num_workers: {num_workers}
  schedule: cosine
"""


def autotune(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"autotune {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        (work / "space.yaml").write_text(
            SPACE.format(
                epochs=args.epochs,
                device=args.device,
                batch_size=args.batch_size,
                num_workers=args.num_workers,
            )
        )
        storage = f"sqlite:///{work / 'studies' / 'autotune.db'}"
        trial_rates: list[float] = []
        script_rates: list[float] = []
        for repeat in range(1, args.repeats + 1):
            autotune("run", "space.yaml", "--n-trials", str(repeat), cwd=work)
            study = optuna.load_study(study_name="reproduction", storage=storage)
            trial_rates.append(study.trials[-1].user_attrs["samples_per_second"])
            if repeat == 1:
                autotune("export", "--study", "reproduction", "-o", "train.py", cwd=work)
            done = subprocess.run(
                [sys.executable, "train.py", "--epochs", str(args.epochs), "--force"],
                cwd=work,
                capture_output=True,
                text=True,
                check=True,
            )
            found = re.search(r"steady state ([\d,]+) samples/s", done.stdout)
            assert found, done.stdout
            script_rates.append(float(found[1].replace(",", "")))
            print(
                f"  run {repeat}: trial {trial_rates[-1]:,.0f} samples/s, "
                f"script {script_rates[-1]:,.0f} samples/s"
            )
        trial, script = statistics.median(trial_rates), statistics.median(script_rates)
        print(
            f"median: trial {trial:,.0f} samples/s, exported script {script:,.0f} samples/s; "
            f"script / trial = {script / trial:.3f}"
        )


if __name__ == "__main__":
    main()
