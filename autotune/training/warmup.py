"""Pay once, before any trial's clock starts, what a fresh process pays once.

A new worker process (or the study process under ``--isolation none``) trains its first trial
cold: torch's lazy imports, the allocator growing its pools, the intra-op thread pool starting,
the first kernels of each kind loaded, pages faulted in. Inside the first trial's clock those
costs make it look slower than it is, and the first trial is usually the untuned baseline, so
every "N times faster than untuned" would be inflated by them (23% on the quickstart).

``Warmth.warm_for(config, workload)`` pays them on throwaway copies of the trial's own model and
data, eager, as the trial trains (a few steps and an evaluation batch). The first trial that
compiles also gets the compiler's machinery loaded by compiling a small unrelated network in a
throwaway cache: the trial's own graphs stay cold, so every compiled trial pays its whole
compile. A trial trains the same whether a warm-up ran before it or not: it seeds everything.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable

import torch

from autotune.config import TrialConfig
from autotune.faults import release_memory
from autotune.pipeline import make_train_loader, make_val_loader
from autotune.training.context import cold_compiler
from autotune.training.timing import synchronize
from autotune.training.trainer import Trainer, backend_flags, seed_everything
from autotune.workloads import Workload
from autotune.workloads.batches import call_model

WARMUP_MICRO_BATCHES = 3  # eager training steps that load every kernel a step uses


def warm_process(config: TrialConfig, workload: Workload) -> bool:
    """A few eager training steps and one evaluation batch, as ``config`` trains, discarded;
    False when there is no batch to train on (the trial says why)."""
    eager = config.replace(
        compile="none",  # the trial's graphs must compile cold in the trial
        accumulation_steps=1,  # every micro-batch an optimizer step: its kernels load too
        num_workers=0,  # DataLoader workers start in every trial anyway (and are charged)
        prefetch_factor=None,
        persistent_workers=False,
    )
    device = torch.device(eager.device)
    with backend_flags(eager):
        seed_everything(eager.seed)
        loader = make_train_loader(workload.train_set, eager, eager.seed, workload.collate_fn)
        if len(loader) == 0:  # a batch larger than the data set: invalid_config in the trial
            return False
        # the trial's own loss (a regression's, classes last...): cross-entropy fails on those
        trainer = Trainer(
            workload.build_model(), eager, WARMUP_MICRO_BATCHES, workload.loss_fn, workload.layout
        )
        batches = iter(loader)
        for _ in range(min(WARMUP_MICRO_BATCHES, len(loader))):
            trainer.train_step(next(batches))
        trainer.model.eval()
        with torch.no_grad(), trainer.autocast():
            val_batch = next(iter(make_val_loader(workload.val_set, eager, workload.collate_fn)))
            call_model(trainer.model, trainer.split(val_batch)[0])
        synchronize(device)
    del trainer, batches, loader
    release_memory()
    return True


def _warm_model() -> torch.nn.Module:
    """A tiny network with the layer kinds most models have (a convolution, a normalization,
    a matrix multiply), so that their lowerings and pattern passes load here, not in a trial."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 3),
    )


def warm_compiler(device: torch.device) -> None:
    """Compile and train one step of a tiny network unrelated to any trial, in a throwaway
    cache: the compiler is loaded, no trial graph is cached."""
    with cold_compiler("autotune-warm-compiler-"):
        compiled = torch.compile(_warm_model().to(device))
        inputs = torch.randn(8, 1, 6, 6, device=device)
        targets = torch.randint(0, 3, (8,), device=device)
        torch.nn.functional.cross_entropy(compiled(inputs), targets).backward()
        synchronize(device)


class Warmth:
    """What this process has warmed; ``warm_for`` warms what the next trial still needs, and
    ``log`` hears each warm-up ("process", "compiler")."""

    def __init__(self, log: Callable[[str], None] | None = None) -> None:
        self.process_warm = False
        self.compiler_warm = False
        self.frozen = False  # gc.freeze() was called: close() undoes it
        self._log = log or (lambda event: None)

    def warm_for(self, config: TrialConfig, workload: Workload) -> None:
        """Warm the process (once) and, for a compiled trial, the compiler (once)."""
        # a failure here is the trial's, raised as such; a later trial tries again
        if not self.process_warm and warm_process(config, workload):
            self.process_warm = True
            # what the process holds now (torch's modules, the workload, the data) lives as
            # long as the process: kept out of every later collection, each release of a
            # trial's memory walks only what trials made (0.25 s a trial less on a CPU)
            gc.freeze()
            self.frozen = True
            self._log("process")
        if config.compile != "none" and not self.compiler_warm:
            self.compiler_warm = True  # tried once; a compiler that cannot work fails the trial
            with contextlib.suppress(Exception):  # ... in the trial, where it is recorded
                warm_compiler(torch.device(config.device))
                self._log("compiler")

    def close(self) -> None:
        """Give the frozen objects back to the collector: a process that goes on (the study
        process, after in-process trials) collects them at exit as it would have, closing the
        storage's connections, so that SQLite folds its write-ahead log back into the file."""
        if self.frozen:
            gc.unfreeze()
            self.frozen = False
