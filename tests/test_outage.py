"""A study rides out its database's restart: storage calls wait for a database that stops
answering (a real SQLite lock held past the busy timeout, a real PostgreSQL server stopped with
``pg_ctl stop -m immediate`` and started again), up to ``study.storage_outage`` seconds, and
past it the run ends in one line, its trial recovered by the next run."""

from __future__ import annotations

import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from autotune.storage import adapter
from autotune.storage._outage import is_outage, troubled_within
from autotune.study import (
    OutageRetry,
    StorageOutage,
    TrialRecord,
    storage_problem,
    without_retry,
)
from autotune.testing import start_cli, write_space


def _locked_study(tmp_path: Path, retry: OutageRetry) -> tuple[optuna.Study, Path]:
    """A study on a SQLite file whose busy timeout is a tenth of a second, through a
    RetryingStorage with ``retry``."""
    path = tmp_path / "outage.db"
    backend = optuna.storages.RDBStorage(
        f"sqlite:///{path}", engine_kwargs={"connect_args": {"timeout": 0.1}}
    )
    retry.url = backend.url
    study = optuna.create_study(
        study_name="outage", storage=adapter.RetryingStorage(backend, retry)
    )
    return study, path


def _hold_lock(path: Path, seconds: float) -> threading.Thread:
    """Another process's exclusive lock on the database at ``path`` for ``seconds``."""
    locker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    locker.execute("BEGIN EXCLUSIVE")

    def release() -> None:
        time.sleep(seconds)
        locker.rollback()
        locker.close()

    thread = threading.Thread(target=release)
    thread.start()
    return thread


def test_what_a_driver_says_is_an_outage_to_wait_for_or_a_problem_to_name():
    def said(text: str) -> sqlalchemy.exc.OperationalError:  # as SQLAlchemy wraps psycopg's
        return sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception(text))

    restart = said("server closed the connection unexpectedly")
    assert is_outage(restart) and storage_problem(restart) == "its server restarts"
    dropped = said("consuming input failed: SSL SYSCALL error: EOF detected")
    assert is_outage(dropped) and storage_problem(dropped) is None
    locked = said("(sqlite3.OperationalError) database is locked")
    assert is_outage(locked) and storage_problem(locked) == "another process holds its lock"
    full = said("(sqlite3.OperationalError) database or disk is full")
    assert not is_outage(full) and storage_problem(full) == "the disk is full"
    assert not is_outage(ValueError("a bug")) and storage_problem(ValueError("a bug")) is None


def test_a_call_inside_a_retried_call_is_retried_by_the_outer_one_only():
    retry, calls = OutageRetry(30), []

    def inner() -> str:
        calls.append("inner")
        if len(calls) == 2:  # the first time: the database is locked
            raise sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("database is locked"))
        return "done"

    def outer() -> str:
        calls.append("outer")
        return retry.call(inner)

    assert retry.call(outer) == "done"
    assert calls == ["outer", "inner", "outer", "inner"]  # the whole outer call again
    with without_retry(), pytest.raises(sqlalchemy.exc.OperationalError):
        calls.clear()
        retry.call(outer)  # refused at once: not waited for


def test_a_storage_call_waits_for_a_locked_database_and_goes_on(tmp_path: Path):
    said: list[tuple[str, object]] = []
    retry = OutageRetry(
        30,
        on_wait=lambda problem, seconds: said.append(("wait", problem)),
        on_back=lambda seconds: said.append(("back", seconds)),
    )
    study, path = _locked_study(tmp_path, retry)
    trial = study.ask()
    released = _hold_lock(path, 1.5)
    trial.set_user_attr("kept", 1)  # waits for the lock, then writes once
    released.join()
    assert study.trials[0].user_attrs == {"kept": 1}
    assert [what for what, _ in said] == ["wait", "back"]  # said once each, however many tries
    assert said[0][1] == "another process holds its lock"
    assert 1.0 < float(said[1][1]) < 20  # type: ignore[arg-type]
    assert troubled_within(retry.url, 60)  # no trial is judged stale for a while now
    # a fault that trying again cannot mend is raised at once, without waiting
    study.tell(trial, 1.0)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        trial.set_user_attr("late", 2)
    assert len(said) == 2
    # a best-effort write (a claim's renewal) does not wait at all
    released = _hold_lock(path, 1.0)
    started = time.monotonic()
    with pytest.raises(optuna.exceptions.StorageInternalError), without_retry():
        study.set_user_attr("renewal", 1)
    assert time.monotonic() - started < 0.9 and len(said) == 2
    released.join()


def test_past_its_bound_a_storage_call_gives_up_in_one_line_and_waits_no_more(tmp_path: Path):
    waits: list[str] = []
    retry = OutageRetry(0.5, on_wait=lambda problem, seconds: waits.append(problem))
    study, path = _locked_study(tmp_path, retry)
    released = _hold_lock(path, 1.5)  # past the 0.5 s bound, and the second call after it
    with pytest.raises(StorageOutage) as refused:
        study.set_user_attr("first", 1)
    assert str(refused.value).startswith(
        "the study's database did not answer for 0.5 s (another process holds its lock); "
        "study.storage_outage says how long a study waits for it."
    )
    assert retry.gave_up and waits == ["another process holds its lock"]
    started = time.monotonic()
    with pytest.raises(StorageOutage):  # the process is ending: nothing waits again
        study.set_user_attr("second", 1)
    assert time.monotonic() - started < 0.5
    released.join()
    study.set_user_attr("third", 1)  # a database that answers is written to as ever
    assert study.user_attrs == {"third": 1}


SPACE = """\
study:
  name: {name}
  n_trials: {n_trials}
  n_startup_trials: 2
  pruner: none
  seed: 0
  heartbeat_interval: 1
  storage_outage: {outage}
  confirm: false
  strategy: joint  # no stage 1: trials from the start
  isolation: none  # trials in the study process: a worker touches no database
workload:
  model: autotune.testing:tiny_mlp
  data: autotune.testing:blobs
  data_args: {{train_delay_seconds: {delay}}}
  epochs: 1
  eval_every: 0.25
  device: cpu
space:
  lr: {{low: 1.0e-3, high: 1.0e-1, log: true}}
  batch_size: [32]
"""


def _running(url: str, name: str, evaluated: bool = False) -> int:
    """How many trials of study ``name`` run with their parameters sampled (and, if
    ``evaluated``, an evaluation recorded); 0 while the study does not exist."""
    try:
        study = optuna.load_study(study_name=name, storage=url)
    except KeyError:
        return 0
    trials = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    return sum(1 for t in trials if t.params and (t.intermediate_values or not evaluated))


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds; fail saying ``what`` never happened."""
    deadline = time.monotonic() + 240
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.2)


def _assert_nothing_lost(url: str, name: str, n_trials: int) -> list[optuna.trial.FrozenTrial]:
    """The fault matrix's invariants; the study's failed trials."""
    study = optuna.load_study(study_name=name, storage=url)
    assert not study.get_trials(states=(TrialState.RUNNING,))
    counted = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(counted) == n_trials  # not exceeded, nothing counted twice
    for trial in study.trials:
        if trial.state != TrialState.COMPLETE:
            record = TrialRecord.of(trial)
            assert record.fail_kind and record.fail_msg, trial
    baselines = [t for t in study.trials if TrialRecord.of(t).baseline]
    assert sum(1 for t in baselines if t.state == TrialState.COMPLETE) == 1
    return study.get_trials(states=(TrialState.FAIL,))


@pytest.mark.slow
def test_two_processes_ride_out_a_postgresql_restart_and_one_past_its_bound_ends_cleanly(
    postgres_to_restart, tmp_path: Path
):
    """Three processes of two studies on one server, each as if on a machine of its own (no
    turns to take: each trains through the outage): the two that wait up to 180 s ride out
    the restart, the one that waits 1 s ends in one line, and its next run recovers its
    trial."""
    server, url = postgres_to_restart.server, postgres_to_restart.url
    # the riders' trials last about 8 s (256 samples of 0.03 s): both must be training at once
    # though three processes start torch on two cores, some seconds apart (at 2.6 s a trial,
    # one rider sometimes took both trials before the other started, and the wait ran out)
    riding = SPACE.format(name="riding", n_trials=2, outage=180, delay=0.03)
    write_space(tmp_path, riding, name="a.yaml")
    giving_up = SPACE.format(name="giving-up", n_trials=1, outage=1, delay=0.01)
    write_space(tmp_path, giving_up, name="b.yaml")

    def start(space: str, machine: str) -> subprocess.Popen[str]:
        env = {"AUTOTUNE_MACHINE_DIR": str(tmp_path / machine)}
        return start_cli("run", space, "--storage", url, cwd=tmp_path, env=env)

    riders = [start("a.yaml", f"machine-{index}") for index in range(2)]
    quitter = start("b.yaml", "machine-2")
    _wait_until(
        lambda: _running(url, "riding") == 2 and _running(url, "giving-up", evaluated=True),
        "two trials of riding and an evaluated one of giving-up running together",
    )
    server.stop("immediate")  # a crash: every connection cut mid-whatever
    stopped = time.monotonic()

    # past study.storage_outage: one line, exit 2
    stdout, stderr = quitter.communicate(timeout=120)
    assert quitter.returncode == 2, stdout + stderr
    assert "the study's database does not answer (" in stdout
    assert stderr.strip().startswith(
        "error: the study's database did not answer for 1 s (no server answers)"
    ), stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1

    # down longer than the grace period (3 heartbeat intervals, 3 s): beats refused meanwhile
    # judge nobody stale. Back soon after: the riders' retries (0.5, 1.5, 3.5 s after their
    # first failure, then 7.5 s) meet it at the third, or the fourth on a busy machine
    time.sleep(max(0.0, stopped + 3.2 - time.monotonic()))
    server.start()
    # the next run of the one that gave up records its trial and goes on
    rerun = start("b.yaml", "machine-2")
    for process in riders:
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stdout + stderr
        # each was training a trial: it said it waited, and that the database came back
        assert "the study's database does not answer (" in stdout, stdout
        assert "the study's database answers again after" in stdout, stdout
    assert _assert_nothing_lost(url, "riding", 2) == []  # no trial interrupted, none lost
    stdout, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stdout + stderr
    (interrupted,) = _assert_nothing_lost(url, "giving-up", 1)
    assert TrialRecord.of(interrupted).fail_kind == "interrupted"


def test_a_confirmation_lock_that_a_restart_took_away_still_keeps_others_out(
    postgres, monkeypatch: pytest.MonkeyPatch
):
    """A PostgreSQL advisory lock lives on its connection: a database restart ends it while
    its holder works on. The lease beside it keeps a waiting process out until the holder is
    done, and a holder that died without releasing it keeps nobody out for long (the lease
    beats every half second here rather than every 2 s: the same rule, four times faster)."""
    from autotune.storage import _liveness
    from autotune.study import open_storage, study_lock

    monkeypatch.setattr(_liveness, "LEASE_INTERVAL", 0.5)
    grace, interval = _liveness.LEASE_GRACE, _liveness.LEASE_INTERVAL

    name = f"leased-{time.monotonic_ns()}"
    optuna.create_study(study_name=name, storage=open_storage(postgres.url))

    def process() -> optuna.Study:  # each with its own engine, as another process has
        return optuna.load_study(study_name=name, storage=open_storage(postgres.url))

    inside, leave, events = threading.Event(), threading.Event(), []

    def holder() -> None:
        with study_lock(process(), "confirm", held_long=True):
            inside.set()
            leave.wait(60)
            events.append("holder done")

    def waiter() -> None:
        def waiting() -> None:
            events.append("waiter waits")

        with study_lock(process(), "confirm", waiting, held_long=True):
            events.append("waiter in")

    first = threading.Thread(target=holder)
    first.start()
    assert inside.wait(30)
    # the holder's lock connection is cut, as a restart cuts it: its advisory lock is gone
    engine = sqlalchemy.create_engine(postgres.url)
    with engine.connect() as connection:
        cut = connection.execute(
            sqlalchemy.text(
                "SELECT pg_terminate_backend(pid) FROM pg_locks "
                "WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()"
            )
        ).all()
    assert cut == [(True,)]
    second = threading.Thread(target=waiter)
    second.start()
    time.sleep((grace + 2) * interval)  # longer than the lease's grace
    assert events == ["waiter waits"]  # kept out, though the advisory lock was free
    leave.set()
    first.join(30)
    second.join(30)
    assert events == ["waiter waits", "holder done", "waiter in"]

    # a holder that died leaves its lease behind: taken over once its beat stood still
    study = process()
    adapter.set_study_system_attr(
        study, f"autotune:lease:autotune:confirm:{name}", {"owner": "dead", "beat": 7}
    )
    started = time.monotonic()
    with study_lock(study, "confirm", held_long=True):
        waited = time.monotonic() - started
    assert grace * interval <= waited < (grace + 3) * interval
    engine.dispose()


def test_a_lease_whose_beat_hangs_is_let_go_within_its_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A beat that hangs on a database that stopped answering (a partition: no refusal comes)
    must not hold the confirmation round's end: release waits LEASE_GRACE intervals at most
    and leaves the lease to go stale, as another process judges it anyway; a beat that
    answers is waited for and the lease cleared."""
    from autotune.storage import _liveness

    monkeypatch.setattr(_liveness, "LEASE_INTERVAL", 0.05)
    monkeypatch.setattr(_liveness, "LEASE_GRACE", 40)  # 2 s: a slow commit is still waited for
    url = f"sqlite:///{tmp_path}/lease.db"
    study = optuna.create_study(study_name="leased", storage=url)
    lease = _liveness._Lease(study, "confirm")
    lease.take()
    time.sleep(0.2)  # beats land
    lease.release()
    assert adapter.study_system_attr(study, lease.key) is None  # cleared

    hang, writes = threading.Event(), []
    real = adapter.set_study_system_attr

    def hanging(study: optuna.Study, key: str, value: object) -> None:
        if isinstance(value, dict) and value.get("beat"):  # a beat: the database is gone
            hang.wait(30)
        writes.append(value)
        real(study, key, value)

    monkeypatch.setattr(adapter, "set_study_system_attr", hanging)
    stuck = _liveness._Lease(study, "confirm")
    stuck.take()
    time.sleep(0.2)  # its first beat hangs
    started = time.monotonic()
    stuck.release()
    assert time.monotonic() - started < _liveness.LEASE_GRACE * 0.05 + 1.0
    assert None not in writes  # not cleared through a database that does not answer
    assert adapter.study_system_attr(study, stuck.key)["owner"] == stuck.owner
    hang.set()  # the database answers the hung beat: its thread clears what it wrote
    assert stuck._thread is not None
    stuck._thread.join(5)
    assert adapter.study_system_attr(study, stuck.key) is None
