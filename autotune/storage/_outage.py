"""A study that rides out its database's restart.

A PostgreSQL server restarted for maintenance, a managed database failing over, a SQLite file
whose lock another process holds past the busy timeout: for a while every call to the storage
fails, and then it answers again. A study shared by many processes and machines must not end
for that. ``OutageRetry`` is the rule every storage call of a study process follows: a call that
fails because the database does not answer waits and tries again, with back-off, for up to the
study's ``storage_outage`` seconds; whoever shows the study is told once that it waits, and
once that the database is back. Past the bound the call raises ``StorageOutage`` (one line for
the user), and the process gives up: its later calls fail at once, so that it ends promptly.

A retried call is a whole storage call (one transaction): one that failed was rolled back, so
trying it again records it once. The one exception is the narrow moment when a commit reached
the server but its answer was lost; a state change retried then finds the trial already
finished as asked, and ``adapter.RetryingStorage`` takes that as done.

Trials whose process stopped beating are failed as stale by the others (``_liveness``); after
an outage every live process's beats were refused too, so a process that saw the database fail
waits a grace period before it judges another process's trial stale (``troubled_within``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import sqlalchemy

from autotune.faults import wrapped
from autotune.storage._rdb import StudyError, driver_said, storage_problem

# A managed database fails over in one to two minutes, a restart for maintenance in seconds
DEFAULT_OUTAGE_SECONDS = 180.0
FIRST_RETRY_SECONDS = 0.5
LONGEST_RETRY_SECONDS = 4.0

T = TypeVar("T")


class StorageOutage(StudyError):
    """The study's database did not answer for longer than the study waits for it."""


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` (or anything it wraps) says the database did not answer for now (a
    server restarting or unreachable, a connection it dropped, SQLite's lock held past its busy
    timeout), as opposed to a fault that trying again cannot mend (a full disk, bad data)."""
    for current in wrapped(exc):
        if isinstance(current, StorageOutage):
            return False  # the wait is over already
        if isinstance(current, sqlalchemy.exc.DBAPIError) and current.connection_invalidated:
            return True  # SQLAlchemy's own verdict: the connection is gone
        if any(outage for _, outage in driver_said(current)):
            return True
    return False


_TROUBLE: dict[str, float] = {}  # storage URL -> time.monotonic() of its last refused call
_TROUBLE_LOCK = threading.Lock()


def note_trouble(url: str | None) -> None:
    """Say that the database at ``url`` refused a call just now (or has just answered again
    after refusing some)."""
    if url is not None:
        with _TROUBLE_LOCK:
            _TROUBLE[url] = time.monotonic()


def troubled_within(url: str | None, seconds: float) -> bool:
    """Whether this process saw the database at ``url`` refuse a call in the last ``seconds``."""
    with _TROUBLE_LOCK:
        last = _TROUBLE.get(url) if url is not None else None
    return last is not None and time.monotonic() - last < seconds


_no_retry = threading.local()  # depth: this thread's calls go to the database untried


class without_retry:
    """In this block, on this thread, storage calls do not wait for the database: a call the
    database refuses raises at once (a claim's renewal or a best-effort write, which must go
    stale rather than hold anything up)."""

    def __enter__(self) -> None:
        _no_retry.depth = getattr(_no_retry, "depth", 0) + 1

    def __exit__(self, *exc: object) -> None:
        _no_retry.depth -= 1


@dataclass
class OutageRetry:
    """How long a process's storage calls wait for a database that stopped answering
    (``seconds``; 0 waits not at all) and who is told: ``on_wait(problem, seconds)`` once when
    a call starts waiting (the problem in a few words, the seconds it may wait),
    ``on_back(seconds)`` once when the database answers again after that many seconds."""

    seconds: float = DEFAULT_OUTAGE_SECONDS
    url: str | None = None
    on_wait: Callable[[str, float], None] | None = None
    on_back: Callable[[float], None] | None = None
    gave_up: bool = False  # past the bound once: the process is ending, nothing waits again
    _waiting_since: float | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def call(self, function: Callable[..., T], *args: object, **kwargs: object) -> T:
        """``function(*args, **kwargs)``, tried again while the database does not answer, up
        to the bound; StorageOutage past it. A call made inside another (a storage method
        that calls another) is tried by the outer one only."""
        if getattr(_no_retry, "depth", 0):
            return function(*args, **kwargs)
        with without_retry():  # what it calls in turn
            return self._patiently(function, *args, **kwargs)

    def _patiently(self, function: Callable[..., T], *args: object, **kwargs: object) -> T:
        started: float | None = None
        delay = FIRST_RETRY_SECONDS
        while True:
            try:
                result = function(*args, **kwargs)
            except Exception as error:
                if not is_outage(error):
                    raise
                note_trouble(self.url)
                now = time.monotonic()
                started = now if started is None else started
                problem = storage_problem(error) or "the database does not answer"
                left = self.seconds - (now - started)
                if self.gave_up or left <= 0:
                    self.gave_up = True
                    raise StorageOutage(
                        f"the study's database did not answer for {self.seconds:g} s "
                        f"({problem}); study.storage_outage says how long a study waits for "
                        f"it. A trial left running is recorded as interrupted, and queued "
                        f"again, by the next run on this study"
                    ) from error
                self._waiting(problem)
                time.sleep(min(delay, left))
                delay = min(2 * delay, LONGEST_RETRY_SECONDS)
                continue
            if started is not None:
                self._back()
            return result

    def _waiting(self, problem: str) -> None:
        with self._lock:
            first = self._waiting_since is None
            if first:
                self._waiting_since = time.monotonic()
        if first and self.on_wait is not None:
            self.on_wait(problem, self.seconds)

    def _back(self) -> None:
        with self._lock:
            since, self._waiting_since = self._waiting_since, None
        note_trouble(self.url)  # its processes' beats were refused too: judge none stale yet
        if since is not None and self.on_back is not None:
            self.on_back(time.monotonic() - since)
