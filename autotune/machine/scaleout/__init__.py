"""One study on several workers of one machine: a share of the cores (and a GPU) each.

``autotune run --workers N`` (CPU) or ``--gpus all|0,2,3`` splits the cores this process may use
into N equal, contiguous shares (equal: trials of different workers are compared with each
other), and gives worker k the k-th GPU listed. Every worker is an ``autotune run`` process of
its own on the same study, pinned to its cores (its DataLoader processes inherit them) and
seeing its GPU as ``cuda:0``: worker 0, the command the user started, starts the others, which
take part in stage 1 and start their trials when worker 0 says stage 1 is measured."""

from autotune.machine.scaleout._shares import (  # noqa: F401
    WorkerShare,
    core_ranges,
    refuse_cuda_workers,
    unused_cores,
)
from autotune.machine.scaleout._workers import (  # noqa: F401
    WORKER_STORAGE_ENV,
    WorkerGone,
    Workers,
    die_with_parent,
    start_workers,
    take_share,
    wait_for_stage1,
)
