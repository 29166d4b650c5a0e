"""Processes of one machine take turns on the cores or GPU a trial trains with."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from autotune.errors import UserError
from autotune.machine import turns


def test_a_cpu_trial_takes_the_cores_this_process_may_use():
    cores = sorted(os.sched_getaffinity(0))
    assert turns.resources("cpu") == tuple(f"core-{c}" for c in cores)
    assert turns.resources("cpu", world_size=4) == turns.resources("cpu")  # ranks share them


def test_a_gpu_trial_takes_its_gpus_named_as_the_machine_knows_them(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")
    assert turns.resources("cuda:0") == ("gpu-3",)
    assert turns.resources("cuda:1", world_size=2) == ("gpu-5", "gpu-7")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1a2b/3, MIG-9")
    assert turns.resources("cuda") == ("gpu-GPU-1a2b_3",)  # a UUID, safe as a file name
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert turns.resources("cuda:2") == ("gpu-2",)


# a process of its own holds the turn until its stdin closes; it says when it holds it and
# when it let go
HOLDER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from autotune.machine import turns
    turns.MACHINE_DIR = Path(sys.argv[1])
    if len(sys.argv) > 2:
        os.sched_setaffinity(0, {int(sys.argv[2])})
    with turns.device_lock("cpu"):
        print("held", flush=True)
        sys.stdin.read()
        print(f"released {time.monotonic()}", flush=True)
    """
)


def _holder(directory: Path, *core: str) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory), *core],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_process_waits_for_the_one_training_on_its_cores_and_says_for_whom(
    tmp_path: Path, monkeypatch
):
    monkeypatch.setattr(turns, "MACHINE_DIR", tmp_path)
    holder = _holder(tmp_path)
    said: list[str] = []

    def waiting(line: str) -> None:
        said.append(line)
        assert holder.stdin is not None
        holder.stdin.close()  # the holder lets go only once this one waits

    with turns.device_lock("cpu", on_wait=waiting):
        got_it = time.monotonic()
    assert holder.stdout is not None
    out = holder.stdout.read()
    holder.wait(timeout=30)
    released = float(out.split()[-1])
    assert released <= got_it  # this one trained only after the holder let go
    assert len(said) == 1 and f"autotune process {holder.pid} trains on core" in said[0]
    with turns.device_lock("cpu", on_wait=said.append):  # nobody holds it now: no wait
        pass
    assert len(said) == 1


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_processes_on_different_cores_do_not_wait_for_each_other(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(turns, "MACHINE_DIR", tmp_path)
    first, second = sorted(os.sched_getaffinity(0))[:2]
    holder = _holder(tmp_path, str(first))  # a --workers worker pinned to one core
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {second})
    try:
        said: list[str] = []
        with turns.device_lock("cpu", on_wait=said.append):
            assert not said
    finally:
        os.sched_setaffinity(0, before)
        holder.communicate(timeout=30)


RELEASE_AFTER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from autotune.machine import turns
    turns.MACHINE_DIR = Path(sys.argv[1])
    with turns.device_lock("cpu"):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
    """
)


def test_a_trial_waits_off_its_clock_while_another_process_trains_on_its_cores(
    tmp_path: Path, monkeypatch, prepare_study
):
    from autotune.study import StudyObserver, TrialRecord

    monkeypatch.setattr(turns, "MACHINE_DIR", tmp_path)
    said: list[str] = []

    class Heard(StudyObserver):
        def turn_waiting(self, line: str) -> None:
            said.append(line)

    space = textwrap.dedent(
        """\
        study: {name: turns, n_trials: 2, strategy: joint, pruner: none, baseline: false,
               confirm: false}
        workload: {model: "autotune.testing:tiny_mlp", data: "autotune.testing:blobs", epochs: 1}
        space:
          lr: {low: 0.01, high: 0.1, log: true}
          batch_size: [32]
        """
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", RELEASE_AFTER, str(tmp_path), "3"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    study = prepare_study(space, tmp_path / "study", observer=Heard()).study
    holder.wait(timeout=30)
    first, second = sorted(study.trials, key=lambda t: t.number)
    waited = TrialRecord.of(first).turn_wait_seconds
    assert waited is not None and waited > 1.0  # the holder had 3 s left when it began
    assert len(said) == 1
    assert said[0].startswith("waiting for its turn (0 s so far, gives up after 30 min")
    assert f"autotune process {holder.pid} trains on core" in said[0]
    # its clock started when its turn came: the wait is in neither its seconds nor its speed
    wall = TrialRecord.of(first).wall_seconds
    assert wall is not None and first.duration is not None
    assert wall < first.duration.total_seconds() - waited + 0.5
    assert TrialRecord.of(second).turn_wait_seconds is None  # nobody held it any more


def test_a_wait_says_for_how_long_and_gives_up_after_the_users_bound_saying_how_to_run_anyway(
    tmp_path: Path, monkeypatch
):
    monkeypatch.setattr(turns, "MACHINE_DIR", tmp_path)
    monkeypatch.setattr(turns, "FIRST_SAID_AGAIN", 0.4)  # said at 0, 0.4, 0.8 s ...
    monkeypatch.setenv(turns.TURN_WAIT_ENV, "1.5")
    holder = _holder(tmp_path)
    said: list[str] = []
    try:
        began = time.monotonic()
        with (
            pytest.raises(turns.DeviceLockTimeout) as given_up,
            turns.device_lock("cpu", on_wait=said.append),
        ):
            pytest.fail("it trained while another process held its turn")
        waited = time.monotonic() - began
    finally:
        holder.communicate(timeout=30)
    assert 1.5 <= waited < 3.0
    assert given_up.value.by_user
    # who, on what, running which command, and for how long so far, each time said longer
    program = Path(sys.executable).name
    assert len(said) >= 3 and all(
        f"autotune process {holder.pid} trains on core" in line and f"({program} -c " in line
        for line in said
    )
    assert said[0].startswith("waiting for its turn (0 s so far, gives up after 2 s: --turn-wait)")
    assert said[-1].startswith("still waiting for its turn (1 s so far")  # said again
    message = str(given_up.value)
    assert message.startswith("gave up waiting for this machine's turn after 2 s: autotune")
    assert "run with --turn-wait 0 (AUTOTUNE_TURN_WAIT=0); to wait longer, --turn-wait" in message
    assert "\n" not in message


def test_a_bound_of_zero_takes_no_turn_and_a_callers_bound_is_its_own(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(turns, "MACHINE_DIR", tmp_path)
    holder = _holder(tmp_path)
    said: list[str] = []
    try:
        with (  # stage 1's budget ends first
            pytest.raises(turns.DeviceLockTimeout) as given_up,
            turns.device_lock("cpu", on_wait=said.append, wait_at_most=0.2),
        ):
            pass
        assert not given_up.value.by_user and "--turn-wait" not in said[0]
        monkeypatch.setenv(turns.TURN_WAIT_ENV, "0")  # the user trains beside it
        with turns.device_lock("cpu", on_wait=said.append):
            assert len(said) == 1
    finally:
        holder.communicate(timeout=30)
    monkeypatch.setenv(turns.TURN_WAIT_ENV, "soon")
    with pytest.raises(UserError, match="AUTOTUNE_TURN_WAIT='soon': give the seconds"):
        turns.lock_wait_seconds()


def test_the_run_command_gives_up_waiting_after_turn_wait_in_one_line(tmp_path: Path, monkeypatch):
    from tests.test_speed import command, two_stage

    monkeypatch.setattr(turns, "MACHINE_DIR", tmp_path)
    monkeypatch.setenv(turns.TURN_WAIT_ENV, "")  # the command sets it, this test unsets it
    space = tmp_path / "two.yaml"
    # one stage: the turn given up is a trial's (stage 1's is tested beside its budget)
    extra = "  isolation: none\n  strategy: joint"
    space.write_text(two_stage(precisions="fp32", workers="[0]", study_extra=extra))
    wrong = command("run", str(space), "--turn-wait", "-1", cwd=tmp_path)
    assert wrong.exit_code == 2 and "--turn-wait -1: it must be 0 or more" in wrong.stderr
    holder = _holder(tmp_path)
    try:
        ran = command("run", str(space), "--turn-wait", "1", cwd=tmp_path)
    finally:
        holder.communicate(timeout=30)
    said = " ".join(ran.stderr.split())
    assert ran.exit_code == 1 and said.count("error:") == 1, ran.stdout + ran.stderr
    assert said.startswith("error: gave up waiting for this machine's turn after 1 s")
    assert "Traceback" not in ran.stdout + ran.stderr
    # the trial that gave up says so, as an interruption: nothing of its configuration
    from autotune.study import TrialRecord, load_study

    study = load_study("two", f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}")
    record = TrialRecord.of(study.trials[0])
    assert record.fail_kind == "interrupted" and "gave up waiting" in (record.fail_msg or "")


def test_a_removed_lock_file_is_not_left_behind_and_a_waiter_locks_the_new_one(tmp_path: Path):
    """A study's purpose lock (``remove``) is deleted on release; a process that waited on the
    deleted file locks the path's file instead, so two holders never overlap."""
    path = tmp_path / "autotune.db.claims-x.lock"
    waits: list[int | None] = []
    holding, events = threading.Event(), []

    def second() -> None:
        holding.wait()
        with turns.file_lock(path, waits.append, remove=True):
            events.append(("second in", path.exists()))
        events.append(("second out", path.exists()))

    other = threading.Thread(target=second)
    other.start()
    with turns.file_lock(path, remove=True):
        holding.set()
        while not waits:  # the second waits on this file
            time.sleep(0.01)
        events.append(("first out", None))
    other.join(10)
    assert waits == [os.getpid()]  # told once, with the holder's id
    assert events == [("first out", None), ("second in", True), ("second out", False)]
    assert not list(tmp_path.iterdir())
