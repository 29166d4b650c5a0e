"""What each worker of a study on one machine may use: its cores and its GPU(s)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from autotune.errors import UserError
from autotune.machine.interference import own_cores

# the cores the shares were made of: a worker starts pinned to worker 0's share and widens
WORKER_CORES_ENV = "AUTOTUNE_WORKER_CORES"
# CUDA_VISIBLE_DEVICES as worker 0 was given it ("" when unset), kept when its share replaces
# it: the workers it starts see those GPUs again and plan their shares from them
VISIBLE_BEFORE_ENV = "AUTOTUNE_VISIBLE_BEFORE_SHARE"


class ScaleOutError(UserError):
    """A --workers or --gpus request this machine cannot meet (a user error)."""


@dataclass(frozen=True)
class WorkerShare:
    """What worker ``index`` of ``count`` may use."""

    index: int  # 0 is the command the user started
    count: int
    cores: tuple[int, ...]  # CPU cores it is pinned to
    # the GPU it sees as cuda:0 (an index or UUID), or the comma-separated GPUs it sees as
    # cuda:0, cuda:1, ... (a trial of several processes, one per GPU); None on the CPU
    gpu: str | None

    def describe(self) -> str:
        """``worker 2 of 4: cores 4-5, GPU 2`` (``GPUs 2,3`` for a trial of two)."""
        cores = core_ranges(self.cores)
        several = self.gpu is not None and "," in self.gpu
        gpu = f", GPU{'s' if several else ''} {self.gpu}" if self.gpu is not None else ""
        size = _plural(len(self.cores), "core")
        return f"worker {self.index + 1} of {self.count}: {size} {cores}{gpu}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def core_ranges(cores: tuple[int, ...]) -> str:
    """``0-3,8`` for cores 0, 1, 2, 3 and 8."""
    parts: list[str] = []
    start = previous = cores[0]
    for core in (*cores[1:], None):
        if core is not None and core == previous + 1:
            previous = core
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if core is not None:
            start = previous = core
    return ",".join(parts)


def _available_cores() -> tuple[int, ...]:
    given = os.environ.get(WORKER_CORES_ENV)
    if given:  # a worker started by worker 0: the cores worker 0 divided
        return tuple(sorted(int(core) for core in given.split(",")))
    return own_cores()


def _listed(text: str) -> list[str]:
    """The items of a comma-separated list, blanks left out."""
    return [item.strip() for item in text.split(",") if item.strip()]


def _gpus(spec: str, gpu_names: Callable[[list[str] | None], list[str]]) -> list[str]:
    """The GPUs ``spec`` names: ``all`` (every visible one) or a comma-separated list."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec == "all":
        if visible is not None:
            found = _listed(visible)
        else:  # counted in another process: CUDA does not start here before the share is set
            found = [str(i) for i in range(len(gpu_names(None)))]
        if not found:
            raise ScaleOutError("--gpus all: this machine has no CUDA GPU autotune can see")
        return found
    wanted = _listed(spec)
    if not wanted:
        raise ScaleOutError(f"--gpus {spec!r}: give 'all' or GPU indices such as 0,2,3")
    if len(set(wanted)) != len(wanted):
        raise ScaleOutError(f"--gpus {spec}: names a GPU twice")
    if visible is None:
        return wanted
    # indices count among the GPUs this process may see (a scheduler's CUDA_VISIBLE_DEVICES)
    allowed = _listed(visible)
    outside = [g for g in wanted if not g.isdigit() or int(g) >= len(allowed)]
    if outside:
        raise ScaleOutError(
            f"--gpus {spec}: this process sees {len(allowed)} GPU(s) (CUDA_VISIBLE_DEVICES="
            f"{visible}); give indices from 0 to {len(allowed) - 1}"
        )
    return [allowed[int(g)] for g in wanted]


def _gpu_groups(devices: list[str], per_trial: int, spec: str) -> list[str]:
    """``devices`` in groups of ``per_trial``, comma-separated (GPUs left over idle)."""
    count = len(devices) // per_trial
    if count == 0:
        raise ScaleOutError(
            f"--gpus {spec}: {_plural(len(devices), 'GPU')}, and workload.gpus_per_trial asks "
            f"for {per_trial} per trial"
        )
    return [",".join(devices[k * per_trial : (k + 1) * per_trial]) for k in range(count)]


def one_gpu_model(devices: list[str], names: list[str]) -> None:
    """Refuse GPUs of different models (``names``, one per device): a study compares trials
    timed on one model, and stage 1's measurements hold for the model they were taken on."""
    models = sorted(set(names))
    if len(models) <= 1:
        return
    found = "; ".join(
        f"{model}: GPU {','.join(d for d, n in zip(devices, names, strict=True) if n == model)}"
        for model in models
    )
    raise ScaleOutError(
        f"--gpus: these GPUs are of {len(models)} models ({found}); a study compares trials "
        f"timed on one model, so run one study per model, naming its GPUs with --gpus"
    )


GPU_QUERY_SECONDS = 120.0  # for a child process to start torch and name the GPUs


def _gpu_names(devices: list[str] | None) -> list[str]:
    """The model name of each of ``devices`` (None: every GPU visible), asked of torch in a
    process of its own: in this one CUDA would start, and a share could no longer apply."""
    query = (
        "import torch\n"
        "for index in range(torch.cuda.device_count()):\n"
        "    print(torch.cuda.get_device_name(index))\n"
    )
    shown = {} if devices is None else {"CUDA_VISIBLE_DEVICES": ",".join(devices)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", query],
            env={**os.environ, **shown},
            capture_output=True,
            text=True,
            timeout=GPU_QUERY_SECONDS,
        )
    except subprocess.TimeoutExpired:  # a wedged driver: one line, not a traceback
        raise ScaleOutError(
            f"--gpus: cannot read the GPUs' models: torch did not answer in "
            f"{GPU_QUERY_SECONDS:.0f} s (is the driver or a GPU hung? try nvidia-smi)"
        ) from None
    names = done.stdout.splitlines()
    if done.returncode != 0 or (devices is not None and len(names) != len(devices)):
        why = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise ScaleOutError(f"--gpus: cannot read the GPUs' models: {why}")
    return names


def plan_shares(
    workers: int | None,
    gpus: str | None,
    gpus_per_trial: int = 1,
    gpu_names: Callable[[list[str] | None], list[str]] = _gpu_names,
) -> list[WorkerShare]:
    """One share per worker: ``workers`` CPU workers, or one per ``gpus_per_trial`` GPUs of
    ``gpus``, the cores divided among them in equal, contiguous blocks; ScaleOutError when they
    cannot be. ``gpu_names`` reads the GPUs' models (tests describe GPUs a machine has not)."""
    devices = _gpus(gpus, gpu_names) if gpus is not None else []
    if len(devices) > 1:
        one_gpu_model(devices, gpu_names(devices))
    groups = _gpu_groups(devices, gpus_per_trial, str(gpus)) if devices else []
    if groups and workers is not None and workers != len(groups):
        raise ScaleOutError(
            f"--workers {workers} and --gpus {gpus} disagree: a GPU study runs one worker per "
            f"{'GPU' if gpus_per_trial == 1 else f'{gpus_per_trial} GPUs'} ({len(groups)}); "
            f"leave --workers out"
        )
    devices = groups
    count = len(devices) or workers or 1
    cores = _available_cores()
    if count > len(cores):
        raise ScaleOutError(
            f"{count} workers need a core each at least; this process may use "
            f"{_plural(len(cores), 'core')} ({core_ranges(cores)})"
        )
    per = len(cores) // count  # equal shares: trials of different workers compare
    return [
        WorkerShare(
            index,
            count,
            cores[index * per : (index + 1) * per],
            devices[index] if devices else None,
        )
        for index in range(count)
    ]


def unused_cores(shares: list[WorkerShare]) -> tuple[int, ...]:
    """The cores no share got (the shares are equal; the rest stays idle)."""
    used = {core for share in shares for core in share.cores}
    return tuple(core for core in _available_cores() if core not in used)


def refuse_cuda_workers(device: str) -> None:
    """ScaleOutError where the study trains on a GPU (``device``: workload.device): --workers
    runs its workers on the CPU."""
    if device == "auto":
        from autotune.machine.hardware import detect

        device = detect(device).device
    if device.startswith("cuda"):
        raise ScaleOutError(
            f"--workers runs workers on the CPU, and this study trains on "
            f"{'cuda:0' if device == 'cuda' else device}: use --gpus (a worker per GPU), or "
            f"--device cpu"
        )


def apply_share(share: WorkerShare) -> None:
    """Pin this process to ``share``'s cores and GPU(s); before torch initialises CUDA."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, share.cores)
    if share.gpu is not None:
        os.environ.setdefault(VISIBLE_BEFORE_ENV, os.environ.get("CUDA_VISIBLE_DEVICES", ""))
        os.environ["CUDA_VISIBLE_DEVICES"] = share.gpu


def unshared_environment(environment: dict[str, str]) -> dict[str, str]:
    """``environment`` with CUDA_VISIBLE_DEVICES as worker 0 was given it, before its share."""
    environment = dict(environment)
    before = environment.pop(VISIBLE_BEFORE_ENV, None)
    if before is not None:
        if before:
            environment["CUDA_VISIBLE_DEVICES"] = before
        else:
            environment.pop("CUDA_VISIBLE_DEVICES", None)
    return environment


def gpus_argument(shares: list[WorkerShare]) -> str:
    """The shares' GPUs as ``--gpus`` names them to a worker that sees what worker 0 was given:
    their indices among CUDA_VISIBLE_DEVICES when it was set, else as they are."""
    devices = [device for share in shares if share.gpu for device in _listed(share.gpu)]
    before = os.environ.get(VISIBLE_BEFORE_ENV, os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    if not before:
        return ",".join(devices)
    allowed = _listed(before)
    return ",".join(str(allowed.index(device)) for device in devices)
