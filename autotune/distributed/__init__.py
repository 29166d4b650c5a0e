"""Distributed trials: one trial trained by several processes under torch.distributed (DDP).

A configuration with ``world_size`` N > 1 (``workload.gpus_per_trial``) is trained by N rank
processes, a ``RankPool``: started as ``supervision`` starts a worker (spawned, a pipe each)
and joined in a process group (NCCL on GPUs, gloo on a CPU) through a file store in this
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

from autotune.distributed._pool import RankPool  # noqa: F401
from autotune.distributed._rank import WorkloadSource  # noqa: F401
