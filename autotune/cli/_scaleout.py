"""``run --workers N`` / ``--gpus``: what worker 0 does for the others (see autotune.scaleout)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from rich.text import Text

from autotune.scaleout import (
    WORKER_STORAGE_ENV,
    Workers,
    WorkerShare,
    gpus_argument,
    unused_cores,
)
from autotune.study import sqlite_path, unhurried

POLL_SECONDS = 0.5  # how often worker 0 looks for the other workers' finished trials


def worker_log_dir(storage: str, study_name: str) -> Path:
    """Where the other workers write their logs: beside a SQLite database, else under
    studies/ in the working directory."""
    path = sqlite_path(storage)
    return (path.parent if path is not None else Path("studies")) / f"{study_name}.workers"


def describe_shares(shares: list[WorkerShare]) -> str:
    """The plan's ``workers`` line: each share, and the cores left idle."""
    text = "; ".join(share.describe() for share in shares)
    idle = unused_cores(shares)
    if idle:
        text += f"; {len(idle)} core(s) idle (the shares are equal, so that trials compare)"
    return text


def start_workers(
    shares: list[WorkerShare],
    space_file: Path,
    spec: Any,
    study_name: str,
    log_dir: Path,
    timeout: float | None,
) -> Workers:
    """Start workers 1..N-1 on the study (``autotune run SPACE ... --as-worker K``): the same
    space file and resolved settings, the study by its name, ``timeout`` (the seconds worker 0
    has), and the storage in their environment (a password stays out of the process list).
    They start up while worker 0 measures stage 1, then wait for ``Workers.go``."""
    arguments = [
        str(space_file),
        "--study-name",
        study_name,
        "--n-trials",
        str(spec.study.n_trials),
        "--isolation",
        spec.study.isolation,
        "--device",
        spec.workload.device,
    ]
    if spec.study.seed is not None:
        arguments += ["--seed", str(spec.study.seed)]
    if timeout is not None:
        arguments += ["--timeout", f"{max(timeout, 0.001):.3f}"]
    if shares[0].gpu is not None:
        arguments += ["--gpus", gpus_argument(shares)]
    else:
        arguments += ["--workers", str(len(shares))]
    workers = Workers(log_dir, tuple(sorted({c for share in shares for c in share.cores})))
    workers.start(shares[1:], arguments, {WORKER_STORAGE_ENV: spec.study.storage})
    return workers


class OthersShown:
    """While the other workers run, show their trials as the study records them (through the
    same observer that shows worker 0's own), and say when a worker ends badly."""

    def __init__(self, study: Any, observer: Any, workers: Workers) -> None:
        self.study, self.observer, self.workers = study, observer, workers
        self.closed = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, name="autotune-others", daemon=True)

    def __enter__(self) -> OthersShown:
        self.observer.mark_shown(self.study.get_trials(deepcopy=False))  # earlier runs' trials
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop polling, after showing what finished meanwhile (once)."""
        if self.closed:
            return
        self.closed = True
        self.stop.set()
        self.thread.join()
        self.observer.show_finished(self.study.get_trials(deepcopy=False))

    def _poll(self) -> None:
        while not self.stop.wait(POLL_SECONDS):
            self._show()

    def _show(self) -> None:
        try:
            with unhurried():  # a database that restarts: the next poll shows them
                trials = self.study.get_trials(deepcopy=False)
        except Exception:  # a busy database: the next poll shows them
            return
        self.observer.show_finished(trials)
        if self.workers.interrupted:  # their exit statuses are worker 0's to say
            return
        for line in ended_badly(self.workers):
            self.observer.say(Text(line, style="yellow"))


def stop_workers(workers: Workers, stop: bool, timeout: float) -> list[str]:
    """Wait, ``timeout`` seconds in all, for the other workers to end (interrupting them first
    when ``stop``: worker 0 was interrupted or gave up on the study); the lines that say which
    ended badly."""
    if stop:
        workers.interrupt()  # each records its running trial as interrupted
    workers.wait(timeout)
    return ended_badly(workers)


def ended_badly(workers: Workers) -> list[str]:
    """A line for each worker that ended badly since last asked (130 and 143 are not bad once
    worker 0 interrupted them)."""
    return [
        f"{share.describe()} ended with exit status {code}; its log: {log}"
        for share, code, log in workers.exited()
        if code != 0 and not (workers.interrupted and code in (130, 143))
    ]
