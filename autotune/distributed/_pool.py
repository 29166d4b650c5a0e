"""The launcher's side of distributed trials: the rank processes started, kept between
trials, supervised, and their faults turned into the trial's one fault."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time

from autotune import supervision
from autotune.config import TrialConfig
from autotune.distributed._rank import WorkloadSource, rank_cores, rank_main
from autotune.faults import FaultKind, TrialFault, describe_exit
from autotune.machine.hardware import device_name
from autotune.results import Reporter, TrialResult
from autotune.speed import BurstPlan, SpeedMeasurement, no_evaluations
from autotune.supervision import Child, Evaluated, Faulted, MeasureSpeed, Request, RunTrial

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
        self.ranks: list[Child] = []
        self._rendezvous: str | None = None
        self.started = 0  # pools started so far (each pays the ranks' start-up)

    def train(self, config: TrialConfig, report: Reporter) -> TrialResult:
        """Train ``config`` (world_size > 1) on the ranks; rank 0's result."""
        value = self._run(RunTrial(config), report)
        assert isinstance(value, TrialResult)
        return value

    def measure(self, config: TrialConfig, plan: BurstPlan) -> SpeedMeasurement:
        """Time bursts of ``config`` (world_size > 1) on the ranks; rank 0's measurement."""
        value = self._run(MeasureSpeed(config, plan), no_evaluations)
        assert isinstance(value, SpeedMeasurement)
        return value

    def close(self) -> None:
        """Stop the ranks: asked to, then killed if they do not exit in time."""
        supervision.ask_to_exit(self.ranks)
        self._stop()

    def _stop(self) -> None:
        supervision.kill(self.ranks)
        if self._rendezvous is not None:
            shutil.rmtree(self._rendezvous, ignore_errors=True)
        self.ranks, self._key, self._rendezvous = [], None, None

    def _start(self, world: int, device: str) -> None:
        self._rendezvous = tempfile.mkdtemp(prefix="autotune-ddp-")
        try:
            cores = sorted(os.sched_getaffinity(0))
        except AttributeError:  # not Linux: no pinning
            cores = []
        shares = rank_cores(cores, world)
        ranks = [
            (rank, world, device, self.source, self._rendezvous, shares) for rank in range(world)
        ]
        self.ranks = supervision.start(rank_main, ranks, "autotune-rank")
        self._key = (world, device)
        self.started += 1

    def _run(self, request: Request, report: Reporter) -> TrialResult | SpeedMeasurement:
        config = request.config
        key = (config.world_size, config.device)
        alive = all(rank.process.exitcode is None for rank in self.ranks)
        if self._key != key or not alive:  # other processes or devices, or a rank died idle
            self._stop()
            self._start(*key)
        try:
            value = self._exchange(request, report)
        except BaseException:
            self._stop()  # its collectives are in an unknown state: the next trial starts anew
            raise
        # the machine the trial ran on, not rank 0's share of it ("(1 core)" of two)
        return dataclasses.replace(value, device_name=device_name(config.device))

    def _exchange(self, request: Request, report: Reporter) -> TrialResult | SpeedMeasurement:
        """Send every rank the request, answer rank 0's evaluations, and return rank 0's
        outcome once every rank is done; TrialFault at the first failure."""
        supervision.tell(self.ranks, request)
        busy = set(range(len(self.ranks)))  # ranks not done with this trial
        # faults the ranks sent, told at once: a rank that failed may hang in its teardown
        # (NCCL's), and its peers in a collective until a timeout
        reported: dict[int, Faulted] = {}
        failed_at: float | None = None
        value = None
        while busy:
            heard = supervision.next_message(self.ranks)
            if heard is None:
                codes = [rank.process.exitcode for rank in self.ranks]
                waited = failed_at is not None and (
                    busy <= reported.keys() or time.monotonic() - failed_at > FAULT_GRACE_SECONDS
                )
                if waited or any(code is not None for code in codes):  # the first failure
                    raise _fault_of(codes, reported)
                continue
            rank, message = heard
            if isinstance(message, Evaluated):
                supervision.answer(self.ranks[rank], message, report)
            elif isinstance(message, Faulted):
                reported[rank] = message
                failed_at = failed_at or time.monotonic()
            else:  # Finished or Measured
                busy.discard(rank)
                value = message.outcome if rank == 0 else value
        assert value is not None
        return value


def _fault_of(codes: list[int | None], reported: dict[int, Faulted]) -> TrialFault:
    """The one fault a distributed trial ends with, from the ranks' exit codes at the first
    failure and the faults they sent (rank: fault, in the order they came). A rank's own fault
    comes first; then a rank that died by a signal (a crash: it sent nothing); then a rank that
    only lost its peers (a collective whose other end went away), which is what the others see
    of any failure."""
    world = len(codes)
    own = [(rank, fault) for rank, fault in reported.items() if not fault.lost_peer]
    crashed = [(r, code) for r, code in enumerate(codes) if code is not None and code < 0]
    if own:
        rank, first = own[0]
    elif crashed:
        rank, code = crashed[0]
        return TrialFault(
            FaultKind.WORKER_CRASHED, f"rank {rank} of {world} died ({describe_exit(code)})"
        )
    elif reported:
        rank, first = next(iter(reported.items()))
    else:
        rank = next(r for r, code in enumerate(codes) if code is not None)
        return TrialFault(
            FaultKind.WORKER_CRASHED,
            f"rank {rank} of {world} exited ({describe_exit(codes[rank])}) without saying why",
        )
    return TrialFault(first.kind, f"rank {rank} of {world}: {first.message}", first.details)
