"""Who is timing which setting of stage 1: claims kept in the speed study itself, so that the
processes of one study on many machines (a PostgreSQL study shared by the pods of a Kubernetes
job or the tasks of a SLURM array) time each (setting, round) once.

A process claims a setting before it times it, under the storage's lock for claims
(``study_lock``: a file lock beside a SQLite database, an advisory lock on PostgreSQL), and
renews the claim while it times; another process that finds it claimed waits for the
measurement and takes it as it is. A claim not renewed for ``CLAIM_STALE_SECONDS`` (its process
was killed, its machine lost) is taken over. The claims are one user attribute of the speed
study, ``stage1_claims``: ``{"KEY round N": {"by": "host:pid", "beat": unix seconds}}``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import optuna

from autotune import stops
from autotune.storage._liveness import study_lock
from autotune.storage._outage import without_retry

CLAIMS_ATTR = "stage1_claims"
CLAIM_BEAT_SECONDS = 5.0  # how often a held claim is renewed
CLAIM_STALE_SECONDS = 60.0  # a claim not renewed for this long is taken over


class Claims:
    """The claims of one speed study."""

    def __init__(self, speed_study: optuna.Study) -> None:
        self.study = speed_study
        self.me = f"{socket.gethostname()}:{os.getpid()}"

    def _read(self) -> dict[str, dict[str, Any]]:
        claims = self.study.user_attrs.get(CLAIMS_ATTR)
        return dict(claims) if isinstance(claims, dict) else {}

    def _update(self, name: str, mine: bool) -> str | None:
        """Under the claims' lock: set (``mine``) or drop this process's claim ``name``; when
        another live process holds it, change nothing and return who."""
        with study_lock(self.study, "claims"):
            claims = self._read()
            held = claims.get(name)
            now = time.time()
            fresh = held is not None and now - float(held.get("beat", 0)) < CLAIM_STALE_SECONDS
            if held is not None and held.get("by") != self.me and fresh:
                return str(held.get("by"))
            if mine:
                claims[name] = {"by": self.me, "beat": now}
            elif held is not None and held.get("by") == self.me:
                del claims[name]
            else:
                return None
            # stale claims of lost processes go with any write: the attribute stays small
            claims = {
                other: claim
                for other, claim in claims.items()
                if other == name or now - float(claim.get("beat", 0)) < CLAIM_STALE_SECONDS
            }
            self.study.set_user_attr(CLAIMS_ATTR, claims)
        return None

    @contextlib.contextmanager
    def hold(self, key: str, round_number: int) -> Iterator[str | None]:
        """Claim round ``round_number`` of setting ``key`` for the block: yields None when this
        process holds it (renewed in the background, dropped afterwards), else who does
        (``host:pid``), and then nothing is claimed."""
        name = f"{key} round {round_number}"
        done = threading.Event()
        renewal = threading.Thread(target=self._renew, args=(name, done), name="autotune-claim")
        renewal.daemon = True
        written = False  # (maybe) claimed: dropped in the end
        try:
            # a Ctrl-C waits for the write (one left behind would be waited on for 60 s)
            with stops.deferred():
                written = True
                other = self._update(name, mine=True)
                written = other is None
            if other is not None:
                yield other
                return
            renewal.start()
            yield None
        finally:
            with stops.deferred():  # (one in join() skipped the drop)
                done.set()
                if renewal.is_alive():
                    renewal.join()
                if written:
                    self._drop(name)

    def _renew(self, name: str, done: threading.Event) -> None:
        """Renew claim ``name`` until ``done``."""
        while not done.wait(CLAIM_BEAT_SECONDS):
            # a missed renewal (the database restarts): the next one is due; one that never
            # comes lets the claim go stale, and another process takes it over
            with contextlib.suppress(Exception), without_retry():
                self._update(name, mine=True)

    def _drop(self, name: str) -> None:
        """Drop this process's claim ``name``, if it holds it (else it goes stale by itself)."""
        with contextlib.suppress(Exception), without_retry():
            self._update(name, mine=False)
