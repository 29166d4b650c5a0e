"""The one place autotune reaches past Optuna's public API.

A study process needs a few things Optuna does not offer publicly: the storage a study writes
through (to beat for a trial, to lock the study, to write on a trial another process owns), the
ids a storage knows trials by, the trials whose heartbeat stopped, a finished trial added with
its number returned, and a storage whose every call rides out a database that stops answering
for a while (``RetryingStorage``, which implements Optuna's storage and heartbeat interfaces).
Each is small and written against Optuna 5, held by ``tests/test_adapter.py`` (a contract
test): an Optuna release that moves one of them fails that test, not a study.

Nothing else in autotune touches an underscored name of Optuna.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna
from optuna.storages import BaseStorage, RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import FrozenTrial, TrialState

from autotune.storage._outage import OutageRetry


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage ``study`` reads and writes through (an RDB storage behind Optuna's cache)."""
    return study._storage


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """The id the storage knows ``trial`` by (unique across its studies; not its number)."""
    return trial._trial_id


def rdb_storage(storage: BaseStorage) -> RDBStorage | None:
    """The SQL storage under ``storage`` (a study wraps it in a cache, and a study process in
    a ``RetryingStorage``), or None for another kind (in memory, a journal)."""
    if isinstance(storage, RetryingStorage):
        storage = storage.inner
    backend = getattr(storage, "_backend", storage)
    return backend if isinstance(backend, RDBStorage) else None


def outage_retry_of(storage: BaseStorage) -> OutageRetry:
    """How long calls to ``storage`` wait for a database that stopped answering: a
    ``RetryingStorage``'s retry, else one that waits not at all."""
    if isinstance(storage, RetryingStorage):
        return storage.retry
    return OutageRetry(seconds=0, url=storage_url(storage))


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


def study_system_attr(study: optuna.Study, key: str) -> Any:
    """A system attribute of ``study`` as its SQL database holds it now (no cache, no wait
    for a database that does not answer: its error is raised); None where it is not set."""
    backend = rdb_storage(storage_of(study))
    assert backend is not None, "an SQL storage's study"
    return backend.get_study_system_attrs(study._study_id).get(key)


def set_study_system_attr(study: optuna.Study, key: str, value: Any) -> None:
    """Write a system attribute on ``study`` straight to its SQL database (no wait for one
    that does not answer: its error is raised). System attributes are autotune's
    bookkeeping: optuna-dashboard does not show them as the user's."""
    backend = rdb_storage(storage_of(study))
    assert backend is not None, "an SQL storage's study"
    backend.set_study_system_attr(study._study_id, key, value)


def _retried(name: str) -> Callable[..., Any]:
    """The method ``name`` of a RetryingStorage: the inner storage's, retried through an outage."""

    def call(self: RetryingStorage, *args: Any, **kwargs: Any) -> Any:
        return self.retry.call(getattr(self.inner, name), *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def _retrying_interfaces() -> type:
    """Optuna's storage and heartbeat interfaces, every call of them handed to the inner
    storage through ``_retried`` (RetryingStorage writes out the one that differs)."""
    names = [name for name in (*dir(BaseStorage), *dir(BaseHeartbeat)) if name[0] != "_"]
    names.append("_get_stale_trial_ids")  # what optuna.storages.fail_stale_trials asks
    methods = {name: _retried(name) for name in names}
    return type("RetryingInterfaces", (BaseStorage, BaseHeartbeat), methods)


class RetryingStorage(_retrying_interfaces()):  # type: ignore[misc]  # made from Optuna's lists
    """An RDB storage (behind Optuna's cache, as a study keeps it: ``inner``) whose every call
    waits for a database that stopped answering, as ``retry`` says (``_outage``); Optuna takes
    it for a study as any ``BaseStorage`` (``optuna.create_study(storage=...)``)."""

    def __init__(self, backend: RDBStorage, retry: OutageRetry) -> None:
        self.inner = optuna.storages.get_storage(backend)  # the cache a study puts around it
        self.retry = retry

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Any = None) -> bool:
        """Set the trial's state (and values). A change retried after its commit reached the
        server but its answer was lost finds the trial finished as asked: done, not refused."""
        tries = 0

        def once() -> bool:
            nonlocal tries
            tries += 1
            try:
                return bool(self.inner.set_trial_state_values(trial_id, state, values))
            except optuna.exceptions.UpdateFinishedTrialError:
                if tries > 1 and self.inner.get_trial(trial_id).state == state:
                    return True
                raise

        return self.retry.call(once)
