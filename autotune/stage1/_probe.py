"""``batch_size: auto``: the micro-batches a study searches, found once before stage 1 by
doubling from the baseline's batch (Lightning's ``scale_batch_size``) until one runs out of
memory (a killed worker on a CPU counts), gains under ``MIN_GAIN`` samples/s over the last, or
passes the training set; after a memory wall, halfway to it and halfway again (its "binsearch"
mode: on a GPU the largest batch that fits is often the fastest). Each size is timed as stage 1
times a cell first: the tuning checklist's precision and reference setting
(``SpeedPlan.reference``), claimed, timed and stored by ``_take``, so stage 1 reuses it and the
processes of a study time it once; under DDP, each process's micro-batch. The list and its line
are kept in the ``StudyRecord``: every process, resume and ``--remeasure`` of the study reads the
same list (Optuna refuses a changed distribution).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from autotune.faults import FaultKind
from autotune.spacefile import Spec
from autotune.stage1._budget import MIN_LIMIT_SECONDS
from autotune.stage1._plan import Cell
from autotune.stage1._stage import Stage
from autotune.stage1._take import SettingTimer, StageInputs
from autotune.storage._liveness import study_lock
from autotune.storage._records import StudyRecord

MIN_GAIN = 0.10  # a doubling that adds less samples/s than this does not pay: the probe stops
TRIES = 3  # measurements of a size the machine's load stopped or spoiled, before it gives up
_WALLS = (FaultKind.OOM.value, FaultKind.KILLED.value, FaultKind.WORKER_CRASHED.value)

WAITING = "waiting for another autotune process of this study, which probes batch_size: auto"

# a micro-batch's samples/s, or why it has none: (fault kind, message)
Speed = float | tuple[str, str]


def doubled(
    start: int,
    limit: int | None,
    speed_of: Callable[[int], Speed],
    again: Callable[[int], Speed] | None = None,
    per: str = "",
) -> tuple[list[int], str]:
    """The micro-batches from ``start``, doubling while each runs and gains (``_tried``), at
    most ``limit`` (the training set's samples, ``per`` process of a distributed trial); after a
    memory wall, the sizes between the last that ran and the wall (``_bisected``); and the one
    line that says what stopped it: "batch_size auto: 32 to 768 (1024 ran out of memory; 896
    too)"."""
    sizes: list[int] = []
    last: float | None = None
    batch = start
    while limit is None or batch <= limit:
        tried = _tried(batch, sizes, last, speed_of, again)
        if not isinstance(tried, float):
            wall, why = tried
            if wall and sizes:
                why += _bisected(sizes, batch, speed_of, again, last)
            break
        sizes.append(batch)
        last, batch = tried, 2 * batch
    else:
        why = f"{batch} is more than the {limit} training samples{per}"
    found = f"{sizes[0]} to {sizes[-1]}" if len(sizes) > 1 else str(sizes[0] if sizes else start)
    return sizes or [start], f"batch_size auto: {found} ({why})"


def _tried(
    batch: int,
    sizes: list[int],
    last: float | None,
    speed_of: Callable[[int], Speed],
    again: Callable[[int], Speed] | None,
) -> float | tuple[bool, str]:
    """``batch``'s samples/s where it runs and gains over ``last`` (the samples/s of
    ``sizes[-1]``, the last size kept) ``MIN_GAIN`` per doubling (a bisected size a share of it:
    1.5 times the batch needs 5.7%); else (whether it ran out of memory, why not). A size
    that seems to gain less is decided on ``again``'s figures for both sizes (one measurement
    more each, pooled): one measurement cannot tell a 10% gain from a noisy machine's spread."""
    speed = speed_of(batch)
    needed = (batch / sizes[-1]) ** math.log2(1 + MIN_GAIN) if sizes else 1.0
    if isinstance(speed, tuple):
        kind, message = speed
        wall = kind in _WALLS
        return wall, f"{batch} ran out of memory" if wall else f"{batch} failed: {message}"
    if last is not None and speed < last * needed and again is not None:
        before, now = again(sizes[-1]), again(batch)
        if not isinstance(before, tuple) and not isinstance(now, tuple):
            last, speed = before, now
    if last is None or speed >= last * needed:
        return float(speed)
    gain = speed / last - 1
    return False, f"{batch} gained {gain:.0%}" if gain >= 0 else f"{batch} ran {-gain:.0%} slower"


def _bisected(
    sizes: list[int],
    wall: int,
    speed_of: Callable[[int], Speed],
    again: Callable[[int], Speed] | None,
    last: float | None,
) -> str:
    """After a memory wall at ``wall`` (Lightning's "binsearch" mode): the size halfway between
    the last that ran and the wall, in multiples of 8 (tensor cores), while the gap is over an
    eighth of the last that ran (about three sizes); one that runs and gains (``_tried``) is
    appended to ``sizes``, one that does not stops it. What it saw, for the probe's line."""
    walls: list[str] = []
    why = ""
    while wall - sizes[-1] > sizes[-1] // 8:
        batch = (sizes[-1] + wall) // 16 * 8  # halfway, down to a multiple of 8
        if batch <= sizes[-1]:
            break
        tried = _tried(batch, sizes, last, speed_of, again)
        if isinstance(tried, float):
            sizes.append(batch)
            last = tried
        elif tried[0]:
            walls.append(str(batch))
            wall = batch
        else:
            why = f"; {tried[1]}"
            break
    return (f"; {', '.join(walls)} too" if walls else "") + why


def _probe(timer: SettingTimer) -> tuple[list[int], str]:
    """Time the micro-batches ``doubled`` asks for in stage 1's first cell group."""
    plan, workload = timer.plan, timer.inputs.workload
    groups = list(plan.groups())
    wanted = plan.checklist.get("precision")
    precision, extras = next((g for g in groups if g[0] == wanted), groups[0])
    world = plan.base.world_size

    def speed_of(batch: int, again: bool = False) -> Speed:
        cell = Cell(batch, precision, extras, world)
        settings = plan.reference(cell)
        pool = timer.pool(cell, settings)
        count = len(pool.results) + 1 if again else 1
        busy = False
        # a measurement the machine's load stopped (it says nothing of the size) is taken again,
        # one taken while others had the cores once more (a busy figure would skew the gain)
        for _ in range(TRIES):
            # the probe always finishes (the space needs its list), past stage 1's budget too,
            # each measurement as long as a busy machine's may take (``Budget.eager_limit``):
            # a distributed trial's processes start again after a memory wall
            timer.rules.deadline = time.monotonic() + max(timer.rules.budget, MIN_LIMIT_SECONDS)
            timer.measure(cell, settings, count)
            pool = timer.pool(cell, settings)
            if pool.fault is not None:
                break
            if len(pool.results) >= count:
                if busy or not pool.flagged_only():
                    break
                count, busy = count + 1, True
        best = pool.combined()
        if best is None:
            return pool.fault or (FaultKind.INTERRUPTED.value, f"stopped in each of {TRIES} tries")
        return best.samples_per_second()

    # under DDP each process trains its share of the training set, batch_size at a time
    limit = len(workload.train_set) // world if workload is not None else None  # type: ignore[arg-type]
    start = int(plan.batch_sizes[0])
    per = " per process" if world > 1 else ""
    return doubled(start, limit, speed_of, lambda batch: speed_of(batch, again=True), per)


def resolve_batch_sizes(
    inputs: StageInputs, on_wait: Callable[[str], None] = lambda line: None
) -> tuple[Spec, str]:
    """The spec with ``batch_size: auto`` resolved, and the probe's line: the study's stored
    list, else the probe's (run once, under the study's lock, and stored). ``on_wait`` hears
    that another process of the study probes it meanwhile (``WAITING``)."""
    study = inputs.study
    record = StudyRecord.of(study)
    if record.batch_sizes is None:
        with study_lock(study, "batch_size", lambda: on_wait(WAITING), held_long=True):
            record = StudyRecord.of(study)  # another process may have probed meanwhile
            if record.batch_sizes is None:
                sizes, line = _probe(Stage(inputs))
                record = StudyRecord(batch_sizes=sizes, batch_size_auto=line)
                record.store(study)
    found = tuple(int(size) for size in record.batch_sizes or ())
    return inputs.spec.with_batch_sizes(found), record.batch_size_auto or ""
