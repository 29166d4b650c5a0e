"""Distributed (DDP) trials on a CPU: gloo, two processes, real torch.distributed throughout."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import runpy
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from optuna.trial import TrialState
from typer.testing import CliRunner

import autotune
from autotune import distributed
from autotune.cli import app
from autotune.faults import FaultKind, TrialFault
from autotune.spacefile import WorkloadSpec
from autotune.study import SpeedRecord, StudyRecord, TrialRecord, trial_config
from autotune.testing import make_config, tiny_mlp, write_space
from autotune.training.trainer import Trainer

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

FEATURES, CLASSES = 6, 3


def _batches(count: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(7)
    return [
        (
            torch.randn(size, FEATURES, generator=generator),
            torch.randint(0, CLASSES, (size,), generator=generator),
        )
        for _ in range(count)
    ]


def _one_step(
    world: int, rank: int, accumulation: int, global_batch: int, static_graph: bool = False
) -> dict[str, torch.Tensor]:
    """The weights after one optimizer step of ``accumulation`` micro-batches, this process
    training its 1/world of every micro-batch of the global batch."""
    torch.manual_seed(0)
    model = tiny_mlp(CLASSES, (FEATURES,), hidden=8)
    config = make_config(
        optimizer="sgd",
        momentum=0.0,
        lr=0.5,
        batch_size=global_batch // world,
        accumulation_steps=accumulation,
        world_size=world,
        ddp_bucket_cap_mb=1,
        static_graph=static_graph,
    )
    trainer = Trainer(model, config, total_steps=1)
    share = global_batch // world
    for inputs, targets in _batches(accumulation, global_batch):
        mine = slice(rank * share, (rank + 1) * share)
        trainer.train_step(inputs[mine], targets[mine])
    assert trainer.steps == 1
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


# (accumulation steps, static_graph): DDP's no_sync between micro-batches, and without it
CASES = ((1, False), (2, False), (2, True))


def _rank_steps(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        for accumulation, static in CASES:
            weights = _one_step(2, rank, accumulation, 8, static)
            torch.save(weights, f"{out}.{accumulation}.{static}.{rank}")
    finally:
        gc.collect()  # DDP's reducers hold the group: free them while the interpreter lives
        dist.destroy_process_group()


def test_two_processes_step_as_one_process_on_the_global_batch(tmp_path: Path):
    """DDP averages the gradients of each process's half of the batch: the weights after a step
    are those of one process on the whole batch (and, with accumulation, no_sync before the
    last micro-batch changes nothing but the number of all-reduces)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    out = str(tmp_path / "weights")
    torch_mp.spawn(_rank_steps, args=(str(tmp_path / "store"), out), nprocs=2)
    initial = _initial()
    for accumulation, static in CASES:
        alone = _one_step(1, 0, accumulation, global_batch=8)
        first, second = (torch.load(f"{out}.{accumulation}.{static}.{rank}") for rank in (0, 1))
        for name, value in alone.items():
            assert torch.allclose(first[name], second[name]), name  # the replicas agree
            assert torch.allclose(first[name], value, atol=1e-6), (accumulation, name)
        assert any(not torch.equal(value, initial[name]) for name, value in alone.items())


def _initial() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return tiny_mlp(CLASSES, (FEATURES,), hidden=8).state_dict()


SPEC = WorkloadSpec(
    model="autotune.testing:tiny_mlp",
    data="autotune.testing:blobs",
    epochs=2,
    eval_every=1,
    device="cpu",
)


@pytest.fixture(scope="module")
def pool() -> Iterator[distributed.RankPool]:
    """One pool of ranks for this module's trials of SPEC (a start-up costs seconds, a trial
    milliseconds): closing it at the end leaves no process."""
    ranks = distributed.RankPool(distributed.WorkloadSource(SPEC, None, "accuracy"))
    try:
        yield ranks
    finally:
        ranks.close()
    assert _children() == []


def test_a_distributed_trial_trains_as_its_processes_and_stops_together(
    pool: distributed.RankPool,
):
    """Rank 0 reports each evaluation here; its verdict stops every rank at the same step.
    Rates and samples are the processes' together; the global batch is theirs together."""
    seen = []

    def report(evaluation):
        seen.append(evaluation)
        return False

    stopped = []

    def stop_at_first(evaluation):
        stopped.append(evaluation)
        return True

    config = make_config(world_size=2, batch_size=16, epochs=2.0)
    result = pool.train(config, report)
    started = pool.started
    assert [e.index for e in seen] == [1, 2] and seen[-1].final
    assert result.world_size == 2 and result.effective_batch_size == 32
    assert result.samples_seen == seen[-1].samples_seen
    assert result.samples_seen == 2 * result.optimizer_steps * 16
    assert result.score > 0.5 and result.samples_per_second > 0

    result = pool.train(config.replace(epochs=3.0), stop_at_first)
    assert len(stopped) == 1 and len(result.evaluations) == 1  # both ranks stopped there
    # ... at the same step: the next trial on the same ranks trains in step again
    assert pool.train(config, lambda evaluation: False).score > 0.5
    assert pool.started == started


@pytest.mark.parametrize(
    "fault, kind, said",
    [
        ({"oom_at_batch": 1}, FaultKind.OOM, "rank 1 of 2: "),
        ({"crash_at_step": 3}, FaultKind.WORKER_CRASHED, "rank 1 of 2 died (signal 11 (SIGSEGV))"),
        # it reports, then hangs in its cleanup (as NCCL's teardown can), its peer in a
        # collective: the trial fails on the report, not after the group's 10-minute timeout
        ({"oom_at_batch": 1, "hang_after_fault": True}, FaultKind.OOM, "rank 1 of 2: "),
    ],
)
def test_a_failing_rank_is_one_fault_and_leaves_no_process(
    fault, kind, said, monkeypatch: pytest.MonkeyPatch
):
    """One rank fails (an exception it reports, or a crash that reports nothing): the trial
    fails once, with that rank's fault, and every rank process is gone when it returns."""
    # its peer, held in a collective, never reports: the pool waits FAULT_GRACE_SECONDS (2 s)
    # for a report that does not come; briefly here
    monkeypatch.setattr("autotune.distributed._pool.FAULT_GRACE_SECONDS", 0.5)
    spec = SPEC.model_copy(update={"model_args": {**fault, "fault_rank": 1}})
    pool = distributed.RankPool(distributed.WorkloadSource(spec, None, "accuracy"))
    others = _children()  # the module's ``pool``, where it runs
    started = time.monotonic()
    with pytest.raises(TrialFault) as raised:  # the failed trial stops the pool itself
        pool.train(make_config(world_size=2), lambda evaluation: False)
    assert raised.value.kind == kind and raised.value.message.startswith(said), raised.value
    assert time.monotonic() - started < 60  # the other rank did not wait out a timeout
    assert _children() == others


def _children() -> list[str]:
    """This process's children (a rank, a DataLoader worker of one), but multiprocessing's
    resource tracker, which lives as long as this process."""
    found = []
    for pid in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone meanwhile
        if "resource_tracker" not in command:
            found.append(f"{pid}: {command}")
    return found


def test_the_ranks_are_kept_between_trials_and_started_anew_after_a_fault(
    pool: distributed.RankPool,
):
    """A pool's ranks train trial after trial (one start-up, paid once); a trial whose rank
    fails stops them, the next trial starts new ones (closing leaves no process: ``pool``)."""
    config = make_config(world_size=2, batch_size=16)
    first = pool.train(config, lambda evaluation: False)
    started, ranks = pool.started, [rank.process.pid for rank in pool.ranks]
    second = pool.train(config.replace(seed=1), lambda evaluation: False)
    assert pool.started == started  # no new processes: the same ranks trained it
    assert [rank.process.pid for rank in pool.ranks] == ranks
    assert first.world_size == second.world_size == 2 and second.score > 0.5
    with pytest.raises(
        TrialFault, match=r"rank [01] of 2: batch_size 100000 \(per process\) is larger"
    ):
        pool.train(config.replace(batch_size=100_000), lambda evaluation: False)
    assert pool.started == started
    assert pool.train(config, lambda evaluation: False).score > 0.5
    assert pool.started == started + 1  # the failed trial's ranks were stopped, new ones started
    os.kill(pool.ranks[1].process.pid, signal.SIGKILL)  # a rank dies between trials
    pool.ranks[1].process.join()
    assert pool.train(config, lambda evaluation: False).score > 0.5
    assert pool.started == started + 2  # not a BrokenPipeError charged to the configuration


# the trials in the study's own process (the worker is not the subject), stage 1 one short
# measurement of each DDP setting; batch_size: auto from 16, rank 1 out of memory at 32 (each
# step's sleep makes samples/s grow with the batch)
DDP_SPACE = """\
study:
  name: ddp
  n_trials: 2
  seed: 0
  confirm: false
  pruner: none
  isolation: none
  baseline: {batch_size: 16, lr: 0.05}  # and the checklist's lr: both learn in 2 epochs
  speed: {repeats: 1, bursts: 1, burst_seconds: 0.05}
workload:
  model: autotune.testing:tiny_mlp
  model_args: {oom_at_batch: 32, fault_rank: 1, step_delay_seconds: 0.005}
  data: autotune.testing:blobs
  epochs: 2
  eval_every: 1
  device: cpu
  gpus_per_trial: 2
space:
  lr: {low: 1.0e-3, high: 1.0e-1, log: true}
  lr_scaling: linear
  base_batch_size: 64
  batch_size: auto
  accumulation_steps: [2]
  static_graph: [false, true]
"""


@pytest.mark.slow
def test_a_study_of_distributed_trials_exports_a_script_torchrun_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`autotune run` with workload.gpus_per_trial: 2 on a CPU (its session, in this process):
    batch_size: auto doubles each process's micro-batch until a rank runs out of memory, then
    tries halfway; stage 1 times the DDP settings as two processes, the trials train as two,
    the records say so; the exported script trains the same way under torchrun (and alone,
    saying it is not the trial's batch)."""
    space = write_space(tmp_path, DDP_SPACE, name="ddp.yaml")
    with contextlib.chdir(tmp_path):  # the study in studies/ here, where the command puts it
        report = autotune.run(space)
    assert report.ok, report.ending
    table = report.outcome.speed_table
    assert table is not None and {c.batch_size for c in table} == {16, 24}
    assert table.batch_size_auto == "batch_size auto: 16 to 24 (32 ran out of memory)"
    url = f"sqlite:///{tmp_path}/studies/autotune.db"
    study = optuna.load_study(study_name="ddp", storage=url)
    assert StudyRecord.of(study).batch_sizes == [16, 24]
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(trials) == 2
    for trial in trials:
        record = TrialRecord.of(trial)
        assert record.config is not None and record.config.world_size == 2
        effective = record.config.batch_size * 2 * 2
        assert record.processes == 2 and record.effective_batch_size == effective
        # the learning rate follows the global batch: base 64 (linear)
        assert record.config.lr == pytest.approx(record.config.base_lr * effective / 64)
    # the untuned baseline at 16 a process, the checklist at the largest that fits
    assert sorted(trial_config(t).batch_size for t in trials) == [16, 24]
    speed = optuna.load_study(study_name="ddp.speed", storage=url)
    assert {t.params.get("static_graph") for t in speed.get_trials()} == {False, True}
    # each process's micro-batch doubled: 16 a process is 256 // (2 * 16) steps an epoch
    (wall,) = [t for t in speed.trials if t.params["batch_size"] == 32]
    assert wall.state == TrialState.FAIL and wall.user_attrs["fail_kind"] == "oom"
    assert wall.user_attrs["fail_msg"].startswith("rank 1 of 2: ")  # found on its rank
    sixteen = SpeedRecord.of(next(t for t in speed.trials if t.params["batch_size"] == 16))
    assert sixteen is not None and sixteen.measurement is not None
    assert (sixteen.measurement["world_size"], sixteen.measurement["batch_size"]) == (2, 16)
    assert sixteen.measurement["micro_batches_per_epoch"] == 256 // (2 * 16)

    verbosity = optuna.logging.get_verbosity()  # the command quiets Optuna: for itself only
    with contextlib.chdir(tmp_path):  # read-only: in this process (Typer's CliRunner)
        exported = CliRunner().invoke(app, ["export", "--study", "ddp", "-o", "train.py"])
    optuna.logging.set_verbosity(verbosity)
    assert exported.exit_code == 0 and exported.exception is None, exported.stderr
    assert "Run it: torchrun --nproc-per-node 2 train.py" in " ".join(exported.stdout.split())
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    ran = subprocess.run(
        [*torchrun, "train.py", "--epochs", "2"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.count("epoch 2/2") == 1  # rank 0 speaks, once
    assert "note: the trial trained as 2" not in ran.stdout
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[-1])["val_accuracy"] > 0.5
    assert (tmp_path / "run" / "model.pt").is_file()
    # alone, as `python train.py` runs it (in this process: what it checks is the script's own
    # count of its processes; torchrun above started real ones); an error fails the test
    monkeypatch.setattr(sys, "argv", ["train.py", "--epochs", "1", "--run-dir", "alone"])
    monkeypatch.syspath_prepend(str(tmp_path))
    alone = io.StringIO()
    with (
        contextlib.chdir(tmp_path),
        contextlib.redirect_stdout(alone),
        torch.random.fork_rng(devices=[]),  # the script seeds torch: for itself only
    ):
        runpy.run_path("train.py", run_name="__main__")
    assert "note: the trial trained as 2 processes, this run has 1" in alone.getvalue()
    assert (tmp_path / "alone" / "model.pt").is_file()


def test_the_python_api_refuses_a_distributed_configuration_outside_its_group():
    """Out of a process group of its size, a distributed configuration's loader would train on
    1/N of every epoch and its trainer could not wrap DDP: both say so."""
    from autotune.export import BestConfig
    from autotune.testing import blobs

    best = BestConfig(study="s", trial=0, metric="m", value=1.0, config=make_config(world_size=2))
    with pytest.raises(ValueError, match="trains as 2 processes and this process is in a group"):
        best.make_loader(blobs().train)
    with pytest.raises(RuntimeError, match="start them with torchrun --nproc-per-node 2"):
        best.make_trainer(tiny_mlp(CLASSES, (FEATURES,)), total_steps=1)
    single = BestConfig(study="s", trial=0, metric="m", value=1.0, config=make_config())
    assert len(single.make_loader(blobs().train)) > 0


def test_each_process_of_a_group_gets_its_own_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Under torchrun every process is given the trial's device (``cuda:0``); in a group, the
    API and the loaders put process LOCAL_RANK on ``cuda:LOCAL_RANK`` instead (the CPU stays
    the CPU, and outside a group nothing changes)."""
    from autotune.machine import ranks

    monkeypatch.setenv("LOCAL_RANK", "3")
    assert ranks.local_device("cuda:0") == "cuda:0"  # not in a group yet
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        assert ranks.local_device("cuda:0") == "cuda:3"
        assert ranks.local_device("cuda") == "cuda:3"
        assert ranks.local_device("cpu") == "cpu"
    finally:
        dist.destroy_process_group()
