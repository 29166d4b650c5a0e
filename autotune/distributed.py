"""Distributed trials: one trial trained by several processes under torch.distributed (DDP).

A configuration with ``world_size`` N > 1 (``workload.gpus_per_trial``) is trained by N rank
processes, started here with torch's own ``torch.multiprocessing.start_processes`` (spawn) and
joined in a process group (NCCL on GPUs, gloo on a CPU) through a file store in this process's
temporary directory, so that no port is chosen and none can be taken. Rank r trains on
``cuda:r`` of the GPUs this process sees, or, on a CPU, on its own equal share of this process's
cores. Each rank loads the workload from its spec (nothing large is sent to it), pays what a
fresh process pays once (``warmup``, a first collective) before any clock starts, and trains
through the same ``runner.train`` (or ``bursts.measure``) as one process does: the model in
DistributedDataParallel, its own share of every epoch. Rank 0 measures, evaluates and reports:
its evaluations come here and are answered by the caller's ``report``; its answer is broadcast
to the other ranks so that all stop together.

Supervision: the ranks die with this process (PR_SET_PDEATHSIG) and share its process group, so
a worker killed on a timeout takes them along. A rank that fails sends its classified fault
here before it exits; torch's process context then stops the others, and the trial fails once,
with that fault, naming the rank. A rank that dies outright (a signal) is a worker crash.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import os
import shutil
import signal
import tempfile
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from autotune import bursts, runner
from autotune.config import TrialConfig
from autotune.faults import FaultKind, TrialFault, classify, describe_exit, release_memory
from autotune.hardware import device_name
from autotune.results import Evaluation, Reporter, TrialResult
from autotune.spec import WorkloadSpec
from autotune.speed import BurstPlan, SpeedMeasurement
from autotune.warmup import Warmth

__all__ = ["WorkloadSource", "measure", "rank_cores", "rank_devices", "train"]

POLL_SECONDS = 0.05  # how often the launcher looks at its ranks between messages
STOP_GRACE_SECONDS = 10.0  # SIGTERM, then this long, then SIGKILL, for the other ranks
GROUP_TIMEOUT = datetime.timedelta(minutes=10)  # a collective that waits longer has failed
PR_SET_PDEATHSIG = 1  # Linux prctl: signal this process when its parent dies


@dataclass(frozen=True)
class WorkloadSource:
    """How a rank process builds the workload: its spec, the space file's folder, the score."""

    spec: WorkloadSpec
    base_dir: Path | None
    score: str


@dataclass(frozen=True)
class _Evaluated:  # rank 0 -> launcher: an evaluation to answer (with a bool: stop or not)
    evaluation: Evaluation


@dataclass(frozen=True)
class _Done:  # rank 0 -> launcher: what the trial (or measurement) came to
    value: TrialResult | SpeedMeasurement


@dataclass(frozen=True)
class _Fault:  # any rank -> launcher: why it stopped
    rank: int
    kind: str
    message: str
    details: str
    lost_peer: bool  # a collective failed because another rank went away


def rank_devices(device: str, world: int) -> list[str]:
    """The device of each rank: ``cuda:i+r`` from the trial's ``cuda:i``; ``cpu`` for all."""
    if not device.startswith("cuda"):
        return ["cpu"] * world
    first = torch.device(device).index or 0
    return [f"cuda:{first + r}" for r in range(world)]


def rank_cores(cores: list[int], world: int) -> list[list[int]]:
    """This process's cores in ``world`` equal shares (the remainder idle, as between
    workers); every rank gets them all when there are fewer cores than ranks."""
    share = len(cores) // world
    if share == 0:
        return [list(cores)] * world
    return [cores[r * share : (r + 1) * share] for r in range(world)]


def train(config: TrialConfig, source: WorkloadSource, report: Reporter) -> TrialResult:
    """Train ``config`` (world_size > 1) as its processes; rank 0's result. TrialFault when
    any rank fails."""
    value = _launch(config, source, report, None)
    assert isinstance(value, TrialResult)
    return value


def measure(config: TrialConfig, source: WorkloadSource, plan: BurstPlan) -> SpeedMeasurement:
    """Time bursts of ``config`` (world_size > 1) as its processes; rank 0's measurement."""
    value = _launch(config, source, _no_evaluations, plan)
    assert isinstance(value, SpeedMeasurement)
    return value


def _no_evaluations(evaluation: Evaluation) -> bool:
    raise TypeError("a speed measurement does not evaluate")


def _launch(
    config: TrialConfig, source: WorkloadSource, report: Reporter, plan: BurstPlan | None
) -> TrialResult | SpeedMeasurement:
    world = config.world_size
    spawn = torch_mp.get_context("spawn")
    leader, leader_end = spawn.Pipe()
    faults = spawn.SimpleQueue()
    rendezvous = tempfile.mkdtemp(prefix="autotune-ddp-")
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no pinning
        cores = []
    shares = rank_cores(cores, world) if cores else [[]] * world
    context = torch_mp.start_processes(
        _rank_main,
        args=(world, config, source, plan, leader_end, faults, rendezvous, shares),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    leader_end.close()
    processes = context.processes
    value: TrialResult | SpeedMeasurement | None = None
    listening = [leader]  # until rank 0 closes its end
    try:
        while True:
            # rank 0's messages, and the ranks' exits, whichever comes first
            ready = wait([*listening, *(p.sentinel for p in processes)], timeout=POLL_SECONDS)
            if leader in ready:
                try:
                    message = leader.recv()
                except EOFError:  # rank 0 exited: its exit code says how
                    message, listening = None, []
                if isinstance(message, _Evaluated):
                    leader.send(report(message.evaluation))
                elif isinstance(message, _Done):
                    value = message.value
                continue  # read every message before looking at exits
            codes = [p.exitcode for p in processes]
            if any(code not in (None, 0) for code in codes):  # the first failure, as it is
                raise _fault_of(codes, faults, world)
            if all(code == 0 for code in codes):
                break
        if value is None:
            raise TrialFault(FaultKind.WORKER_CRASHED, "rank 0 exited without a result")
        # the machine the trial ran on, not rank 0's share of it ("(1 core)" of two)
        return dataclasses.replace(value, device_name=device_name(config.device))
    finally:  # done, failed, or interrupted (Ctrl-C, a report that raised): no rank left
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join()
        leader.close()
        shutil.rmtree(rendezvous, ignore_errors=True)


def _fault_of(codes: list[int | None], faults: Any, world: int) -> TrialFault:
    """The one fault a distributed trial ends with, from the ranks' exit codes at the first
    failure and the faults they sent. A rank's own fault comes first; then a rank that died
    by a signal (a crash: it sent nothing); then a rank that only lost its peers (a collective
    whose other end went away), which is what the others see of any failure."""
    sent: list[_Fault] = []
    with contextlib.suppress(EOFError, OSError):
        while not faults.empty():
            sent.append(faults.get())
    own = [fault for fault in sent if not fault.lost_peer]
    crashed = [(r, code) for r, code in enumerate(codes) if code is not None and code < 0]
    if own:
        first = own[0]
    elif crashed:
        rank, code = crashed[0]
        return TrialFault(
            FaultKind.WORKER_CRASHED, f"rank {rank} of {world} died ({describe_exit(code)})"
        )
    elif sent:
        first = sent[0]
    else:
        rank = next(r for r, code in enumerate(codes) if code not in (None, 0))
        return TrialFault(
            FaultKind.WORKER_CRASHED,
            f"rank {rank} of {world} exited ({describe_exit(codes[rank])}) without saying why",
        )
    return TrialFault(first.kind, f"rank {first.rank} of {world}: {first.message}", first.details)


def _lost_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because another rank went away (gloo closes
    its connections; NCCL reports the remote error), rather than this rank's own fault."""
    text = str(error)
    return isinstance(error, dist.DistNetworkError) or any(
        sign in text
        for sign in ("Connection closed by peer", "Connection reset by peer", "remote process")
    )


# ---------------------------------------------------------------------------------------------
# A rank process
# ---------------------------------------------------------------------------------------------


def _rank_main(
    rank: int,
    world: int,
    config: TrialConfig,
    source: WorkloadSource,
    plan: BurstPlan | None,
    leader_end: Connection,
    faults: Any,
    rendezvous: str,
    shares: list[list[int]],
) -> None:
    with contextlib.suppress(OSError, AttributeError):  # die with the launcher, even by SIGKILL
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the study decides what to stop
    if shares[rank]:
        os.sched_setaffinity(0, shares[rank])  # the trial's threads follow (trial_threads)
    device = rank_devices(config.device, world)[rank]
    config = config.replace(device=device)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this machine
    try:
        from autotune import workloads

        dist.init_process_group(
            "nccl" if device.startswith("cuda") else "gloo",
            init_method=f"file://{rendezvous}/store",
            rank=rank,
            world_size=world,
            timeout=GROUP_TIMEOUT,
            device_id=torch.device(device) if device.startswith("cuda") else None,
        )
        workload = workloads.load(source.spec, source.base_dir, source.score)
        # what a fresh process pays once, before any clock: torch's first steps (as one
        # process), the compiler, and the first collective (NCCL builds its communicator)
        Warmth().before(config.replace(world_size=1), workload)
        dist.all_reduce(torch.zeros(1, device=device))

        def report(evaluation: Evaluation) -> bool:
            leader_end.send(_Evaluated(evaluation))
            return bool(leader_end.recv())

        if plan is not None:
            value: TrialResult | SpeedMeasurement = bursts.measure(config, workload, plan)
        else:
            value = runner.train(config, workload, report if rank == 0 else _not_leader)
        if rank == 0:
            leader_end.send(_Done(value))
    except Exception as error:
        kind, message = classify(error)
        details = getattr(error, "details", "") or traceback.format_exc()[-4000:]
        faults.put(_Fault(rank, str(kind), message, details, _lost_peer(error)))
        release_memory()
        raise SystemExit(1) from None
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _not_leader(evaluation: Evaluation) -> bool:
    raise AssertionError("only rank 0 reports")
