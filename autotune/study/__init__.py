"""Studies: how they sample, open and resume (``_sampling``, ``_open``), one trial's life
(``_trial``), the run loop over the stages and the trials (``_run``), the confirmation round
(``_confirm``, ``_confirmed``), the one answer every rendering shows (``_answer``) and the answer
at full length (``_verify``).

Everything public is re-exported here, with the names of ``autotune.storage`` (where studies
live) and ``autotune.stage1`` (the speed stage) that other rooms read, each imported on first
use.
"""

# ruff: noqa: F401 (re-exported: __all__ is every name of _MODULES)
import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.stage1._stage import run_speed_stage
    from autotune.stage1._store import SpeedEvent, SpeedRecord, speed_study_name
    from autotune.stage1._take import StageInputs
    from autotune.storage._liveness import recover_stale_trials, study_lock
    from autotune.storage._outage import OutageRetry, StorageOutage, without_retry
    from autotune.storage._queries import (
        COUNTED_STATES,
        baseline_trial,
        best_trial,
        counted_trials,
        feasible_trials,
        is_feasible,
        knob_origin,
        reference_trial,
        trial_config,
        trial_knob_origin,
    )
    from autotune.storage._rdb import (
        StudyError,
        display_url,
        open_storage,
        password_note,
        sqlite_path,
        storage_problem,
    )
    from autotune.storage._records import (
        METRIC_FIELDS,
        REFERENCE_NAMES,
        ConfirmationRecord,
        ConfirmRun,
        StudyRecord,
        TrialRecord,
    )
    from autotune.storage._walls import MemoryWalls
    from autotune.study._answer import (
        Answer,
        Reference,
        answer_of,
        answer_trial,
        listed,
        trials_named,
    )
    from autotune.study._confirm import ConfirmationInputs, confirm_study, confirmation_plan
    from autotune.study._confirmed import NOISY_SPREAD, Confirmed
    from autotune.study._open import load_study, open_study, patient_storage, with_study_strategy
    from autotune.study._run import RunOutcome, count_states, run_study
    from autotune.study._sampling import make_sampler
    from autotune.study._trial import StudyInputs, StudyObserver, Terminated
    from autotune.study._verify import (
        Verification,
        VerifyRun,
        role_name,
        runs_left,
        verify_candidates,
        verify_study,
    )


# Imported on first use: a reader of finished studies (autotune best, studies, export) never
# loads _run and _confirm, which import the trainer and torch. The names and their modules are
# those of the imports above, read once from this file, as scientific-python's lazy_loader reads
# a stub: one list for the type checker and the lazy import alike.
def _lazy_names() -> dict[str, str]:
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    (typed,) = (node for node in tree.body if isinstance(node, ast.If))
    return {
        alias.name: statement.module
        for statement in typed.body
        if isinstance(statement, ast.ImportFrom) and statement.module is not None
        for alias in statement.names
    }


_MODULES = _lazy_names()


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = getattr(importlib.import_module(_MODULES[name]), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'autotune.study' has no attribute {name!r}")


__all__ = sorted(_MODULES)
