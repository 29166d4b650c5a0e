"""Studies: a study's stages and its answer. Its modules: ARCHITECTURE.md.

Everything public is re-exported here, with the names of ``autotune.storage`` (where studies
live) and ``autotune.stage1`` (the speed stage) that other rooms read, each imported on first
use.
"""

# ruff: noqa: F401 (re-exported: every name of _MODULES)
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.stage1._stage import run_speed_stage
    from autotune.stage1._store import SpeedEvent, SpeedRecord, speed_study_name
    from autotune.stage1._take import StageInputs
    from autotune.storage._liveness import recover_stale_trials, study_lock
    from autotune.storage._outage import OutageRetry, StorageOutage, without_retry
    from autotune.storage._queries import (
        COUNTED_STATES,
        best_trial,
        count_endings,
        counted_trials,
        feasible_trials,
        is_feasible,
        knob_origin,
        reference_trial,
        trial_config,
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
        UNCONFIRMED,
        Answer,
        answer_of,
        answer_trial,
        listed,
        trials_named,
    )
    from autotune.study._confirm import ConfirmationInputs, confirm_study, confirmation_plan
    from autotune.study._confirmed import NOISY_SPREAD, Confirmed, loads_alike, loads_said
    from autotune.study._observer import StudyInputs, StudyObserver
    from autotune.study._open import load_study, open_study, patient_storage, with_study_strategy
    from autotune.study._reference import Reference
    from autotune.study._run import RunOutcome, count_states, run_study
    from autotune.study._sampling import make_sampler
    from autotune.study._trial import Terminated
    from autotune.study._verify import (
        Verification,
        VerifyInputs,
        VerifyRun,
        role_name,
        runs_kept,
        runs_left,
        verify_candidates,
        verify_study,
    )


# Imported on first use: a reader of finished studies (autotune best, studies, export) never
# loads _run and _confirm, which import the trainer and torch. The table (module -> names) is the
# lazy import's; the imports above are the type checker's, held equal to it by test_architecture.
_LAZY = {  # module (under autotune) -> its names
    "stage1._stage": "run_speed_stage",
    "stage1._store": "SpeedEvent SpeedRecord speed_study_name",
    "stage1._take": "StageInputs",
    "storage._liveness": "recover_stale_trials study_lock",
    "storage._outage": "OutageRetry StorageOutage without_retry",
    "storage._queries": "COUNTED_STATES best_trial count_endings counted_trials feasible_trials"
    " is_feasible knob_origin reference_trial trial_config",
    "storage._rdb": "StudyError display_url open_storage password_note sqlite_path"
    " storage_problem",
    "storage._records": "METRIC_FIELDS REFERENCE_NAMES ConfirmationRecord ConfirmRun StudyRecord"
    " TrialRecord",
    "storage._walls": "MemoryWalls",
    "study._answer": "Answer UNCONFIRMED answer_of answer_trial listed trials_named",
    "study._confirm": "ConfirmationInputs confirm_study confirmation_plan",
    "study._confirmed": "NOISY_SPREAD Confirmed loads_alike loads_said",
    "study._observer": "StudyInputs StudyObserver",
    "study._open": "load_study open_study patient_storage with_study_strategy",
    "study._reference": "Reference",
    "study._run": "RunOutcome count_states run_study",
    "study._sampling": "make_sampler",
    "study._trial": "Terminated",
    "study._verify": "Verification VerifyInputs VerifyRun role_name runs_kept runs_left"
    " verify_candidates verify_study",
}
_MODULES = {
    name: f"autotune.{module}" for module, names in _LAZY.items() for name in names.split()
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = getattr(importlib.import_module(_MODULES[name]), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'autotune.study' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULES})
