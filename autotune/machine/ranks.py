"""Which process of a distributed trial this is, and what its processes agree on.

Rank 0 measures, evaluates and reports; every rank must still stop at the same step and raise
the same faults, so the few decisions a trial makes are agreed here, through torch.distributed's
collectives, only at evaluations. Outside a process group every function is the one-process
answer."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def _joined() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank in the trial's process group (0 outside one)."""
    return dist.get_rank() if _joined() else 0


def world_size() -> int:
    """Processes in the trial's process group (1 outside one)."""
    return dist.get_world_size() if _joined() else 1


def local_device(device: str) -> str:
    """This process's own GPU when ``device`` is CUDA and the process is in a group:
    ``cuda:LOCAL_RANK`` (torchrun's), else ``cuda:`` the rank modulo the GPUs it sees;
    ``device`` itself outside a group or on the CPU."""
    if not device.startswith("cuda") or not _joined():
        return device
    local = os.environ.get("LOCAL_RANK")
    index = int(local) if local is not None else rank() % max(torch.cuda.device_count(), 1)
    return f"cuda:{index}"


def rank_zero_value(value: int, device: torch.device) -> int:
    """Rank 0's ``value``, on every rank (a broadcast; the others' arguments are ignored)."""
    if not _joined():
        return value
    held = torch.tensor([value], dtype=torch.int64, device=device)
    dist.broadcast(held, src=0)
    return int(held.item())


def agree(decision: bool, device: torch.device) -> bool:
    """Rank 0's ``decision``, on every rank."""
    return bool(rank_zero_value(int(decision), device))


def sum_over_ranks(values: torch.Tensor) -> torch.Tensor:
    """``values`` summed over every rank, in place and returned (itself outside a group)."""
    if _joined():
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values
