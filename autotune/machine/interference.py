"""What else ran on the machine while a trial measured: interference is detected, not averaged in.

On a shared machine another process's threads take cores from a trial, and its samples/s drops
by whatever they took (a study saw one configuration at 290 and at 843 samples/s). A trial
therefore trains on the cores others do not keep busy as it starts (``trial_threads``), and
``CpuMeter`` measures how much of those cores' time went to processes outside its own process
tree: the CPU time the kernel accounts to the cores (``/proc/stat``, hypervisor steal included)
minus the trial tree's (``/proc/PID/stat``). More than ``INTERFERENCE_SHARE`` of the cores'
capacity flags the measurement, which the confirmation round measures again rather than naming
an answer from it. Linux only: elsewhere nothing is read and nothing flagged.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Self

# Others' share of the trial's cores above which its measurement is flagged. A quiet machine's
# daemons take about 1%; one busy process on a 2-core machine takes 50%.
INTERFERENCE_SHARE = 0.15

BUSY_WINDOW_SECONDS = 0.05  # how long idle_cores watches what others run
# ... unless others ran nothing in its first part: a core another process keeps busy shows in
# /proc/stat within 20 ms (2 ticks of 10 ms; the kernel charges every tick, 4 ms at HZ=250)
QUIET_WINDOW_SECONDS = 0.02
_PROC = Path("/proc")
_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def interfered(other_share: float | None) -> bool:
    """Whether a measurement taken while others took ``other_share`` of its cores is flagged."""
    return other_share is not None and other_share > INTERFERENCE_SHARE


def own_cores() -> tuple[int, ...]:
    """The cores this process may run on (every core where the system does not say)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return tuple(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores this process may run on."""
    return len(own_cores())


def idle_cores(own_ticks: Callable[[], int | None]) -> int:
    """How many of the cores this process may run on other processes leave idle now (at least
    one; all where /proc cannot be read): intra-op threads for a trial, and for the script
    exported from it. ``own_ticks`` reads the CPU ticks of the processes that are not others
    (``process_ticks``: this one). A pool larger than the idle cores waits at every parallel
    region for a thread the scheduler gave to another process: beside two spinning processes on
    a 2-core VM, the quickstart's CNN at micro-batch 16 trained 156-611 samples/s on 2 threads
    and 4.7-5.1k on 1 (quiet: 10k and 7.8k; 2026-11-27). Others are watched for
    ``BUSY_WINDOW_SECONDS``, a quiet machine's for ``QUIET_WINDOW_SECONDS``."""
    cores = set(own_cores())
    start = _ticks_now(cores, own_ticks)
    others = 0.0  # cores others kept busy
    for window in (QUIET_WINDOW_SECONDS, BUSY_WINDOW_SECONDS):
        if start is None:
            return len(cores)
        time.sleep(max(0.0, start[0] + window - time.perf_counter()))
        now = _ticks_now(cores, own_ticks)
        if now is None:
            return len(cores)
        seconds, busy, own = (after - before for after, before in zip(now, start, strict=True))
        # the own processes' time may run on other cores, or be accounted a tick apart
        others = max(0.0, busy - own) / _TICKS_PER_SECOND / seconds
        if others == 0:
            return len(cores)
    return max(1, len(cores) - int(others + 0.5))


def _ticks_now(
    cores: set[int], own_ticks: Callable[[], int | None]
) -> tuple[float, int, int] | None:
    """perf_counter's seconds, the busy ticks of ``cores`` and the own processes' ticks (None:
    no /proc)."""
    busy, own = _busy_ticks(cores), own_ticks()
    return None if busy is None or own is None else (time.perf_counter(), busy, own)


def process_ticks() -> int | None:
    """CPU ticks of this process, its reaped children included (None: no /proc)."""
    try:
        return _ticks(_stat(_PROC / "self"))
    except OSError:
        return None


def trial_threads() -> int:
    """Intra-op threads for a trial: the cores others leave idle (``idle_cores``), the trial's
    process tree (``count_tree_as_own``) not counted as others."""
    return idle_cores(CpuMeter().own_ticks)


@dataclass(frozen=True)
class CpuShare:
    """Where the trial's cores spent an interval, in CPU seconds and as shares of capacity."""

    wall_seconds: float
    cores: int
    own_cpu_seconds: float  # the trial's process tree (DataLoader workers included)
    other_cpu_seconds: float  # every other process, and time the hypervisor stole

    @property
    def other_share(self) -> float:
        """Others' CPU time over the cores' capacity in the interval, 0..1."""
        capacity = self.wall_seconds * self.cores
        return min(1.0, self.other_cpu_seconds / capacity) if capacity > 0 else 0.0

    @property
    def interfered(self) -> bool:
        """Whether others took enough of the cores to distort the measurement."""
        return interfered(self.other_share)


def _busy_ticks(cores: set[int]) -> int | None:
    """CPU ticks the kernel accounts as busy on ``cores`` since boot (steal counts as busy:
    the trial could not run then either)."""
    try:
        lines = (_PROC / "stat").read_text().splitlines()
    except OSError:
        return None
    busy = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cores:
            continue
        # user nice system idle iowait irq softirq steal guest guest_nice (guest is in user)
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
        busy += user + nice + system + irq + softirq + steal
    return busy


_SCANS = 3  # reads of /proc before one in which a process vanished mid-read is accepted


def _tree_ticks(root: int) -> int | None:
    """CPU ticks of process ``root`` and its descendants, reaped children included (in the
    parent's cutime and cstime). A child reaped mid-scan, after its parent's line and before its
    own, would be counted nowhere (a rank that sees its peer's last write reads at just that
    moment): a scan in which a listed process vanished is read again, up to ``_SCANS`` times."""
    for _ in range(_SCANS):
        scanned = _scan()
        if scanned is None:
            return None
        parents, ticks, vanished = scanned
        if not vanished:
            break
    if root not in ticks:
        return None
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += ticks.get(pid, 0)
        stack.extend(children.get(pid, ()))
    return total


def _scan() -> tuple[dict[int, int], dict[int, int], bool] | None:
    """Every process's parent and CPU ticks (utime stime cutime cstime), and whether a listed
    process vanished before its line was read; None without /proc."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    try:
        entries = [entry for entry in _PROC.iterdir() if entry.name.isdigit()]
    except OSError:
        return None
    vanished = False
    for entry in entries:
        try:
            fields = _stat(entry)
        except OSError:  # gone since the listing
            vanished = True
            continue
        with contextlib.suppress(ValueError, IndexError):  # unreadable
            pid = int(entry.name)
            parents[pid] = int(fields[1])
            ticks[pid] = _ticks(fields)
    return parents, ticks, vanished


def _stat(process: Path) -> list[str]:
    """The fields of a process's ``stat`` after its command name (its parent is [1]): the name
    is in parentheses and may hold spaces."""
    return (process / "stat").read_text().rpartition(")")[2].split()


def _ticks(fields: list[str]) -> int:
    """A process's CPU ticks from its ``stat`` fields: utime stime cutime cstime."""
    return sum(int(f) for f in fields[11:15])


_trial_root: int | None = None  # the process whose tree is the trial (None: this process)


def count_tree_as_own(pid: int) -> None:
    """From now on, charge the CPU time of process ``pid`` and its descendants to the trial:
    for the ranks of a distributed trial that run on the same cores (fewer cores than ranks),
    each of which would otherwise count its peers as interference."""
    global _trial_root
    _trial_root = pid


class CpuMeter:
    """Where the cores this process may use spent a ``with`` block: ``share`` (None: no /proc)."""

    def __init__(self) -> None:
        self._cores = set(own_cores())
        self._pid = _trial_root if _trial_root is not None else os.getpid()
        self.share: CpuShare | None = None

    def own_ticks(self) -> int | None:
        """CPU ticks of the trial's process tree (None: no /proc)."""
        return _tree_ticks(self._pid)

    def _read(self) -> tuple[float, int, int] | None:
        return _ticks_now(self._cores, self.own_ticks)

    def __enter__(self) -> Self:
        self._start = self._read()
        return self

    def __exit__(self, *exc: object) -> None:
        self.share = self.so_far()

    def so_far(self) -> CpuShare | None:
        """Where the cores' time went from the start of the block until now (None: no /proc)."""
        now = self._read()
        if self._start is None or now is None or not self._cores:
            return None
        seconds, busy, own = (
            after - before for after, before in zip(now, self._start, strict=True)
        )
        return CpuShare(
            wall_seconds=seconds,
            cores=len(self._cores),
            own_cpu_seconds=own / _TICKS_PER_SECOND,
            # the tree's time may run on cores outside the set, or be accounted a tick apart
            other_cpu_seconds=max(0.0, busy - own) / _TICKS_PER_SECOND,
        )
