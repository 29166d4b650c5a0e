"""``run --workers N`` / ``--gpus``: what worker 0 does for the others (see autotune.scaleout)."""

from __future__ import annotations

import threading
from typing import Any

from rich.text import Text

from autotune.scaleout import Workers, WorkerShare, unused_cores
from autotune.study import unhurried

POLL_SECONDS = 0.5  # how often worker 0 looks for the other workers' finished trials


def describe_shares(shares: list[WorkerShare]) -> str:
    """The plan's ``workers`` line: each share, and the cores left idle."""
    text = "; ".join(share.describe() for share in shares)
    idle = unused_cores(shares)
    if idle:
        text += f"; {len(idle)} core(s) idle (the shares are equal, so that trials compare)"
    return text


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
        for line in self.workers.ended_badly():
            self.observer.say(Text(line, style="yellow"))
