"""One study on several workers of one machine: a share of the cores (and a GPU) each.

``autotune run --workers N`` (CPU) or ``--gpus all|0,2,3`` splits the cores this process may use
into N equal, contiguous shares, one per worker (equal: trials of different workers are compared
with each other; cores left over stay idle), and gives worker k the k-th GPU listed. Every
worker is an ``autotune run`` process of its own on the same study (Optuna's way of running a
study in parallel, and the one many machines use too): worker 0 is the command the user started,
which starts workers 1..N-1 at once, shows the study, waits for the others and confirms. Every
worker takes part in stage 1 (each times the settings it claims first, on its own share), and
the others start their trials when worker 0 says stage 1 is measured. A worker is pinned to its
cores (``sched_setaffinity``: its DataLoader processes inherit them, so trials never
oversubscribe the host) and sees its GPU as ``cuda:0`` (``CUDA_VISIBLE_DEVICES``). Each writes
its own log; worker 0 shows every worker's trials as the study records them.
"""

from autotune.machine.scaleout._shares import (  # noqa: F401
    VISIBLE_BEFORE_ENV,
    WORKER_CORES_ENV,
    ScaleOutError,
    WorkerShare,
    apply_share,
    core_ranges,
    gpus_argument,
    plan_shares,
    refuse_cuda_workers,
    unshared_environment,
    unused_cores,
)
from autotune.machine.scaleout._workers import (  # noqa: F401
    WORKER_PARENT_ENV,
    WORKER_STORAGE_ENV,
    WorkerGone,
    Workers,
    die_with_parent,
    start_workers,
    take_share,
    wait_for_stage1,
)
