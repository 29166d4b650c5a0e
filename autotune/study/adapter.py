"""The one place autotune reaches past Optuna's public API.

A study process needs a few things Optuna does not offer publicly: the storage a study writes
through (to beat for a trial, to lock the study, to write on a trial another process owns), the
ids a storage knows trials by, the trials whose heartbeat stopped, and a finished trial added
with its number returned. Each is one small function here, written against Optuna 5 and held
by ``tests/test_adapter.py`` (a contract test): an Optuna release that moves one of them fails
that test, not a study.

Nothing else in autotune touches an underscored name of Optuna.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial

__all__ = [
    "add_finished_trial",
    "get_trial",
    "heartbeat_interval",
    "rdb_storage",
    "set_trial_user_attr",
    "stale_trial_ids",
    "storage_of",
    "storage_url",
    "trial_id",
]


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage ``study`` reads and writes through (an RDB storage behind Optuna's cache)."""
    return study._storage


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """The id the storage knows ``trial`` by (unique across its studies; not its number)."""
    return trial._trial_id


def rdb_storage(storage: BaseStorage) -> RDBStorage | None:
    """The SQL storage under ``storage`` (a study wraps it in a cache), or None for another
    kind (in memory, a journal)."""
    backend = getattr(storage, "_backend", storage)
    return backend if isinstance(backend, RDBStorage) else None


def storage_url(storage: BaseStorage) -> str | None:
    """The SQLAlchemy URL of an SQL storage (``sqlite:///...``, ``postgresql+psycopg://...``);
    None for another kind."""
    backend = rdb_storage(storage)
    return backend.url if backend is not None else None


def heartbeat_interval(storage: BaseStorage) -> int | None:
    """Seconds between a running trial's heartbeats; None where the storage keeps none."""
    interval = getattr(storage, "get_heartbeat_interval", None)
    return interval() if interval is not None else None


def stale_trial_ids(study: optuna.Study) -> list[int]:
    """Ids of the study's RUNNING trials whose heartbeat stopped longer than the grace period:
    the trials ``optuna.storages.fail_stale_trials`` is about to fail ([] without heartbeats)."""
    storage = storage_of(study)
    if heartbeat_interval(storage) is None:
        return []
    # the heartbeat interface's own query, the one fail_stale_trials uses
    return list(storage._get_stale_trial_ids(study._study_id))  # type: ignore[attr-defined]


def get_trial(study: optuna.Study, trial_id: int) -> FrozenTrial:
    """The trial of storage id ``trial_id`` as the storage holds it now (not a cached copy)."""
    return storage_of(study).get_trial(trial_id)


def set_trial_user_attr(study: optuna.Study, trial_id: int, key: str, value: Any) -> None:
    """Write a user attribute on a trial this process does not hold an ``optuna.Trial`` for
    (one another process runs, or a retry); UpdateFinishedTrialError once it has finished."""
    storage_of(study).set_trial_user_attr(trial_id, key, value)


def add_finished_trial(study: optuna.Study, trial: FrozenTrial) -> int:
    """Add a finished ``trial`` (made with ``optuna.trial.create_trial``) to ``study``; its
    number. ``Study.add_trial`` does the same but does not say the number."""
    storage = storage_of(study)
    new_id = storage.create_new_trial(study._study_id, template_trial=trial)
    return storage.get_trial_number_from_id(new_id)
