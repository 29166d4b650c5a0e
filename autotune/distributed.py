"""Distributed trials: one trial trained by several processes under torch.distributed (DDP).

A configuration with ``world_size`` N > 1 (``workload.gpus_per_trial``) is trained by N rank
processes, a ``RankPool``: started with torch's own ``torch.multiprocessing.start_processes``
(spawn) and joined in a process group (NCCL on GPUs, gloo on a CPU) through a file store in this
process's temporary directory, so that no port is chosen and none can be taken. Rank r trains
on ``cuda:r`` of the GPUs this process sees, or, on a CPU, on its own equal share of this
process's cores. Each rank loads the workload from its spec once (nothing large is sent to it)
and keeps it, with its process group and what it warmed, for every trial after: a trial sends
each rank its configuration, and each pays what it has not paid yet (``warmup``) and meets the
others in a collective before any clock starts. They train through the same ``runner.train``
(or ``bursts.measure``) as one process does: the model in DistributedDataParallel, each its own
share of every epoch. Rank 0 measures, evaluates and reports: its evaluations come here and are
answered by the caller's ``report``; its answer is broadcast to the other ranks so that all stop
together.

Supervision: the ranks die with this process (PR_SET_PDEATHSIG) and share its process group, so
a worker killed on a timeout takes them along. A rank that fails sends its classified fault
here before it exits; the pool is stopped (its collectives can no longer be trusted) and the
trial fails once, with that fault, naming the rank; the next trial starts a new pool. A rank
that dies outright (a signal) is a worker crash.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import gc
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from autotune import bursts, interference, runner
from autotune.config import TrialConfig
from autotune.faults import (
    FaultKind,
    TrialFault,
    as_fault,
    describe_exit,
    needs_fresh_process,
    release_memory,
)
from autotune.hardware import device_name
from autotune.results import Evaluation, Reporter, TrialResult
from autotune.spec import WorkloadSpec
from autotune.speed import BurstPlan, SpeedMeasurement
from autotune.warmup import Warmth

__all__ = ["RankPool", "WorkloadSource", "measure", "rank_cores", "rank_devices", "train"]

POLL_SECONDS = 0.05  # how often the launcher looks at its ranks between messages
STOP_GRACE_SECONDS = 10.0  # how long closing ranks may take to exit before they are killed
# after a rank reports its fault, how long the others may take to report theirs (the first
# report may be a peer's view of it) before the trial fails and every rank is killed
FAULT_GRACE_SECONDS = 2.0
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
class _Done:  # a rank -> launcher: done with the trial (rank 0: what it came to)
    value: TrialResult | SpeedMeasurement | None


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


class RankPool:
    """The rank processes of distributed trials, kept from one trial to the next.

    Started at the first trial (or when the processes or device change), stopped after a
    trial that failed and by ``close``. ``train`` and ``measure`` raise TrialFault when a rank
    fails; an exception from ``report`` (Ctrl-C, say) stops the pool and goes on up.
    """

    def __init__(self, source: WorkloadSource) -> None:
        self.source = source
        self._key: tuple[int, str] | None = None  # (world_size, device) of the ranks running
        self._context: Any = None
        self._pipes: list[Connection] = []
        self._faults: Any = None
        self._rendezvous: str | None = None
        self.started = 0  # pools started so far (each pays the ranks' start-up)

    def train(self, config: TrialConfig, report: Reporter) -> TrialResult:
        """Train ``config`` (world_size > 1) on the ranks; rank 0's result."""
        value = self._run(config, None, report)
        assert isinstance(value, TrialResult)
        return value

    def measure(self, config: TrialConfig, plan: BurstPlan) -> SpeedMeasurement:
        """Time bursts of ``config`` (world_size > 1) on the ranks; rank 0's measurement."""
        value = self._run(config, plan, _no_evaluations)
        assert isinstance(value, SpeedMeasurement)
        return value

    def close(self) -> None:
        """Stop the ranks: asked to, then killed if they do not exit in STOP_GRACE_SECONDS."""
        if self._context is None:
            return
        for pipe in self._pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        processes = self._context.processes
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        self._stop()

    def _stop(self) -> None:
        for process in self._context.processes:
            if process.is_alive():
                process.kill()
            process.join()
        for pipe in self._pipes:
            pipe.close()
        if self._rendezvous is not None:
            shutil.rmtree(self._rendezvous, ignore_errors=True)
        self._context, self._pipes, self._key, self._rendezvous = None, [], None, None

    def _start(self, world: int, device: str) -> None:
        spawn = torch_mp.get_context("spawn")
        pairs = [spawn.Pipe() for _ in range(world)]
        self._faults = spawn.SimpleQueue()
        self._rendezvous = tempfile.mkdtemp(prefix="autotune-ddp-")
        try:
            cores = sorted(os.sched_getaffinity(0))
        except AttributeError:  # not Linux: no pinning
            cores = []
        shares = rank_cores(cores, world) if cores else [[]] * world
        self._context = torch_mp.start_processes(
            _rank_main,
            args=(
                world,
                device,
                self.source,
                [ends[1] for ends in pairs],
                self._faults,
                self._rendezvous,
                shares,
            ),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        for ends in pairs:
            ends[1].close()
        self._pipes = [ends[0] for ends in pairs]
        self._key = (world, device)
        self.started += 1

    def _run(
        self, config: TrialConfig, plan: BurstPlan | None, report: Reporter
    ) -> TrialResult | SpeedMeasurement:
        key = (config.world_size, config.device)
        alive = self._context is not None and all(
            p.exitcode is None for p in self._context.processes
        )
        if self._key != key or not alive:  # other processes or devices, or a rank died idle
            if self._context is not None:
                self._stop()
            self._start(*key)
        processes = self._context.processes
        value: TrialResult | SpeedMeasurement | None = None
        try:
            for pipe in self._pipes:
                pipe.send((config, plan))
            busy = set(range(len(self._pipes)))  # ranks not done with this trial
            closed: set[int] = set()  # ranks whose pipe closed: they exited
            reported: list[_Fault] = []  # faults the ranks sent through their pipes
            failed: set[int] = set()  # ranks that reported one
            failed_at: float | None = None
            while busy:
                listening = [self._pipes[r] for r in busy - closed]
                ready = wait([*listening, *(p.sentinel for p in processes)], POLL_SECONDS)
                answered = [r for r in busy - closed if self._pipes[r] in ready]
                for rank in answered:
                    try:
                        message = self._pipes[rank].recv()
                    except EOFError:  # the rank exited: its exit code says how
                        closed.add(rank)
                        continue
                    if isinstance(message, _Evaluated):
                        self._pipes[rank].send(report(message.evaluation))
                    elif isinstance(message, _Done):
                        busy.discard(rank)
                        value = message.value if rank == 0 else value
                    elif isinstance(message, _Fault):  # told at once: a rank that failed
                        reported.append(message)  # may hang in its teardown (NCCL's), and
                        failed.add(rank)  # its peers in a collective until a timeout
                        failed_at = failed_at or time.monotonic()
                if answered:
                    continue  # read every message before looking at exits
                codes = [p.exitcode for p in processes]
                waited = failed_at is not None and (
                    not busy - closed - failed
                    or time.monotonic() - failed_at > FAULT_GRACE_SECONDS
                )
                if waited or any(code is not None for code in codes):  # the first failure
                    raise _fault_of(codes, self._faults, config.world_size, reported)
        except BaseException:
            self._stop()  # its collectives are in an unknown state: the next trial starts anew
            raise
        assert value is not None
        # the machine the trial ran on, not rank 0's share of it ("(1 core)" of two)
        return dataclasses.replace(value, device_name=device_name(config.device))


def train(config: TrialConfig, source: WorkloadSource, report: Reporter) -> TrialResult:
    """Train ``config`` (world_size > 1) on ranks started for it alone; rank 0's result."""
    pool = RankPool(source)
    try:
        return pool.train(config, report)
    finally:
        pool.close()


def measure(config: TrialConfig, source: WorkloadSource, plan: BurstPlan) -> SpeedMeasurement:
    """Time bursts of ``config`` (world_size > 1) on ranks started for it alone."""
    pool = RankPool(source)
    try:
        return pool.measure(config, plan)
    finally:
        pool.close()


def _no_evaluations(evaluation: Evaluation) -> bool:
    raise TypeError("a speed measurement does not evaluate")


def _fault_of(
    codes: list[int | None], faults: Any, world: int, reported: list[_Fault] | None = None
) -> TrialFault:
    """The one fault a distributed trial ends with, from the ranks' exit codes at the first
    failure and the faults they sent (through their pipes, ``reported``, and the queue). A
    rank's own fault comes first; then a rank that died by a signal (a crash: it sent
    nothing); then a rank that only lost its peers (a collective whose other end went away),
    which is what the others see of any failure."""
    sent: list[_Fault] = list(reported or [])
    with contextlib.suppress(EOFError, OSError):
        while not faults.empty():
            fault = faults.get()
            if fault not in sent:
                sent.append(fault)
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
        rank = next(r for r, code in enumerate(codes) if code is not None)
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
    device: str,
    source: WorkloadSource,
    pipes: list[Connection],
    faults: Any,
    rendezvous: str,
    shares: list[list[int]],
) -> None:
    with contextlib.suppress(OSError, AttributeError):  # die with the launcher, even by SIGKILL
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the study decides what to stop
    if shares[rank]:
        os.sched_setaffinity(0, shares[rank])  # the trial's threads follow (trial_threads)
        if len({core for share in shares for core in share}) < sum(map(len, shares)):
            interference.count_tree_as_own(os.getppid())  # peers on these cores: the trial
    pipe = pipes[rank]
    for other in pipes:  # the other ranks' ends, inherited: not this rank's to hold open
        if other is not pipe:
            other.close()
    rank_device = rank_devices(device, world)[rank]
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

        def report(evaluation: Evaluation) -> bool:
            pipe.send(_Evaluated(evaluation))
            return bool(pipe.recv())

        while True:
            job = pipe.recv()
            if job is None:  # the pool is closing
                return
            config, plan = job
            config = config.replace(device=rank_device)
            # what this process has not paid yet, before any clock: torch's first steps (as
            # one process), the compiler; then every rank meets in a collective (the first
            # builds NCCL's communicator), so that no clock starts while a peer is still away
            warmth.before(config.replace(world_size=1), workload)
            dist.all_reduce(torch.zeros(1, device=rank_device))
            if plan is not None:
                value: TrialResult | SpeedMeasurement = bursts.measure(config, workload, plan)
            else:
                value = runner.train(config, workload, report if rank == 0 else _not_leader)
            pipe.send(_Done(value if rank == 0 else None))
            release_memory()  # the next trial's peak memory is its own
    except Exception as error:
        fault = as_fault(error)
        said = _Fault(rank, str(fault.kind), fault.message, fault.details, _lost_peer(error))
        # the launcher first, through the pipe it listens to: what follows (freeing memory,
        # NCCL's teardown) may hang, and the peers with it; the queue keeps it for the count
        with contextlib.suppress(OSError, ValueError):
            pipe.send(said)
        faults.put(said)
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


def _not_leader(evaluation: Evaluation) -> bool:
    raise AssertionError("only rank 0 reports")
