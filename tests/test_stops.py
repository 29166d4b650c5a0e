"""A stop the user asks for (Ctrl-C, SIGTERM) is acted on, even where Python would lose it."""

from __future__ import annotations

import signal

import pytest

from autotune import stops
from autotune.executor import attempt


class _Finalized:
    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)  # Ctrl-C lands in a finalizer (SQLAlchemy has them)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_that_a_finalizer_swallowed_stops_the_run_after_the_call():
    """Python prints "Exception ignored in ... KeyboardInterrupt" and goes on: a CI run of
    ``autotune run`` finished with exit 0 after a Ctrl-C in stage 1."""
    went_on = []

    def call() -> int:
        _Finalized()  # collected at once: the KeyboardInterrupt raised in it is lost
        went_on.append(True)
        return 1

    with stops.handled(), pytest.raises(KeyboardInterrupt):
        attempt(call)
    assert went_on == [True]
    assert attempt(lambda: 2) == 2  # raised once, and only inside ``handled``
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigterm_stops_as_terminated_and_a_write_finishes_before_a_stop():
    before = signal.getsignal(signal.SIGTERM)
    with stops.handled(sigterm=True), pytest.raises(stops.Terminated):
        signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before
    written = []
    with stops.handled(), pytest.raises(KeyboardInterrupt), stops.deferred():
        signal.raise_signal(signal.SIGINT)
        written.append(True)  # the block goes on to its end; the stop is raised after it
    assert written == [True]
