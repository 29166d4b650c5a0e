"""Exporting the winner: a standalone script that trains, YAML/JSON, and the Python API."""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import io
import json
import math
import os
import re
import runpy
import sqlite3
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from typer.testing import CliRunner

import autotune
from autotune.cli import app
from autotune.export import (
    BestConfig,
    ExportError,
    StudyObjective,
    TrialConfirmation,
    best_config,
    load_config,
    render,
    render_script,
    select_trial,
)
from autotune.export._bundle import call, entry_point, literal
from autotune.files import write_new_file
from autotune.knobs import KNOBS
from autotune.spacefile import ObjectiveSpec
from autotune.study import TrialRecord, trial_config
from autotune.testing import (
    blobs,
    import_blocker,
    imported_modules,
    lint,
    make_config,
    provenance,
    run_script,
    tiny_mlp,
)
from autotune.training.trainer import Trainer


def autotune_here(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``autotune ARGS`` in ``cwd``, run in this process by Typer's CliRunner: what run_cli
    gives (exit status, stdout, stderr; a bug's traceback in stderr, as the command prints it)
    without starting Python and torch again. For the commands that only read a study."""
    verbosity = optuna.logging.get_verbosity()  # the command quiets Optuna: for itself only
    try:
        with contextlib.chdir(cwd):
            ran = CliRunner().invoke(app, list(args), env={"COLUMNS": "160", **(env or {})})
    finally:
        optuna.logging.set_verbosity(verbosity)
    stderr = ran.stderr
    if ran.exception is not None and not isinstance(ran.exception, SystemExit):
        stderr += "".join(traceback.format_exception(ran.exception))
    return subprocess.CompletedProcess(["autotune", *args], ran.exit_code, ran.stdout, stderr)


def script_here(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARGS`` in the script's folder, run in this process: the file run as
    ``__main__`` (runpy) with its folder first on sys.path, as Python puts it; the exit status
    is what SystemExit carries (1 and the traceback for an exception). For the branches of a
    script; that a script trains without autotune is checked in a process of its own
    (run_script with block_autotune)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    status: object = 0
    saved_argv, saved_path = sys.argv, list(sys.path)
    threads = torch.get_num_threads()  # the script sets them: for itself only
    sys.argv, sys.path[:0] = [script.name, *args], [str(script.parent)]
    try:
        with (
            contextlib.chdir(script.parent),
            torch.random.fork_rng(devices=[]),  # the script seeds torch: for itself only
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
        ):
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as ended:
                status = ended.code
            except Exception:
                traceback.print_exc()
                status = 1
            if not (status is None or isinstance(status, int)):
                print(status, file=sys.stderr)  # sys.exit("message"), as Python reports it
                status = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        torch.set_num_threads(threads)
    code = status or 0
    return subprocess.CompletedProcess(
        [script.name, *args], code, stdout.getvalue(), stderr.getvalue()
    )


DIGITS_SPACE = """\
study: {name: digits, n_trials: 1, pruner: none, strategy: joint, confirm: false}
workload: {model: digits_cnn, data: digits, epochs: 1}
objective: {full_run_epochs: 4}
space:
  lr: 0.003
  batch_size: 64
  schedule: cosine
"""

TINY_SPACE = """\
study: {name: tiny, n_trials: 2, pruner: none}
workload:
  model: autotune.testing:tiny_mlp
  data: autotune.testing:blobs
  data_args: {image: true}
  epochs: 2
objective: {min_accuracy: 0.5}
space:
  lr: {low: 0.01, high: 0.1, log: true}
  batch_size: [16, 32]
"""


@pytest.fixture(scope="module")
def digits_study(tmp_path_factory, prepare_study) -> tuple[optuna.Study, str]:
    study, url, _, _ = prepare_study(DIGITS_SPACE, tmp_path_factory.mktemp("digits"))
    return study, url


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory, prepare_study) -> tuple[optuna.Study, str]:
    study, url, _, _ = prepare_study(TINY_SPACE, tmp_path_factory.mktemp("tiny"))
    return study, url


@pytest.mark.slow
def test_exported_script_trains_checkpoints_and_resumes_without_autotune(
    digits_study, tmp_path: Path
):
    """The first run is a real process in which autotune cannot be imported, and a refusal's
    exit status is a real process's too; the other runs (a refusal, the resumed run, other
    arguments) run the same file in this process: what they check is the script's own logic,
    which imports nothing the first run did not (no autotune anywhere in the file;
    torch.load, weights only, would refuse an autotune class in a checkpoint)."""
    study, _ = digits_study
    best = best_config(study, select_trial(study))
    script = tmp_path / "train.py"
    write_new_file(script, render(best, "script", study, script_name="train.py"))
    text = script.read_text()

    assert "autotune" not in imported_modules(text)
    assert imported_modules(text) <= {
        "argparse", "collections", "contextlib", "dataclasses", "itertools", "json", "math", "os",
        "random", "shlex", "sys", "time", "pathlib", "typing", "torch", "numpy", "sklearn",
    }  # fmt: skip
    assert provenance(text)["study"] == "digits" and "EPOCHS = 4" in text
    assert provenance(text)["trial"] == best.trial
    compile(text, str(script), "exec")
    assert lint(script).returncode == 0, lint(script).stdout

    # a package named autotune that refuses to import: the script must not need the real one
    blocker = import_blocker(tmp_path, "autotune")
    probe = subprocess.run(
        [sys.executable, "-c", "import autotune"],
        env={**os.environ, "PYTHONPATH": str(blocker)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert probe.returncode != 0 and "no autotune here" in probe.stderr

    first = run_script(script, "--epochs", "1", block_autotune=blocker)
    assert first.returncode == 0, first.stderr
    assert re.match(
        r"training on cpu with \d+ intra-op threads? \(the idle cores of", first.stdout
    )
    assert re.search(r"epoch 1/1 .* val accuracy 0\.\d+ .* samples/s", first.stdout)
    assert "done: 1 epoch;" in first.stdout  # not "1 epochs"
    run = tmp_path / "run"
    saved = torch.load(run / "checkpoint.pt")
    assert saved["epoch"] == 1 and {"model", "optimizer", "scheduler", "plan"} <= set(saved)
    assert set(torch.load(run / "model.pt")) == set(saved["model"])  # the final weights
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [entry["epoch"] for entry in logged] == [1] and 0 < logged[0]["val_accuracy"] <= 1

    # a second run in the same folder is refused: nothing of the first is overwritten
    again = script_here(script, "--epochs", "1")
    assert again.returncode == 2 and "run/ holds an earlier run: --resume" in again.stderr
    assert torch.load(run / "checkpoint.pt")["epoch"] == 1

    # continued, with more epochs: the schedule keeps the length the run started with
    resumed = script_here(script, "--epochs", "2", "--resume", "--threads", "1")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith("training on cpu with 1 intra-op thread (--threads;")
    assert "resumed from run/checkpoint.pt after 1 epoch" in resumed.stdout
    assert "the learning-rate schedule ends after epoch 1" in resumed.stdout
    assert "epoch 2/2" in resumed.stdout and "epoch 1/2" not in resumed.stdout
    state = torch.load(run / "checkpoint.pt")
    assert state["epoch"] == 2 and state["plan"]["total_steps"] == saved["plan"]["total_steps"]
    assert state["scheduler"]["last_epoch"] == saved["plan"]["total_steps"]  # ended, not re-run
    logged = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in logged] == [1, 2]  # appended

    missing = run_script(script, "--resume", "--run-dir", "nope")  # as a user runs it
    assert missing.returncode == 2 and "there is no checkpoint at nope/checkpoint.pt" in (
        missing.stderr
    )
    # Ctrl-C in the second epoch, as its checkpoint is written: the first one's is kept whole
    torch_save, saves = torch.save, 0

    def interrupted_save(*args: object, **kwargs: object) -> None:
        nonlocal saves
        saves += 1
        if saves in (2, 4):  # half written
            Path(str(args[1])).write_bytes(b"\x80")
            raise KeyboardInterrupt
        torch_save(*args, **kwargs)

    def interrupt(*args: object) -> None:
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "save", interrupted_save)
        other = script_here(
            script, "--epochs", "2", "--run-dir", "b", "--seed", "3", "--lr", ".01"
        )
        saves = 2  # the next run's second save: model.pt, after its last epoch
        last = script_here(script, "--epochs", "1", "--run-dir", "d")
        patch.setattr(torch, "manual_seed", interrupt)  # before the first epoch
        early = script_here(script, "--epochs", "1", "--run-dir", "c")
    assert (other.returncode, other.stderr) == (
        130,
        f"interrupted in epoch 2 of 2; the last checkpoint is epoch 1 in b/: python {script} "
        "--resume --run-dir b\n",  # runpy runs it as python /its/path/train.py
    )
    assert torch.load(tmp_path / "b" / "checkpoint.pt")["plan"] == {
        "lr": 0.01,
        "seed": 3,
        "epochs": 2,
        "total_steps": 2 * saved["plan"]["total_steps"],
    }
    assert (last.returncode, last.stderr) == (
        130,
        f"interrupted after the last epoch, writing d/model.pt: python {script} --resume "
        "--run-dir d writes it\n",
    )
    written = script_here(script, "--resume", "--run-dir", "d")
    assert (
        "nothing to do: d/checkpoint.pt already holds 1 epoch; the final weights are in d/model.pt"
        in written.stdout
    )
    assert set(torch.load(tmp_path / "d" / "model.pt")) == set(saved["model"])
    assert (early.returncode, early.stderr) == (
        130,
        f"interrupted before training began: python {script} --epochs 1 --run-dir c starts it "
        "again\n",
    )
    # a --run-dir that is a file; checkpoints not torch's, without a plan, of another model
    (tmp_path / "a-file").write_text("")
    for folder in "efg":
        (tmp_path / folder).mkdir()
    (tmp_path / "e" / "checkpoint.pt").write_text("not a checkpoint")
    torch.save({"model": saved["model"]}, tmp_path / "f" / "checkpoint.pt")
    torch.save({**saved, "model": {}}, tmp_path / "g" / "checkpoint.pt")
    foreign = "checkpoint.pt is not a checkpoint of this script's runs"
    # arguments out of range, and a device this machine does not have: argparse's one line
    for given, said in [
        (("--run-dir", "a-file"), "--run-dir: a-file is a file, not a folder"),
        (("--resume", "--run-dir", "e"), f"--resume: e/{foreign} (torch.load cannot read it)"),
        (("--resume", "--run-dir", "f"), f"--resume: f/{foreign} (it holds no run's plan and"),
        (("--resume", "--run-dir", "g"), f"--resume: g/{foreign} (RuntimeError: Error(s) in"),
        (("--seed", "-1"), "argument --seed: -1: must be 0 to 2**64 - 1"),
        (("--epochs", "0"), "argument --epochs: 0: must be above 0"),
        (("--epochs", "-1"), "argument --epochs: -1: must be above 0"),
        (("--lr", "-1"), "argument --lr: -1: must be above 0"),
        (("--threads", "0"), "argument --threads: 0: must be above 0"),
        (("--device", "cuda:99"), "argument --device: cuda:99: this machine has "),
    ]:
        refused = script_here(script, *given)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert refused.stderr.splitlines()[-1].startswith(f"train.py: error: {said}"), (
            refused.stderr
        )


def test_a_used_run_dir_and_a_ctrl_c_while_torch_loads_are_one_line(
    tiny_study, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A used --run-dir is refused by its option's name (it said 'run holds a run already'); a
    Ctrl-C in the script's first seconds, while torch loads, is one line and exit 130, as it is
    later (it was Python's traceback, and death by SIGINT)."""
    study, _ = tiny_study
    script = tmp_path / "train.py"
    write_new_file(script, render_script(study, best_config(study, select_trial(study))))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"")
    used = script_here(script, "--epochs", "2")
    assert used.returncode == 2 and used.stderr.splitlines()[-1] == (
        "train.py: error: --run-dir run/ holds an earlier run: --resume continues it, --force "
        "starts over (replacing it), or choose another --run-dir"
    )
    importing = builtins.__import__

    def interrupted(name: str, *args: object, **kwargs: object) -> object:
        if name == "torch":
            raise KeyboardInterrupt
        return importing(name, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(builtins, "__import__", interrupted)
        early = script_here(script, "--epochs", "2")
    assert (early.returncode, early.stderr) == (
        130,
        f"interrupted while loading torch: python {script} --epochs 2 starts it again\n",
    )


def test_the_script_compares_its_speed_with_the_confirmed_median_else_the_trials(tiny_study):
    """The trial's own samples/s is the one measurement the search picked for being fast: it
    reads high. The script's done line quotes the confirmation round's median where the round
    timed the trial, and says which figure it is."""
    study, _ = tiny_study
    best = best_config(study, select_trial(study))
    confirmed = TrialConfirmation(median=1.0, runs=3, median_samples_per_second=1234.56)
    for confirmation, (speed, source) in [
        (confirmed, (1234.6, f"the median of trial {best.trial}'s 3 confirmation runs")),
        (None, (round(best.metrics["samples_per_second"], 1), f"trial {best.trial}")),
    ]:
        text = render_script(study, dataclasses.replace(best, confirmation=confirmation))
        assert f"TRIAL_SAMPLES_PER_SECOND = {literal(speed)}  # steady state\n" in text
        assert f"TRIAL_SPEED_SOURCE = {literal(source)}\n" in text


def test_a_study_that_recorded_no_speed_still_ends_with_a_done_line(tiny_study, tmp_path: Path):
    """Without a speed of the trial's (none recorded, no confirmation round's), the header's
    TRIAL_SAMPLES_PER_SECOND is None: the done line says so (formatting None raised a
    TypeError after the run had trained)."""
    study, _ = tiny_study
    best = best_config(study, select_trial(study))
    metrics = {k: v for k, v in best.metrics.items() if k != "samples_per_second"}
    unmeasured = dataclasses.replace(best, metrics=metrics, confirmation=None)
    script = tmp_path / "train.py"
    write_new_file(script, render_script(study, unmeasured))
    assert "TRIAL_SAMPLES_PER_SECOND = None" in script.read_text()
    done = script_here(script, "--epochs", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("done: 2 epochs; ")
    # what others took of the cores meanwhile, where a trial would be flagged busy (the machine's)
    busy = r"(; other processes took \d+% of its cores meanwhile)?"
    assert re.search(rf"\(trial {best.trial} recorded no samples/s\){busy}\n$", done.stdout)


def test_ctrl_c_says_what_the_run_kept_and_the_command_that_goes_on(
    tiny_study, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Before the first checkpoint, the same command (its arguments too: it said ``python
    train.py``, which would train for the default epochs at the default rate); after the run
    ended, that its weights are written (it said 'interrupted before training began'); and the
    --resume that goes on carries what a checkpoint does not keep: more epochs than planned
    (it was left out, and the run resumed as it said stopped at once) and the threads; what the
    checkpoint keeps (the learning rate, the seed) a resumed run is not given anew (--lr was
    ignored); each epoch is recorded once in metrics.jsonl."""
    study, _ = tiny_study
    script = tmp_path / "train.py"
    write_new_file(script, render_script(study, best_config(study, select_trial(study))))
    printing = builtins.print

    def last_line(stderr: str) -> str:  # after a note of where the workload module was found
        return stderr.splitlines()[-1]

    def stopped_saving(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    def stopped_saying_done(*args: object, **kwargs: object) -> None:
        if str(args[0]).startswith("done:"):
            raise KeyboardInterrupt
        printing(*args, **kwargs)

    given = ("--epochs", "2", "--lr", "0.01", "--seed", "3", "--run-dir", "a")
    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", stopped_saving)  # epoch 1's checkpoint
        first = script_here(script, *given)
    assert (first.returncode, last_line(first.stderr)) == (
        130,
        f"interrupted in epoch 1 of 2, before its first checkpoint: python {script} "
        f"{' '.join(given)} starts it again",
    )
    with monkeypatch.context() as patch:
        patch.setattr(builtins, "print", stopped_saying_done)
        ended = script_here(script, "--epochs", "1")
    assert (ended.returncode, last_line(ended.stderr)) == (
        130,
        "interrupted after the run ended: its final weights are in run/model.pt",
    )
    assert (tmp_path / "run" / "model.pt").exists()
    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", stopped_saving)  # epoch 2's checkpoint
        longer = script_here(script, "--resume", "--epochs", "3", "--threads", "1")
    resume = f"python {script} --resume --epochs 3 --threads 1"
    assert (longer.returncode, last_line(longer.stderr)) == (
        130,
        f"interrupted in epoch 2 of 3; the last checkpoint is epoch 1 in run/: {resume}",
    )
    # the learning rate and seed are the run's plan: another one is refused, not ignored
    planned = re.search(r"^LEARNING_RATE = (\S+)", script.read_text(), re.MULTILINE)
    assert planned is not None
    other_lr = script_here(script, "--resume", "--lr", "0.5")
    assert (other_lr.returncode, last_line(other_lr.stderr)) == (
        2,
        f"train.py: error: --lr 0.5: the run in run/ goes on with the --lr it began with, "
        f"{float(planned[1])} (--force starts it over with --lr 0.5)",
    )
    went_on = script_here(script, *resume.split()[2:])
    assert went_on.returncode == 0, went_on.stderr
    assert (
        "epoch 3/3" in went_on.stdout
        and torch.load(tmp_path / "run" / "checkpoint.pt")["epoch"] == 3
    )
    # each epoch recorded once: the one stopped while its checkpoint was written is recorded
    # when it trains again (it was recorded twice)
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in metrics] == [1, 2, 3]
    # a longer run stopped while writing its final weights: the --resume it says writes them,
    # over the shorter run's model.pt (which it kept, as if it were this run's)
    saving, saves = torch.save, 0

    def stopped_saving_the_weights(*args: object, **kwargs: object) -> None:
        nonlocal saves
        saves += 1
        if saves == 2:  # the checkpoint of epoch 4, then model.pt
            raise KeyboardInterrupt
        saving(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", stopped_saving_the_weights)
        writing = script_here(script, "--resume", "--epochs", "4")
    resume = f"python {script} --resume --epochs 4"
    assert (writing.returncode, last_line(writing.stderr)) == (
        130,
        f"interrupted after the last epoch, writing run/model.pt: {resume} writes it",
    )
    assert script_here(script, *resume.split()[2:]).returncode == 0
    kept = torch.load(tmp_path / "run" / "checkpoint.pt")
    assert kept["epoch"] == 4
    for name, weights in torch.load(tmp_path / "run" / "model.pt").items():
        assert torch.equal(weights, kept["model"][name]), name


def test_resuming_for_fewer_epochs_than_the_checkpoint_holds_is_refused(
    tiny_study, tmp_path: Path
):
    """``--resume --epochs 1`` of a run whose checkpoint holds 2 epochs is one line by the
    option's name, exit 2 (it trained nothing, wrote the 2 epochs' weights as the final ones
    and said 'nothing to do: ... already holds 2 epochs'); with the epochs it holds, there is
    nothing to do."""
    study, _ = tiny_study
    script = tmp_path / "train.py"
    write_new_file(script, render_script(study, best_config(study, select_trial(study))))
    assert script_here(script, "--epochs", "2").returncode == 0
    weights = (tmp_path / "run" / "model.pt").read_bytes()
    fewer = script_here(script, "--resume", "--epochs", "1")
    assert (fewer.returncode, fewer.stderr.splitlines()[-1]) == (
        2,
        "train.py: error: --epochs 1: the run in run/ already holds 2 epochs (--force starts "
        "it over for 1 epoch, or choose another --run-dir)",
    )
    assert (tmp_path / "run" / "model.pt").read_bytes() == weights  # untouched
    same = script_here(script, "--resume", "--epochs", "2")
    assert same.returncode == 0 and "nothing to do: run/checkpoint.pt already holds 2 epochs" in (
        same.stdout
    )


def test_a_ctrl_c_before_torchruns_processes_train_is_said_once_with_torchrun(
    tiny_study, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Under torchrun every process gets the Ctrl-C: before training, rank 0 alone says so, and
    with the command that started them (each said 'python train.py ...')."""
    study, _ = tiny_study
    best = best_config(study, select_trial(study))
    script = tmp_path / "train.py"
    write_new_file(script, render_script(study, _with(best, best.config.replace(world_size=2))))

    def interrupted(*args: object) -> int:  # as the command line is read
        raise KeyboardInterrupt

    monkeypatch.setattr(torch.cuda, "device_count", interrupted)
    monkeypatch.setenv("WORLD_SIZE", "2")
    said = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        said[rank] = script_here(script, "--epochs", "2", "--device", "cpu")
    assert (said["0"].returncode, said["0"].stderr.splitlines()[-1]) == (
        130,
        f"interrupted before training began: torchrun --nproc-per-node 2 {script} --epochs 2 "
        "--device cpu starts it again",
    )
    assert said["1"].returncode == 130 and "interrupted" not in said["1"].stderr


VARIANTS = {
    "defaults": {},
    "fp16-sgd-onecycle-workers-accumulation-nhwc": {
        "precision": "fp16",
        "optimizer": "sgd",
        "momentum": 0.9,
        "nesterov": True,
        "schedule": "onecycle",
        "num_workers": 1,
        "prefetch_factor": 2,
        "persistent_workers": True,
        "accumulation_steps": 2,
        "channels_last": True,
    },
    "device-pipeline": {"data_pipeline": "device", "accumulation_steps": 2},
    "bf16-warmup-compile": {
        "precision": "bf16",
        "schedule": "constant",
        "warmup_fraction": 0.2,
        "compile": "default",
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_branch_of_the_script_runs(tiny_study, tmp_path: Path, variant):
    study, _ = tiny_study
    best = best_config(study, select_trial(study))
    changed = BestConfig.from_dict(
        {**best.to_dict(), "config": best.config.replace(**VARIANTS[variant]).to_dict()}
    )
    script = tmp_path / "train.py"
    write_new_file(script, render_script(study, changed))
    done = script_here(script, "--epochs", "1")
    assert done.returncode == 0, done.stderr
    assert "epoch 1/1" in done.stdout
    if VARIANTS[variant].get("precision") == "fp16":
        assert "scaler" in torch.load(tmp_path / "run" / "checkpoint.pt")
    # a longer run continued from the checkpoint: every schedule keeps its length and ends
    # (OneCycleLR would raise if stepped past it)
    longer = script_here(script, "--epochs", "2", "--resume")
    assert longer.returncode == 0, longer.stderr
    assert "epoch 2/2" in longer.stdout


# every variant the template renders (VARIANTS' run too): a process or several, the data
# loaded by workers or living on the device, compiled, and a user's own workload
LINTED = {
    **VARIANTS,
    "distributed-accumulation-compile": {
        "world_size": 2,
        "accumulation_steps": 2,
        "compile": "max-autotune",
    },
    "distributed-device-pipeline-fp16": {
        "world_size": 2,
        "data_pipeline": "device",
        "precision": "fp16",
        "schedule": "onecycle",
    },
    "distributed-workers-nhwc": {"world_size": 2, "num_workers": 2, "channels_last": True},
}


def test_every_variant_of_the_script_is_lint_and_format_clean(
    tiny_study, regression_study, tmp_path: Path
):
    """``ruff check`` and ``ruff format --check`` with this project's configuration: the script
    is the code users keep, and reads as the project's own."""
    for study, variants in [(tiny_study[0], LINTED), (regression_study[0], {"users": {}})]:
        best = best_config(study, select_trial(study))
        for name, changes in variants.items():
            script = tmp_path / f"{name}.py"
            write_new_file(
                script, render_script(study, _with(best, best.config.replace(**changes)))
            )
    config = Path(autotune.__file__).parents[1] / "pyproject.toml"
    ruff = [sys.executable, "-m", "ruff"]
    checked = subprocess.run(
        [*ruff, "check", "--no-cache", "--config", str(config), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout
    formatted = subprocess.run(
        [
            *ruff,
            "format",
            "--check",
            "--diff",
            "--no-cache",
            "--config",
            str(config),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr


# every knob, a value unlike its default, and the code the script must then hold
KNOB_CODE = {
    "lr": (0.5, "LEARNING_RATE = 0.5  "),
    "lr_scaling": ("linear", "scaled linear to the effective batch"),
    "base_batch_size": (7, "per 7 examples, scaled linear"),
    "batch_size": (3, "BATCH_SIZE = 3  "),
    "accumulation_steps": (3, "ACCUMULATION_STEPS = 3  "),
    "num_workers": (2, "NUM_WORKERS = 2  "),
    "pin_memory": (True, "PIN_MEMORY = True"),
    "prefetch_factor": (5, "PREFETCH_FACTOR = 5"),
    "persistent_workers": (True, "PERSISTENT_WORKERS = True"),
    "precision": ("bf16", 'PRECISION = "bf16"'),
    "compile": ("max-autotune", 'torch.compile(model, mode="max-autotune")'),
    "optimizer": ("sgd", 'OPTIMIZER = "sgd"'),
    "weight_decay": (0.125, "WEIGHT_DECAY = 0.125"),
    "momentum": (0.5, "MOMENTUM = 0.5"),
    "nesterov": (True, "NESTEROV = True"),
    "schedule": ("onecycle", 'SCHEDULE = "onecycle"'),
    "warmup_fraction": (0.25, "WARMUP_FRACTION = 0.25  "),
    "channels_last": (True, "make_model().to(device, memory_format=torch.channels_last)"),
    "cudnn_benchmark": (True, "CUDNN_BENCHMARK = True"),
    "device": ("cuda:0", 'DEVICE = "cuda:0"'),
    "val_batch_size": (17, "VAL_BATCH_SIZE = 17"),
    "seed": (12345, "SEED = 12345  "),
    "data_pipeline": ("device", "DeviceBatches("),
    "ddp_bucket_cap_mb": (50, "DDP_BUCKET_CAP_MB = 50"),
    "gradient_as_bucket_view": (True, "GRADIENT_AS_BUCKET_VIEW = True"),
    "static_graph": (True, "STATIC_GRAPH = True"),
}


def test_every_knob_is_rendered_as_its_code(tiny_study):
    study, _ = tiny_study
    best = best_config(study, select_trial(study))
    # the searched knobs, and the run settings a script carries too
    assert set(KNOB_CODE) == {*KNOBS, "device", "val_batch_size", "seed"}
    rendered: dict[object, str] = {}  # most knobs change the same configuration: render it once
    for knob, (value, code) in KNOB_CODE.items():
        # the knobs a knob depends on, set so that it matters
        config = best.config.replace(data_pipeline="dataloader")
        if knob in ("momentum", "nesterov"):
            config = config.replace(optimizer="sgd", momentum=0.9)
        elif knob in ("prefetch_factor", "persistent_workers"):
            config = config.replace(num_workers=1, prefetch_factor=2)
        elif knob == "cudnn_benchmark":
            config = config.replace(device="cuda:0")
        elif knob == "base_batch_size":
            config = config.replace(lr_scaling="linear")
        elif knob in ("ddp_bucket_cap_mb", "gradient_as_bucket_view", "static_graph"):
            # a trial of two processes, accumulating (DDP's no_sync) and compiled over DDP
            config = config.replace(world_size=2, accumulation_steps=2, compile="default")
        if config not in rendered:
            rendered[config] = render_script(study, _with(best, config))
        before = rendered[config]
        changed = render_script(study, _with(best, config.replace(**{knob: value})))
        assert code not in before, f"{knob}: {code!r} is there before the change"
        assert code in changed, f"{knob}={value!r} is not rendered as {code!r}"
        compile(changed, f"train.py ({knob}={value})", "exec")
        long_lines = [line for line in changed.splitlines() if len(line) > 99]
        assert not long_lines, f"{knob}={value} renders lines over 99 characters: {long_lines}"


HOSTILE_NAMES = [
    'q""";__import__("os").system("touch pwned");"""',
    "q''';__import__('os').system('touch pwned');'''",
    "a \"quoted\" name with 'both' kinds",
    "back\\slash\\ and \\N{BULLET} and a trailing \\",
    'line\nbreak\n__import__("os").system("touch pwned")\n#',
    "{{ jinja }} {% if x %} # not a comment",
    "étude 学習 🚀",
    "x[/y] run[fast]" + "z" * 150,  # markup, and longer than a line
    "line\u2028separator\u2029paragraph\x85next",  # line breaks to YAML and str.splitlines
    "\udcff a lone surrogate, as a file system name decodes",
    "\x00 nul \x1b[31m escape \u202e reversed",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_strings_reach_the_script_only_as_data(tiny_study, tmp_path: Path, name):
    """A study name (or anything else a user or a shared study gives) is data in the export."""
    study, _ = tiny_study
    best = best_config(study, select_trial(study))
    hostile = dataclasses.replace(best, study=name, metrics={**best.metrics, "device_name": name})
    script = tmp_path / "train.py"
    text = render(hostile, "script", study, script_name=f"{name}.py")
    write_new_file(script, text)
    compile(text, str(script), "exec")  # parses: nothing ended a string or docstring early
    assert lint(script).returncode == 0, lint(script).stdout
    found = provenance(text)
    assert found["study"] == name and name in str(found["measured_on"])
    help_run = script_here(script, "--help")  # runs the module: nothing in it is code
    assert help_run.returncode == 0, help_run.stderr
    assert help_run.stdout.startswith("usage: train.py [-h]"), help_run.stdout
    assert not (tmp_path / "pwned").exists()
    for fmt in ("yaml", "json"):
        path = tmp_path / f"best.{fmt}"
        write_new_file(path, render(hostile, fmt))
        assert load_config(path).study == name


@pytest.mark.parametrize("value", [*HOSTILE_NAMES, "\ud83d\ude80 a split pair", "", "\U0010ffff"])
def test_a_string_literal_is_ascii_and_evaluates_to_the_string(value):
    written = literal(value)
    assert written.isascii() and written.isprintable(), written
    assert ast.literal_eval(written) == value


def test_nan_and_infinity_are_written_as_float_calls():
    values = [float("nan"), float("inf"), -float("inf"), 0.1, -0.0, 1e300, 3, True, None, "s"]
    written = literal(values)
    assert written.count("float(") == 3
    found = eval(written, {"__builtins__": {}, "float": float})  # no other name is in reach
    assert math.isnan(found[0]) and found[1:3] == [math.inf, -math.inf]
    assert found[3:] == values[3:] and math.copysign(1, found[4]) == -1


@pytest.mark.parametrize("key", ["x=1); evil(", "class", "a b", "1x", ""])
def test_a_call_refuses_keyword_names_that_are_not_argument_names(key):
    with pytest.raises(ValueError, match="is not a Python argument name"):
        call("make", {"width": 1, key: 2})


@pytest.fixture
def tiny_copy(tiny_study, tmp_path: Path) -> tuple[optuna.Study, str]:
    """The tiny study copied into a database of its own, to be edited as somebody might."""
    url = f"sqlite:///{tmp_path / 'copy.db'}"
    optuna.copy_study(from_study_name="tiny", from_storage=tiny_study[1], to_storage=url)
    return optuna.load_study(study_name="tiny", storage=url), url


def model_call_arguments(source: str) -> dict[str, object]:
    """The keyword arguments of the script's model call, evaluated with only ``float`` in reach."""
    make_model = next(
        node for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == "make_model"
    )  # fmt: skip
    returned = next(node for node in make_model.body if isinstance(node, ast.Return))
    assert isinstance(returned.value, ast.Call)
    scope = {"__builtins__": {}, "float": float}
    return {k.arg: eval(ast.unparse(k.value), scope) for k in returned.value.keywords}


def test_nan_and_infinity_reach_the_script_and_yaml_exactly_and_json_refuses_them(
    tiny_copy, tmp_path: Path
):
    study, _ = tiny_copy
    recorded = study.user_attrs["model_kwargs"]
    study.set_user_attr("model_kwargs", {**recorded, "clip": float("inf"), "eps": float("nan")})
    best = best_config(study, select_trial(study))
    odd = _with(best, best.config.replace(weight_decay=float("inf")))
    text = render_script(study, odd)
    compile(text, "train.py", "exec")
    assert 'WEIGHT_DECAY = float("inf")' in text
    arguments = model_call_arguments(text)
    assert arguments["clip"] == math.inf and math.isnan(arguments["eps"])  # type: ignore[arg-type]
    assert {k: v for k, v in arguments.items() if k not in ("clip", "eps")} == recorded

    odd = dataclasses.replace(odd, metrics={**odd.metrics, "mfu": float("nan")})
    write_new_file(tmp_path / "best.yaml", render(odd, "yaml"))
    loaded = load_config(tmp_path / "best.yaml")  # YAML writes .inf and .nan
    assert loaded.config.weight_decay == math.inf and math.isnan(loaded.metrics["mfu"])
    with pytest.raises(ExportError, match=r"^config.weight_decay is inf, which JSON cannot hold"):
        render(odd, "json")


def test_a_study_whose_recorded_arguments_or_names_were_edited_is_refused(
    tiny_copy, tmp_path: Path
):
    """A study database is data anyone may have edited: what the script writes as code (argument
    names, entry names) must still be what a space file may hold, or export refuses."""
    study, url = tiny_copy
    marker = tmp_path / "pwned"
    recorded = study.user_attrs["model_kwargs"]
    study.set_user_attr(
        "model_kwargs", {**recorded, f"x=__import__('os').system('touch {marker}'),y": 1}
    )
    refused = autotune_here(
        "export", "--study", "tiny", "--storage", url, "-o", "t.py", cwd=tmp_path
    )
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert "records model arguments that no space file could hold" in refused.stderr
    assert "is not a Python argument name); was its database edited?" in refused.stderr
    assert not (tmp_path / "t.py").exists()

    mapping = "must be a mapping of keys to values, got"  # worded as a space file's problem
    for edited, problem in (
        ([1, 2], f"{mapping} [1, 2]"),
        ("width=2", f"{mapping} 'width=2'"),
        ({"class": 1}, "'class' is not a Python argument name"),
    ):
        study.set_user_attr("model_kwargs", edited)
        with pytest.raises(ExportError, match=re.escape(f"could hold (model_args: {problem});")):
            render(best_config(study, select_trial(study)), "script", study)
    study.set_user_attr("model_kwargs", recorded)
    space = study.user_attrs["space_file"]
    study.set_user_attr(
        "space_file",
        space.replace(
            "model: autotune.testing:tiny_mlp", f"model: 'os:system\n(\"touch {marker}\")'"
        ),
    )
    with pytest.raises(ExportError) as refusal:
        render(best_config(study, select_trial(study)), "script", study)
    message = str(refusal.value)
    assert "holds a space file autotune refuses" in message and "\n" not in message
    assert "was its database edited?" in message
    assert not marker.exists()


def _with(best: BestConfig, config) -> BestConfig:
    return BestConfig.from_dict({**best.to_dict(), "config": config.to_dict()})


def test_an_export_says_its_objective_to_be_read_on_its_own(tiny_study, tmp_path: Path):
    """A time_to_score study's YAML/JSON (and best --json: the same to_dict) says what its value
    measures: the score function, its direction and the target (an export had ``value:
    0.1216`` and ``score_name: rmse`` but no target 0.8 nor lower-is-better); one of format 3
    still loads, without it."""
    study, _ = tiny_study
    best = best_config(study, select_trial(study))
    assert best.objective == StudyObjective(
        "accuracy_per_second", "maximize", "accuracy", True, min_score=0.5
    )
    section = {"metric": "time_to_score", "target_score": 0.8, "score": "tabular:rmse"}
    goal = ObjectiveSpec(**section, higher_is_better=False)
    timed = dataclasses.replace(best, objective=StudyObjective.of(goal))
    for fmt in ("yaml", "json"):
        path = tmp_path / f"best.{fmt}"
        write_new_file(path, render(timed, fmt))
        assert load_config(path) == timed
    assert yaml.safe_load((tmp_path / "best.yaml").read_text())["objective"] == {
        "metric": "time_to_rmse",
        "direction": "minimize",
        "score": "tabular:rmse",
        "score_higher_is_better": False,
        "target_score": 0.8,
        "min_score": None,
    }
    older = {k: v for k, v in best.to_dict().items() if k != "objective"}
    assert BestConfig.from_dict({**older, "autotune_export": 3}).objective is None


def test_a_cuda_graph_mode_accumulates_into_gradients_outside_the_graphs_pool(tiny_study):
    study, _ = tiny_study
    best = best_config(study, select_trial(study))
    for mode, in_place in (("reduce-overhead", True), ("max-autotune", True), ("default", False)):
        config = best.config.replace(compile=mode, accumulation_steps=2)
        text = render_script(study, _with(best, config))
        compile(text, f"train.py (compile {mode})", "exec")
        assert ("\n    keep_grads_outside_graphs(model)" in text) is in_place, mode
        assert ("grads_in_place=True," in text) is in_place, mode
        # the trials' own rule, pasted: zeroed in place with grads_in_place
        assert "self.optimizer.zero_grad(set_to_none=not self.grads_in_place)" in text


def test_yaml_and_json_round_trip_to_the_same_config(tiny_study, tmp_path: Path):
    study, _ = tiny_study
    trial = select_trial(study)
    best = best_config(study, trial)
    for fmt in ("yaml", "json"):
        path = tmp_path / f"best.{fmt}"
        write_new_file(path, render(best, fmt))
        loaded = load_config(path)
        assert loaded.config == trial_config(trial)
        assert loaded == best
    assert yaml.safe_load((tmp_path / "best.yaml").read_text())["trial"] == trial.number
    assert json.loads((tmp_path / "best.json").read_text())["config"]["seed"] == trial.number
    # a confirmed answer's verdict is typed, and round-trips through the plain data
    said = ("1.50x the untuned baseline (at least 1.20x)",)  # its lowest run was 0
    verdict = TrialConfirmation(
        median=2.5, runs=3, spread=0.1, answer=True, speedup=1.5, tied_with=(4,), said=said,
        speedup_interval=(1.2, math.inf),
    )  # fmt: skip
    confirmed = dataclasses.replace(best, confirmation=verdict)
    plain = json.dumps(confirmed.to_dict(), allow_nan=False)  # strict JSON: no Infinity
    assert BestConfig.from_dict(json.loads(plain)) == confirmed
    # "value" is the figure every rendering shows (best --json gave the trial's own 1.132 where
    # the text, the note and `studies --json` said 1.051, the median); the trial's is named so
    data = confirmed.to_dict()
    assert data["value"] == 2.5 and data["value_source"] == "median of 3 confirmed runs"
    assert data["trial_value"] == best.value and best.value != 2.5
    older = {key: item for key, item in data.items() if key != "trial_value"}
    assert BestConfig.from_dict({**older, "value": best.value}).value == best.value  # format 2
    assert confirmed.confirmation_text() == (
        "confirmed: median 2.5 over 3 runs (spread ±10%); 1.50x the untuned baseline (at least "
        "1.20x); tied within noise with trial 4"
    )
    several = dataclasses.replace(verdict, tied_with=(18, 4, 16), said=())
    assert (
        dataclasses.replace(best, confirmation=several)
        .confirmation_text()
        .endswith("tied within noise with trials 4, 16 and 18")
    )
    # the checklist named among tied trials for its better score: a new user read "found
    # nothing better" beside a tied trial whose median was higher
    checklist = dataclasses.replace(
        verdict, said=(), reference="the tuning checklist", tie_rule="score", speedup=None
    )
    assert (
        dataclasses.replace(best, confirmation=checklist)
        .confirmation_text()
        .endswith(
            "; it is the tuning checklist: the search found nothing better beyond noise; tied "
            "within noise with trial 4, and named for its better median score"
        )
    )
    # the headline is quoted in parentheses (export messages, the YAML header)
    assert confirmed.headline == f"{confirmed.metric} 2.5: median of 3 confirmed runs"
    # the script's PROVENANCE names the median once: its answer says which measurement it is
    said = provenance(render_script(study, confirmed))
    assert said["answer"] == confirmed.confirmation_text()
    assert said["result"] == f"{confirmed.metric} 2.5"  # the round measured no score: none
    # beside the median, the round's medians of the same runs, never the trial's own figures
    medians = dataclasses.replace(verdict, median_score=0.75, median_samples_per_second=812.34)
    said = provenance(render_script(study, dataclasses.replace(best, confirmation=medians)))
    assert said["result"] == (  # samples/s as the tables write it: fmt's
        f"{confirmed.metric} 2.5, validation accuracy 0.75, 812.3 samples/s steady state"
    )
    own = dataclasses.replace(best, confirmation=None)  # the trial's value: its own figures
    said = provenance(render_script(study, own))
    own_value = autotune.display.fmt(best.value)
    assert said["result"].startswith(f"{best.metric} {own_value}, validation ")
    once = dataclasses.replace(verdict, runs=1)
    assert dataclasses.replace(best, confirmation=once).headline.endswith(
        ": median of 1 confirmed run"
    )
    unconfirmed = dataclasses.replace(best, confirmation=None)
    assert unconfirmed.to_dict()["confirmation"] == {}  # as exports have always written it
    assert BestConfig.from_dict(unconfirmed.to_dict()).confirmation is None


def test_reading_a_crafted_study_runs_none_of_the_code_it_names(tiny_copy, tmp_path: Path):
    """A study database someone else wrote could name any function: export places it by name
    and says so; it imports and calls nothing unless --rebuild-workload asks it to."""
    study, url = tiny_copy
    marker = tmp_path / "pwned"
    space = study.user_attrs["space_file"].replace(
        "data: autotune.testing:blobs\n  data_args: {image: true}",
        f"data: os:system\n  data_args: {{command: 'touch {marker}'}}",
    )
    study.set_user_attr("space_file", space)
    for missing in ("num_classes", "input_shape"):  # once, export called the data to learn them
        study.set_user_attr(missing, None)

    exported = autotune_here(
        "export", "--study", "tiny", "--storage", url, "-o", "t.py", cwd=tmp_path
    )
    assert exported.returncode == 0, exported.stderr
    assert "It imports and runs your code: autotune.testing:tiny_mlp, os:system." in (
        exported.stdout
    )
    assert "from os import system" in (tmp_path / "t.py").read_text()
    # the hint names each of the script's options (--force: a used --run-dir's refusal says it)
    options = re.findall(r'add_argument\(\s*"(--[a-z-]+)"', (tmp_path / "t.py").read_text())
    assert set(options) - {"--force"} <= set(re.findall(r"--[a-z-]+", exported.stdout)), options
    best = autotune_here("best", "--study", "tiny", "--storage", url, cwd=tmp_path)
    assert "its workload is your code: autotune.testing:tiny_mlp, os:system" in best.stdout
    assert not marker.exists()

    study.set_user_attr("model_kwargs", None)  # as older studies: only rebuilding could tell
    refused = autotune_here(
        "export", "--study", "tiny", "--storage", url, "-o", "u.py", cwd=tmp_path
    )
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert "add --rebuild-workload if you trust this study" in refused.stderr
    assert "os:system" in refused.stderr and not (tmp_path / "u.py").exists()
    assert not marker.exists()


def test_load_best_matches_autotune_best_json(tiny_study, tmp_path: Path):
    _, url = tiny_study
    best = autotune.load_best("tiny", storage=url)
    shown = autotune_here("best", "--study", "tiny", "--storage", url, "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    payload = json.loads(shown.stdout)
    assert payload["config"] == best.config.to_dict()
    assert payload == best.to_dict()


def test_api_building_blocks_train_a_model(tiny_study):
    _, url = tiny_study
    best = autotune.load_best("tiny", storage=url)
    splits = blobs(image=True)
    loader = best.make_loader(splits.train)
    assert loader.batch_size == best.config.batch_size and loader.drop_last
    torch.manual_seed(0)
    model = tiny_mlp(4, (1, 4, 4))
    trainer = best.make_trainer(model, total_steps=3 * len(loader))
    losses = []
    for _ in range(3):
        for inputs, targets in loader:
            losses.append(trainer.train_step(*trainer.to_device(inputs, targets)).item())
    assert trainer.steps == 3 * len(loader) // best.config.accumulation_steps
    assert sum(losses[-4:]) < sum(losses[:4])
    # what the README says is the user's to checkpoint: the training's own objects
    state = {
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scaler": trainer.scaler.state_dict(),
    }
    assert state["optimizer"]["state"] and trainer.optimizer is trainer.training_steps.optimizer
    assert trainer.scheduler is trainer.training_steps.scheduler  # None: a constant rate
    assert (trainer.scheduler is None) == (
        best.config.schedule == "constant" and best.config.warmup_fraction == 0
    )


def test_export_errors_are_one_line(tiny_study, tmp_path: Path):
    _, url = tiny_study
    existing = tmp_path / "train.py"
    existing.write_text("my own work\n")
    refused = autotune_here(
        "export", "--study", "tiny", "--storage", url, "-o", str(existing), cwd=tmp_path
    )
    assert refused.returncode == 1 and "exists; pass --force" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr  # a long path: unwrapped
    assert existing.read_text() == "my own work\n"  # nothing a user made is lost

    # every error is one line with a non-zero status (the CLI turns ExportError into that)
    unknown = autotune_here("export", "--study", "nope", "--storage", url, cwd=tmp_path)
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr
    assert unknown.stderr.strip().startswith("error: no study 'nope'")
    assert len(unknown.stderr.strip().splitlines()) == 1, unknown.stderr
    study = optuna.load_study(study_name="tiny", storage=url)
    with pytest.raises(ExportError, match="has no trial 99"):
        select_trial(study, 99)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]  # no half-written files
    bad_format = autotune_here("export", "--study", "tiny", "--format", "toml", cwd=tmp_path)
    assert bad_format.returncode == 2 and "--format must be one of" in bad_format.stderr

    forced = autotune_here(
        "export", "--study", "tiny", "--storage", url, "-o", str(existing), "--force", cwd=tmp_path
    )
    assert forced.returncode == 0 and "def main():" in existing.read_text()


def test_an_infeasible_trial_exports_with_a_warning_into_a_new_folder(tiny_copy, tmp_path: Path):
    study, url = tiny_copy
    chosen = select_trial(study)
    with sqlite3.connect(url.removeprefix("sqlite:///")) as db:  # as if it missed min_accuracy
        db.execute(
            "UPDATE trial_system_attributes SET value_json = '0.5' WHERE trial_id = ? AND key = ?",
            (chosen._trial_id, "constraints:min_accuracy"),
        )
    target = tmp_path / "runs" / "b" / "train.py"  # a folder that does not exist yet
    args = ("--study", "tiny", "--storage", url, "--trial", str(chosen.number), "-o", str(target))
    done = autotune_here("export", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"warning: trial {chosen.number} is infeasible" in done.stdout
    text = target.read_text()
    assert "this trial did not meet the study's requirement" in text
    assert provenance(text)["feasible"] is False
    assert provenance(text)["answer"] == "not an answer: infeasible"


def test_no_feasible_trial_and_multi_objective_studies(tmp_path: Path):
    storage = f"sqlite:///{tmp_path / 'x.db'}"
    empty = optuna.create_study(study_name="empty", storage=storage)
    with pytest.raises(ExportError, match=r"no feasible trial yet .* --trial N picks one"):
        select_trial(empty)
    multi = optuna.create_study(
        study_name="multi", storage=storage, directions=["maximize", "minimize"]
    )
    with pytest.raises(ExportError, match="pick one with --trial N"):
        select_trial(multi)
    config = make_config().to_dict()
    multi.add_trial(optuna.trial.create_trial(values=[2.0, 0.5], user_attrs={"config": config}))
    picked = best_config(multi, select_trial(multi, 0))
    assert picked.trial == 0 and picked.value == 2.0 and picked.config.to_dict() == config
    with pytest.raises(ExportError, match="no such file"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "other.yaml").write_text("a: 1\n")
    with pytest.raises(ExportError, match="not an autotune configuration"):
        load_config(tmp_path / "other.yaml")
    # a value no knob has (an edited file): named, not trained on
    edited = yaml.safe_load(render(picked, "yaml"))
    edited["config"]["precision"] = "fp8"
    (tmp_path / "edited.yaml").write_text(yaml.safe_dump(edited))
    with pytest.raises(ExportError, match="precision 'fp8' is none of fp32, fp32-strict, tf32"):
        load_config(tmp_path / "edited.yaml")


VISION_SPACE = """\
study: {name: vision, n_trials: 1, pruner: none, strategy: joint, confirm: false}
workload:
  model: torchvision:resnet18
  model_args: {cifar_stem: true}
  data: shapes
  data_args: {n_train: 16, n_val: 8}
  epochs: 1
space:
  batch_size: 8
  data_pipeline: device
  channels_last: true
"""


@pytest.mark.slow
def test_a_torchvision_model_on_shapes_exports_with_the_device_pipeline(
    tmp_path: Path, prepare_study
):
    study = prepare_study(VISION_SPACE, tmp_path).study
    best = best_config(study, select_trial(study))
    assert best.config.data_pipeline == "device"
    script = tmp_path / "out" / "train.py"
    script.parent.mkdir()
    write_new_file(script, render_script(study, best))
    text = script.read_text()
    assert "autotune" not in imported_modules(text)
    assert 'torchvision_model("resnet18", cifar_stem=True, num_classes=10)' in text
    assert "class DeviceBatches" in text and "def shapes(" in text
    assert lint(script).returncode == 0, lint(script).stdout
    blocker = import_blocker(tmp_path, "autotune")
    done = run_script(script, "--epochs", "1", block_autotune=blocker)
    assert done.returncode == 0, done.stderr
    assert "epoch 1/1" in done.stdout


TWO_FOLDERS_SPACE = """\
study: {name: folders, n_trials: 1, pruner: none, strategy: joint, confirm: false}
workload: {model: "folder_model:small_model", data: "folder_data:small_data", epochs: 1}
space: {batch_size: 16}
"""

FOLDER_MODEL = """\
from torch import nn


def small_model(width: int = 8) -> nn.Module:
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))
"""

FOLDER_DATA = """\
import torch
from torch.utils.data import TensorDataset

print("folder_data is imported")  # user code that prints: not into an exported script


def small_data(count: int = 64):
    generator = torch.Generator().manual_seed(0)

    def split(n):
        labels = torch.arange(n) % 2
        points = torch.randn(n, 4, generator=generator) + 3.0 * labels[:, None]
        return TensorDataset(points, labels)

    return split(count), split(count // 2)
"""


@pytest.fixture(scope="module")
def two_folder_study(tmp_path_factory, prepare_study) -> Iterator[tuple[optuna.Study, Path, str]]:
    """A study whose model module lives beside its space file and whose data module lives in
    another folder (on sys.path, as PYTHONPATH would put it)."""
    root = tmp_path_factory.mktemp("folders_" * 5)  # the script's lines past 99 columns
    (root / "models").mkdir()
    (root / "data").mkdir()
    (root / "models" / "folder_model.py").write_text(FOLDER_MODEL)
    (root / "data" / "folder_data.py").write_text(FOLDER_DATA)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root / "data"))
        prepared = prepare_study(TWO_FOLDERS_SPACE, root / "models")
        yield prepared.study, root, prepared.url


@pytest.mark.slow
def test_modules_in_two_folders_put_both_on_the_scripts_sys_path(two_folder_study, tmp_path):
    study, root, _ = two_folder_study
    best = best_config(study, select_trial(study))

    def looked_for(text: str) -> dict[str, tuple[str, str]]:
        """The script's WORKLOAD_MODULES: module -> (folder relative to it, the study's)."""
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "WORKLOAD_MODULES":
                return ast.literal_eval(node.value)
        raise AssertionError(text)

    # each module once, in the order placed (data, model), with the folder the study found it in
    found = {"folder_data": str(root / "data"), "folder_model": str(root / "models")}
    text = render_script(study, best)
    assert looked_for(text) == {module: ("", folder) for module, folder in found.items()}
    assert looked_for(render_script(study, best, rebuild_workload=True)) == looked_for(text)
    # written where it will be, the script also looks where the folders are from there (the
    # same place relative to it on another machine)
    script = tmp_path / "elsewhere" / "train.py"
    script.parent.mkdir()
    text = render_script(study, best, script_dir=script.parent)
    assert looked_for(text) == {
        module: (os.path.relpath(folder, script.parent), folder)
        for module, folder in found.items()
    }
    beside = looked_for(render_script(study, best, script_dir=root / "models"))
    assert beside["folder_model"][0] == "." and beside["folder_data"][0] == "../data"
    write_new_file(script, text)
    assert lint(script).returncode == 0, lint(script).stdout
    done = run_script(script, "--epochs", "1", block_autotune=import_blocker(tmp_path, "autotune"))
    assert done.returncode == 0, done.stderr
    assert "epoch 1/1" in done.stdout


def test_a_users_module_is_found_beside_the_space_file_else_by_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """One finder for a plain export and --rebuild-workload (``_bundle.entry_point``), which
    imports nothing: a namespace package (a folder without ``__init__.py``) found on sys.path
    gets its folder onto the script's sys.path, as a module file does; the plain export
    once left it out, and the script then failed to import it from any other folder."""
    beside, elsewhere = tmp_path / "space", tmp_path / "elsewhere"
    (beside / "s51_beside").mkdir(parents=True)
    (elsewhere / "s51_spaced").mkdir(parents=True)
    (elsewhere / "s51_spaced" / "nets.py").write_text("def net():\n    return None\n")
    (elsewhere / "s51_flat.py").write_text("def net():\n    return None\n")
    monkeypatch.syspath_prepend(str(elsewhere))
    found = str(elsewhere.resolve())
    assert entry_point("s51_beside.nets:net", beside) == (
        "from s51_beside.nets import net",
        "net",
        str(beside),
    )
    assert entry_point("s51_spaced.nets:make.net", None) == (
        "from s51_spaced.nets import make",
        "make.net",
        found,
    )
    assert entry_point("s51_flat:net", beside)[2] == found
    assert entry_point("yaml:safe_load", beside)[2] is None  # installed: found by name
    assert entry_point("s51_nowhere:net", beside)[2] is None  # the script says where it looked


def test_rebuilding_says_what_it_imports_first_and_stdout_is_only_the_script(
    two_folder_study, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    _, root, url = two_folder_study
    # the data's folder on sys.path (as PYTHONPATH puts it), and neither module imported yet
    monkeypatch.syspath_prepend(str(root / "data"))
    for module in ("folder_model", "folder_data"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    done = autotune_here(
        "export", "--study", "folders", "--storage", url, "--rebuild-workload", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    # exactly the script: every notice, and what the user's code printed, went to stderr
    ast.parse(done.stdout)
    assert done.stdout.startswith('"""Train folder_model:small_model on folder_data:small_data')
    notice = (
        "Rebuilding the workload: importing and running folder_model:small_model, "
        "folder_data:small_data."
    )
    lines = done.stderr.splitlines()
    assert lines.index(notice) < lines.index("folder_data is imported"), done.stderr
    assert (
        lines[-1]
        == "It imports and runs your code: folder_model:small_model, folder_data:small_data."
    )


# ---------------------------------------------------------------------------------------------
# The Python API uses the study's workload: its loss, collate_fn and batch layout
# ---------------------------------------------------------------------------------------------

REGRESSION_MODULE = """\
import torch
from torch import nn
from torch.utils.data import Dataset

from autotune.workloads import DataSplits

LONGEST = 6


class Sums(Dataset):
    \"\"\"Dict samples of different lengths; the target is half their sum (a regression).\"\"\"

    def __init__(self, n, seed):
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(1, LONGEST + 1, (n,), generator=generator)
        self.values = [torch.randn(int(k), generator=generator) for k in lengths]

    def __len__(self):
        return len(self.values)

    def __getitem__(self, i):
        return {"values": self.values[i], "y": 0.5 * self.values[i].sum()}


def pad(samples):  # DataLoader's default cannot stack samples of different lengths
    values = torch.zeros(len(samples), LONGEST)
    for row, sample in enumerate(samples):
        values[row, : len(sample["values"])] = sample["values"]
    return {"values": values, "y": torch.stack([sample["y"] for sample in samples])}


def sums(n_train=256, n_val=128):
    return DataSplits(Sums(n_train, 0), Sums(n_val, 1), collate_fn=pad)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(LONGEST, 1)

    def forward(self, values):
        return self.head(values).squeeze(-1)


def regressor():
    return Regressor()


def mse(output, target):
    return nn.functional.mse_loss(output.float(), target)


@torch.no_grad()
def r2(model, loader, device):
    predicted, targets = [], []
    for batch in loader:
        predicted.append(model(values=batch["values"].to(device)).float().cpu())
        targets.append(batch["y"])
    p, t = torch.cat(predicted), torch.cat(targets)
    return float(1 - ((p - t) ** 2).sum() / ((t - t.mean()) ** 2).sum())
"""

REGRESSION_SPACE = """\
study: {name: sums, n_trials: 1, pruner: none, baseline: false, confirm: false, strategy: joint}
workload:
  model: api_regression:regressor
  data: api_regression:sums
  inputs: values
  target: y
  loss: api_regression:mse
  epochs: 1
objective: {score: api_regression:r2}
space:
  lr: 0.05
  batch_size: 16
  optimizer: adamw
"""


@pytest.fixture(scope="module")
def regression_study(tmp_path_factory, prepare_study) -> tuple[optuna.Study, str]:
    """A study of a regression on dict samples of different lengths: the user's own loss, score
    and collate_fn, the target under a key."""
    folder = tmp_path_factory.mktemp("regression")
    (folder / "api_regression.py").write_text(REGRESSION_MODULE)
    study, url, _, _ = prepare_study(REGRESSION_SPACE, folder)
    return study, url


@pytest.mark.slow
def test_the_exported_script_travels_and_reproduces_its_trials_curve_to_the_bit(
    tmp_path_factory, prepare_study
):
    """Copied to another folder and run isolated (``python -I``: neither its folder nor
    PYTHONPATH on sys.path), the script finds the workload's module where the study found it
    and says so, and its validation scores equal the trial's at every epoch; where the module
    is nowhere, one line names it and where the study found it."""
    folder = tmp_path_factory.mktemp("curve")
    (folder / "api_regression.py").write_text(REGRESSION_MODULE)
    space = REGRESSION_SPACE.replace("name: sums", "name: curve").replace("epochs: 1", "epochs: 3")
    study, _, _, _ = prepare_study(space, folder)
    trial = select_trial(study)
    script = tmp_path_factory.mktemp("elsewhere") / "train.py"
    text = render(best_config(study, trial), "script", study, script_name="train.py")
    write_new_file(script, text)
    ran = subprocess.run(
        [sys.executable, "-I", script.name], cwd=script.parent, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr == f"note: workload module api_regression from {folder}\n"
    logged = (script.parent / "run" / "metrics.jsonl").read_text().splitlines()
    curve = [[float(entry["epoch"]), entry["val_r2"]] for entry in map(json.loads, logged)]
    assert curve == TrialRecord.of(trial).score_curve  # every epoch, every digit

    script.write_text(text.replace(literal(str(folder)), literal(str(folder / "gone"))))
    lost = subprocess.run(
        [sys.executable, "-I", script.name, "--run-dir", "b"],
        cwd=script.parent,
        capture_output=True,
        text=True,
    )
    assert (lost.returncode, lost.stderr.strip()) == (
        1,
        f"error: the workload's module 'api_regression' is neither beside this script nor in "
        f"{folder / 'gone'}, where the study found it: copy api_regression.py (or its package "
        f"folder) into {script.parent}",
    )


def test_a_workload_module_found_nowhere_is_one_line_whose_advice_works_under_python_i(
    regression_study, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The script's one line for a module it finds nowhere says what works under ``python -I``
    (as the README runs it), where PYTHONPATH, which it used to suggest, is ignored: copying
    the module beside the script. Run as -I runs it: its folder not on sys.path."""
    study, _ = regression_study
    user = sys.modules["api_regression"]  # the study's module, imported as the study ran
    found = Path(user.__file__).parent
    script = tmp_path / "elsewhere" / "train.py"
    script.parent.mkdir()
    text = render_script(study, best_config(study, select_trial(study)))
    write_new_file(script, text.replace(literal(str(found)), literal(str(tmp_path / "gone"))))
    monkeypatch.delitem(sys.modules, "api_regression")
    # no folder on the path holds the module (earlier tests' copies of it included)
    hold = [p for p in sys.path if (Path(p or ".") / "api_regression.py").exists()]
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in hold])
    with pytest.raises(SystemExit) as lost:
        runpy.run_path(str(script))  # not __main__: finds its modules, trains nothing
    assert str(lost.value.code).endswith(
        f"where the study found it: copy api_regression.py (or its package folder) into "
        f"{script.parent}"
    )
    (script.parent / "api_regression.py").write_text(REGRESSION_MODULE)  # as it says
    runpy.run_path(str(script))
    assert sys.path[0] == str(script.parent)


def test_a_ddp_scripts_note_of_where_its_workload_module_is_is_rank_0s_alone(
    regression_study, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    """Every process torchrun starts runs the script; the note that the workload's module was
    found where the study found it is rank 0's alone (every rank printed it)."""
    study, _ = regression_study
    best = best_config(study, select_trial(study))
    script = tmp_path / "elsewhere" / "train.py"
    script.parent.mkdir()
    write_new_file(script, render_script(study, _with(best, best.config.replace(world_size=2))))
    folder = Path(sys.modules["api_regression"].__file__).parent
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the folder first
    said = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        runpy.run_path(str(script))  # not __main__: finds its modules, trains nothing
        said[rank] = capsys.readouterr().err
    assert said == {"0": f"note: workload module api_regression from {folder}\n", "1": ""}


def _r2_after_training(best: BestConfig, epochs: int = 6, **given: object) -> float:
    """The R² on the validation split of a model trained in a loop of the user's own, with
    the API's defaults (or what ``given`` passes to make_loader and make_trainer)."""
    user = sys.modules["api_regression"]
    splits = user.sums()
    collate = given.get("collate_fn")
    loader = best.make_loader(splits.train, **({"collate_fn": collate} if collate else {}))
    torch.manual_seed(0)
    trainer = best.make_trainer(
        user.regressor(),
        total_steps=epochs * len(loader),
        **({"loss_fn": given["loss_fn"]} if "loss_fn" in given else {}),
    )
    for _ in range(epochs):
        for batch in loader:
            trainer.train_step(batch)  # as the DataLoader gives it: a dict
    val = best.make_val_loader(splits.val)
    return user.r2(trainer.model.eval(), val, trainer.device)


def test_the_api_trains_with_the_studys_loss_collate_fn_and_batch_layout(regression_study):
    _, url = regression_study
    best = autotune.load_best("sums", storage=url)
    user = sys.modules["api_regression"]
    assert best.study_collate_fn is user.pad  # the data function's, found by calling it
    assert best.make_loader(user.sums().train).collate_fn is user.pad
    trainer = best.make_trainer(user.regressor(), total_steps=10)
    assert isinstance(trainer, Trainer) and trainer.loss_fn is user.mse  # not cross-entropy
    assert _r2_after_training(best) > 0.95  # cross-entropy of these outputs does not get there

    # the same configuration read back from a YAML export knows the same workload
    yaml_best = BestConfig.from_dict(yaml.safe_load(render(best, "yaml")))
    assert yaml_best.batch_layout == {
        "inputs": ["values"],
        "target": "y",
        "target_to_model": False,
    }
    assert yaml_best.make_trainer(user.regressor(), total_steps=10).loss_fn is user.mse


def test_what_the_user_passes_wins_over_the_studys_workload(regression_study):
    _, url = regression_study
    best = autotune.load_best("sums", storage=url)
    user = sys.modules["api_regression"]
    calls = []

    def own_loss(output, target):
        calls.append(len(target))
        return user.mse(output, target)

    def own_pad(samples):
        calls.append("pad")
        return user.pad(samples)

    assert _r2_after_training(best, epochs=1, loss_fn=own_loss, collate_fn=own_pad) > -10
    assert calls.count("pad") > 0 and any(isinstance(call, int) for call in calls)
    # the trainer's own form: inputs and target split and on the device already
    trainer = best.make_trainer(user.regressor(), total_steps=2, loss_fn=own_loss)
    batch = user.pad([user.sums().train[i] for i in range(4)])
    inputs, _ = trainer.split(batch)
    loss = trainer.train_step(inputs, batch["y"])
    assert loss.shape == () and calls[-1] == 4


def test_a_configuration_without_a_recorded_layout_finds_it_from_the_first_batch(
    regression_study,
):
    _, url = regression_study
    best = autotune.load_best("sums", storage=url)
    older = BestConfig.from_dict({**best.to_dict(), "batch_layout": None})  # as older exports
    assert _r2_after_training(older, epochs=6) > 0.95
    user = sys.modules["api_regression"]
    trainer = older.make_trainer(user.regressor(), total_steps=2)
    with pytest.raises(ValueError, match=r"the batch does not fit the study's workload") as caught:
        trainer.train_step({"values": torch.zeros(2, 6)})  # no target "y"
    assert "\n" not in str(caught.value)


def test_a_studys_workload_that_cannot_be_used_is_one_line_and_passing_it_mends_it(
    regression_study,
):
    _, url = regression_study
    best = autotune.load_best("sums", storage=url)
    user = sys.modules["api_regression"]
    workload = {**best.workload, "loss": "nowhere_module:mse", "data": "nowhere_module:sums"}
    moved = BestConfig.from_dict({**best.to_dict(), "workload": workload})
    with pytest.raises(ExportError, match=r"no module named 'nowhere_module'") as caught:
        moved.make_trainer(user.regressor(), total_steps=2)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("the study's loss 'nowhere_module:mse'")
    assert str(caught.value).endswith("pass make_trainer(..., loss_fn=...)")
    assert moved.make_trainer(user.regressor(), 2, loss_fn=user.mse).loss_fn is user.mse
    with pytest.raises(ExportError, match=r"pass make_loader\(\.\.\., collate_fn=") as caught:
        moved.make_loader(user.sums().train)
    assert "\n" not in str(caught.value)
    assert moved.make_loader(user.sums().train, collate_fn=user.pad).collate_fn is user.pad


@pytest.mark.parametrize("others", [0, 1, 64])
def test_the_api_trainer_trains_on_the_threads_the_trials_rule_chooses(
    tiny_study, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, others: int
):
    """make_trainer sets torch's intra-op threads as a trial chose its own (the cores others
    leave idle: beside busy processes, torch's default pool trained 20x slower); ``threads``
    overrides it."""
    from autotune.machine import interference
    from tests.test_export_parity import BusyProc

    best = autotune.load_best("tiny", storage=tiny_study[1])
    cores = interference.usable_cores()
    before = torch.get_num_threads()
    try:
        with monkeypatch.context() as patch:
            BusyProc(tmp_path / "proc", others).install(patch, interference)
            torch.set_num_threads(cores + 1)  # neither torch's default nor the rule's
            best.make_trainer(tiny_mlp(4, (1, 4, 4)), total_steps=1)
            assert torch.get_num_threads() == max(1, cores - others)
        best.make_trainer(tiny_mlp(4, (1, 4, 4)), total_steps=1, threads=3)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
