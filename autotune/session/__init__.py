"""The run as a library call: ``autotune.run(space)`` runs (or resumes) the study a space file
describes, its stages and then its confirmation round, and returns a ``RunReport`` that says how
it ended, in the words ``autotune run`` prints.

A notebook or a scheduler calls ``run``; ``autotune run`` calls the same steps
(``load_run_spec``, ``prepare``, ``run_prepared``, ``end_run``), its display, its workers and
SIGTERM passed to ``run_prepared`` as ``RunHooks``, its exit statuses around them. Nothing
prints. The first steps (the space file, ``prepare``, the executor) are ``_prepare``'s.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotune import stops
from autotune import study as studies
from autotune.ending import RESUME, Ending, ending
from autotune.errors import UserError
from autotune.spacefile import Spec

if TYPE_CHECKING:
    import optuna

    from autotune.executor import TrialExecutor
    from autotune.export import BestConfig
    from autotune.machine.scaleout import Workers, WorkerShare
    from autotune.study import ConfirmationInputs, RunOutcome, StudyObserver

from autotune.session._prepare import (
    STORAGE_ENV,
    Prepared,
    RunOptions,
    cores_changed,
    executor_for,
    load_run_spec,
    prepare,
    storage_faults,
)

__all__ = [
    "STORAGE_ENV",
    "Prepared",
    "RunHooks",
    "RunOptions",
    "RunReport",
    "ScaleOut",
    "confirm_after_run",
    "confirm_answer",
    "cores_changed",
    "end_run",
    "executor_for",
    "load_run_spec",
    "prepare",
    "run",
    "run_prepared",
    "storage_faults",
]


def confirm_answer(inputs: ConfirmationInputs, on_other: Callable[[], None] | None = None) -> bool:
    """Run (or resume) the confirmation round ``inputs`` describe; whether a round exists now
    (False: no feasible trial to confirm). One process at a time runs a study's round: another
    that finishes beside it waits (``on_other`` is called) and then finds the round done."""
    with studies.study_lock(inputs.study, "confirm", on_other, held_long=True):
        return studies.confirm_study(inputs) is not None


def confirm_after_run(
    study: optuna.Study, spec: Spec, outcome: RunOutcome, confirm: Callable[[int, int], bool]
) -> bool:
    """The one rule for a run's confirmation round: ``confirm(top, repeats)`` (the space file's
    ``study.confirm``) runs it when the file asks for one, the study holds its total or the
    timeout ended its search (the timeout stops new trials; the answer is still named from
    runs side by side), and the run was not stopped (interrupted, the same error in every
    trial, nothing stage 1 could train); an interruption of the round is recorded in
    ``outcome``. Whether a round exists."""
    plan = spec.study.confirm
    finished = outcome.timed_out or studies.counted_trials(study) >= spec.study.n_trials
    stopped = outcome.interrupted or outcome.repeated_error or outcome.stage_failed
    if not plan.enabled or not finished or stopped:
        return False
    try:
        return confirm(plan.top, plan.repeats)
    except KeyboardInterrupt as stop:
        outcome.stopped_by(stop)
        return False


@dataclass(frozen=True)
class ScaleOut:
    """The workers of ``autotune run --workers`` or ``--gpus`` (``autotune.machine.scaleout``), one
    ``autotune run`` process each: their shares, this process's ``index`` among them (0: the
    one the user started, which starts the others on ``space_file``), for ``run_prepared``."""

    shares: list[WorkerShare]
    index: int
    space_file: Path

    @property
    def worker(self) -> str | None:
        """This process's place, as "2/4"; None for a single worker."""
        share = self.shares[self.index]
        return f"{share.index + 1}/{share.count}" if share.count > 1 else None

    def start_others(self, spec: Spec, study: optuna.Study) -> Workers | None:
        """Worker 0 of several starts the others now (their start-up overlaps stage 1, on their
        own cores), logging beside a SQLite database, else under studies/; else None."""
        from autotune.machine import scaleout

        if self.index or len(self.shares) == 1:
            return None
        name, path = study.study_name, studies.sqlite_path(spec.study.storage)
        log_dir = (path.parent if path is not None else Path("studies")) / f"{name}.workers"
        return scaleout.start_workers(self.shares, self.space_file, spec, name, log_dir)


class RunHooks:
    """What a caller adds to a run's steps (``run_prepared``): ``autotune run`` its live
    display and SIGTERM as a stop. These defaults add nothing (a library run): ``observer`` is
    told of each measurement and trial."""

    sigterm_stops = False  # SIGTERM stops the run as Ctrl-C does (``stops.handled``)

    def __init__(self, observer: StudyObserver | None = None) -> None:
        self.observer = observer

    @contextlib.contextmanager
    def training(
        self, study: optuna.Study, executor: TrialExecutor
    ) -> Iterator[StudyObserver | None]:
        """Around stage 1 and the trials: yields the observer told of them."""
        yield self.observer

    def trials_start(self, others: Workers | None) -> None:
        """Once stage 1 is measured, before the first trial; ``others``: the workers this
        process started, told to train."""

    def trials_done(self, outcome: RunOutcome) -> None:
        """After the trials, inside ``training``, before the other workers are stopped."""

    def others_ended(self, lines: list[str]) -> None:
        """The other workers stopped: a line for each that ended badly."""

    def confirm(
        self, study: optuna.Study, spec: Spec, executor: TrialExecutor, top: int, repeats: int
    ) -> bool:
        """Run the confirmation round (``confirm_answer``); whether one exists now."""
        inputs = studies.ConfirmationInputs(study, spec.objective, executor, top, repeats)
        return confirm_answer(inputs)


def run_prepared(
    prepared: Prepared,
    base_dir: Path,
    hooks: RunHooks,
    *,
    verbose: bool = False,
    remeasure: bool = False,
    confirm: bool = True,
    scale: ScaleOut | None = None,
) -> tuple[RunOutcome, bool]:
    """A prepared run's steps: its stages and trials, then (``confirm``, by the rule of
    ``confirm_after_run``) the confirmation round, ``hooks`` told of each; the executor closed
    in the end. With ``scale``, worker 0 starts the other workers, lets them train once stage 1
    is measured, stops them and counts their trials; another waits for its word. The run's
    outcome, and whether a confirmation round exists. A storage fault is raised as a StudyError
    (``storage_faults``)."""
    from autotune.machine import scaleout

    spec, study = prepared.spec, prepared.study
    began = time.time()  # every trial that starts from here is this run's, any worker's
    with contextlib.ExitStack() as stack:
        stack.enter_context(storage_faults(spec.study.storage))
        stack.enter_context(stops.handled(sigterm=hooks.sigterm_stops))
        executor = executor_for(
            spec, base_dir, prepared.workload, verbose=verbose, launched=prepared.launched
        )
        stack.callback(executor.close)
        with hooks.training(study, executor) as observer:
            workers = scale.start_others(spec, study) if scale is not None else None
            if workers is not None:  # a path that left them running: never leave them behind
                stack.callback(workers.wait, 60)
                stack.callback(workers.interrupt)

            def trials_start() -> None:  # once stage 1 is measured
                if scale is not None and scale.index:
                    scaleout.wait_for_stage1()  # (it measured its share as worker 0 did)
                if workers is not None:
                    workers.start_trials()
                hooks.trials_start(workers)

            worker = scale.worker if scale is not None else None
            observer = observer or studies.StudyObserver()
            inputs = studies.StudyInputs(
                study, spec, prepared.hardware, executor, prepared.workload, observer, worker
            )
            outcome = studies.run_study(inputs, remeasure, trials_start)
            hooks.trials_done(outcome)
            if workers is not None:  # the study is done, or this worker stopped or gave up
                stopping = outcome.interrupted or outcome.failed_out or not workers.trials_started
                stopping = stopping or bool(outcome.repeated_error)
                hooks.others_ended(workers.stop(stopping, spec.study.trial_timeout or 600))
                studies.count_states(study, outcome, began)  # the workers' trials
        round_of = functools.partial(hooks.confirm, study, spec, executor)
        confirmed = confirm and confirm_after_run(study, spec, outcome, round_of)
    return outcome, confirmed


def end_run(study: optuna.Study, spec: Spec, outcome: RunOutcome, resume: str = RESUME) -> Ending:
    """A run's last step: the study's note (optuna-dashboard's) written where this run trained
    a trial, and how the run ended (``ending``; ``resume``: how a stopped run goes on). A
    storage fault raised as a StudyError."""
    from autotune.outputs import notes

    with storage_faults(spec.study.storage):
        if outcome.trials_run:
            notes.write_note(study, spec.study.storage)
        return ending(study, spec, outcome, resume)


@dataclass(frozen=True, repr=False)
class RunReport:
    """What ``run`` did: the study (its name and masked storage URL), this run's outcome
    (trials run, why it stopped early), whether the confirmation round exists, how the run
    ended (``ending.status`` "ok", or "failed" and why) and the study's answer in a line.
    Printed, it says these in two lines."""

    study_name: str
    storage: str  # as it may be shown: a password masked
    outcome: RunOutcome
    confirmed: bool
    ending: Ending
    storage_url: str = ""  # with its password
    # "best: trial 7, 1.256 acc/s (median of 5 confirmed runs)", or why there is none
    answer: str = ""

    def __str__(self) -> str:
        """``study cq (sqlite:///...): ok, 8 trials this run, confirmed`` and the answer, each
        on a line of its own (where the run failed, the first line says why)."""
        how = [self.ending.status, f"{self.outcome.trials_run} trials this run"]
        how += ["confirmed"] * self.confirmed + list(self.ending.lines[:1])
        return f"study {self.study_name} ({self.storage}): {', '.join(how)}\n{self.answer}"

    def __repr__(self) -> str:
        return f"<RunReport {'; '.join(str(self).splitlines())}>"

    @property
    def ok(self) -> bool:
        """Whether a trial of the study trained to its end and the run was not stopped."""
        return self.ending.status == "ok"

    def best(self) -> BestConfig:
        """The study's answer (``autotune.load_best``): the confirmed best configuration, or
        the best feasible trial when none was confirmed."""
        from autotune.export import load_best

        return load_best(self.study_name, storage=self.storage_url)


def answer_line(study: optuna.Study, spec: Spec) -> str:
    """The study's answer in a line, as the summary heads it: "best: trial 7, 1.256 acc/s
    (median of 5 confirmed runs)"; else why there is none."""
    from autotune import display

    answer = studies.answer_of(study)
    if answer is None:
        return display.no_answer(spec.objective, display.finished_any(study))
    value, what = answer.headline
    unit = display.metric_unit(spec.objective.metric_name)
    sure = "" if answer.confirmed else ", not confirmed"
    kind = studies.TrialRecord.of(answer.trial).reference  # "best: trial 1" hid the checklist
    named = f" ({studies.REFERENCE_NAMES[kind].removeprefix('the ')})" if kind else ""
    return f"best: trial {answer.number}{named}, {display.value_text(value, unit)} ({what}{sure})"


def run(
    space: Path | str | Spec,
    *,
    n_trials: int | None = None,
    timeout: float | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    device: str | None = None,
    seed: int | None = None,
    isolation: str | None = None,
    new_study: bool = False,
    remeasure: bool = False,
    confirm: bool = True,
    base_dir: Path | str | None = None,
    observer: StudyObserver | None = None,
) -> RunReport:
    """Run (or resume) the study ``space`` describes (a space file's path, or a Spec) as
    ``autotune run`` does, without printing: its stages, its trials until the study holds its
    total, then (``confirm`` and the space file's ``study.confirm``) the confirmation round.

    The keyword arguments are ``autotune run``'s options (None: as the space file says).
    ``base_dir`` is where the workload's ``package.module:function`` names resolve (default:
    the space file's folder, or the working directory for a Spec); ``observer`` (a
    ``autotune.study.StudyObserver``) is told of each measurement and trial. Returns a
    RunReport. Raises a UserError for a space file, workload, storage or script the user must
    fix, its traceback cut to this call and its message what to do; Ctrl-C stops the run as
    ``autotune run``'s does (the running trial recorded, the study's note written) and is
    raised on, a KeyboardInterrupt that says how to resume. The workers of ``--workers`` and
    ``--gpus`` are the command's: one call runs one process.
    """
    options = RunOptions(
        n_trials=n_trials,
        timeout=timeout,
        storage=storage,
        study_name=study_name,
        device=device,
        seed=seed,
        isolation=isolation,
    )
    if base_dir is None:
        base_dir = Path(space).parent if not isinstance(space, Spec) else Path.cwd()
    try:
        report = _run(space, options, Path(base_dir), new_study, remeasure, confirm, observer)
    except UserError as error:  # its frames below this call: nothing the user can fix
        raise error.with_traceback(None) from None  # what to do: the message below
    if report.ending.status in ("interrupted", "terminated"):
        raise KeyboardInterrupt(report.ending.lines[0])
    return report


def _run(
    space: Path | str | Spec,
    options: RunOptions,
    base_dir: Path,
    new_study: bool,
    remeasure: bool,
    confirm: bool,
    observer: StudyObserver | None,
) -> RunReport:
    """``run``'s steps, Optuna's INFO lines held back."""
    import optuna

    spec = load_run_spec(space, options)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # its INFO lines: a library prints nothing
    try:
        prepared = prepare(spec, base_dir, new_study=new_study)
        outcome, confirmed = run_prepared(
            prepared, base_dir, RunHooks(observer), remeasure=remeasure, confirm=confirm
        )
        spec, study = prepared.spec, prepared.study
        resume = "call autotune.run again with the same arguments to resume"
        if new_study:  # the same call would start yet another study
            resume = f"resume with study_name={study.study_name!r}, without new_study=True"
        end = end_run(study, spec, outcome, resume)
        answer = answer_line(study, spec) if not outcome.interrupted else ""
    finally:
        optuna.logging.set_verbosity(verbosity)
    shown = studies.display_url(spec.study.storage)
    return RunReport(study.study_name, shown, outcome, confirmed, end, spec.study.storage, answer)
