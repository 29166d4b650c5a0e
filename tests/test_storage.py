"""Storages under real faults: readers that change nothing, damaged, read-only and full
databases said in one line, and passwords that are never shown or stored."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

import autotune
from autotune.study import (
    ConfirmationRecord,
    ConfirmRun,
    StudyError,
    StudyRecord,
    TrialRecord,
    answer_trial,
    display_url,
    open_storage,
    storage_problem,
)
from autotune.testing import import_blocker, run_cli, run_python, write_space

# root ignores file modes; without these two capabilities it meets them as anyone does
WITHOUT_ROOT_OVERRIDE = ("setpriv", "--bounding-set=-dac_override,-dac_read_search")


def _space(directory: Path, n_trials: int = 2) -> Path:
    """The tiny space file, trained in this process (no worker), in one stage (no stage 1)
    and not confirmed: quick."""
    space = write_space(directory, n_trials=n_trials)
    quick = "  seed: 0\n  confirm: false\n  isolation: none\n  strategy: joint\n"
    space.write_text(space.read_text().replace("  seed: 0\n", quick))
    return space


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_error_line(done: subprocess.CompletedProcess[str], code: int, expected: str) -> None:
    assert done.returncode == code, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines


@pytest.fixture(scope="module")
def ran_once(tmp_path_factory: pytest.TempPathFactory, invoke_cli) -> Path:
    """A folder in which ``autotune run`` made a two-trial study (studies/autotune.db): the
    one run every test here reads a copy of."""
    folder = tmp_path_factory.mktemp("ran")
    done = invoke_cli("run", str(_space(folder)), cwd=folder)
    assert done.returncode == 0, done.stderr
    return folder


@pytest.fixture
def study_copy(ran_once: Path, tmp_path: Path) -> Path:
    """A copy of the study's folder (space file, studies/autotune.db) for one test."""
    folder = tmp_path / "work"
    shutil.copytree(ran_once, folder)
    return folder


def test_display_url_masks_the_password():
    assert display_url("postgresql+psycopg://u:S3cret@h:5432/db") == (
        "postgresql+psycopg://u:***@h:5432/db"
    )
    assert display_url("sqlite:///studies/a b.db") == "sqlite:///studies/a b.db"  # as given
    assert display_url("postgresql://u@h/db?password=S3cret") == "postgresql://u@h/db?password=***"
    assert display_url("postgresql://u:S3cret@h:notaport/db") == "postgresql://***@h:notaport/db"


@pytest.mark.slow
def test_readers_change_nothing(invoke_cli, study_copy: Path):
    db = study_copy / "studies" / "autotune.db"
    before, files = _sha256(db), sorted(p.name for p in db.parent.iterdir())
    for command in (["best", "--study", "tiny"], ["studies"], ["export", "--study", "tiny"]):
        done = invoke_cli(*command, cwd=study_copy)
        assert done.returncode == 0, done.stderr
    assert autotune.load_best("tiny", storage=f"sqlite:///{db}").trial >= 0
    assert _sha256(db) == before
    assert sorted(p.name for p in db.parent.iterdir()) == files  # no -wal, -shm, artifacts


@pytest.mark.slow
def test_missing_empty_foreign_and_damaged_files_are_one_line(invoke_cli, study_copy: Path):
    folder = study_copy / "studies"
    (folder / "empty.db").write_bytes(b"")
    with sqlite3.connect(folder / "foreign.db") as connection:
        connection.execute("CREATE TABLE notes (text)")
    damaged = folder / "damaged.db"
    shutil.copy(folder / "autotune.db", damaged)
    with damaged.open("r+b") as file:  # garbage over the pages after the first
        file.seek(4096)
        file.write(b"\xde\xad\xbe\xef" * 2048)
    cases = {
        # where it looked, as an absolute path: a relative URL is read from the current folder
        "missing.db": f"no study database at {(folder / 'missing.db').resolve()}; name the "
        "storage with --storage URL (or set AUTOTUNE_STORAGE)",
        "empty.db": "studies/empty.db is not an autotune study database",
        "foreign.db": "studies/foreign.db is not an autotune study database",
        "damaged.db": "cannot read studies/damaged.db: the database file is damaged",
    }
    hashes = {name: _sha256(folder / name) for name in cases if (folder / name).exists()}
    files = sorted(p.name for p in folder.iterdir())
    for name, expected in cases.items():
        done = invoke_cli("best", "--study", "tiny", "--storage", f"sqlite:///studies/{name}",
                          cwd=study_copy)  # fmt: skip
        _one_error_line(done, 1, expected)
    assert {name: _sha256(folder / name) for name in hashes} == hashes
    assert sorted(p.name for p in folder.iterdir()) == files
    with pytest.raises(StudyError, match="damaged"):  # `run` is told too, before Optuna
        open_storage(f"sqlite:///{damaged}", "write")


def test_storage_problem_reads_through_the_wrappers(tmp_path: Path):
    """The exceptions SQLAlchemy and Optuna really raise, wrapped as they wrap them."""
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database " * 100)
    with pytest.raises(Exception) as raised:
        optuna.storages.RDBStorage(f"sqlite:///{garbage}")
    assert storage_problem(raised.value) == (
        "the database file is damaged (not a database, or malformed)"
    )
    good = tmp_path / "good.db"
    open_storage(f"sqlite:///{good}", "create")
    engine = sqlalchemy.create_engine(f"sqlite:///file:{good}?mode=ro&uri=true")
    with pytest.raises(sqlalchemy.exc.OperationalError) as raised, engine.connect() as connection:
        connection.exec_driver_sql("DELETE FROM studies")
    try:
        raise optuna.exceptions.StorageInternalError("wrapped") from raised.value
    except optuna.exceptions.StorageInternalError as wrapped:
        assert storage_problem(wrapped) == "it is read-only"
    assert storage_problem(ValueError("a bug")) is None


def test_a_missing_database_driver_is_named_in_one_line():
    # SQLAlchemy raises its own ImportError from the driver's: the driver's names the module
    with pytest.raises(StudyError) as refused:
        open_storage("postgresql+psycopg2://u@127.0.0.1:1/none")
    assert "its driver is not installed (No module named 'psycopg2')" in str(refused.value)
    assert "pip install 'autotune[postgres]'" in str(refused.value)


def test_a_study_record_stores_its_confirmation_round_as_json_and_reads_it_back():
    run = ConfirmRun(
        3, 1, 7, value=0.5, score=0.9, samples_per_second=1e3, feasible=True, wall_seconds=2.0
    )
    confirmation = ConfirmationRecord(2, 3, True, candidates=(3, 0), baseline=0, runs=(run,))
    attrs = StudyRecord(metric="accuracy_per_second", confirmation=confirmation).to_attrs()
    stored = json.loads(json.dumps(attrs))  # as Optuna stores a user attribute
    assert StudyRecord.from_attrs(stored) == StudyRecord(
        metric="accuracy_per_second", confirmation=confirmation
    )


# the commands, each as Typer runs it (a bug's traceback on stderr), in one process kept from
# overriding file modes: one interpreter to start, not one a command; what each said as JSON
_AS_A_USER = """
import json, sys
from typer.testing import CliRunner
from autotune.cli import app
said = [CliRunner().invoke(app, args, catch_exceptions=False) for args in json.loads(sys.argv[1])]
print(json.dumps([(done.exit_code, done.stdout, done.stderr) for done in said]))
"""


@pytest.mark.slow
def test_a_read_only_study_is_read_and_reported_but_not_run(study_copy: Path, tmp_path: Path):
    folder = study_copy / "studies"
    db = folder / "autotune.db"
    before = _sha256(db)
    files = sorted(p.name for p in folder.iterdir())  # the database, and run's lock file
    out = tmp_path / "out"
    out.mkdir()
    db.chmod(0o444)
    folder.chmod(0o555)
    try:
        commands = [
            ["best", "--study", "tiny"],
            ["report", "-o", str(out / "r.html"), "--study", "tiny"],
            ["export", "-o", str(out / "t.py"), "--study", "tiny"],
            ["run", "tiny.yaml"],
        ]
        ran = run_python(
            _AS_A_USER, json.dumps(commands), cwd=study_copy, wrapper=WITHOUT_ROOT_OVERRIDE
        )
        said = json.loads(ran.stdout.splitlines()[-1])  # (exit code, stdout, stderr) each
        best, report, export, again = (
            subprocess.CompletedProcess(command, *what)
            for command, what in zip(commands, said, strict=True)
        )
        assert best.returncode == 0 and "tiny: trial" in best.stdout, best.stderr
        for done in (report, export):
            assert done.returncode == 0, done.stderr
            warning = [line for line in done.stdout.splitlines() if "Warning:" in line]
            assert len(warning) == 1 and "could not be attached" in warning[0], done.stdout
            assert "read-only" in warning[0]
        assert (out / "r.html").exists() and (out / "t.py").exists()
        _one_error_line(again, 2, "cannot write the study to studies/autotune.db: it is")
        assert "read-only" in again.stderr
    finally:
        folder.chmod(0o755)
        db.chmod(0o644)
    assert _sha256(db) == before
    assert sorted(p.name for p in folder.iterdir()) == files  # the readers made nothing


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 300 KiB tmpfs (mounting needs root); unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_the_study_resumes(
    invoke_cli, small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # the resumed run finds the study the full disk left unlabelled and waits
    # PEER_CREATION_SECONDS (5 s) for a creator that may still be labelling it; briefly here
    monkeypatch.setattr("autotune.study._open.PEER_CREATION_SECONDS", 0.2)
    space = _space(tmp_path)  # the disk fills while the study is made: before any trial
    url = f"sqlite:///{small_disk / 'studies' / 'autotune.db'}"
    full = invoke_cli("run", str(space), "--storage", url, cwd=tmp_path, columns=80)
    _one_error_line(full, 2, f"cannot write the study to {url}")
    assert "the disk is full" in full.stderr
    subprocess.run(["mount", "-o", "remount,size=20m", str(small_disk)], check=True)
    resumed = invoke_cli("run", str(space), "--storage", url, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    storage = optuna.storages.RDBStorage(url)
    study = optuna.load_study(study_name="tiny", storage=storage)
    assert answer_trial(study) is not None and StudyRecord.of(study).search_fingerprint
    # the fault-matrix invariants: nothing left RUNNING, every other trial says why, and
    # exactly one untuned baseline measured
    trials = study.get_trials()
    assert [t.number for t in trials if t.state == TrialState.RUNNING] == []
    for trial in trials:
        if trial.state != TrialState.COMPLETE:
            assert trial.user_attrs.get("fail_kind") and trial.user_attrs.get("fail_msg")
    baselines = [t for t in trials if TrialRecord.of(t).baseline]
    assert [t.state for t in baselines].count(TrialState.COMPLETE) == 1
    storage.engine.dispose()  # the disk is unmounted next


def test_a_half_made_study_is_named_as_such(tmp_path: Path, prepare_study, monkeypatch):
    """A study whose labelling stopped half way and that could not be removed then (the disk
    was full) is named as half-made by the next run, not as another tool's study."""
    monkeypatch.setattr("autotune.study._open.PEER_CREATION_SECONDS", 0.2)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    half = optuna.create_study(study_name="tiny", storage=open_storage(storage))
    StudyRecord(autotune_version=autotune.__version__).store(half)  # what _label writes first
    with pytest.raises(StudyError, match=r"was left half-made .* optuna delete-study"):
        prepare_study(_space(tmp_path).read_text(), tmp_path, run=False, storage=storage)


@pytest.mark.slow
def test_a_postgresql_study_never_shows_or_stores_its_password(
    invoke_cli, postgres, tmp_path: Path
):
    space = _space(tmp_path)
    url = postgres.url
    done = {"run": invoke_cli("run", str(space), "--storage", url, cwd=tmp_path)}
    assert done["run"].returncode == 0, done["run"].stderr
    assert "postgresql+psycopg://autotune:***@127.0.0.1" in done["run"].stdout
    assert "put yours in its place" in done["run"].stdout
    where = ("--study", "tiny", "--storage", url)
    done["best"] = invoke_cli("best", *where, cwd=tmp_path)
    done["studies"] = invoke_cli("studies", "--storage", url, cwd=tmp_path)
    done["export"] = invoke_cli("export", *where, "-o", "train.py", cwd=tmp_path)
    done["report"] = invoke_cli("report", *where, "-o", "report.html", cwd=tmp_path)
    for name, result in done.items():
        assert result.returncode == 0, (name, result.stderr)
        assert "Warning" not in result.stdout, (name, result.stdout)  # the note was written
    wrong = url.replace(postgres.password, "wrong-password")
    refused = invoke_cli("best", "--study", "tiny", "--storage", wrong, cwd=tmp_path)
    _one_error_line(refused, 1, "the password or user name is wrong")
    assert "wrong-password" not in refused.stderr

    storage = optuna.storages.RDBStorage(url)
    study = optuna.load_study(study_name="tiny", storage=storage)
    assert answer_trial(study) is not None
    # the note is kept in the study's system attributes
    stored = [study.user_attrs, storage.get_study_system_attrs(study._study_id)]
    stored += [[t.user_attrs, t.system_attrs] for t in study.get_trials()]
    assert "autotune export --study tiny --storage" in str(stored)
    storage.engine.dispose()
    written = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]  # artifacts too
    assert any(b"<html" in text for text in written)
    shown = [r.stdout + r.stderr for r in [*done.values(), refused]]
    for text in [*shown, str(stored), *[t.decode(errors="replace") for t in written]]:
        assert postgres.password not in text


@pytest.mark.slow
def test_a_missing_postgresql_driver_names_the_extra(tmp_path: Path):
    blocker = import_blocker(tmp_path, "psycopg")
    path = os.pathsep.join(filter(None, [str(blocker), os.environ.get("PYTHONPATH")]))
    url = "postgresql+psycopg://autotune:S3cret@127.0.0.1:1/db"
    done = run_cli("studies", "--storage", url, cwd=tmp_path, env={"PYTHONPATH": path})
    _one_error_line(done, 1, "pip install 'autotune[postgres]'")
    assert "S3cret" not in done.stderr


def test_a_sqlite_study_writes_in_wal_mode_without_a_sync_per_commit(tmp_path: Path):
    storage = open_storage(f"sqlite:///{tmp_path / 'wal.db'}")
    optuna.create_study(study_name="wal", storage=storage)
    with storage.engine.connect() as connection:  # a connection made after open_storage
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL


def test_a_command_without_study_reads_the_storages_only_study(tmp_path: Path):
    """`autotune best|export|report|confirm` without --study: the storage's only study, its
    stage-1 speed study (NAME.speed) not counted; one line where there is none or several."""
    from autotune.study import StudyError, load_study

    url = f"sqlite:///{tmp_path}/studies.db"
    optuna.create_study(study_name="empty", storage=url).set_user_attr("x", 1)
    optuna.delete_study(study_name="empty", storage=url)
    with pytest.raises(StudyError, match=r"no study in .*studies\.db: run one with"):
        load_study(None, url)
    optuna.create_study(study_name="mine", storage=url)
    optuna.create_study(study_name="mine.speed", storage=url)
    assert load_study(None, url).study_name == "mine"
    optuna.create_study(study_name="other.speed", storage=url)  # no study "other": a study
    with pytest.raises(StudyError, match=r"holds 2 studies \(mine, other\.speed\)"):
        load_study(None, url)


def test_reading_a_study_this_process_holds_open_keeps_its_locks(tmp_path: Path):
    """Reading a study's file header with a plain descriptor and closing it dropped every POSIX
    lock this process held on the database (SQLite's connections included): the next writer in
    another process, believing itself the last, checkpointed and removed the journal under this
    process's connections ("database disk image is malformed", seen with `best` and `export`
    called in-process between two runs)."""
    url = f"sqlite:///{tmp_path / 'held.db'}"
    held = optuna.create_study(study_name="held", storage=open_storage(url))
    held.set_user_attr("before", 1)  # this process now holds the database, in WAL mode
    open_storage(url, "read")  # a reader in the same process (autotune best, load_best)
    open_storage(url, "write")  # a writer that checks the file first (export's artifacts)
    # another process writes and closes its connections, as `autotune run` does when it ends
    writer = (
        "import optuna, sys\n"
        "storage = optuna.storages.RDBStorage(sys.argv[1])\n"
        "optuna.load_study(study_name='held', storage=storage).set_user_attr('after', 2)\n"
        "storage.engine.dispose()\n"
    )
    subprocess.run([sys.executable, "-c", writer, url], check=True)
    # it was not the last: this process still holds the database, so the journal stays
    assert (tmp_path / "held.db-wal").exists() and (tmp_path / "held.db-shm").exists()
    again = optuna.load_study(study_name="held", storage=url)
    assert again.user_attrs == {"before": 1, "after": 2}
    assert held.user_attrs == {"before": 1, "after": 2}
