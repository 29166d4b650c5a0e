"""Memory walls: the micro-batch sizes that ran out of memory, so that the study does not pay
for the same out-of-memory twice. Trials and stage 1 keep theirs in one ``MemoryWalls``."""

from __future__ import annotations

from dataclasses import dataclass, field

import optuna

from autotune.config import TrialConfig
from autotune.faults import FaultKind
from autotune.storage._records import TrialRecord

# what, beside the micro-batch, decides how much device memory a step takes: the precision,
# the compiled graph and its layout, the data pipeline (the device pipeline holds the whole
# training set in device memory), the optimizer's state and the ranks that share a model
_WallKey = tuple[str, str, bool, str, str, int]


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
    def _key(config: TrialConfig) -> _WallKey:
        return (
            config.precision,
            config.compile,
            config.channels_last,
            config.data_pipeline,
            config.optimizer,
            config.world_size,
        )

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
