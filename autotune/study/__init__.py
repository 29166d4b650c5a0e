"""Studies: where they live, how they sample, how they open and resume, what they record, and
the loop that runs their trials.

One subpackage, one concern per private module, everything public re-exported here:

- ``_records``: what a trial and a study record (``TrialRecord``, ``StudyRecord``);
- ``_queries``: what every other module asks of a study's trials (``feasible_trials``,
  ``best_trial``, ``trial_config``), read through those records;
- ``_storage``: Optuna RDB storages (SQLite in WAL mode, PostgreSQL), opened as asked;
- ``_outage``: the patience with which a study process's storage calls wait for a database that
  stops answering for a while (a restart, a failover);
- ``_liveness``: the heartbeat of running trials, the recovery of stale ones, and the study's
  lock under which a process counts and starts trials;
- ``_sampling``: the per-trial seeded sampler and the pruners;
- ``_open``: creating, resuming (with the guard that refuses to mix two searches) and loading;
- ``adapter``: the one place that reaches past Optuna's public API (storage, ids, stale
  trials), held by a contract test;
- ``_trial``: one trial's life (sampled, trained, scored, told) and the observer the display
  implements; ``_walls``: the memory walls trials and stage 1 share;
- ``_run``: the run loop over the stages and the trials, under the study's lock;
- ``_speed_plan``, ``_speed_store``, ``_speed_rules``, ``_speed_table``, ``_speed``: stage 1
  of a two-stage study: what it measures (and estimates before it starts), the speed study
  that records and caches it, what it leaves out and why, its answer, and the stage that runs
  it;
- ``_confirm``: the confirmation round that re-measures the leaders and the baseline side by
  side; ``_answer``: what the round concludes, the study's one answer
  (``answer_of``), which every rendering shows; ``_verify``: the answer and the references
  trained for the full run (``autotune verify``).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.study._answer import (
        NOISY_SPREAD,
        Answer,
        Confirmed,
        Reference,
        answer_of,
        answer_trial,
        trials_named,
    )
    from autotune.study._confirm import confirm_study, confirmation_plan
    from autotune.study._liveness import heartbeat, recover_stale_trials, study_lock
    from autotune.study._open import load_study, open_study, patient_storage, with_study_strategy
    from autotune.study._outage import Patience, StorageOutage, unhurried
    from autotune.study._queries import (
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
    from autotune.study._records import (
        METRIC_FIELDS,
        REFERENCE_NAMES,
        ConfirmationRecord,
        ConfirmRun,
        StudyRecord,
        TrialRecord,
    )
    from autotune.study._run import RunOutcome, count_states, run_study
    from autotune.study._sampling import TrialSeededSampler, make_pruner, make_sampler
    from autotune.study._speed import run_speed_stage
    from autotune.study._speed_store import SpeedEvent, SpeedRecord, speed_study_name
    from autotune.study._storage import (
        Access,
        StudyError,
        display_url,
        open_storage,
        password_note,
        sqlite_path,
        storage_problem,
    )
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
    from autotune.study._walls import MemoryWalls

# Imported on first use: a reader of finished studies (autotune best, studies, export) never
# loads _run and _confirm, which import the trainer and torch.
_MODULES = {
    "Confirmed": "_answer",
    "NOISY_SPREAD": "_answer",
    "answer_trial": "_answer",
    "Answer": "_answer",
    "Reference": "_answer",
    "REFERENCE_NAMES": "_records",
    "answer_of": "_answer",
    "trials_named": "_answer",
    "confirm_study": "_confirm",
    "confirmation_plan": "_confirm",
    "load_study": "_open",
    "open_study": "_open",
    "with_study_strategy": "_open",
    "patient_storage": "_open",
    "Patience": "_outage",
    "StorageOutage": "_outage",
    "unhurried": "_outage",
    "run_speed_stage": "_speed",
    "SpeedEvent": "_speed_store",
    "SpeedRecord": "_speed_store",
    "speed_study_name": "_speed_store",
    "COUNTED_STATES": "_queries",
    "METRIC_FIELDS": "_records",
    "ConfirmationRecord": "_records",
    "ConfirmRun": "_records",
    "StudyRecord": "_records",
    "TrialRecord": "_records",
    "baseline_trial": "_queries",
    "reference_trial": "_queries",
    "best_trial": "_queries",
    "counted_trials": "_queries",
    "feasible_trials": "_queries",
    "is_feasible": "_queries",
    "knob_origin": "_queries",
    "trial_knob_origin": "_queries",
    "trial_config": "_queries",
    "MemoryWalls": "_walls",
    "RunOutcome": "_run",
    "count_states": "_run",
    "StudyObserver": "_trial",
    "Terminated": "_trial",
    "run_study": "_run",
    "TrialSeededSampler": "_sampling",
    "make_pruner": "_sampling",
    "make_sampler": "_sampling",
    "Access": "_storage",
    "StudyError": "_storage",
    "display_url": "_storage",
    "heartbeat": "_liveness",
    "open_storage": "_storage",
    "password_note": "_storage",
    "recover_stale_trials": "_liveness",
    "study_lock": "_liveness",
    "sqlite_path": "_storage",
    "storage_problem": "_storage",
    "Verification": "_verify",
    "VerifiedRow": "_verify",
    "VerifyRun": "_verify",
    "verify_candidates": "_verify",
    "runs_left": "_verify",
    "role_name": "_verify",
    "verify_study": "_verify",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        import importlib

        value = getattr(importlib.import_module(f"autotune.study.{_MODULES[name]}"), name)
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
    "Patience",
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
    "unhurried",
    "verify_candidates",
    "verify_study",
    "with_study_strategy",
]
