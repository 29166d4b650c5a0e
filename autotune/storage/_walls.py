"""Memory walls: the micro-batch sizes that ran out of memory, so that the study does not pay
for the same out-of-memory twice. Trials and stage 1 keep theirs in one ``MemoryWalls``."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import optuna

from autotune.config import TrialConfig
from autotune.faults import FaultKind
from autotune.search.space import offered
from autotune.spacefile import Spec
from autotune.storage._records import TrialRecord

# what, beside the micro-batch, decides how much device memory a step takes: the precision,
# the compiled graph and its layout, the data pipeline (the device pipeline holds the whole
# training set in device memory), the optimizer's state and the ranks that share a model
_DECIDE = ("precision", "compile", "channels_last", "data_pipeline", "optimizer", "world_size")
_WallKey = tuple[Any, ...]  # the values of _DECIDE


@dataclass
class MemoryWalls:
    """The smallest micro-batch that ran out of memory at each of the settings that decide
    memory, and where it did ("trial 12", "stage 1").

    A configuration at or above a wall is not trained again: it is recorded as ``oom``
    straight away. A wall an earlier run found (``from_study``) is tried once more in this
    one: another process's memory on the device, a leak in a worker or a fragmented cache may
    have built it, and a wall that does not hold is not kept (a false wall would cut the
    space for good). It stands again when the retry runs out of memory too.
    """

    walls: dict[_WallKey, tuple[int, str]] = field(default_factory=dict)
    inherited: set[_WallKey] = field(default_factory=set)  # from earlier runs, not retried yet

    @staticmethod
    def _key(config: TrialConfig | SimpleNamespace) -> _WallKey:
        return tuple(getattr(config, name) for name in _DECIDE)

    def add(self, config: TrialConfig, where: str) -> None:
        """``config`` ran out of memory in ``where`` ("trial 12", "stage 1")."""
        key = self._key(config)
        if key not in self.walls or config.batch_size < self.walls[key][0]:
            self.walls[key] = (config.batch_size, where)

    def fits(self, config: TrialConfig) -> bool:
        """Whether ``config`` is below every wall (those of earlier runs included): what the
        tuning checklist's "largest batch that fits" asks. Unlike ``blocks``, it retries none."""
        wall = self.walls.get(self._key(config))
        return wall is None or config.batch_size < wall[0]

    def blocks(self, config: TrialConfig) -> str | None:
        """Why ``config`` would run out of memory, or None (also for the first configuration
        at a wall of an earlier run: it is tried once more, and the wall waits for it)."""
        if self.fits(config):
            return None
        key = self._key(config)
        wall = self.walls[key]
        if key in self.inherited:
            self.inherited.discard(key)
            del self.walls[key]  # back if the retry runs out of memory again (add)
            return None
        return (
            f"not run: batch {config.batch_size} >= {wall[0]}, which ran out of memory in "
            f"{wall[1]} at {config.precision}, compile {config.compile}, "
            f"{config.data_pipeline} pipeline"
        )

    def stands(self, config: TrialConfig | SimpleNamespace) -> bool:
        """Whether a wall this run found (not one of an earlier run, which waits for its
        retry) is at or below ``config``'s micro-batch: what the sampler and a two-stage
        trial's split keep clear of."""
        key = self._key(config)
        wall = self.walls.get(key)
        return wall is not None and key not in self.inherited and config.batch_size >= wall[0]

    def runnable_points(self, spec: Spec) -> tuple[dict[str, Any], ...]:
        """Each combination of the micro-batch and the knobs that decide memory that ``spec``'s
        space offers and no wall found in this run blocks, named by the knobs it searches: what
        a joint study's sampler keeps to (``TrialSeededSampler.keep_to``). Empty where no such
        wall stands (nothing ruled out): a wall of an earlier run waits for its retry."""
        if set(self.walls) <= self.inherited:
            return ()
        names = ("batch_size", *_DECIDE[:-1])
        knobs = [getattr(spec.space, name) for name in names]
        searched = [name for name, knob in zip(names, knobs, strict=True) if not knob.is_fixed]
        world = spec.workload.gpus_per_trial
        points = []
        for values in itertools.product(*(offered(knob) for knob in knobs)):
            point = dict(zip(names, values, strict=True))
            if not self.stands(SimpleNamespace(**point, world_size=world)):
                points.append({name: point[name] for name in searched})
        return tuple(points)

    @classmethod
    def from_study(cls, study: optuna.Study) -> MemoryWalls:
        """The walls the study's trials ran into (trials skipped at a wall are not walls),
        each to be tried once more before it blocks."""
        walls = cls()
        for trial in study.get_trials(deepcopy=False):
            record = TrialRecord.of(trial)
            ran_out = record.fail_kind == FaultKind.OOM and not record.oom_skipped
            if ran_out and record.config is not None:
                walls.add(record.config, f"trial {trial.number}")
        walls.inherited = set(walls.walls)
        return walls
