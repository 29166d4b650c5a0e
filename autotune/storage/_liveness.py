"""How processes that share a study stay out of each other's way: the running trials'
heartbeat (through a connection of its own), the recovery of trials whose process stopped
beating, and the study's lock under which a process counts the trials and starts one."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import optuna
import sqlalchemy
from optuna.exceptions import ExperimentalWarning
from optuna.trial import TrialState

from autotune.faults import FaultKind
from autotune.machine.turns import file_lock
from autotune.storage import adapter
from autotune.storage._outage import is_outage, note_trouble, troubled_within
from autotune.storage._rdb import STALE_BEATS, optuna_storage, sqlite_path
from autotune.storage._records import TrialRecord


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial_id: int) -> Iterator[None]:
    """Record the trial's heartbeat every interval while it runs (RDB storages with heartbeat):
    a study process that dies (SIGKILL, power loss) stops beating, and the next ``autotune
    run`` finds its trial stale (``recover_stale_trials``)."""
    interval = adapter.heartbeat_interval(adapter.storage_of(study))
    if interval is None:
        yield
        return
    storage = _beat_storage(adapter.storage_of(study), interval)
    url = adapter.storage_url(adapter.storage_of(study))
    stop = threading.Event()

    def beat() -> None:
        started = time.monotonic()
        for count in itertools.count(1):
            try:
                storage.record_heartbeat(trial_id)
            except Exception as error:  # a missed beat is not worth a crash
                if is_outage(error):  # every process's beats are refused: none stale yet
                    note_trouble(url)
            # on a fixed clock: a beat that waited does not push the next one later
            if stop.wait(max(0.0, started + count * interval - time.monotonic())):
                return

    thread = threading.Thread(target=beat, name="autotune-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# a lock held for minutes (the confirmation round) on PostgreSQL beats a lease beside it this
# often (seconds); a lease whose beat stood still for LEASE_GRACE intervals lost its holder
LEASE_INTERVAL = 2.0
LEASE_GRACE = 3


class _Lease:
    """Who holds a long-held advisory lock, in the study's own database: a PostgreSQL advisory
    lock lives on its connection, so a database restart ends it while its holder works on, and
    a process that waited for the lock would take it and work beside the holder. The holder
    beats ``{"owner", "beat"}`` every ``LEASE_INTERVAL`` on a thread of its own and clears it
    when done; a process that takes the advisory lock and finds another's lease whose beat
    still moves gives the lock back and waits. A holder that died (its beat stands still for
    ``LEASE_GRACE`` intervals) has its lease taken over."""

    def __init__(self, study: optuna.Study, key: str) -> None:
        self.study, self.key = study, f"autotune:lease:{key}"
        self.owner = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _holder(self) -> tuple[str, int] | None:
        held = adapter.study_system_attr(self.study, self.key)
        return (str(held["owner"]), int(held["beat"])) if isinstance(held, dict) else None

    def held_elsewhere(self) -> bool:
        """Whether another live process holds the lease: its beat moves while this one
        watches (up to ``LEASE_GRACE`` intervals)."""
        holder = self._holder()  # never this one's: it takes the lease after asking this
        if holder is None:
            return False
        deadline = time.monotonic() + LEASE_GRACE * LEASE_INTERVAL
        while time.monotonic() < deadline:
            time.sleep(LEASE_INTERVAL / 4)
            now = self._holder()
            if now != holder:  # beaten or taken by another (alive), or released
                return now is not None
        return False  # its holder died without releasing it

    def take(self) -> None:
        """Hold the lease, beating it until ``release``."""
        adapter.set_study_system_attr(self.study, self.key, {"owner": self.owner, "beat": 0})

        def beat() -> None:
            for count in itertools.count(1):
                if self._stop.wait(LEASE_INTERVAL):
                    return
                with contextlib.suppress(sqlalchemy.exc.SQLAlchemyError):  # a restart: next
                    adapter.set_study_system_attr(
                        self.study, self.key, {"owner": self.owner, "beat": count}
                    )
                    if self._stop.is_set():  # released while this beat hung: not held now
                        adapter.set_study_system_attr(self.study, self.key, None)

        self._thread = threading.Thread(target=beat, name="autotune-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop beating and clear the lease (left to go stale where the database is down). A
        beat that hangs on a database that stopped answering (a partition, not a refusal) is
        waited for ``LEASE_GRACE`` intervals at most: the lease is then left to go stale, as
        another process would judge it anyway."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(LEASE_GRACE * LEASE_INTERVAL)
            if self._thread.is_alive():  # its beat hangs: so would the clearing
                return
        with contextlib.suppress(sqlalchemy.exc.SQLAlchemyError):
            adapter.set_study_system_attr(self.study, self.key, None)


@contextlib.contextmanager
def study_lock(
    study: optuna.Study,
    purpose: str = "",
    on_wait: Callable[[], None] | None = None,
    held_long: bool = False,
) -> Iterator[None]:
    """Hold the study's lock against every other process on its storage: while held, no other
    ``autotune run`` counts the study's trials or starts one (so ``n_trials`` is never exceeded
    by processes that count at the same moment). With a ``purpose`` (``"confirm"``), a lock of
    its own: one process at a time runs the study's confirmation round. SQLite: an exclusive
    lock on a file beside the database (its processes share a machine); PostgreSQL: an advisory
    lock on a connection of its own; other storages: none. ``on_wait`` is called once when
    another process holds it. ``held_long`` (a lock held for minutes): on PostgreSQL, a lease
    beside the lock keeps others out when a database restart ended the lock (``_Lease``)."""
    backend = adapter.rdb_storage(adapter.storage_of(study))
    url = backend.url if backend is not None else None
    path = sqlite_path(url) if url is not None else None
    # a purpose's lock is the study's own (two studies in one database confirm side by side)
    suffix = f".{purpose}-{hashlib.sha1(study.study_name.encode()).hexdigest()[:12]}"
    suffix = suffix if purpose else ""
    if path is not None:  # a full or read-only disk: none; the study's own write says so next
        waiting = (lambda pid: on_wait()) if on_wait is not None else None
        with file_lock(path.with_name(f"{path.name}{suffix}.lock"), waiting, remove=bool(purpose)):
            yield
    elif backend is not None and url is not None and url.startswith("postgresql"):
        key = f"autotune{':' + purpose if purpose else ''}:{study.study_name}"
        with _advisory_lock(study, backend, key, on_wait, held_long):
            yield
    else:
        yield


@contextlib.contextmanager
def _advisory_lock(
    study: optuna.Study,
    backend: optuna.storages.RDBStorage,
    key: str,
    on_wait: Callable[[], None] | None,
    held_long: bool,
) -> Iterator[None]:
    """``study_lock`` on PostgreSQL: an advisory lock on ``key``, held by a connection of its
    own, and a lease beside it where ``held_long``."""
    retry = adapter.outage_retry_of(adapter.storage_of(study))
    waiting = functools.cache(on_wait or (lambda: None))  # said once, however often it waits
    lease = _Lease(study, key) if held_long else None
    while True:
        # a database that restarts: wait for it
        connection = retry.call(_locked_connection, backend, key, waiting)
        try:
            if lease is None or not retry.call(lease.held_elsewhere):
                break
        except BaseException:
            _unlock(connection, key)
            raise
        # its holder lost the lock with its connection and works on: wait for it
        _unlock(connection, key)
        waiting()
        time.sleep(LEASE_INTERVAL)
    try:
        if lease is not None:
            retry.call(lease.take)
        yield
    finally:
        try:
            if lease is not None:
                lease.release()
        finally:
            _unlock(connection, key)


def _locked_connection(
    backend: optuna.storages.RDBStorage, key: str, waiting: Callable[[], None]
) -> sqlalchemy.Connection:
    """A new connection holding the advisory lock on ``key``; ``waiting`` called before it
    waits for another holder."""
    connection = backend.engine.connect()
    try:
        taken = connection.execute(
            sqlalchemy.text("SELECT pg_try_advisory_lock(hashtext(:key))"), {"key": key}
        ).scalar()
        if not taken:
            waiting()
            connection.execute(
                sqlalchemy.text("SELECT pg_advisory_lock(hashtext(:key))"), {"key": key}
            )
    except BaseException:
        connection.close()
        raise
    return connection


def _unlock(connection: sqlalchemy.Connection, key: str) -> None:
    try:
        connection.execute(
            sqlalchemy.text("SELECT pg_advisory_unlock(hashtext(:key))"), {"key": key}
        )
    except sqlalchemy.exc.SQLAlchemyError as error:
        if not is_outage(error):  # its connection was lost: the lock went with it
            raise
    finally:
        connection.close()


_BEAT_STORAGES: dict[str, optuna.storages.RDBStorage] = {}


def _beat_storage(storage: optuna.storages.BaseStorage, interval: int) -> Any:
    """The storage the heartbeat writes through: one of its own (its own engine, so its own
    connections) whose writes give up after half an interval.

    The rule: a trial is stale after ``STALE_BEATS`` intervals without a beat. A beat
    that waited behind the study's own writes (SQLite's busy timeout is a minute) could land
    after that although its process is alive. Beats are due on a fixed clock, one an interval,
    and each gives up after half an interval, so a live process is judged stale only when the
    database refused every beat due in those intervals. Falls back to ``storage`` where none
    can be made.
    """
    url = adapter.storage_url(storage)
    if url is None:
        return storage
    if url not in _BEAT_STORAGES:
        if url.startswith("sqlite"):
            connect_args: dict[str, Any] = {"timeout": interval / 2}
        elif url.startswith("postgresql"):
            milliseconds = interval * 500
            connect_args = {
                "options": f"-c lock_timeout={milliseconds} -c statement_timeout={milliseconds}"
            }
        else:
            connect_args = {}
        try:
            fast = {"skip_compatibility_check": True, "skip_table_creation": True}
            _BEAT_STORAGES[url] = optuna_storage(url, connect_args, interval, **fast)
        except Exception:  # the study's own storage beats then, as before
            return storage
    return _BEAT_STORAGES[url]


def recover_stale_trials(study: optuna.Study) -> int:
    """Fail trials whose study process stopped beating, as ``interrupted``; return how many.

    Their parameters are queued once more (RetryHeartbeatStaleTrialCallback in the storage).
    None is judged stale for ``STALE_BEATS`` heartbeat intervals after this process saw
    the database refuse a call: every live process's beats were refused too, and are due again.
    """
    storage = adapter.storage_of(study)
    interval = adapter.heartbeat_interval(storage)
    if interval is None or troubled_within(adapter.storage_url(storage), STALE_BEATS * interval):
        return 0
    stale = adapter.stale_trial_ids(study)  # the trials fail_stale_trials is about to fail
    if not stale:
        return 0
    for trial_id in stale:
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            record = TrialRecord(
                fail_kind=FaultKind.INTERRUPTED,
                fail_msg="its study process stopped without recording it (killed or lost); "
                "its parameters were queued again",
            )
            for key, value in record.to_attrs().items():
                adapter.set_trial_user_attr(study, trial_id, key, value)
    with warnings.catch_warnings(action="ignore", category=ExperimentalWarning):
        optuna.storages.fail_stale_trials(study)
    failed = 0
    # a trial whose beat came back between the two queries (a slow process, not a dead one)
    # was not failed: it trains on, so the label written above is taken back
    for trial_id in stale:
        state = adapter.get_trial(study, trial_id).state
        if state == TrialState.FAIL:
            failed += 1
        if state != TrialState.RUNNING:  # failed, or finished by its owner in between (its
            continue  # label cannot be taken back; TrialRecord.of ignores it on COMPLETE)
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            adapter.set_trial_user_attr(study, trial_id, "fail_kind", None)
            adapter.set_trial_user_attr(study, trial_id, "fail_msg", None)
    return failed
