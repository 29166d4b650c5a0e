"""Fixtures the test files share: a study prepared (and run) in a folder, a real study of five
trials, an ImageFolder tree, a PostgreSQL server. Plain helpers live in ``autotune.testing``;
test files import from there, never from here or from each other."""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import optuna
import pytest
from PIL import Image

from autotune.executor import InProcessExecutor, TrialExecutor
from autotune.machine.hardware import Hardware
from autotune.search.space import restrict
from autotune.spacefile import Spec, parse_spec
from autotune.study import (
    RunOutcome,
    StudyInputs,
    StudyObserver,
    open_storage,
    open_study,
    run_study,
    with_study_strategy,
)
from autotune.testing import CPU, write_space
from autotune.worker import WorkerExecutor
from autotune.workloads import load


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the commands the tests start as a terminal's foreground command gets it.
    A suite started in the background (``cmd &``, nohup, some CI runners) ignores SIGINT; its
    children inherit that, Python then installs no KeyboardInterrupt handler, and a test of
    Ctrl-C sees the run finish instead. A handled signal is reset to the default in a child."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After each test (its fixtures torn down), what is still alive is frozen: Python's
    collector no longer walks it. The suite's process holds the modules, torch, Optuna and the
    session's fixtures, half a million objects and more as it goes, and every ``gc.collect()``
    the product makes (``faults.release_memory``, after each trial and measurement) and every
    automatic full collection walked them all: 0.4 s a call after collection, a fifth of
    test_study's and test_cli's time. A test's own objects are young and collected as before;
    garbage is collected before the freeze, so only what lives is frozen."""
    yield
    gc.collect()
    gc.freeze()


# what a test needs, read off the test itself so that no test can forget its marker
_PROCESS_CALLS = (
    "run_cli(",
    "start_cli(",
    "run_script(",
    "run_python(",
    "subprocess.",
    "torchrun",
)


def _starts_processes(item: pytest.Item) -> bool:
    """Whether a test (or a fixture of its own module) starts processes: the command, an
    exported script, a worker, a server."""
    sources = [getattr(item, "function", None)]
    sources += [getattr(item.module, name, None) for name in item.fixturenames]
    for source in filter(None, sources):
        try:
            text = inspect.getsource(getattr(source, "__wrapped__", source))
        except (OSError, TypeError):
            continue
        if any(call in text for call in _PROCESS_CALLS):
            return True
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Markers by what a test needs: ``postgres`` (a real server), ``e2e`` (real processes of
    the command, a script or a server), beside ``slow``, ``browser`` and ``gpu`` that test
    files set; ``python -m pytest -m "not slow and not e2e"`` is the fast lane."""
    for item in items:
        if {"postgres", "postgres_to_restart"} & set(item.fixturenames):
            item.add_marker(pytest.mark.postgres)
        if _starts_processes(item):
            item.add_marker(pytest.mark.e2e)


def _invoke_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, columns: int = 160
) -> subprocess.CompletedProcess[str]:
    """Run ``autotune ARGS`` in this process (Typer's CliRunner) in ``cwd``, with ``env`` added
    to the environment and consoles ``columns`` wide, as ``run_cli`` runs it in a subprocess:
    for commands that read a study, and for runs whose subject is not the process (no worker,
    no signal), where a new interpreter and torch would cost seconds and test nothing more. Its
    exit code is the returned ``returncode``."""
    from typer.testing import CliRunner

    from autotune.cli import app
    from autotune.cli._common import console, errors

    widths = console.width, errors.width
    verbosity = optuna.logging.get_verbosity()  # the command sets Optuna's: for itself only
    here = Path.cwd()
    os.chdir(cwd)
    console.width = errors.width = columns
    try:
        result = CliRunner().invoke(
            app, list(args), env={"PYTHONWARNINGS": "ignore", **(env or {})}
        )
    finally:
        console.width, errors.width = widths
        optuna.logging.set_verbosity(verbosity)
        os.chdir(here)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a bug: its traceback, as the command would print it
    return subprocess.CompletedProcess(
        ["autotune", *args], result.exit_code, result.stdout, result.stderr
    )


@pytest.fixture(scope="session")
def invoke_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``invoke_cli(*args, cwd, env=None, columns=160)``: ``autotune ARGS`` in this process, as
    ``run_cli`` runs it in a subprocess (``_invoke_cli``)."""
    return _invoke_cli


@pytest.fixture
def tiny_space(tmp_path: Path) -> Path:
    return write_space(tmp_path)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], Path]:
    """Write a user's module ``name`` with ``source`` into a folder of its own and return the
    folder; the test imports this copy (not one an earlier test imported) and sys.path is
    restored afterwards."""

    def write(name: str, source: str) -> Path:
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.delitem(sys.modules, name, raising=False)
        monkeypatch.setattr(sys, "path", list(sys.path))
        return tmp_path

    return write


class PreparedStudy(NamedTuple):
    study: optuna.Study
    url: str  # its storage
    outcome: RunOutcome | None  # None when it was not run
    executor: TrialExecutor | None  # the one it ran with, closed; None when it was not run


def _prepare_study(
    space: str | Spec,
    directory: Path,
    *,
    run: bool = True,
    hardware: Hardware = CPU,
    isolation: str = "none",
    trial_timeout: float | None = None,
    heartbeat_interval: int | None = None,
    new_study: bool = False,
    storage: str | None = None,
    executor: TrialExecutor | None = None,
    remeasure: bool = False,
    observer: StudyObserver | None = None,
) -> PreparedStudy:
    """The study that a space file's text (written to ``directory``/space.yaml) or a parsed Spec
    describes, restricted to ``hardware``, in ``storage`` (by default a SQLite file under
    ``directory``, where ``autotune run`` puts it); run to its end unless ``run`` is False, in
    this process or, with ``isolation="worker"``, in a supervised worker (or by ``executor``,
    which is then left open)."""
    directory.mkdir(parents=True, exist_ok=True)  # the study's folder, studies/, goes in it
    if isinstance(space, str):
        (directory / "space.yaml").write_text(space)
        space = parse_spec(space, directory / "space.yaml")
    spec = restrict(space, hardware).spec
    url = storage or f"sqlite:///{directory / 'studies' / 'autotune.db'}"
    workload = load(spec.workload, directory, spec.objective.score)
    study = open_study(
        spec,
        open_storage(url, heartbeat_interval=heartbeat_interval),
        hardware,
        workload,
        new_study=new_study,
    )
    spec = with_study_strategy(study, spec)
    if not run:
        return PreparedStudy(study, url, None, None)
    given = executor is not None
    if executor is None and isolation == "worker":
        executor = WorkerExecutor(
            spec.workload, directory, trial_timeout=trial_timeout, score=spec.objective.score
        )
    elif executor is None:
        executor = InProcessExecutor(workload)
    try:
        inputs = StudyInputs(
            study, spec, hardware, executor, workload, observer or StudyObserver()
        )
        outcome = run_study(inputs, remeasure=remeasure)
    finally:
        if not given:
            executor.close()
    return PreparedStudy(study, url, outcome, executor)


@pytest.fixture(scope="session")
def prepare_study() -> Callable[..., PreparedStudy]:
    """``prepare_study(space, directory, run=True, hardware=CPU, isolation="none", ...)``:
    restrict, open the storage, open the study and run it, as ``autotune run`` does."""
    return _prepare_study


SEEN_SPACE = """\
study: {name: seen, n_trials: 5, pruner: none, n_startup_trials: 2}
workload:
  model: autotune.testing:tiny_mlp
  data: autotune.testing:blobs
  epochs: 2
objective: {min_accuracy: 0.5}
space:
  lr: {low: 0.005, high: 0.1, log: true}
  batch_size: [16, 32, 64]
  precision: [bf16, fp32]
  num_workers: [1, 0]
"""


@pytest.fixture(scope="session")
def seen(tmp_path_factory: pytest.TempPathFactory) -> tuple[optuna.Study, str]:
    """A real study of five trials and its storage URL, run once for every test that looks at a
    finished study: its records, note, report and dashboard."""
    prepared = _prepare_study(SEEN_SPACE, tmp_path_factory.mktemp("seen"))
    return prepared.study, prepared.url


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """An ImageFolder tree (train/ and val/, cats and dogs, four small PNGs each) with a colour
    cue per class; returns its root."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for index, name in enumerate(("cats", "dogs")):
            folder = tmp_path / split / name
            folder.mkdir(parents=True)
            for k in range(4):
                pixels = rng.integers(0, 256, (20 + k, 24, 3), dtype=np.uint8)
                pixels[..., index] = 255  # a learnable colour cue per class
                Image.fromarray(pixels).save(folder / f"{k}.png")
    return tmp_path


POSTGRES_BIN = Path("/usr/lib/postgresql/15/bin")
PLANTED_PASSWORD = "S3cret-planted-pw"  # must never appear in anything autotune shows or stores


class Postgres(NamedTuple):
    url: str  # postgresql+psycopg://autotune:PLANTED_PASSWORD@127.0.0.1:PORT/postgres
    password: str
    port: int
    server: PostgresServer


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    """A real PostgreSQL 15 server in a temporary folder, on 127.0.0.1 and a free port, whose
    superuser ``autotune`` has the password ``PLANTED_PASSWORD`` (md5 authentication). It
    refuses to run as root: as root it runs as ``postgres``. ``stop`` and ``start`` restart it
    (``stop("immediate")`` is a crash: connections cut, no checkpoint)."""

    def __init__(self) -> None:
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.root = Path(tempfile.mkdtemp(prefix="autotune-postgres-"))  # not pytest's 0700
        (self.root / "password").write_text(PLANTED_PASSWORD + "\n")
        if self.as_postgres:
            for path in (self.root, self.root / "password"):
                shutil.chown(path, "postgres", "postgres")
        self.data, self.port = self.root / "data", _free_port()
        self._pg(str(POSTGRES_BIN / "initdb"), "-D", str(self.data), "--auth=md5",
                 "--username=autotune", f"--pwfile={self.root / 'password'}")  # fmt: skip
        self.url = (
            f"postgresql+psycopg://autotune:{PLANTED_PASSWORD}@127.0.0.1:{self.port}/postgres"
        )

    def _pg(self, *args: str) -> None:
        subprocess.run([*self.as_postgres, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        self._pg(str(POSTGRES_BIN / "pg_ctl"), "-D", str(self.data), "-l",
                 str(self.root / "log"), "-o", options, "-w", "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._pg(str(POSTGRES_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def remove(self) -> None:
        if self.running():
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def _postgres_server() -> Iterator[Postgres]:
    if not (POSTGRES_BIN / "initdb").exists():
        pytest.skip(f"PostgreSQL 15 is not installed ({POSTGRES_BIN} has no initdb)")
    server = PostgresServer()
    try:
        server.start()
        yield Postgres(server.url, PLANTED_PASSWORD, server.port, server)
    finally:
        server.remove()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A real PostgreSQL 15 server for this session (``PostgresServer``)."""
    with _postgres_server() as server:
        yield server


@pytest.fixture
def postgres_to_restart() -> Iterator[Postgres]:
    """A real PostgreSQL 15 server of the test's own, which it may stop and start again."""
    with _postgres_server() as server:
        yield server
