"""Studies: how they sample, open and resume, the loop that runs their stages and trials, the
confirmation round and the one answer.

- ``_sampling``: the per-trial seeded sampler and the pruners;
- ``_open``: creating, resuming (with the guard that refuses to mix two searches) and loading;
- ``_trial``: one trial's life (sampled, trained, scored, told) and the observer the display
  implements;
- ``_run``: the run loop over the stages and the trials, under the study's lock;
- ``_confirm``: the confirmation round that re-measures the leaders and the references side by
  side, each configuration's runs in it (``_confirmed``); ``_answer``: what the round
  concludes, the study's one answer (``answer_of``), which every rendering shows;
  ``_verify``: the answer and the references trained for the full run (``autotune verify``).

Everything public is re-exported here, with the names of ``autotune.storage`` (where studies
live) and ``autotune.stage1`` (the speed stage) that other rooms read, each imported on first
use.
"""

# ruff: noqa: F401 (re-exported: __all__ is every name of _MODULES)
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.stage1._stage import run_speed_stage
    from autotune.stage1._store import SpeedEvent, SpeedRecord, speed_study_name
    from autotune.storage._liveness import heartbeat, recover_stale_trials, study_lock
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
        Access,
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
    from autotune.study._confirm import confirm_study, confirmation_plan
    from autotune.study._confirmed import NOISY_SPREAD, Confirmed
    from autotune.study._open import load_study, open_study, patient_storage, with_study_strategy
    from autotune.study._run import RunOutcome, count_states, run_study
    from autotune.study._sampling import TrialSeededSampler, make_pruner, make_sampler
    from autotune.study._trial import StudyObserver, Terminated
    from autotune.study._verify import (
        Verification,
        VerifiedRow,
        VerifyRun,
        role_name,
        runs_left,
        verify_candidates,
        verify_study,
    )

# Imported on first use: a reader of finished studies (autotune best, studies, export) never
# loads _run and _confirm, which import the trainer and torch.
_FROM = {
    "autotune.stage1._stage": ("run_speed_stage",),
    "autotune.stage1._store": ("SpeedEvent", "SpeedRecord", "speed_study_name"),
    "autotune.storage._liveness": ("heartbeat", "recover_stale_trials", "study_lock"),
    "autotune.storage._outage": ("OutageRetry", "StorageOutage", "without_retry"),
    "autotune.storage._queries": (
        "COUNTED_STATES",
        "baseline_trial",
        "best_trial",
        "counted_trials",
        "feasible_trials",
        "is_feasible",
        "knob_origin",
        "reference_trial",
        "trial_config",
        "trial_knob_origin",
    ),
    "autotune.storage._rdb": (
        "Access",
        "StudyError",
        "display_url",
        "open_storage",
        "password_note",
        "sqlite_path",
        "storage_problem",
    ),
    "autotune.storage._records": (
        "METRIC_FIELDS",
        "REFERENCE_NAMES",
        "ConfirmationRecord",
        "ConfirmRun",
        "StudyRecord",
        "TrialRecord",
    ),
    "autotune.storage._walls": ("MemoryWalls",),
    "autotune.study._answer": (
        "Answer",
        "Reference",
        "answer_of",
        "answer_trial",
        "listed",
        "trials_named",
    ),
    "autotune.study._confirm": ("confirm_study", "confirmation_plan"),
    "autotune.study._confirmed": ("NOISY_SPREAD", "Confirmed"),
    "autotune.study._open": ("load_study", "open_study", "patient_storage", "with_study_strategy"),
    "autotune.study._run": ("RunOutcome", "count_states", "run_study"),
    "autotune.study._sampling": ("TrialSeededSampler", "make_pruner", "make_sampler"),
    "autotune.study._trial": ("StudyObserver", "Terminated"),
    "autotune.study._verify": (
        "Verification",
        "VerifiedRow",
        "VerifyRun",
        "role_name",
        "runs_left",
        "verify_candidates",
        "verify_study",
    ),
}
_MODULES = {name: module for module, names in _FROM.items() for name in names}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        import importlib

        value = getattr(importlib.import_module(_MODULES[name]), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'autotune.study' has no attribute {name!r}")


__all__ = sorted(_MODULES)
