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
_MODULES = {
    "Confirmed": "autotune.study._confirmed",
    "NOISY_SPREAD": "autotune.study._confirmed",
    "answer_trial": "autotune.study._answer",
    "Answer": "autotune.study._answer",
    "Reference": "autotune.study._answer",
    "REFERENCE_NAMES": "autotune.storage._records",
    "answer_of": "autotune.study._answer",
    "trials_named": "autotune.study._answer",
    "listed": "autotune.study._answer",
    "confirm_study": "autotune.study._confirm",
    "confirmation_plan": "autotune.study._confirm",
    "load_study": "autotune.study._open",
    "open_study": "autotune.study._open",
    "with_study_strategy": "autotune.study._open",
    "patient_storage": "autotune.study._open",
    "OutageRetry": "autotune.storage._outage",
    "StorageOutage": "autotune.storage._outage",
    "without_retry": "autotune.storage._outage",
    "run_speed_stage": "autotune.stage1._stage",
    "SpeedEvent": "autotune.stage1._store",
    "SpeedRecord": "autotune.stage1._store",
    "speed_study_name": "autotune.stage1._store",
    "COUNTED_STATES": "autotune.storage._queries",
    "METRIC_FIELDS": "autotune.storage._records",
    "ConfirmationRecord": "autotune.storage._records",
    "ConfirmRun": "autotune.storage._records",
    "StudyRecord": "autotune.storage._records",
    "TrialRecord": "autotune.storage._records",
    "baseline_trial": "autotune.storage._queries",
    "reference_trial": "autotune.storage._queries",
    "best_trial": "autotune.storage._queries",
    "counted_trials": "autotune.storage._queries",
    "feasible_trials": "autotune.storage._queries",
    "is_feasible": "autotune.storage._queries",
    "knob_origin": "autotune.storage._queries",
    "trial_knob_origin": "autotune.storage._queries",
    "trial_config": "autotune.storage._queries",
    "MemoryWalls": "autotune.storage._walls",
    "RunOutcome": "autotune.study._run",
    "count_states": "autotune.study._run",
    "StudyObserver": "autotune.study._trial",
    "Terminated": "autotune.study._trial",
    "run_study": "autotune.study._run",
    "TrialSeededSampler": "autotune.study._sampling",
    "make_pruner": "autotune.study._sampling",
    "make_sampler": "autotune.study._sampling",
    "Access": "autotune.storage._rdb",
    "StudyError": "autotune.storage._rdb",
    "display_url": "autotune.storage._rdb",
    "heartbeat": "autotune.storage._liveness",
    "open_storage": "autotune.storage._rdb",
    "password_note": "autotune.storage._rdb",
    "recover_stale_trials": "autotune.storage._liveness",
    "study_lock": "autotune.storage._liveness",
    "sqlite_path": "autotune.storage._rdb",
    "storage_problem": "autotune.storage._rdb",
    "Verification": "autotune.study._verify",
    "VerifiedRow": "autotune.study._verify",
    "VerifyRun": "autotune.study._verify",
    "verify_candidates": "autotune.study._verify",
    "runs_left": "autotune.study._verify",
    "role_name": "autotune.study._verify",
    "verify_study": "autotune.study._verify",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        import importlib

        value = getattr(importlib.import_module(_MODULES[name]), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'autotune.study' has no attribute {name!r}")


__all__ = [
    "COUNTED_STATES",
    "METRIC_FIELDS",
    "NOISY_SPREAD",
    "REFERENCE_NAMES",
    "Access",
    "Answer",
    "ConfirmRun",
    "ConfirmationRecord",
    "Confirmed",
    "MemoryWalls",
    "OutageRetry",
    "Reference",
    "RunOutcome",
    "SpeedEvent",
    "SpeedRecord",
    "StorageOutage",
    "StudyError",
    "StudyObserver",
    "StudyRecord",
    "Terminated",
    "TrialRecord",
    "TrialSeededSampler",
    "Verification",
    "VerifiedRow",
    "VerifyRun",
    "answer_of",
    "answer_trial",
    "baseline_trial",
    "best_trial",
    "confirm_study",
    "confirmation_plan",
    "count_states",
    "counted_trials",
    "display_url",
    "feasible_trials",
    "heartbeat",
    "is_feasible",
    "knob_origin",
    "listed",
    "load_study",
    "make_pruner",
    "make_sampler",
    "open_storage",
    "open_study",
    "password_note",
    "patient_storage",
    "recover_stale_trials",
    "reference_trial",
    "role_name",
    "run_speed_stage",
    "run_study",
    "runs_left",
    "speed_study_name",
    "sqlite_path",
    "storage_problem",
    "study_lock",
    "trial_config",
    "trial_knob_origin",
    "trials_named",
    "verify_candidates",
    "verify_study",
    "with_study_strategy",
    "without_retry",
]
