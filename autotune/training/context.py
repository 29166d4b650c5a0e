"""The context one training run executes in (``guarded``: device, backend flags, a cold
compiler, intra-op threads, others' load meanwhile), and its memory peak and compile work. A
trial and a stage-1 burst both run in it: they measure the same way and fail the same way."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import resource
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch

from autotune.config import TrialConfig
from autotune.errors import ReportFailed
from autotune.faults import as_fault
from autotune.knobs import GRAPH_KNOBS
from autotune.machine.interference import CpuMeter, trial_threads
from autotune.results import TrialResult
from autotune.speed import SpeedMeasurement
from autotune.training.trainer import backend_flags


def compiled_graphs() -> int:
    counters = getattr(torch._dynamo.utils, "counters", {})
    return int(counters.get("stats", {}).get("unique_graphs", 0))


def compile_seconds() -> float:
    """Seconds torch.compile has spent compiling in this process: the forward graphs and the
    backward ones (compiled at the first ``backward()``); CUDA-graph recording is warm-up."""
    metrics = getattr(torch._dynamo.utils, "compilation_time_metrics", {})
    return float(
        sum(metrics.get("_compile.compile_inner", ()))
        + sum(metrics.get("backward._backward_impl", ()))
    )


# what the compiled graph of a training step depends on (the registry's graph knobs): the shapes,
# dtypes and layout its inputs have, its mode, and the processes DDP splits it for; not the
# pipeline that feeds it, cuDNN's algorithm choice, the learning rate or the seed
GRAPH_FIELDS = (*GRAPH_KNOBS, "device", "world_size")


def graph_key(config: TrialConfig) -> str:
    """Which compiled graph ``config`` trains with: the same key, the same graph."""
    return json.dumps({name: getattr(config, name) for name in GRAPH_FIELDS}, sort_keys=True)


@dataclass
class CompiledGraph:
    """The compiled graph of one run: whether it reuses a graph kept in this process (``warm``)
    and whether the run failed (then it is not kept)."""

    warm: bool = False
    failed: bool = False


class _Kept:
    """Stage 1's live compiled graph in this process: its key (graph and intra-op threads), the
    stage it was compiled for and its Inductor caches' directory."""

    key: str | None = None
    stage: str = ""
    directory: str = ""

    @classmethod
    def drop(cls) -> None:
        """Forget the kept graph: its Dynamo state and its caches."""
        if cls.key is not None:
            torch.compiler.reset()
            cls.key = None
        if cls.directory:
            shutil.rmtree(cls.directory, ignore_errors=True)
            cls.directory = ""


atexit.register(_Kept.drop)


def _inductor_cache(directory: str) -> contextlib.AbstractContextManager:
    """Inductor's on-disk caches pointed at ``directory`` while the block runs."""
    from torch._inductor import utils as inductor_utils

    # fresh_cache since torch 2.8; fresh_inductor_cache, its old name, is kept as an alias
    fresh_cache = getattr(inductor_utils, "fresh_cache", None)
    return (fresh_cache or inductor_utils.fresh_inductor_cache)(dir=directory, delete=False)


@contextlib.contextmanager
def cold_compiler(prefix: str) -> Iterator[None]:
    """Dynamo reset and Inductor's on-disk caches (FX graphs, AOTAutograd, autotuning, kernels)
    in a fresh directory while the block runs; both dropped afterwards (compiled graphs and
    CUDA-graph memory pools included), also when it fails or is interrupted."""
    scratch = tempfile.mkdtemp(prefix=prefix)
    torch.compiler.reset()
    try:
        with _inductor_cache(scratch):
            yield
    finally:
        torch.compiler.reset()
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def compile_state(config: TrialConfig, threads: int, keep: str = "") -> Iterator[CompiledGraph]:
    """For a compiled trial, a cold compiler (``cold_compiler``), so the compile time a trial
    pays does not depend on which trials or studies ran before it.

    ``keep`` (stage 1, its id): a graph is kept, live, for the runs of that stage that follow
    it in this process at the same intra-op ``threads`` (another pipeline, cudnn_benchmark, a
    rematch): they reuse it (``CompiledGraph.warm``), their one-time cost charged from its cold
    compile. Any other run drops it: another graph (one live graph bounds the memory held), a
    run without ``keep``, a run that failed, or another thread count, on which Dynamo's
    guards compile the graph again (cold, as a trial would at that count: Inductor's caches
    are fresh at every entry, so only the live Dynamo state makes a run warm)."""
    graph = CompiledGraph()
    if keep != _Kept.stage:  # another stage, or a trial: nothing kept helps it or holds memory
        _Kept.drop()
        _Kept.stage = keep
    if config.compile == "none":
        yield graph
        return
    if keep:
        key = json.dumps([graph_key(config), threads])
        graph.warm = _Kept.key == key
        if not graph.warm:
            _Kept.drop()
            torch.compiler.reset()  # cold, whatever this process compiled before
            _Kept.directory = tempfile.mkdtemp(prefix="autotune-graph-")
        try:
            with _inductor_cache(_Kept.directory):
                yield graph
        finally:
            if graph.failed:
                _Kept.drop()
            else:
                _Kept.key = key
        return
    with cold_compiler("autotune-compile-"):
        yield graph


def reset_peak_memory(device: torch.device) -> None:
    """Start this trial's peak-memory reading (a CPU's: the resident-set high-water mark)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # VmHWM := current RSS


def peak_memory_bytes(device: torch.device) -> int:
    """Bytes: max allocated on a CUDA device since the reset; on a CPU the process's peak RSS
    since the reset (since it started where /proc cannot be reset or read)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


@contextlib.contextmanager
def intra_op_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` for the block (explicit: neither a library
    default nor an earlier trial decides), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


Measured = TypeVar("Measured", TrialResult, SpeedMeasurement)


def guarded(
    config: TrialConfig, body: Callable[[CompiledGraph], Measured], keep_compiled: str = ""
) -> Measured:
    """Run ``body`` (training under ``config``, given its compiled graph) in its context
    (``keep_compiled``: stage 1's kept graph, ``compile_state``): what it measured, with the
    intra-op threads it ran on and others' share of its cores meanwhile; every failure raised
    as a TrialFault (kind, one line, and the traceback as ``details`` for unexpected errors)."""
    device = torch.device(config.device)
    threads = trial_threads()  # before compile_state: a graph is kept per thread count
    with (
        # the current CUDA device: streams, events and caches follow it
        torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext(),
        backend_flags(config),
        compile_state(config, threads, keep_compiled) as graph,
        intra_op_threads(threads),
        warnings.catch_warnings(),
    ):
        # GradScaler skips the optimizer step when fp16 gradients overflow; the scheduler
        # stepping anyway is intended (the schedule follows steps attempted).
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        try:
            with CpuMeter() as meter:  # what else ran on these cores meanwhile
                value = body(graph)
            share = meter.share.other_share if meter.share is not None else None
            return dataclasses.replace(value, intra_op_threads=threads, other_cpu_share=share)
        except BaseException as error:
            graph.failed = True  # a graph that failed (or was interrupted) is not kept
            if not isinstance(error, Exception) or isinstance(error, ReportFailed):
                raise  # an interruption, or the study's own fault: not the configuration's
            fault = as_fault(error)
            fault.__traceback__ = None
    # Raised here, outside the except block, the fault carries no traceback of the run's
    # frames. Those hold the DataLoader iterator: alive, its workers would stay watched by
    # torch's SIGCHLD handler, which raises later, anywhere in this process, when one dies.
    raise fault
