"""A run's first steps, shared by ``autotune.run`` and ``autotune run``: the space file read
with the command's overrides (``load_run_spec``), the worker launched and the workload and
study opened (``prepare``), the one executor of a run (``executor_for``), and the storage
faults as a run meets them (``storage_faults``)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotune import study as studies
from autotune.errors import UserError
from autotune.spacefile import Spec, load_spec

if TYPE_CHECKING:
    import optuna

    from autotune.executor import TrialExecutor
    from autotune.machine.hardware import Hardware
    from autotune.study import OutageRetry
    from autotune.worker import WorkerExecutor
    from autotune.workloads import Workload

STORAGE_ENV = "AUTOTUNE_STORAGE"  # the storage of a space file that names none


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What one run changes of its space file: ``autotune run``'s options (None: as the file
    says)."""

    n_trials: int | None = None
    timeout: float | None = None  # seconds
    storage: str | None = None  # an Optuna storage URL
    study_name: str | None = None
    device: str | None = None  # auto, cpu, cuda or cuda:N
    seed: int | None = None
    isolation: str | None = None  # worker or none


def load_run_spec(space: Path | str | Spec, options: RunOptions | None = None) -> Spec:
    """The space file's Spec (or ``space`` itself) with the run's ``options``, and
    ``$AUTOTUNE_STORAGE`` where neither they nor the file name a storage. SpecError (a
    UserError) for a file that is missing or wrong."""
    options = options or RunOptions()
    spec = space if isinstance(space, Spec) else load_spec(Path(space))
    storage = options.storage
    if storage is None and "storage" not in spec.study.model_fields_set:
        storage = os.environ.get(STORAGE_ENV) or None
    return spec.with_overrides(
        study={
            "n_trials": options.n_trials,
            "timeout": options.timeout,
            "storage": storage,
            "name": options.study_name,
            "seed": options.seed,
            "isolation": options.isolation,
        },
        workload={"device": options.device},
    )


@dataclass(frozen=True)
class Prepared:
    """What a run trains on (``prepare``'s), for ``run_prepared``."""

    spec: Spec  # as this machine runs it: values it cannot run dropped, a study's strategy kept
    hardware: Hardware
    workload: Workload
    dropped: tuple[str, ...]  # the values dropped for this machine, described
    study: optuna.Study
    retry: OutageRetry  # how its storage waits for a database that stops answering
    launched: WorkerExecutor | None = None  # its worker process (isolation: worker), started


def prepare(
    spec: Spec,
    base_dir: Path,
    *,
    verbose: bool = False,
    new_study: bool = False,
    cpu_share: bool = False,
    meanwhile: Callable[[], None] | None = None,
) -> Prepared:
    """A run's first steps, in order: its worker process launched (its imports overlap the
    rest), ``meanwhile``, the machine, the workload (resolved from ``base_dir``), what this
    machine cannot run dropped, and the study opened. ``cpu_share``: this process runs on a
    share of the cores (``--workers``). UserError in one line for what the user can fix."""
    from autotune.worker import WorkerExecutor  # torch is not imported before it starts

    launched = None
    if spec.study.isolation == "worker":
        launched = WorkerExecutor.of(spec, base_dir, verbose)
        launched.launch()
    try:
        if meanwhile is not None:
            meanwhile()
        from autotune.machine.hardware import detect
        from autotune.search.space import restrict
        from autotune.workloads import load as load_workload

        hardware = detect(spec.workload.device)
        if cpu_share:  # its cores are a share of the machine's
            hardware = dataclasses.replace(hardware, cpu_share=True)
        with _held_prints(verbose) as printed:  # the check calls the user's code
            workload = load_workload(spec.workload, base_dir, spec.objective.score)
        if lines := printed.getvalue().splitlines():
            said = f"your code printed {len(lines)} line{'s' * (len(lines) > 1)}"
            first = f"(the first: {lines[0][:60]!r}); --verbose shows them"
            note = f"{said} while autotune checked the workload {first}"
            workload = dataclasses.replace(workload, warnings=(*workload.warnings, note))
        restriction = restrict(spec, hardware, workload)
        spec = restriction.spec
        with storage_faults(spec.study.storage):
            storage = studies.patient_storage(
                spec.study.storage,
                "create",
                heartbeat_interval=spec.study.heartbeat_interval,
                outage_seconds=spec.study.storage_outage,
            )
            study = studies.open_study(spec, storage, hardware, workload, new_study)
            spec = studies.with_study_strategy(study, spec)  # an older study resumes as it was
    except BaseException:
        if launched is not None:
            launched.close()
        raise
    dropped = tuple(d.describe() for d in restriction.dropped)
    return Prepared(spec, hardware, workload, dropped, study, storage.retry, launched)


@contextlib.contextmanager
def _held_prints(verbose: bool) -> Iterator[io.StringIO]:
    """What the user's code prints inside, held (shown where ``verbose``): a model that prints
    in ``forward`` printed above the run's plan. Where the code inside fails, what it printed
    goes to stderr with the error: it may say why."""
    held = io.StringIO()
    if verbose:
        yield held
        return
    try:
        with contextlib.redirect_stdout(held):
            yield held
    except BaseException:
        sys.stderr.write(held.getvalue())
        raise


def cores_changed(prepared: Prepared) -> tuple[int, int] | None:
    """The cores the study's trials trained on (as it was created) and those this run's
    trials train on, where the two differ on the same CPU: a study started without
    ``--workers`` and resumed with it, or the other way. Trials timed on different cores do
    not compare (the run says so before it trains); None where they do not differ, or where
    the study was created on another device (the plan warns of that as it is)."""
    created = studies.StudyRecord.of(prepared.study).hardware or {}
    hardware = prepared.hardware
    cores = created.get("cpu_cores")
    if hardware.device != "cpu" or created.get("device") != "cpu" or not isinstance(cores, int):
        return None
    same_cpu = created.get("cpu") == hardware.device_name.rsplit(" (", 1)[0]  # "X (2 cores)"
    return (cores, hardware.cpu_count) if same_cpu and cores != hardware.cpu_count else None


@contextlib.contextmanager
def storage_faults(storage: str) -> Iterator[None]:
    """A storage fault inside (a full disk, a read-only or damaged database, no server) raised
    as a StudyError, a UserError of one line that names the storage; anything else as it was."""
    try:
        yield
    except UserError:
        raise
    except Exception as err:
        problem = studies.storage_problem(err)
        if problem is None:
            raise
        shown = studies.display_url(storage)
        raise studies.StudyError(f"cannot write the study to {shown}: {problem}") from err


def executor_for(
    spec: Spec,
    base_dir: Path | None,
    workload: Workload | None = None,
    *,
    verbose: bool = False,
    launched: WorkerExecutor | None = None,
) -> TrialExecutor:
    """What trains the study's trials: a supervised worker process (``study.isolation:
    worker``, which loads the workload itself; ``launched``, the one ``prepare`` started,
    unless ``spec`` asks for another) or this process (``none``: on ``workload``, loaded here
    when it is not given)."""
    from autotune.distributed import WorkloadSource
    from autotune.executor import InProcessExecutor
    from autotune.worker import WorkerExecutor
    from autotune.workloads import load as load_workload

    if spec.study.isolation == "worker":
        wanted = WorkerExecutor.of(spec, base_dir, verbose)
        if launched is not None and not launched.serves(wanted):
            launched.close()  # restriction resolves the device, which loading does not read
            launched = None
        return launched or wanted
    source = WorkloadSource(spec.workload, base_dir, spec.objective.score)
    if workload is None:
        workload = load_workload(spec.workload, base_dir, spec.objective.score)
    return InProcessExecutor(workload, source=source)
