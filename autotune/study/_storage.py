"""Where studies live: Optuna RDB storages (SQLite, PostgreSQL) and the trials' heartbeat."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.exceptions import ExperimentalWarning
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial

from autotune.errors import UserError
from autotune.faults import FaultKind
from autotune.study._records import TrialRecord

__all__ = ["StudyError", "heartbeat", "open_storage", "recover_stale_trials"]

SQLITE_BUSY_TIMEOUT_SECONDS = 60
STORAGE_OPEN_ATTEMPTS = 5


class StudyError(UserError):
    """A study that cannot be opened, created or resumed as asked (a user error)."""


class _RetryOnce:
    """Queue a stale trial's parameters once more, without anything it measured.

    RetryHeartbeatStaleTrialCallback copies the stale trial's user and system attributes into
    the new trial. Those hold how the stale one failed and the pruner's state (Hyperband's
    ``completed_rung_*`` values): a retry that inherited them would be judged on measurements
    it never made. It keeps only the retry history, the parameters it was queued with, and
    whether it is the study's untuned baseline.
    """

    KEPT_SYSTEM_ATTRS = ("failed_trial", "retry_history", "fixed_params")

    def __init__(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)  # stable since Optuna 2.8
            self._retry = RetryHeartbeatStaleTrialCallback(max_retry=1)

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        clean = copy.deepcopy(trial)
        clean.user_attrs = TrialRecord(baseline=TrialRecord.of(trial).baseline).to_attrs()
        kept = self.KEPT_SYSTEM_ATTRS
        clean.system_attrs = {k: v for k, v in trial.system_attrs.items() if k in kept}
        self._retry(study, clean)


def open_storage(
    url: str, create_dirs: bool = True, heartbeat_interval: int | None = None
) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage for ``url``; SQLite files get WAL mode and a long busy timeout.

    With ``create_dirs`` the folder of a SQLite file is created when missing (``autotune run``);
    readers pass False so that looking at a study never creates anything. With
    ``heartbeat_interval`` (seconds) running trials beat, and one silent for three intervals is
    stale: failed as interrupted and retried once.
    """
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        path = Path(url.removeprefix("sqlite:///"))
        if not path.exists():
            if not create_dirs:
                raise StudyError(f"no study database at {path} (storage {url})")
            path.parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_SECONDS}
    heartbeat: dict[str, Any] = {}
    if heartbeat_interval is not None:
        heartbeat = {
            "heartbeat_interval": heartbeat_interval,
            "grace_period": 3 * heartbeat_interval,
            "heartbeat_stale_trial_callback": _RetryOnce(),
        }
    for attempt in range(STORAGE_OPEN_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)  # heartbeat_interval
                storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **heartbeat)
            break
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as err:
            # another process is creating the same new database's tables right now
            racing = isinstance(err, sqlalchemy.exc.IntegrityError) or "already exists" in str(err)
            if not racing or attempt == STORAGE_OPEN_ATTEMPTS - 1:
                raise StudyError(
                    f"cannot open storage {url}: {type(err).__name__}: {err}"
                ) from None
            time.sleep(0.2 * (attempt + 1))
        except Exception as err:  # SQLAlchemy raises many kinds for a bad URL or server
            raise StudyError(f"cannot open storage {url}: {type(err).__name__}: {err}") from None
    if url.startswith("sqlite:///"):
        # WAL lets optuna-dashboard and other autotune processes read while a study writes.
        with storage.engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA journal_mode=WAL")
    return storage


def _heartbeat_interval(storage: optuna.storages.BaseStorage) -> int | None:
    """The storage's heartbeat interval in seconds; None when it keeps no heartbeat.

    Studies hold their RDB storage wrapped in a cache; both speak Optuna's heartbeat interface.
    """
    interval = getattr(storage, "get_heartbeat_interval", None)
    return interval() if interval is not None else None


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial_id: int) -> Iterator[None]:
    """Record the trial's heartbeat every interval while it runs (RDB storages with heartbeat).

    A study process that dies (SIGKILL, power loss) stops beating; the next ``autotune run``
    finds the trial stale, records it as interrupted and queues its parameters once more.
    """
    storage = study._storage
    interval = _heartbeat_interval(storage)
    if interval is None:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):  # a missed beat is not worth a crash
                # RDB storages and their cache beat; BaseStorage does not declare it
                storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name="autotune-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def recover_stale_trials(study: optuna.Study) -> int:
    """Fail trials whose study process stopped beating, as ``interrupted``; return how many.

    Their parameters are queued once more (RetryHeartbeatStaleTrialCallback in the storage).
    """
    storage = study._storage
    if _heartbeat_interval(storage) is None:
        return 0
    # the heartbeat interface's own query (underscored in Optuna, but the one
    # fail_stale_trials uses): these are the trials it is about to fail
    stale = storage._get_stale_trial_ids(study._study_id)  # type: ignore[attr-defined]  # as above
    for trial_id in stale:
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            record = TrialRecord(
                fail_kind=FaultKind.INTERRUPTED,
                fail_msg="its study process stopped without recording it (killed or lost); "
                "its parameters were queued again",
            )
            for key, value in record.to_attrs().items():
                storage.set_trial_user_attr(trial_id, key, value)
    if stale:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
    return len(stale)
