"""The launcher's side of distributed trials: the rank processes started, kept between
trials, supervised, and their faults turned into the trial's one fault."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
from multiprocessing.connection import Connection, wait
from typing import Any

import torch.multiprocessing as torch_mp

from autotune.config import TrialConfig
from autotune.distributed._rank import (
    RankDone,
    RankEvaluated,
    RankFault,
    WorkloadSource,
    rank_cores,
    rank_main,
)
from autotune.faults import FaultKind, TrialFault, describe_exit
from autotune.machine.hardware import device_name
from autotune.results import Reporter, TrialResult
from autotune.speed import BurstPlan, SpeedMeasurement, no_evaluations

POLL_SECONDS = 0.05  # how often the launcher looks at its ranks between messages
STOP_GRACE_SECONDS = 10.0  # how long closing ranks may take to exit before they are killed
# after a rank reports its fault, how long the others may take to report theirs (the first
# report may be a peer's view of it) before the trial fails and every rank is killed
FAULT_GRACE_SECONDS = 2.0


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
        value = self._run(config, plan, no_evaluations)
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
            rank_main,
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
            reported: list[RankFault] = []  # faults the ranks sent through their pipes
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
                    if isinstance(message, RankEvaluated):
                        self._pipes[rank].send(report(message.evaluation))
                    elif isinstance(message, RankDone):
                        busy.discard(rank)
                        value = message.value if rank == 0 else value
                    elif isinstance(message, RankFault):  # told at once: a rank that failed
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


def _fault_of(
    codes: list[int | None], faults: Any, world: int, reported: list[RankFault]
) -> TrialFault:
    """The one fault a distributed trial ends with, from the ranks' exit codes at the first
    failure and the faults they sent (through their pipes, ``reported``, and the queue). A
    rank's own fault comes first; then a rank that died by a signal (a crash: it sent
    nothing); then a rank that only lost its peers (a collective whose other end went away),
    which is what the others see of any failure."""
    sent = list(reported)
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
