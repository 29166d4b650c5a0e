"""Processes of one machine take turns on what a trial trains with.

Two ``autotune run`` commands on one machine (many processes on one study, as the README's
SLURM and Kubernetes examples start them; or two studies side by side) would otherwise train at
the same moment on the same cores or GPU. Each trial's samples/s then falls by whatever the
other takes (two quickstarts together trained at 130 samples/s against 7k alone), and trials
measured so compare nothing. So a trial, a stage-1 measurement and a confirmation run each hold
the machine's turn on their resources while they run: on the CPU the cores this process may
use, on a GPU the GPU(s) it trains on. Processes whose resources do not overlap (the workers of
``--workers`` and ``--gpus``, pinned to their own shares) never wait for each other.

A turn is an exclusive ``flock`` per resource on ``/tmp/autotune-turn-NAME.lock`` (the folder
is ``$AUTOTUNE_MACHINE_DIR`` where that is set: containers of one host that share a folder
other than /tmp), taken in
sorted order, so two processes that want overlapping resources cannot each hold part of them.
The holder's process id is written into each file it holds, so a process that waits can say
for whom. A file that cannot be opened (another user's, a read-only /tmp) is not waited for.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from autotune.scaleout import core_ranges

__all__ = ["MACHINE_DIR", "MACHINE_DIR_ENV", "file_lock", "resources", "turn"]

MACHINE_DIR_ENV = "AUTOTUNE_MACHINE_DIR"


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
    """What a trial on ``device`` (``cpu``, ``cuda:N``) with ``world_size`` processes trains
    with, named machine-wide: ``gpu-ID`` for each of its GPUs (their entries in
    CUDA_VISIBLE_DEVICES where it is set, an index or a UUID), else ``core-N`` for each core this
    process may use (the ranks of a distributed CPU trial share them)."""
    if device.startswith("cuda"):
        first = int(device.partition(":")[2] or 0)
        visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
        visible = [d for d in visible if d]
        names = []
        for index in range(first, first + world_size):
            name = visible[index] if index < len(visible) else str(index)
            names.append("gpu-" + re.sub(r"[^A-Za-z0-9_.-]", "_", name))
        return tuple(sorted(names))
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: every core
        cores = list(range(os.cpu_count() or 1))
    return tuple(f"core-{core}" for core in cores)


@contextlib.contextmanager
def file_lock(path: Path, on_wait: Callable[[int | None], None] | None = None) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (made if missing) while held, with this process's id
    written into it; none where the file cannot be opened. Where another process holds it,
    ``on_wait`` is called with that process's id (None: unknown) before waiting."""
    import fcntl

    try:
        handle = open(path, "a+")  # noqa: SIM115
    except OSError:
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait(_holder(handle))
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            with contextlib.suppress(OSError):
                handle.truncate(0)
                handle.write(str(os.getpid()))
                handle.flush()
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _holder(handle: object) -> int | None:
    """The process id written into a lock file, if it reads as one."""
    try:
        handle.seek(0)  # type: ignore[attr-defined]
        return int(handle.read().strip())  # type: ignore[attr-defined]
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def turn(
    device: str, world_size: int = 1, on_wait: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold this machine's turn on what a trial on ``device`` trains with (``resources``)
    while the block runs. Where another process holds part of it, ``on_wait`` is called once,
    with a line saying who and on what, before waiting."""
    names = resources(device, world_size)
    said: list[bool] = []

    def waiting(pid: int | None) -> None:
        if on_wait is not None and not said:
            said.append(True)
            who = f"autotune process {pid}" if pid is not None else "another autotune process"
            on_wait(f"waiting for its turn: {who} trains on {_describe(names)}")

    with contextlib.ExitStack() as held:
        for name in names:
            held.enter_context(file_lock(MACHINE_DIR / f"autotune-turn-{name}.lock", waiting))
        yield


def _describe(names: tuple[str, ...]) -> str:
    """``cores 0-3`` or ``GPU 1`` for a turn's resource names."""
    gpus = [name[4:] for name in names if name.startswith("gpu-")]
    if gpus:
        return ("GPUs " if len(gpus) > 1 else "GPU ") + ",".join(gpus)
    cores = tuple(sorted(int(name[5:]) for name in names))
    return ("cores " if len(cores) > 1 else "core ") + core_ranges(cores)
