"""The child processes a trial runs in, with real spawned children that run the small targets
below (spawned children import this module, so it imports no torch): spoken to, answered, their
deaths heard at once, killed with what they started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection

import pytest

from autotune import supervision
from autotune.faults import TrialFault
from autotune.results import Evaluation, TrialResult
from autotune.worker._protocol import Warmed

EVALUATION = Evaluation(1, 1.0, 10, 320, 0.5, 0.7, 0.9, 1.5, 0.0, 0.1, final=False)


def _echo(pipe: Connection, label: str) -> None:
    """Send (label, each message) back until Exit."""
    while not isinstance(message := pipe.recv(), supervision.Exit):
        pipe.send((label, message))


def _evaluate(pipe: Connection) -> None:
    """Report one evaluation through ``reporter`` and send back what the answer said."""
    pipe.send(("stop", supervision.reporter(pipe)(EVALUATION)))


def _die(pipe: Connection, exitcode: int) -> None:
    """Exit at once, without a word."""
    os._exit(exitcode)


def _lead_a_group(pipe: Connection) -> None:
    """Lead a process group, as a worker does, start a grandchild in it, name it and wait."""
    os.setsid()
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    pipe.send(grandchild.pid)
    time.sleep(60)


def _ignore_exit(pipe: Connection) -> None:
    """Say it is ready, then never read the pipe again."""
    pipe.send("ready")
    time.sleep(60)


def _answer_as_a_worker(pipe: Connection, own_seconds: float, result: TrialResult) -> None:
    """Say it is ready; then answer a request as a worker does: warmed, one evaluation, and
    after ``own_seconds`` of its own work, finished."""
    pipe.send("ready")
    pipe.recv()
    pipe.send(Warmed())
    supervision.reporter(pipe)(EVALUATION)
    time.sleep(own_seconds)
    pipe.send(supervision.Finished(result))


def _heard(children: list[supervision.Child], within: float = 10.0) -> tuple[int, object]:
    """The next message of any child, waited for up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while (heard := supervision.next_message(children)) is None:
        assert time.monotonic() < deadline, "no message came"
    return heard


def test_each_child_answers_its_own_message_and_exits_when_asked():
    children = supervision.start(_echo, [("a",), ("b",)], "autotune-test")
    try:
        supervision.tell(children, "hello")
        heard = {_heard(children) for _ in range(2)}
        assert heard == {(0, ("a", "hello")), (1, ("b", "hello"))}
        supervision.ask_to_exit(children)
        assert [child.process.exitcode for child in children] == [0, 0]
    finally:
        supervision.kill(children)


def test_an_evaluation_is_answered_with_the_reports_verdict_and_its_seconds():
    (child,) = supervision.start(_evaluate, [()], "autotune-test")
    seen: list[Evaluation] = []

    def slow_report(evaluation: Evaluation) -> bool:
        seen.append(evaluation)
        time.sleep(0.3)  # a database that takes its time to record it
        return True

    try:
        index, evaluated = _heard([child])
        assert index == 0 and isinstance(evaluated, supervision.Evaluated)
        seconds = supervision.answer(child, evaluated, slow_report)
        assert seen == [EVALUATION]
        assert 0.3 <= seconds < 2.0
        assert _heard([child]) == (0, ("stop", True))
    finally:
        supervision.kill([child])


def test_a_child_that_dies_is_heard_at_once_not_after_a_poll(monkeypatch: pytest.MonkeyPatch):
    """Its end wakes the supervisor, which then stops listening to its closed pipe (a poll as long
    as the test shows that nothing waits for it)."""
    monkeypatch.setattr(supervision, "POLL_SECONDS", 30.0)
    (child,) = supervision.start(_die, [(3,)], "autotune-test")
    try:
        started = time.monotonic()
        assert supervision.next_message([child]) is None
        child.process.join(5)
        assert supervision.next_message([child]) is None  # its closed pipe read, and let go
        assert child.pipe.closed and child.process.exitcode == 3
        assert supervision.next_message([child]) is None  # its ended process wakes it still
        assert time.monotonic() - started < 5.0
    finally:
        supervision.kill([child])


def test_kill_ends_a_child_and_the_process_group_it_leads():
    from autotune.testing import live_group_members  # torch: not in the children's imports

    (child,) = supervision.start(_lead_a_group, [()], "autotune-test")
    try:
        _, grandchild = _heard([child])
        assert grandchild in live_group_members(child.process.pid)
    finally:
        supervision.kill([child])
    assert child.process.exitcode == -signal.SIGKILL and child.pipe.closed
    deadline = time.monotonic() + 5
    while live_group_members(child.process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # the grandchild is reaped by init once killed
    assert live_group_members(child.process.pid) == []


def test_a_spawn_that_fails_kills_the_children_already_started(monkeypatch: pytest.MonkeyPatch):
    started: list[supervision.Child] = []
    real_kill = supervision.kill

    def kill(children: list[supervision.Child]) -> None:
        started.extend(children)
        real_kill(children)

    monkeypatch.setattr(supervision, "kill", kill)
    with pytest.raises(Exception, match="pickle"):  # the second child's argument cannot travel
        supervision.start(_echo, [("a",), (lambda: None,)], "autotune-test")
    assert len(started) == 2
    assert not started[0].process.is_alive() and started[0].process.exitcode is not None
    assert all(child.pipe.closed for child in started)


def test_a_child_that_ignores_exit_is_waited_for_its_grace_and_no_longer(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(supervision, "EXIT_GRACE_SECONDS", 1.0)
    children = supervision.start(_ignore_exit, [(), ()], "autotune-test")
    try:
        assert {_heard(children) for _ in range(2)} == {(0, "ready"), (1, "ready")}
        started = time.monotonic()
        supervision.ask_to_exit(children)
        assert 1.0 <= time.monotonic() - started < 1.9  # one grace for all, not one each
        assert all(child.process.is_alive() for child in children)  # the caller then kills
    finally:
        supervision.kill(children)
    assert all(child.process.exitcode == -signal.SIGKILL for child in children)


@pytest.mark.parametrize("own_seconds", [0.3, 0.8])
def test_the_time_a_trial_waits_for_the_study_to_record_an_evaluation_is_not_its_timeout(
    own_seconds: float,
):
    """The worker trains on while the study process waits for its database (a restart, say):
    the seconds the answer to an evaluation takes are not held against the trial's timeout;
    its own seconds are (0.3 s within its 0.5 s, 0.8 s past it). Its own work is a sleep: a busy
    machine changes nothing here."""
    from autotune.machine.interference import CpuMeter
    from autotune.testing import make_config, make_result
    from autotune.worker._supervisor import WorkerExecutor

    def slow_report(evaluation: Evaluation) -> bool:
        time.sleep(0.8)  # past the trial's timeout
        return False

    result = make_result(EVALUATION)
    (child,) = supervision.start(_answer_as_a_worker, [(own_seconds, result)], "autotune-test")
    try:
        assert _heard([child]) == (0, "ready")
        with CpuMeter() as meter:
            request = supervision.RunTrial(make_config())
            if own_seconds > 0.5:
                with pytest.raises(TrialFault, match=r"^no result after 0\.5 s; the worker"):
                    WorkerExecutor._exchange(child, request, slow_report, meter, 0.5)
            else:
                done = WorkerExecutor._exchange(child, request, slow_report, meter, 0.5)
                assert done == supervision.Finished(result)
    finally:
        supervision.kill([child])
