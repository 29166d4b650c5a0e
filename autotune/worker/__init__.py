"""Trials in a supervised worker process.

A long-lived worker process loads the workload once and trains trial after trial, so a short
trial does not pay a torch import each time. It streams every evaluation to the study process,
which answers whether to stop (the pruner runs there, next to the storage). When the worker
crashes, hangs past the trial timeout, or its CUDA context breaks, the study process kills its
whole process group (DataLoader workers included), records the trial and starts a fresh worker;
GPU memory is released between such trials by construction.

Only ``_protocol``'s frozen messages, pickled, cross the pipe. Its modules: ARCHITECTURE.md.
"""

from autotune.worker._supervisor import WorkerExecutor, remove_orphaned_scratch  # noqa: F401
