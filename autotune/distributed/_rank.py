"""A rank process of a distributed trial (``rank_main``, its body); it and its launcher
(``_pool.RankPool``) speak ``supervision``'s messages."""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import torch
import torch.distributed as dist

from autotune.faults import as_fault, needs_fresh_process, release_memory
from autotune.machine import interference
from autotune.machine.scaleout import die_with_parent
from autotune.results import Evaluation
from autotune.spacefile import WorkloadSpec
from autotune.supervision import (
    Exit,
    Faulted,
    Finished,
    Measured,
    MeasureSpeed,
    exit_at_once,
    reporter,
)
from autotune.training import bursts, runner
from autotune.training.warmup import Warmth

GROUP_TIMEOUT = datetime.timedelta(minutes=10)  # a collective that waits longer has failed


@dataclass(frozen=True)
class WorkloadSource:
    """How a rank process builds the workload: its spec, the space file's folder, the score."""

    spec: WorkloadSpec
    base_dir: Path | None
    score: str


def device_of_rank(device: str, rank: int) -> str:
    """The device of rank r: ``cuda:i+r`` from the trial's ``cuda:i``; ``cpu`` on a CPU."""
    if not device.startswith("cuda"):
        return "cpu"
    return f"cuda:{(torch.device(device).index or 0) + rank}"


def rank_cores(cores: list[int], world: int) -> list[list[int]]:
    """This process's cores in ``world`` equal shares (the remainder idle, as between
    workers); every rank gets them all when there are fewer cores than ranks."""
    share = len(cores) // world
    if share == 0:
        return [list(cores)] * world
    return [cores[r * share : (r + 1) * share] for r in range(world)]


def _lost_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because another rank went away (gloo closes
    its connections; NCCL reports the remote error), rather than this rank's own fault."""
    text = str(error)
    return isinstance(error, dist.DistNetworkError) or any(
        sign in text
        for sign in ("Connection closed by peer", "Connection reset by peer", "remote process")
    )


def rank_main(
    pipe: Connection,
    rank: int,
    world: int,
    device: str,
    source: WorkloadSource,
    rendezvous: str,
    shares: list[list[int]],
) -> None:
    die_with_parent(signal.SIGKILL)  # with the launcher, even when it is SIGKILLed
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the study decides what to stop
    if shares[rank]:
        os.sched_setaffinity(0, shares[rank])  # the trial's threads follow (trial_threads)
        if len({core for share in shares for core in share}) < sum(map(len, shares)):
            interference.count_tree_as_own(os.getppid())  # peers on these cores: the trial
    rank_device = device_of_rank(device, rank)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this machine
    try:
        from autotune import workloads

        if rank_device.startswith("cuda"):  # the current device: what torch uses unasked
            torch.cuda.set_device(rank_device)  # (pinned memory, streams, CUDA graphs, NCCL)
        dist.init_process_group(
            "nccl" if rank_device.startswith("cuda") else "gloo",
            init_method=f"file://{rendezvous}/store",
            rank=rank,
            world_size=world,
            timeout=GROUP_TIMEOUT,
            device_id=torch.device(rank_device) if rank_device.startswith("cuda") else None,
        )
        workload = workloads.load(source.spec, source.base_dir, source.score)
        warmth = Warmth()
        while not isinstance(request := pipe.recv(), Exit):  # until the pool closes
            config = request.config.replace(device=rank_device)
            # what this process has not paid yet, before any clock: torch's first steps (as
            # one process), the compiler; then every rank meets in a collective (the first
            # builds NCCL's communicator), so that no clock starts while a peer is still away
            warmth.warm_for(config.replace(world_size=1), workload)
            dist.all_reduce(torch.zeros(1, device=rank_device))
            if isinstance(request, MeasureSpeed):
                pipe.send(Measured(bursts.measure(config, workload, request.plan)))
            else:
                report = reporter(pipe) if rank == 0 else _not_leader
                pipe.send(Finished(runner.train(config, workload, report)))
            release_memory()  # the next trial's peak memory is its own
    except Exception as error:
        fault = as_fault(error)
        said = Faulted(fault.kind, fault.message, fault.details, True, _lost_peer(error))
        # the launcher first: what follows (freeing memory, NCCL's teardown) may hang, and
        # the peers with it
        with contextlib.suppress(OSError):
            pipe.send(said)
        # told first: after a CUDA fault the context is broken and releasing memory raises
        if not needs_fresh_process(error):
            release_memory()
        raise SystemExit(1) from None
    finally:
        # DDP's reducers hold the group; a group freed at the interpreter's exit, with gloo's
        # threads still joinable, aborts the process ("terminate called without an active
        # exception"): free them now, then the group
        gc.collect()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    exit_at_once()  # (torch's interpreter shutdown is seconds the parent waits for)


def _not_leader(evaluation: Evaluation) -> bool:
    raise AssertionError("only rank 0 reports")
