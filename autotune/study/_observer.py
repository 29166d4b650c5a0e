"""What a study run hears and is given: ``StudyObserver``, the hooks the display implements
(each a no-op here), and ``StudyInputs``, the study as it runs in this process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autotune.stage1._take import StudyParts

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from autotune.config import TrialConfig
    from autotune.results import Evaluation
    from autotune.speed import SpeedTable
    from autotune.stage1._store import SpeedEvent


class StudyObserver:
    """Hooks for showing a study's progress; the default does nothing."""

    def speed_measured(self, event: SpeedEvent) -> None:
        """Stage 1 (two-stage studies) measured, reused or skipped one setting."""

    def speed_finished(self, table: SpeedTable, seconds: float) -> None:
        """Stage 1 is done, in ``seconds``: ``table`` holds the fastest settings; stage 2
        starts."""

    def trial_started(self, number: int, config: TrialConfig) -> None:
        """A trial is about to train with ``config``."""

    def evaluated(self, number: int, evaluation: Evaluation, value: float) -> None:
        """A trial evaluated; ``value`` is what the pruner sees."""

    def trial_finished(self, trial: FrozenTrial) -> None:
        """A trial ended (any state); its attributes are final."""

    def recovered(self, count: int) -> None:
        """``count`` trials a stopped process left running were failed as interrupted and their
        parameters queued again (``recover_stale_trials``)."""

    def waiting(self, running: int) -> None:
        """The study's last trials are running elsewhere (or are stale); this run waits."""

    def turn_waiting(self, line: str) -> None:
        """This process waits for its turn on the machine (``turns``): ``line`` says for whom;
        the trial's or measurement's clock has not started."""

    def study_waiting(self, line: str) -> None:
        """This process waits for another process of the study (``study_lock``), minutes
        perhaps: ``line`` says for what; said once, as a line of its own."""

    def taken_over(self, number: int, kept_on: str | None) -> None:
        """Another process failed trial ``number`` as stale while this one trained it; what
        this one measured is kept on ``kept_on`` (a trial or the study), if anything."""

    def storage_waiting(self, problem: str, seconds: float) -> None:
        """The study's database stopped answering (``problem``, in a few words); this process
        waits up to ``seconds`` for it while the running trial trains on."""

    def storage_back(self, seconds: float) -> None:
        """The study's database answers again, after ``seconds`` without; the study goes on."""


@dataclass(frozen=True)
class StudyInputs(StudyParts):
    """The study as it runs in this process, who hears of it, and this process's place among
    ``--workers`` ("2/4"), recorded on each trial."""

    observer: StudyObserver = field(default_factory=StudyObserver)
    worker: str | None = None
