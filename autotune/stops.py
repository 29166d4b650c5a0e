"""A stop the user asked for (Ctrl-C, SIGTERM), kept until the run has acted on it.

Python raises KeyboardInterrupt wherever the main thread is when SIGINT arrives. Inside a
garbage-collection callback or a ``__del__`` (SQLAlchemy has them) it is printed as "Exception
ignored" and lost: the run went on and finished as if nothing was asked (a CI run: exit 0 after
a Ctrl-C in stage 1). One that lands while a record is half written leaves it behind (a claim on
a stage-1 setting that the next run waits 60 s for). So while ``handled`` is in force a stop is
also kept: ``raise_pending`` raises it again where the run can act on it (``executor.attempt``,
before and after each trial, measurement and confirmation run), and inside ``deferred`` it waits
until the block has written what it writes.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(KeyboardInterrupt):
    """The study process got SIGTERM: stop like Ctrl-C, recording the running trial."""


_pending: int | None = None  # the signal asked for and not raised again yet
_deferred = 0  # how many ``deferred`` blocks the main thread is in


def _stop(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _on_signal(signum: int, frame: object) -> None:
    global _pending
    _pending = signum
    if not _deferred:
        raise _stop(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def handled(sigterm: bool = False) -> Iterator[None]:
    """Inside, Ctrl-C (and SIGTERM with ``sigterm``, as ``Terminated``) stops the run as a
    KeyboardInterrupt that is kept until raised again; the handlers before are restored after.
    Off the main thread, or where the caller has a Ctrl-C handler of its own, Ctrl-C is left
    to it."""
    global _pending
    if not _main_thread():
        yield
        return
    signums = [signal.SIGTERM] if sigterm else []
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signums.append(signal.SIGINT)
    before = {signum: signal.signal(signum, _on_signal) for signum in signums}
    _pending = None
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        _pending = None


def raise_pending() -> None:
    """Raise, once, the stop asked for and not raised again yet (one a callback swallowed, or
    one that waited for a ``deferred`` block)."""
    global _pending
    if _pending is not None and not _deferred and _main_thread():
        signum, _pending = _pending, None
        raise _stop(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A write that must finish once begun (a claim taken or dropped): a stop asked inside it
    is raised when it has."""
    global _deferred
    if not _main_thread():
        yield
        return
    _deferred += 1
    try:
        yield
    finally:
        _deferred -= 1
    raise_pending()
