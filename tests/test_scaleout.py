"""Several workers on one machine, one study: shares of the cores, trials at once, the count of
trials kept, and a Ctrl-C that stops them all (``run --workers N``; GPUs take the same path)."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
import pytest
import torch
from optuna.artifacts import get_all_artifact_meta
from optuna.trial import TrialState

from autotune.machine.scaleout import unused_cores
from autotune.machine.scaleout._shares import (
    VISIBLE_BEFORE_ENV,
    WORKER_CORES_ENV,
    ScaleOutError,
    apply_share,
    gpus_argument,
    plan_shares,
    unshared_environment,
)
from autotune.machine.scaleout._workers import WORKER_PARENT_ENV
from autotune.study import SpeedRecord, TrialRecord, load_study
from autotune.testing import run_cli, start_cli, write_space

if TYPE_CHECKING:
    from typer.testing import Result

CORES = len(os.sched_getaffinity(0))
two_cores = pytest.mark.skipif(CORES < 2, reason=f"needs 2 cores for 2 workers; has {CORES}")

# trials of about a second (a sample takes 2 ms to load) and nothing to search but lr: the
# time goes to training, not to starting workers
SLOW_SPACE = """\
study:
  name: shared
  n_trials: {n_trials}
  n_startup_trials: 2
  pruner: none
  seed: 0
  confirm: false
workload:
  model: autotune.testing:tiny_mlp
  data: autotune.testing:blobs
  data_args: {{train_delay_seconds: {delay}}}
  epochs: 2
  device: cpu
space:
  lr: {{low: 1.0e-3, high: 1.0e-1, log: true}}
  batch_size: [32]
"""
SHORT_BURSTS = "{repeats: 2, bursts: 1, burst_seconds: 0.05}"  # stage 1 in a fraction of a second


def test_the_cores_are_divided_into_equal_shares(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(WORKER_CORES_ENV, "0,1,2,3,4")  # the cores a worker 0 divided
    shares = plan_shares(2, None)
    assert [share.cores for share in shares] == [(0, 1), (2, 3)]
    assert unused_cores(shares) == (4,)  # equal shares: trials of either worker compare
    assert shares[1].describe() == "worker 2 of 2: 2 cores 2-3"
    gpus = plan_shares(None, "1,3", gpu_names=_h100s)
    assert [(share.gpu, share.cores) for share in gpus] == [("1", (0, 1)), ("3", (2, 3))]
    assert gpus[0].describe() == "worker 1 of 2: 2 cores 0-1, GPU 1"
    for workers, devices, problem in [
        (6, None, "6 workers need a core each at least; this process may use 5 cores (0-4)"),
        (3, "0,1", "--workers 3 and --gpus 0,1 disagree"),
        (None, "2,2", "--gpus 2,2: names a GPU twice"),
    ]:
        with pytest.raises(ScaleOutError, match=re.escape(problem)):
            plan_shares(workers, devices, gpu_names=_h100s)


def _h100s(devices: list[str] | None) -> list[str]:
    return ["NVIDIA H100 80GB HBM3"] * (len(devices) if devices is not None else 8)


def test_trials_of_several_gpus_get_a_group_each_of_one_model(monkeypatch: pytest.MonkeyPatch):
    """--gpus with workload.gpus_per_trial: 2 gives each worker two GPUs (seen as cuda:0 and
    cuda:1), leaves an odd one idle, and refuses GPUs of two models in one study."""
    monkeypatch.setenv(WORKER_CORES_ENV, "0,1,2,3,4,5,6,7")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    shares = plan_shares(None, "0,1,2,3,4", gpus_per_trial=2, gpu_names=_h100s)
    assert [(s.gpu, s.cores) for s in shares] == [("0,1", (0, 1, 2, 3)), ("2,3", (4, 5, 6, 7))]
    assert shares[1].describe() == "worker 2 of 2: 4 cores 4-7, GPUs 2,3"
    with pytest.raises(ScaleOutError, match=re.escape("--gpus 0: 1 GPU, and workload.gpus")):
        plan_shares(None, "0", gpus_per_trial=2, gpu_names=_h100s)
    every = plan_shares(None, "all", gpus_per_trial=2, gpu_names=_h100s)  # 8 seen: 4 workers
    assert [s.gpu for s in every] == ["0,1", "2,3", "4,5", "6,7"]
    if not torch.cuda.is_available():  # this machine, asked for real (in another process)
        with pytest.raises(ScaleOutError, match="this machine has no CUDA GPU autotune can see"):
            plan_shares(None, "all")

    def mixed(devices: list[str] | None) -> list[str]:
        assert devices is not None
        return ["NVIDIA A100-SXM4-80GB" if d == "2" else "NVIDIA H100 80GB HBM3" for d in devices]

    with pytest.raises(ScaleOutError) as raised:
        plan_shares(None, "0,1,2", gpu_names=mixed)
    assert str(raised.value) == (
        "--gpus: these GPUs are of 2 models (NVIDIA A100-SXM4-80GB: GPU 2; NVIDIA H100 80GB "
        "HBM3: GPU 0,1); a study compares trials timed on one model, so run one study per "
        "model, naming its GPUs with --gpus"
    )


def test_gpus_that_do_not_answer_are_one_line(monkeypatch: pytest.MonkeyPatch):
    """The GPUs' models are read in a child process; one that does not answer in time (a hung
    driver; here, a limit no interpreter starts within) is a ScaleOutError, not a traceback."""
    from autotune.machine.scaleout import _shares

    monkeypatch.setattr(_shares, "GPU_QUERY_SECONDS", 0.001)
    with pytest.raises(ScaleOutError, match="cannot read the GPUs' models: torch did not answer"):
        plan_shares(None, "0,1")


@pytest.mark.parametrize("given", [None, "4,5,6,7"])
def test_the_workers_worker_0_starts_find_their_own_gpus(
    monkeypatch: pytest.MonkeyPatch, given: str | None
):
    """Worker 0 sees its share as cuda:0 (its CUDA_VISIBLE_DEVICES replaced); the workers it
    starts get the GPUs worker 0 was given back and a --gpus that names them as worker 0 was
    asked to, so each plans the same shares and takes its own (a scheduler's list or none)."""
    monkeypatch.setenv(WORKER_CORES_ENV, "0,1,2,3")
    monkeypatch.delenv(VISIBLE_BEFORE_ENV, raising=False)
    if given is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", given)
    shares = plan_shares(None, "1,3", gpu_names=_h100s)
    physical = ["5", "7"] if given else ["1", "3"]
    assert [share.gpu for share in shares] == physical
    cores = os.sched_getaffinity(0)
    try:
        apply_share(shares[0])
    finally:
        os.sched_setaffinity(0, cores)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == physical[0]  # worker 0: its GPU as cuda:0
    argument = gpus_argument(shares)
    assert argument == "1,3"
    started = unshared_environment(dict(os.environ))
    assert VISIBLE_BEFORE_ENV not in started
    assert started.get("CUDA_VISIBLE_DEVICES") == given
    monkeypatch.setattr(os, "environ", started)  # a worker's environment, as Workers gives it
    again = plan_shares(None, argument, gpu_names=_h100s)
    assert [(share.gpu, share.cores) for share in again] == [(s.gpu, s.cores) for s in shares]


@two_cores
def test_a_worker_that_cannot_run_is_one_line_and_creates_nothing(tmp_path: Path):
    """Each refusal of ``run --workers``/``--as-worker`` is one line and a non-zero exit before
    any study exists: CPU workers for a study that trains on a GPU (told by its device before
    any CUDA call, so on any machine), a hand-started --as-worker, and a worker whose worker 0
    died before it started (its parent is not the worker 0 that started it)."""
    write_space(tmp_path, SLOW_SPACE.format(n_trials=1, delay=0), name="space.yaml")
    for arguments, env, code, said in [
        (
            ("--workers", "2", "--device", "cuda"),
            {},
            2,
            "--workers runs workers on the CPU, and this study trains on cuda:0: use --gpus (a "
            "worker per GPU), or --device cpu",
        ),
        (("--as-worker", "1"), {}, 2, "--as-worker is for the workers autotune starts itself"),
        (
            ("--workers", "2", "--as-worker", "1"),
            {WORKER_PARENT_ENV: "1"},  # not this worker's parent: worker 0 is gone
            1,
            "worker 1 of this study is gone: this worker does not start",
        ),
    ]:
        done = run_cli("run", "space.yaml", *arguments, cwd=tmp_path, env=env)
        assert (done.returncode, done.stderr) == (code, f"error: {said}\n"), done.stdout
        assert not (tmp_path / "studies").exists()


@two_cores
@pytest.mark.slow
def test_two_workers_train_at_once_on_their_own_cores_and_keep_the_count(tmp_path: Path):
    text = SLOW_SPACE.format(n_trials=4, delay=0.002)  # stage 1 in short bursts
    # trials and measurements in the two workers' own processes: two start torch, not four
    text = text.replace("  seed: 0\n", f"  seed: 0\n  speed: {SHORT_BURSTS}\n  isolation: none\n")
    write_space(tmp_path, text, name="space.yaml")
    done = run_cli("run", "space.yaml", "--workers", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "workers worker 1 of 2: 1 core 0; worker 2 of 2: 1 core 1" in done.stdout
    study = load_study("shared", f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}")
    counted = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(counted) == 4 and not study.get_trials(states=(TrialState.RUNNING,))
    ended = sum(1 for t in study.trials if t.datetime_complete is not None)
    assert f"{ended} trials this run" in done.stdout  # both workers' (issue 44 item 5)
    records = {t.number: TrialRecord.of(t) for t in counted}
    assert {r.worker for r in records.values()} == {"1/2", "2/2"}
    assert all(r.intra_op_threads == 1 for r in records.values())  # a core each: no more
    # trained at the same time: a trial of each worker overlapping in time
    by_worker = {w: [t for t in counted if records[t.number].worker == w] for w in ("1/2", "2/2")}
    assert any(
        a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete
        for a in by_worker["1/2"]
        for b in by_worker["2/2"]
    )
    # worker 0 shows the other worker's trials as they end; the other wrote its own log
    assert "w2 trial" in done.stdout
    log = (tmp_path / "studies" / "shared.workers" / "worker-2.log").read_text()
    assert "worker 2 of 2: 1 core 1 of study shared" in log
    # both took part in stage 1, each timing what it claimed first on its own core: between
    # them each setting was timed once (what one timed, the other reused)
    speed = load_study("shared.speed", f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}")
    taken = [(r.cache_key, r.round) for r in map(SpeedRecord.of, speed.trials) if r is not None]
    assert taken and len(taken) == len(set(taken))
    timed = 0
    for said in (done.stdout, log):
        pattern = r"(\d+) settings? timed( \((\d+) leaders? again\))?"
        found = re.search(pattern, " ".join(said.split()))
        assert found is not None, said
        timed += int(found.group(1)) + int(found.group(3) or 0)
    assert timed == len(taken)


def _own_processes(marker: str) -> list[int]:
    """Processes whose command line holds ``marker`` (this test's folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@two_cores
@pytest.mark.slow
def test_a_ctrl_c_stops_every_worker_and_records_their_trials(tmp_path: Path):
    # trials of about 5 s; one stage (stage 1 is the test above's)
    text = SLOW_SPACE.format(n_trials=40, delay=0.01).replace(
        "  seed: 0\n", "  seed: 0\n  strategy: joint\n"
    )
    space = write_space(tmp_path, text, name="space.yaml")
    process = start_cli("run", str(space), "--workers", "2", cwd=tmp_path)
    url = f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}"
    deadline = time.monotonic() + 240
    running: set[str | None] = set()
    while running != {"1/2", "2/2"} and time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            trials = load_study("shared", url).get_trials(states=(TrialState.RUNNING,))
        except Exception:  # not created yet
            continue
        running = {TrialRecord.of(t).worker for t in trials}
    assert running == {"1/2", "2/2"}, process.stdout.read() if process.stdout else ""
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=180)
    assert process.returncode == 130, stdout + stderr
    study = optuna.load_study(study_name="shared", storage=url)
    assert not study.get_trials(states=(TrialState.RUNNING,))
    interrupted = [
        TrialRecord.of(t).worker
        for t in study.get_trials(states=(TrialState.FAIL,))
        if TrialRecord.of(t).fail_kind == "interrupted"
    ]
    assert sorted(interrupted) == ["1/2", "2/2"]  # each worker recorded its own
    deadline = time.monotonic() + 1
    while _own_processes(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _own_processes(str(tmp_path)) == []  # nothing left behind a second later


def _read(*args: str) -> Result:
    """``autotune ARGS`` run in this process, as a command that only reads a study is: its
    exit code and what it printed (``stdout`` and ``stderr``)."""
    from typer.testing import CliRunner

    from autotune.cli import app

    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.mark.slow
def test_three_processes_share_a_postgresql_study_and_recover_a_killed_one(
    postgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Many machines on one PostgreSQL study, played by three processes (each with a machine
    folder of its own: no turns to take): the count holds under the advisory lock, a process
    killed mid-trial is recovered, and the readers work there. Trials in the study processes
    (a worker touches no database): three processes start torch, not six."""
    text = SLOW_SPACE.format(n_trials=4, delay=0.002).replace("name: shared", "name: pg-shared")
    quick = "  seed: 0\n  heartbeat_interval: 1\n  strategy: joint\n  isolation: none\n"
    text = text.replace("  seed: 0\n", quick)
    write_space(tmp_path, text, name="space.yaml")
    url = postgres.url
    processes = [
        start_cli(
            "run",
            "space.yaml",
            "--storage",
            url,
            cwd=tmp_path,
            env={"AUTOTUNE_MACHINE_DIR": str(tmp_path / f"machine-{index}")},
        )
        for index in range(3)
    ]
    deadline = time.monotonic() + 240
    running = 0
    while running < 3 and time.monotonic() < deadline:  # each process trains one: kill one
        time.sleep(0.2)
        try:
            study = optuna.load_study(study_name="pg-shared", storage=url)
        except KeyError:
            continue
        # a trial is RUNNING from the moment it is asked; count it once its params are sampled,
        # or the killed one may carry none and its retry samples afresh
        trials = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        running = sum(1 for trial in trials if trial.params)
    assert running == 3
    processes[0].kill()
    processes[0].wait()
    for process in processes[1:]:
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stdout + stderr
    study = optuna.load_study(study_name="pg-shared", storage=url)
    counted = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(counted) == 4 and not study.get_trials(states=(TrialState.RUNNING,))
    (killed,) = study.get_trials(states=(TrialState.FAIL,))
    assert TrialRecord.of(killed).fail_kind == "interrupted"
    retried = [t for t in counted if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retried) == 1 and retried[0].params == killed.params
    monkeypatch.chdir(tmp_path)
    where = ("--study", "pg-shared", "--storage", url)
    for command in (("best",), ("export", "-o", "train.py"), ("report", "-o", "r.html")):
        done = _read(*command, *where)
        assert done.exit_code == 0, (command, done.stderr)
        said = " ".join(done.stdout.split())
        assert "not attached to the study" in said or command == ("best",)
    assert not (tmp_path / "studies").exists()  # a shared study's files: never into the cwd
    shared = tmp_path / "shared-artifacts"
    done = _read("report", "-o", "r2.html", "--artifacts", str(shared), *where)
    assert done.exit_code == 0 and "attached" not in done.stdout, done.stdout + done.stderr
    (attached,) = get_all_artifact_meta(study)
    assert attached.filename == "r2.html" and (shared / attached.artifact_id).is_file()
