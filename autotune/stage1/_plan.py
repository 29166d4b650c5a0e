"""What the speed stage measures: its cells, the settings it tries in each, and cache keys.

A *cell* is one micro-batch size at one precision (and one value of each declared learning
knob); its *settings* are values of the other ``SPEED_KNOBS``, conditional ones only where they
mean something. At most ``FULL_PRODUCT_LIMIT`` settings are all measured; more are measured in
two passes, the compute knobs with a reference pipeline, then the pipelines with the fastest
compute settings: the sum of the two groups' sizes, not their product (240 settings of
``cifar10_resnet18.yaml`` per cell become 16 + 15). Nothing here touches Optuna or torch.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.config import TrialConfig
from autotune.knobs import COMPUTE_KNOBS, DDP_KNOBS, KNOBS, PIPELINE_KNOBS, SPEED_KNOBS, as_written
from autotune.spacefile import Choice, FloatRange, IntRange, Knob, Spec, SpecError
from autotune.speed import Extras

if TYPE_CHECKING:
    from autotune.machine.hardware import Hardware

FULL_PRODUCT_LIMIT = 12  # settings per cell measured exhaustively; more: in two passes
MAX_RANGE_VALUES = 64  # an integer range of an execution knob is enumerated up to this many
METHOD_VERSION = 1  # of the measurement: a change makes earlier measurements a cache miss

Settings = tuple[tuple[str, Any], ...]  # execution knob values by name, in SPEED_KNOBS order

# seconds of one cold compile by mode, before stage 1 has measured one. Only the plan's estimate
# uses them; stage 1 charges what it measures. Measured on the first GPU (BENCHMARKS.md, an H200
# with 16 cores, torch 2.11, 2026-11-26) for the ResNet-18 training step of
# cifar10_resnet18.yaml, rounded up:
# - default: 11.5 s cold (9.8 s with channels_last);
# - reduce-overhead: 10.6 s (9.8 s): CUDA graphs add seconds, not minutes;
# - max-autotune-no-cudagraphs: still compiling after 65 s when stage 1 stopped it; published
#   figures put it at 60-150 s (ResNet-18 inference compiles in 24 s, pytorch/serve#2925; a
#   training step has a forward and a backward graph; coordinate-descent tuning took 66 s of a
#   155 s compile in pytorch/pytorch#172819): 150 s kept until one is measured to the end;
# - max-autotune: as the mode without CUDA graphs, plus their few seconds.
COMPILE_SECONDS_GUESS = {
    "default": 15.0,
    "reduce-overhead": 15.0,
    "max-autotune-no-cudagraphs": 150.0,
    "max-autotune": 155.0,
}
# the order in which stage 1 times the precisions on a GPU: its tensor cores run the half
# precisions fastest (on the H100 a ResNet-18 at batch 1024: fp16 69k samples/s, bf16 56k,
# TF32 and fp32 34k), so the budget goes first where the answer most likely is, and the
# groups it cannot reach get one eager setting a cell; on a CPU, the space's own order
GPU_PRECISION_ORDER = ("fp16", "bf16", "tf32", "fp32", "fp32-strict")
MEASUREMENT_OVERHEAD_SECONDS = 0.5  # a measurement's model, loader, warm-up and calibration
REMATCHED_LEADERS = 2  # leaders measured again per cell and round, as the estimate counts


@dataclass(frozen=True)
class StageEstimate:
    """What stage 1 will time, said before it starts: counts, and seconds from guesses."""

    cells: int
    measurements: int  # first-round settings and rematches, over every cell
    graphs: int  # distinct compiled graphs: cold compiles when every compile mode pays back
    graphs_first_cells: int  # cold compiles when the first cell drops every compile mode
    low_seconds: float  # every compile mode dropped after the first cell that times it
    high_seconds: float  # none dropped


@dataclass(frozen=True)
class Cell:
    """One micro-batch size at one precision (and declared learning knob values)."""

    batch_size: int
    precision: str
    extras: Extras = ()
    world_size: int = 1  # processes of a distributed trial, each batch_size per micro-batch

    @property
    def distributed(self) -> bool:
        """Whether the cell is timed as several processes (DDP's settings then apply)."""
        return self.world_size > 1

    def label(self) -> str:
        extra = "".join(f", {name} {as_written(value)}" for name, value in self.extras)
        return f"batch {self.batch_size}, {self.precision}{extra}"


def describe(settings: Settings) -> str:
    """Settings in a few words: "dataloader, 2 workers, pinned, compile default"."""
    values = dict(settings)
    if values.get("data_pipeline") == "device":
        words = ["device pipeline"]
    else:
        workers = values.get("num_workers", 0)
        words = [f"{workers} worker{'s' * (workers != 1)}" if workers else "no workers"]
        if workers:
            words.append(f"prefetch {values.get('prefetch_factor')}")
            if values.get("persistent_workers"):
                words.append("persistent")
        if values.get("pin_memory"):
            words.append("pinned")
    if values.get("compile", "none") != "none":
        words.append(f"compile {values['compile']}")
    if values.get("channels_last"):
        words.append("channels_last")
    if values.get("cudnn_benchmark"):
        words.append("cudnn.benchmark")
    return ", ".join(words)


def _values(name: str, knob: Knob) -> tuple[Any, ...]:
    """Every value of an execution knob's space entry, in order."""
    if isinstance(knob, Choice):
        return knob.values
    if isinstance(knob, IntRange):
        count = (knob.high - knob.low) // knob.step + 1
        if count > MAX_RANGE_VALUES:
            raise SpecError(
                [
                    f"space.{name}: the speed stage tries every value of an execution knob; "
                    f"{knob.low}..{knob.high} has {count} (list the ones worth trying)"
                ]
            )
        return tuple(range(knob.low, knob.high + 1, knob.step))
    assert isinstance(knob, FloatRange)
    raise SpecError([f"space.{name}: an execution knob takes a list of values, not a range"])


class SpeedPlan:
    """The cells and settings the speed stage of ``spec`` (restricted to the machine) tries."""

    def __init__(
        self, spec: Spec, base: TrialConfig, checklist: Mapping[str, Any] | None = None
    ) -> None:
        self.spec = spec
        self.base = base  # the untuned configuration: every knob stage 1 does not set
        # the tuning checklist's rules (``references.checklist_rules``): what a cell's
        # reference setting, the one it is timed with first, takes where the space offers it
        self.checklist = dict(checklist or {})
        space = spec.space
        self.values = {name: _values(name, getattr(space, name)) for name in SPEED_KNOBS}
        self.values["precision"] = _values("precision", space.precision)
        self.declared = tuple(
            name for name in SPEED_KNOBS if name in spec.study.learning_knobs
        )  # fixed within a cell, sampled by stage 2
        self.batch_sizes = tuple(sorted(set(_values("batch_size", space.batch_size))))
        self.accumulations = tuple(
            sorted(set(_values("accumulation_steps", space.accumulation_steps)))
        )

    @classmethod
    def for_hardware(cls, spec: Spec, hardware: Hardware) -> SpeedPlan:
        """The plan of ``spec``'s stage 1 on ``hardware``: the untuned baseline's values of
        the knobs it does not time, the tuning checklist's reference settings (imports torch)."""
        from autotune.search.references import checklist_rules, untuned_config

        return cls(spec, untuned_config(spec, hardware), checklist_rules(hardware))

    # -- cells ---------------------------------------------------------------------------------

    def groups(self) -> Iterator[tuple[str, Extras]]:
        """(precision, declared knob values) of every group of cells, in a stable order: the
        space's, but on a GPU the half precisions first (``GPU_PRECISION_ORDER``)."""
        declared = [self.values[name] for name in self.declared]
        precisions = list(self.values["precision"])
        if self.base.device.startswith("cuda"):
            order = (*GPU_PRECISION_ORDER, *precisions)  # a value it does not name: last
            precisions.sort(key=order.index)
        for precision in precisions:
            for combination in itertools.product(*declared):
                yield precision, tuple(zip(self.declared, combination, strict=True))

    def cells(self) -> Iterator[Cell]:
        """Every cell; within a group, micro-batch sizes ascending (memory walls grow)."""
        for precision, extras in self.groups():
            for batch_size in self.batch_sizes:
                yield Cell(batch_size, precision, extras, self.base.world_size)

    def predicted(self) -> list[Cell]:
        """Every cell, those predicted fastest first: the checklist's precision (on a GPU
        both half precisions: tensor cores) before the others, and within them the largest
        micro-batches first (a larger batch spreads each step's launches and optimizer step
        over more samples: the tuning guide's "increase the batch size")."""
        groups = list(dict.fromkeys((c.precision, c.extras) for c in self.cells()))
        fast = {self.checklist.get("precision")}
        if self.base.device.startswith("cuda"):
            fast |= set(GPU_PRECISION_ORDER[:2])

        def rank(cell: Cell) -> tuple[int, int, int]:
            group = groups.index((cell.precision, cell.extras))
            return 0 if cell.precision in fast else 1 + group, -cell.batch_size, group

        return sorted(self.cells(), key=rank)

    # -- settings -------------------------------------------------------------------------------

    def _product(self, cell: Cell, names: tuple[str, ...]) -> list[dict[str, Any]]:
        """Every combination of the values of ``names`` the space offers (a cell's own where
        it fixes one), each knob's only where it means something (the registry's
        ``only_when``), the first knob's values outermost."""
        fixed = dict(cell.extras)
        found: list[dict[str, Any]] = [{"world": self.base.world_size}]
        for name in names:
            info = KNOBS[name]
            found = [
                {**setting, name: value}
                for setting in found
                for value in (
                    [fixed[name]]
                    if name in fixed
                    else self.values[name]
                    if info.applies(setting)
                    else [info.value_off()]
                )
            ]
        return [{k: v for k, v in setting.items() if k != "world"} for setting in found]

    def pipeline_settings(self, cell: Cell) -> list[dict[str, Any]]:
        """Every pipeline setting (data_pipeline and the loader knobs) of ``cell``."""
        return self._product(cell, PIPELINE_KNOBS)

    def compute_settings(self, cell: Cell) -> list[dict[str, Any]]:
        """Every compute setting (compile, channels_last, cudnn_benchmark) of ``cell``."""
        found = self._product(cell, COMPUTE_KNOBS)
        # cudnn_benchmark off, then on: a worker switches value only in a fresh process (its
        # cuDNN plans are its own: trainer.cudnn_plans_differ), so once a cell, not every other;
        # eager first (its speed bounds what a compile may cost), then the compile modes from
        # the quickest to compile, so that a budget that runs out has timed the cheap ones
        return sorted(
            found,
            key=lambda setting: (
                bool(setting["cudnn_benchmark"]),
                COMPILE_SECONDS_GUESS.get(setting["compile"], 0.0),
            ),
        )

    def exhaustive(self, cell: Cell) -> bool:
        """Whether ``cell``'s settings are few enough to measure every one."""
        size = len(self.pipeline_settings(cell)) * len(self.compute_settings(cell))
        return size <= FULL_PRODUCT_LIMIT

    def reference_pipeline(self, cell: Cell) -> dict[str, Any]:
        """The pipeline that keeps the model best fed, for timing the compute knobs: the data
        on the device when offered, else the most workers, persistent and pinned if offered."""

        def feeding(setting: dict[str, Any]) -> tuple[Any, ...]:
            return (
                setting["data_pipeline"] == "device",
                setting["num_workers"],
                setting["persistent_workers"],
                setting["pin_memory"],
                setting["prefetch_factor"] or 0,
            )

        return max(self.pipeline_settings(cell), key=feeding)

    def reference(self, cell: Cell) -> Settings:
        """The setting ``cell`` is timed with first, before any cell's others: the pipeline
        that keeps the model fed (``reference_pipeline``) and the tuning checklist's compute
        knobs where the space offers them (channels_last, cudnn.benchmark, eager), else each
        knob's first value: what the checklist predicts runs fastest without a compile."""
        fixed = dict(cell.extras)
        compute = {}
        for name in COMPUTE_KNOBS:
            offered = [fixed[name]] if name in fixed else list(self.values[name])
            wanted = self.checklist.get(name)
            compute[name] = wanted if wanted in offered else offered[0]
        return self.settings(self.reference_pipeline(cell), compute)

    def settings(self, pipeline: dict[str, Any], compute: dict[str, Any]) -> Settings:
        merged = {**pipeline, **compute}
        return tuple((name, merged[name]) for name in SPEED_KNOBS)

    def all_settings(self, cell: Cell) -> list[Settings]:
        """Every setting of ``cell`` (the exhaustive plan)."""
        return [
            self.settings(pipeline, compute)
            for compute in self.compute_settings(cell)
            for pipeline in self.pipeline_settings(cell)
        ]

    def first_round(self, cell: Cell) -> list[Settings]:
        """The settings ``cell``'s first round times (before any is left out)."""
        if self.exhaustive(cell):
            return self.all_settings(cell)
        reference = self.reference_pipeline(cell)
        computes = self.compute_settings(cell)
        compute = [self.settings(reference, c) for c in computes]
        # the pipelines with the fastest compute setting: one of the above, for counting
        return compute + [self.settings(p, computes[0]) for p in self.pipeline_settings(cell)]

    def estimate(self, burst_seconds: float, bursts: int, repeats: int) -> StageEstimate:
        """How much the stage will time, and about how long that takes (from
        ``COMPILE_SECONDS_GUESS`` and ``MEASUREMENT_OVERHEAD_SECONDS``)."""
        cells = list(self.cells())
        measurements = 0
        graphs: set[tuple[Any, ...]] = set()
        first_cells: dict[str, tuple[Any, ...]] = {}  # compile mode -> its first graph's cell
        first_graphs: set[tuple[Any, ...]] = set()
        for cell in cells:
            settings = self.first_round(cell)
            measurements += len(settings) + (repeats - 1) * min(REMATCHED_LEADERS, len(settings))
            for values in map(dict, settings):
                mode = values.get("compile", "none")
                if mode == "none":
                    continue
                graph = (cell, mode, values.get("channels_last"), *dict(cell.extras).items())
                graphs.add(graph)
                if first_cells.setdefault(mode, graph[:1]) == graph[:1]:
                    first_graphs.add(graph)
        per_measurement = MEASUREMENT_OVERHEAD_SECONDS + bursts * burst_seconds

        def compiles(found: set[tuple[Any, ...]]) -> float:
            return sum(COMPILE_SECONDS_GUESS.get(graph[1], 60.0) for graph in found)

        timing = measurements * per_measurement
        return StageEstimate(
            cells=len(cells),
            measurements=measurements,
            graphs=len(graphs),
            graphs_first_cells=len(first_graphs),
            low_seconds=timing + compiles(first_graphs),
            high_seconds=timing + compiles(graphs),
        )

    def config(self, cell: Cell, settings: Settings) -> TrialConfig:
        """The configuration that times ``settings`` in ``cell``."""
        return self.base.replace(
            batch_size=cell.batch_size,
            accumulation_steps=1,
            precision=cell.precision,
            **dict(settings),
        )


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def config_key(context: str, config: TrialConfig) -> str:
    """The cache key of timing ``config`` in ``context`` (machine, model, data, code): what a
    measurement depends on, and nothing it does not (learning rate, schedule, epochs)."""
    fields = ("batch_size", "precision", "optimizer", "device", *SPEED_KNOBS)
    values = {name: getattr(config, name) for name in fields}
    values["momentum"] = config.momentum is not None  # a momentum buffer costs a step
    if config.distributed:  # several processes; one process keeps the keys it always had
        values["world_size"] = config.world_size
    else:
        for name in DDP_KNOBS:
            del values[name]
    return _digest({"method": METHOD_VERSION, "context": context, "config": values})


def context_key(facts: dict[str, Any]) -> str:
    """A short hash of what every measurement of a study depends on."""
    return _digest({"method": METHOD_VERSION, **facts})
