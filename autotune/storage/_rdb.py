"""Where studies live: Optuna RDB storages (SQLite, PostgreSQL), opened as asked, with every
fault they raise said in one line (see ``_liveness`` for the processes that share them)."""

from __future__ import annotations

import copy
import errno
import os
import re
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import optuna
import sqlalchemy
from optuna.exceptions import ExperimentalWarning
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial

from autotune.errors import UserError
from autotune.faults import wrapped
from autotune.files import OutputFileError, make_folder_for
from autotune.storage._records import TrialRecord

SQLITE_BUSY_TIMEOUT_SECONDS = 60
STORAGE_OPEN_ATTEMPTS = 5
STALE_BEATS = 3  # heartbeats a running trial may miss before it is stale (its process is lost)


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
        # experimental, but stable since Optuna 2.8
        with warnings.catch_warnings(action="ignore", category=ExperimentalWarning):
            self._retry = RetryHeartbeatStaleTrialCallback(max_retry=1)

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        clean = copy.deepcopy(trial)
        record = TrialRecord.of(trial)
        clean.user_attrs = TrialRecord(
            baseline=record.baseline, checklist=record.checklist
        ).to_attrs()
        kept = self.KEPT_SYSTEM_ATTRS
        clean.system_attrs = {k: v for k, v in trial.system_attrs.items() if k in kept}
        self._retry(study, clean)


Access = Literal["create", "write", "read"]
OPTUNA_TABLES = frozenset({"studies", "trials", "version_info"})
_SQLITE_PREFIX = "sqlite:///"


def display_url(url: str) -> str:
    """``url`` as it may be shown or stored: its password (and a ``password=`` query value)
    replaced by ``***``; a URL that does not parse has everything between ``//`` and ``@``
    masked."""
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except Exception:  # SQLAlchemy raises several kinds for a malformed URL
        return re.sub(r"//[^/]*@", "//***@", url)
    secret_keys = [key for key in parsed.query if "password" in key.lower()]
    if parsed.password is None and not secret_keys:
        return url  # shown exactly as given (SQLAlchemy would re-quote a SQLite path)
    masked = parsed.update_query_dict({key: "***" for key in secret_keys})
    return masked.render_as_string(hide_password=True).replace("%2A%2A%2A", "***")


def password_note(url: str) -> str:
    """What to tell a user who copies a command whose ``--storage`` shows ``***`` for the
    password; "" when ``url`` has none."""
    if display_url(url) == url:
        return ""
    return "(--storage shows the password as ***: put yours in its place)"


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URL; None for other storages and memory."""
    if not url.startswith(_SQLITE_PREFIX) or url == "sqlite:///:memory:":
        return None
    return Path(url.removeprefix(_SQLITE_PREFIX))


def _url_problem(url: str) -> str | None:
    """Why ``url`` cannot hold a study that outlives the command; None when it can."""
    scheme = url.partition("://")[0].split("+")[0].lower() if "://" in url else ""
    if scheme == "sqlite" and sqlite_path(url) is None:
        return (
            "a SQLite study in memory is lost when the command ends; give a file, sqlite:///PATH"
        )
    if scheme not in ("sqlite", "postgresql", "mysql"):
        return "autotune keeps studies in sqlite:///PATH or postgresql://USER@HOST/DATABASE"
    return None


# What database drivers say (lowercased), what it means in a few words (None: no more than that
# the database does not answer), and whether it is an outage that trying again may mend: a
# server restarting, failing over or unreachable for a moment, a connection it dropped, SQLite's
# lock held past its busy timeout
_DRIVER_PHRASES: tuple[tuple[tuple[str, ...], str | None, bool], ...] = (
    (("database or disk is full",), "the disk is full", False),
    (("disk i/o error",), "a disk I/O error (is the disk full?)", False),
    (("attempt to write a readonly database", "read-only transaction"), "it is read-only", False),
    (
        ("file is not a database", "database disk image is malformed"),
        "the database file is damaged (not a database, or malformed)",
        False,
    ),
    (
        ("unable to open database file",),
        "the database file cannot be opened (permissions?)",
        False,
    ),
    (("password authentication failed",), "the password or user name is wrong", False),
    (("connection refused", "could not connect", "connection failed"), "no server answers", True),
    (
        # "the database system is" starting up / shutting down / in recovery mode
        ("server closed the connection", "terminating connection", "the database system is"),
        "its server restarts",
        True,
    ),
    (("database is locked",), "another process holds its lock", True),
    (("connection is closed", "connection already closed", "consuming input failed"), None, True),
    (("no connection to the server", "ssl syscall error", "connection timed out"), None, True),
    (("connection reset", "could not receive data", "could not send data"), None, True),
)


def driver_said(error: BaseException) -> list[tuple[str | None, bool]]:
    """(problem, outage) of each of the ``_DRIVER_PHRASES`` that ``error``'s own text holds."""
    text = str(error).lower()
    return [
        (problem, outage)
        for needles, problem, outage in _DRIVER_PHRASES
        if any(needle in text for needle in needles)
    ]


def storage_problem(exc: BaseException) -> str | None:
    """What went wrong with the storage, in a few words ("the disk is full", "it is read-only",
    "the database file is damaged ..."), read from ``exc`` and everything it ``wrapped``; None
    when it is not a storage fault."""
    for current in wrapped(exc):
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return "the disk is full"
        if isinstance(current, OSError) and current.errno == errno.EROFS:
            return "it is read-only"
        if isinstance(current, PermissionError):
            return f"permission denied ({current.filename or 'a file or folder'})"
        for problem, _ in driver_said(current):
            if problem is not None:
                return problem
    return None


def _check_sqlite_study(path: Path) -> None:
    """Refuse, in one line, a SQLite file that is missing, damaged or holds no Optuna study
    tables; it is read through a read-only connection that changes nothing (immutable)."""
    if not path.is_file():
        raise StudyError(
            f"no study database at {path.absolute()}; name the storage with --storage URL "
            "(or set AUTOTUNE_STORAGE)"
        )
    try:
        if path.stat().st_size == 0:
            raise StudyError(f"{path} is not an autotune study database (it is empty)")
        query = _read_only_query(path, follow_writers=False)
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?{query}", uri=True)
        try:
            checked = connection.execute("PRAGMA quick_check").fetchone()
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        finally:
            connection.close()
    except (OSError, sqlite3.Error) as err:
        raise StudyError(f"cannot read {path}: {storage_problem(err) or err}") from None
    if checked is None or checked[0] != "ok":
        raise StudyError(f"cannot read {path}: the database file is damaged ({checked})")
    if not tables >= OPTUNA_TABLES:
        raise StudyError(f"{path} is not an autotune study database")


def _unwritable(path: Path) -> str | None:
    """Why SQLite could not write ``path`` (the file, or its folder where the ``-wal`` journal
    goes, is read-only); None when it can."""
    if path.exists() and not os.access(path, os.W_OK):
        return "it is read-only"
    if path.parent.exists() and not os.access(path.parent, os.W_OK):
        return f"its folder {path.parent} is read-only"
    return None


def _read_only_query(path: Path, follow_writers: bool) -> str:
    """The URI query that opens ``path`` read-only. A WAL database with no ``-wal`` file beside
    it (no writer now) is opened immutable, since plain ``mode=ro`` would create the ``-wal``
    and ``-shm`` files; ``follow_writers`` (a long-lived reader such as the dashboard) keeps
    plain ``mode=ro`` so that it sees a study that runs later.

    The header is read only where no ``-wal`` file is there: while one is, a connection of this
    process may hold the file, and closing any other descriptor of it drops every POSIX lock the
    process holds on it (SQLite's "how to corrupt", 2.2): another process then checkpoints and
    removes the journal under this one's connections ("database disk image is malformed")."""
    if follow_writers or path.with_name(path.name + "-wal").exists():
        return "mode=ro"
    with path.open("rb") as file:
        in_wal = file.read(20)[18:20] == b"\x02\x02"  # the header's file format versions
    return "mode=ro&immutable=1" if in_wal else "mode=ro"


def open_storage(
    url: str,
    access: Access = "create",
    heartbeat_interval: int | None = None,
    follow_writers: bool = False,
) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage for ``url``.

    ``access``: "create" (``autotune run``) creates a SQLite file's folder and Optuna's tables
    when missing and sets WAL mode; "write" opens an existing study database to add to it
    (``confirm``, the note); "read" opens an existing one read-only and changes nothing: a
    SQLite file is checked first (``PRAGMA quick_check`` on a read-only connection), then opened
    with ``mode=ro``; a PostgreSQL session is read-only. A missing, empty, damaged or foreign
    file is a StudyError of one line. With ``heartbeat_interval`` (seconds) running trials
    beat (``optuna_storage``), and one that is stale is failed as interrupted and retried once.
    """
    shown = display_url(url)
    if (problem := _url_problem(url)) is not None:
        raise StudyError(f"storage {shown}: {problem}")
    path = sqlite_path(url)
    connect_args: dict[str, Any] = {}
    target = url
    if path is not None:
        unwritable = _unwritable(path) if access != "read" else None
        if unwritable is not None:
            raise StudyError(f"cannot write the study to {path}: {unwritable}")
        if access == "create":
            try:
                make_folder_for(path)  # studies/; never the folders above it (a typo)
            except OutputFileError as err:
                raise StudyError(str(err)) from None
            except OSError as err:
                raise StudyError(
                    f"cannot create {path.parent}: {storage_problem(err) or err}"
                ) from None
        else:
            _check_sqlite_study(path)
        if access == "read":
            query = _read_only_query(path, follow_writers)
            target = f"{_SQLITE_PREFIX}file:{quote(str(path.resolve()))}?{query}&uri=true"
        connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_SECONDS}
    elif access == "read" and url.startswith("postgresql"):
        connect_args = {"options": "-c default_transaction_read_only=on"}
    retry_stale = _RetryOnce() if heartbeat_interval is not None else None
    options = {
        "skip_table_creation": access != "create",
        "heartbeat_stale_trial_callback": retry_stale,
    }
    for attempt in range(STORAGE_OPEN_ATTEMPTS):
        try:
            storage = optuna_storage(target, connect_args, heartbeat_interval, **options)
            break
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as err:
            # another process is creating the same new database's tables right now
            racing = isinstance(err, sqlalchemy.exc.IntegrityError) or "already exists" in str(err)
            if not racing or attempt == STORAGE_OPEN_ATTEMPTS - 1:
                raise StudyError(_open_error(shown, err)) from None
            time.sleep(0.2 * (attempt + 1))
        except Exception as err:  # SQLAlchemy raises many kinds for a bad URL or server
            raise StudyError(_open_error(shown, err)) from None
    if path is not None and access != "read":
        # WAL lets optuna-dashboard and other autotune processes read while a study writes.
        try:
            with storage.engine.connect() as connection:
                connection.exec_driver_sql("PRAGMA journal_mode=WAL")
        except sqlalchemy.exc.SQLAlchemyError as err:
            raise StudyError(_open_error(shown, err)) from None
        # In WAL mode, synchronous=NORMAL cannot corrupt the database; a power cut may lose
        # its last commits, and the heartbeat recovers their trial. A trial writes some sixty
        # attributes, each its own commit: 1.4 ms each with a sync, 0.6 ms without, and the
        # commits of several workers on one study take turns.
        sqlalchemy.event.listen(storage.engine, "connect", _synchronous_normal)
        storage.engine.dispose()  # the pooled connections were made before: made again
    return storage


def optuna_storage(
    url: str, connect_args: dict[str, Any], heartbeat_interval: int | None, **options: Any
) -> optuna.storages.RDBStorage:
    """Optuna's storage of ``url``. With ``heartbeat_interval`` (seconds) running trials beat,
    and one that missed ``STALE_BEATS`` beats is stale."""
    if heartbeat_interval is not None:
        options["heartbeat_interval"] = heartbeat_interval
        options["grace_period"] = STALE_BEATS * heartbeat_interval
    with warnings.catch_warnings(action="ignore", category=ExperimentalWarning):  # heartbeats
        engine = {"connect_args": connect_args}
        return optuna.storages.RDBStorage(url, engine_kwargs=engine, **options)


def _synchronous_normal(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _open_error(shown: str, err: BaseException) -> str:
    """The one line that says why the storage ``shown`` (a masked URL) did not open."""
    imports = [e for e in wrapped(err) if isinstance(e, ImportError)]
    missing = imports[-1] if imports else None  # the innermost names the module
    if missing is not None and shown.startswith("postgresql"):
        return (
            f"cannot open storage {shown}: its driver is not installed ({missing}); "
            f"pip install 'autotune[postgres]' and use a postgresql+psycopg:// URL"
        )
    if missing is not None:
        return f"cannot open storage {shown}: its database driver is not installed ({missing})"
    problem = storage_problem(err)
    detail = problem or f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return f"cannot open storage {shown}: {detail}"
