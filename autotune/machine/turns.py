"""A machine-wide lock on the training device: one process of this machine trains on it at a time.

Two ``autotune run`` commands on one machine (many processes on one study, as the README's
SLURM and Kubernetes examples start them; or two studies side by side) would otherwise train at
the same moment on the same cores or GPU, and each trial's samples/s would fall by whatever the
other takes (two quickstarts together trained at 130 samples/s against 7k alone). So a trial, a
stage-1 measurement and a confirmation run each hold ``device_lock`` on their ``resources``
while they run; processes pinned to shares that do not overlap (``--workers``, ``--gpus``) never
wait for each other. The user calls a held lock "the machine's turn".

The lock is an exclusive ``flock`` per resource in ``/tmp`` (or ``$AUTOTUNE_MACHINE_DIR``: a
folder containers of one host share), taken in sorted order. A wait is given up after
``$AUTOTUNE_TURN_WAIT`` seconds (``--turn-wait``), half an hour by default: the lock is held for
one trial, stage-1 measurement or confirmation run of the other process, and a longer wait is a
process that holds the machine for good, which an unattended job should say rather than wait on.
``0`` takes no lock: the process trains beside the others, each measuring the other as
interference.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from autotune.errors import UserError
from autotune.machine.interference import own_cores
from autotune.machine.scaleout import core_ranges

MACHINE_DIR_ENV = "AUTOTUNE_MACHINE_DIR"
TURN_WAIT_ENV = "AUTOTUNE_TURN_WAIT"
TURN_WAIT_SECONDS = 1800.0  # how long the lock is waited for, unless $AUTOTUNE_TURN_WAIT says
POLL_SECONDS = 0.05  # how often a held lock is tried again (the holder's gap between trials)
FIRST_SAID_AGAIN = 10.0  # seconds: a wait is said again after this, then at each doubling


def _machine_dir() -> Path:
    """Where processes of this machine meet: $AUTOTUNE_MACHINE_DIR, else /tmp, which is one
    per machine even where a scheduler gives each job a TMPDIR of its own."""
    given = os.environ.get(MACHINE_DIR_ENV)
    if given:
        with contextlib.suppress(OSError):  # unusable: its locks are skipped, as a read-only /tmp
            Path(given).mkdir(parents=True, exist_ok=True)
        return Path(given)
    return Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())


MACHINE_DIR = _machine_dir()


def resources(device: str, world_size: int = 1) -> tuple[str, ...]:
    """What a trial on ``device`` with ``world_size`` processes trains with, named machine-wide:
    ``gpu-ID`` for each of its GPUs (as CUDA_VISIBLE_DEVICES names them, where it is set), else
    ``core-N`` for each core this process may use."""
    if device.startswith("cuda"):
        first = int(device.partition(":")[2] or 0)
        visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
        visible = [d for d in visible if d]
        names = []
        for index in range(first, first + world_size):
            name = visible[index] if index < len(visible) else str(index)
            names.append("gpu-" + re.sub(r"[^A-Za-z0-9_.-]", "_", name))
        return tuple(sorted(names))
    return tuple(f"core-{core}" for core in own_cores())


class DeviceLockTimeout(UserError):
    """Another process held the device lock longer than the user's bound (``by_user``: the run
    stops) or the caller's (``wait_at_most``: stage 1's budget ran out)."""

    def __init__(self, message: str, by_user: bool) -> None:
        super().__init__(message)
        self.by_user = by_user


def lock_wait_seconds() -> float:
    """Seconds the device lock is waited for: ``$AUTOTUNE_TURN_WAIT``, else
    ``TURN_WAIT_SECONDS``; UserError for a value that is not seconds."""
    given = os.environ.get(TURN_WAIT_ENV, "").strip()
    try:
        seconds = float(given) if given else TURN_WAIT_SECONDS
    except ValueError:
        seconds = math.nan
    if not seconds >= 0:  # (nan too)
        raise UserError(f"{TURN_WAIT_ENV}={given!r}: give the seconds to wait, 0 or more")
    return seconds


@contextlib.contextmanager
def file_lock(
    path: Path,
    on_wait: Callable[[int | None], None] | None = None,
    wait: Callable[[IO[str]], None] | None = None,
    remove: bool = False,
) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` while held, this process's id written into it (none
    where the file cannot be opened). Where another process holds it, ``on_wait`` hears that
    process's id (None: unknown) once before waiting, or ``wait`` waits instead (returns holding
    the lock, or raises). ``remove``: the file is deleted on release (no lock file left behind
    per study); a process that waited on the deleted file locks the path's new one instead."""
    import fcntl

    while True:
        try:
            handle = open(path, "a+")  # noqa: SIM115
        except OSError:
            yield
            return
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if wait is not None:
                    wait(handle)
                else:
                    if on_wait is not None:
                        on_wait(_holder(handle))
                        on_wait = None  # said once
                    fcntl.flock(handle, fcntl.LOCK_EX)
            if remove and not _is_file_at(handle, path):
                continue  # its holder removed it on release: lock the one at the path now
            try:
                with contextlib.suppress(OSError):
                    handle.truncate(0)
                    handle.write(str(os.getpid()))
                    handle.flush()
                yield
            finally:
                if remove:
                    with contextlib.suppress(OSError):
                        path.unlink()
                fcntl.flock(handle, fcntl.LOCK_UN)
        return


def _is_file_at(handle: IO[str], path: Path) -> bool:
    """Whether ``handle`` is still the file at ``path`` (not one deleted since it was opened)."""
    try:
        return os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
    except OSError:
        return False


def _holder(handle: object) -> int | None:
    """The process id written into a lock file, if it reads as one."""
    try:
        handle.seek(0)  # type: ignore[attr-defined]
        return int(handle.read().strip())  # type: ignore[attr-defined]
    except (OSError, ValueError):
        return None


def _command(pid: int) -> str:
    """`` (autotune run space.yaml)``: what process ``pid`` runs, from ``autotune`` on where it
    is there, on one line and shortened; "" where /proc does not say."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return ""
    at = next((i for i, w in enumerate(words) if w.split("/")[-1] == "autotune"), None)
    words = ["autotune", *words[at + 1 :]] if at is not None else [Path(words[0]).name, *words[1:]]
    line = " ".join(" ".join(words).split())
    return f" ({line if len(line) <= 60 else line[:57] + '...'})" if line else ""


@dataclass
class _LockWait:
    """One wait for the device lock, over all its resources (``device_lock`` says how)."""

    names: tuple[str, ...]
    on_wait: Callable[[str], None] | None
    bound: float
    by_user: bool  # the bound is the user's (else the caller's: stage 1's budget)
    started: float | None = None
    said_at: float = 0.0  # the wait is said again once it has lasted this long

    def who(self, handle: IO[str]) -> str:
        """``autotune process 12 trains on cores 0-1 (autotune run space.yaml)``"""
        pid = _holder(handle)
        who = "another autotune process" if pid is None else f"autotune process {pid}"
        return f"{who} trains on {_describe(self.names)}{_command(pid) if pid else ''}"

    def __call__(self, handle: IO[str]) -> None:
        import fcntl

        self.started = self.started or time.monotonic()
        while True:
            waited = time.monotonic() - self.started
            if waited >= self.said_at and self.on_wait is not None:
                still = "still " if self.said_at else ""  # said again: a long wait
                self.on_wait(
                    f"{still}waiting for its turn ({_seconds(waited)} so far, gives up after "
                    f"{_seconds(self.bound)}{': --turn-wait' if self.by_user else ''}): "
                    f"{self.who(handle)}"
                )
                self.said_at = max(FIRST_SAID_AGAIN, 2 * waited)
            if waited >= self.bound:
                raise DeviceLockTimeout(
                    f"gave up waiting for this machine's turn after {_seconds(waited)}: "
                    f"{self.who(handle)}. To train beside it anyway (each slows the other, and "
                    f"measurements are flagged for interference), run with --turn-wait 0 "
                    f"({TURN_WAIT_ENV}=0); to wait longer, --turn-wait SECONDS",
                    self.by_user,
                )
            time.sleep(min(POLL_SECONDS, max(0.0, self.bound - waited)))
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return


def _seconds(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


@contextlib.contextmanager
def device_lock(
    device: str,
    world_size: int = 1,
    on_wait: Callable[[str], None] | None = None,
    wait_at_most: float | None = None,
) -> Iterator[None]:
    """Hold the machine-wide lock on ``resources(device, world_size)`` while the block runs.
    Where another process holds part of it, ``on_wait`` hears who, on what and for how long so
    far, when the wait begins and at each doubling; past ``lock_wait_seconds()``, or the
    caller's ``wait_at_most`` seconds when that is less: DeviceLockTimeout. A bound of 0 takes
    no lock."""
    wait_bound = lock_wait_seconds()
    if wait_bound == 0:  # the user runs beside the others
        yield
        return
    names = resources(device, world_size)
    by_user = wait_at_most is None or wait_bound <= wait_at_most
    bound = wait_bound if by_user else max(0.0, wait_at_most or 0.0)
    waiting = _LockWait(names, on_wait, bound, by_user)
    with contextlib.ExitStack() as held:
        for name in names:
            held.enter_context(file_lock(MACHINE_DIR / f"autotune-turn-{name}.lock", wait=waiting))
        yield


def _describe(names: tuple[str, ...]) -> str:
    """``cores 0-3`` or ``GPU 1`` for the lock's resource names."""
    gpus = [name[4:] for name in names if name.startswith("gpu-")]
    if gpus:
        return ("GPUs " if len(gpus) > 1 else "GPU ") + ",".join(gpus)
    cores = tuple(sorted(int(name[5:]) for name in names))
    return ("cores " if len(cores) > 1 else "core ") + core_ranges(cores)
