"""Studies: storage, sampler, pruner, the resume guard and the optimize loop.

One space file is one study. Re-running it resumes the study (``n_trials`` is the study's total);
a study created from a different search (another space, or a machine that filters the space
differently) is refused rather than silently mixed, because Optuna cannot mix distributions.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import hashlib
import json
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.distributions import BaseDistribution
from optuna.exceptions import ExperimentalWarning
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

import autotune
from autotune import faults, objective, space, telemetry, timing
from autotune.config import TrialConfig
from autotune.hardware import Hardware
from autotune.runner import Evaluation, TrialResult
from autotune.spec import Spec
from autotune.worker import TrialExecutor, WorkerError
from autotune.workloads import Workload

__all__ = [
    "COUNTED_STATES",
    "RunOutcome",
    "StudyError",
    "StudyObserver",
    "best_trial",
    "counted_trials",
    "feasible_trials",
    "load_study",
    "open_storage",
    "open_study",
    "run_study",
    "trial_config",
]

# Trials that count towards ``n_trials``: those that told the sampler something.
COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED)
SQLITE_BUSY_TIMEOUT_SECONDS = 60
STORAGE_OPEN_ATTEMPTS = 5
PEER_CREATION_SECONDS = 5.0  # how long a study another process is creating may lack its attrs
SAME_ERROR_LIMIT = 3  # identical unexpected errors in a row, with no trial completed: stop


class StudyError(Exception):
    """A study that cannot be opened, created or resumed as asked (a user error)."""


# ---------------------------------------------------------------------------------------------
# Storage, sampler, pruner
# ---------------------------------------------------------------------------------------------


class _RetryOnce:
    """Queue a stale trial's parameters once more, without its stale measurements.

    RetryHeartbeatStaleTrialCallback copies the stale trial's user attributes into the new
    trial; those say how the stale one failed, so the copy starts from none.
    """

    def __init__(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)  # stable since Optuna 2.8
            self._retry = RetryHeartbeatStaleTrialCallback(max_retry=1)

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        clean = copy.deepcopy(trial)
        clean.user_attrs = {}
        self._retry(study, clean)


def open_storage(
    url: str, create_dirs: bool = True, heartbeat_interval: int | None = None
) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage for ``url``; SQLite files get WAL mode and a long busy timeout.

    With ``create_dirs`` the folder of a SQLite file is created when missing (``autotune run``);
    readers pass False so that looking at a study never creates anything. With
    ``heartbeat_interval`` (seconds) running trials beat, and one silent for three intervals is
    stale: failed as interrupted and retried once.
    """
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        path = Path(url.removeprefix("sqlite:///"))
        if not path.exists():
            if not create_dirs:
                raise StudyError(f"no study database at {path} (storage {url})")
            path.parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_SECONDS}
    heartbeat: dict[str, Any] = {}
    if heartbeat_interval is not None:
        heartbeat = {
            "heartbeat_interval": heartbeat_interval,
            "grace_period": 3 * heartbeat_interval,
            "heartbeat_stale_trial_callback": _RetryOnce(),
        }
    for attempt in range(STORAGE_OPEN_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)  # heartbeat_interval
                storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **heartbeat)
            break
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as err:
            # another process is creating the same new database's tables right now
            racing = isinstance(err, sqlalchemy.exc.IntegrityError) or "already exists" in str(err)
            if not racing or attempt == STORAGE_OPEN_ATTEMPTS - 1:
                raise StudyError(
                    f"cannot open storage {url}: {type(err).__name__}: {err}"
                ) from None
            time.sleep(0.2 * (attempt + 1))
        except Exception as err:  # SQLAlchemy raises many kinds for a bad URL or server
            raise StudyError(f"cannot open storage {url}: {type(err).__name__}: {err}") from None
    if url.startswith("sqlite:///"):
        # WAL lets optuna-dashboard and other autotune processes read while a study writes.
        with storage.engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA journal_mode=WAL")
    return storage


class TrialSeededSampler(optuna.samplers.BaseSampler):
    """A sampler made afresh for each trial, seeded from the study's seed and the trial's number.

    The storage hands every trial a number of its own, so processes that share a study draw
    different configurations even when they start together, while one process re-running a
    seeded study draws the same ones, resumed runs included. TPE and random sampling keep no
    state between trials but their random generator (TPE reads the history from the storage
    every time), so a new instance per trial changes nothing else.
    """

    def __init__(self, make: Callable[[int], optuna.samplers.BaseSampler], seed: int) -> None:
        self._make, self._seed = make, seed
        self._number: int | None = None
        self._inner = make(seed)

    def _for(self, trial: FrozenTrial) -> optuna.samplers.BaseSampler:
        if trial.number != self._number:
            # the study seed spaced far apart, so seeds s and s + 1 share no trial's draw
            seed = (self._seed * 1_000_003 + trial.number) % 2**32
            self._inner, self._number = self._make(seed), trial.number
        return self._inner

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self._for(trial).infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self._for(trial).sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._for(trial).sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._for(trial).before_trial(study, trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._for(trial).after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._inner.reseed_rng()


def make_sampler(spec: Spec) -> optuna.samplers.BaseSampler:
    """The study's sampler (seeded TPE or random), seeded per trial: see TrialSeededSampler."""
    if spec.study.sampler == "random":
        return TrialSeededSampler(
            lambda seed: optuna.samplers.RandomSampler(seed=seed), spec.study.seed
        )

    def tpe(seed: int) -> optuna.samplers.BaseSampler:
        with warnings.catch_warnings():
            # group and constant_liar are experimental
            warnings.simplefilter("ignore", ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed,
                multivariate=True,
                group=True,  # conditional knobs (prefetch_factor, momentum) form their own groups
                constant_liar=True,  # trials running in other processes count as poor ones
                n_startup_trials=spec.study.n_startup_trials,  # counted over the whole study
            )

    return TrialSeededSampler(tpe, spec.study.seed)


def make_pruner(spec: Spec) -> optuna.pruners.BasePruner:
    """The study's pruner; evaluations are the steps it compares trials at."""
    name = spec.study.pruner
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1)
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0)
    if name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1)
    return optuna.pruners.NopPruner()


# ---------------------------------------------------------------------------------------------
# Creating, resuming and loading studies
# ---------------------------------------------------------------------------------------------


def _effective_space_text(spec: Spec) -> str:
    return json.dumps(spec.space.model_dump(mode="json"), indent=1, sort_keys=True)


def _resume_problem(study: optuna.Study, spec: Spec) -> str | None:
    """Why ``spec`` cannot continue ``study``, with a readable diff; None when it can."""
    attrs = study.user_attrs
    deadline = time.monotonic() + PEER_CREATION_SECONDS
    while "search_fingerprint" not in attrs and _is_new(study) and time.monotonic() < deadline:
        time.sleep(0.2)  # another `autotune run` created it a moment ago and is labelling it
        attrs = study.user_attrs
    stored = attrs.get("search_fingerprint")
    if stored is None:
        return (
            f"study '{study.study_name}' was not created by autotune (it has no "
            f"search_fingerprint); give another --study-name"
        )
    if stored == spec.search_fingerprint():
        return None
    if "search_definition" not in attrs and stored in _fingerprints_before_1122(spec):
        return None  # the same search, labelled by an earlier autotune
    old_text, new_text = attrs.get("space_file", ""), spec.text
    if old_text != new_text:
        title = "the space file changed since the study was created"
        before, after = old_text, new_text
    elif "search_definition" in attrs:  # the same file: an option (--device) or the machine
        title = (
            "the search differs from the one the study was created with (another --device, "
            "or a machine that can run other values)"
        )
        before, after = attrs["search_definition"], spec.search_definition()
    else:
        title = "this machine can run a different set of values than the machine that created it"
        before, after = attrs.get("effective_space", ""), _effective_space_text(spec)
    diff = "\n".join(
        difflib.unified_diff(
            before.splitlines(), after.splitlines(), "in the study", "now", lineterm="", n=1
        )
    )
    if not diff:
        return (
            f"study '{study.study_name}' cannot be resumed: its search label "
            f"({stored}) does not match this space file's, and the study records no "
            f"difference autotune can show (was it made by another autotune version?)"
        )
    return f"study '{study.study_name}' cannot be resumed: {title}:\n{diff}"


def _fingerprints_before_1122(spec: Spec) -> set[str]:
    """The search fingerprints autotune wrote until 2026-11-22: compact JSON, and the device as
    given (not yet resolved), so every spelling it could have had is tried."""
    found = set()
    for device in {"auto", "cpu", "cuda", spec.workload.device}:
        canonical = json.dumps(spec.search_payload(device), sort_keys=True, separators=(",", ":"))
        found.add(hashlib.sha256(canonical.encode()).hexdigest()[:16])
    return found


def _is_new(study: optuna.Study) -> bool:
    """A study with no trials yet: possibly one another process is still setting up."""
    return not study.get_trials(deepcopy=False)


def _next_free_name(storage: optuna.storages.BaseStorage, name: str) -> str:
    taken = set(optuna.get_all_study_names(storage))
    number = 2
    while f"{name}-{number}" in taken:
        number += 1
    return f"{name}-{number}"


def open_study(
    spec: Spec,
    storage: optuna.storages.BaseStorage,
    hardware: Hardware,
    workload: Workload | None = None,
    new_study: bool = False,
) -> optuna.Study:
    """Create the study of ``spec`` (already restricted to ``hardware``), or resume it.

    A study whose search differs is refused (StudyError with a diff) unless ``new_study``,
    which starts a fresh study under the next free name (``name-2``, ``name-3``, ...).
    """
    name = spec.study_name
    if name in optuna.get_all_study_names(storage):
        study = optuna.load_study(study_name=name, storage=storage)
        problem = _resume_problem(study, spec)
        if problem is None:
            return _with_sampler(study, spec, storage)
        if not new_study:
            raise StudyError(
                f"{problem}\nrun with --new-study to start a new study, or set study.name"
            )
        name = _next_free_name(storage, name)
    try:
        study = optuna.create_study(
            study_name=name, storage=storage, direction=spec.objective.direction
        )
    except optuna.exceptions.DuplicatedStudyError:
        # another `autotune run` created it a moment ago: join it like a resume
        return open_study(spec, storage, hardware, workload, new_study=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)  # stable in practice since 3.2
        study.set_metric_names([spec.objective.metric])
    text = spec.text
    for key, value in {
        "space_file": text,
        "space_file_path": str(spec.path) if spec.path else None,
        "space_hash": hashlib.sha256(text.encode()).hexdigest()[:16],
        "search_fingerprint": spec.search_fingerprint(),
        "search_definition": spec.search_definition(),
        "effective_space": _effective_space_text(spec),
        # where module:function entry points were found, for exported scripts
        "space_file_dir": str(spec.path.resolve().parent) if spec.path else None,
        "metric": spec.objective.metric,
        "created_on": hardware.device_name,
        "autotune_version": autotune.__version__,
    }.items():
        study.set_user_attr(key, value)
    if workload is not None:
        study.set_user_attr("num_classes", workload.num_classes)
        study.set_user_attr("input_shape", list(workload.input_shape))
    study.set_user_attr("hardware", telemetry.fingerprint(hardware))
    if spec.study.baseline is not False:
        study.enqueue_trial(space.baseline_params(spec, hardware), user_attrs={"baseline": True})
    return _with_sampler(study, spec, storage)


def _with_sampler(
    study: optuna.Study, spec: Spec, storage: optuna.storages.BaseStorage
) -> optuna.Study:
    return optuna.load_study(
        study_name=study.study_name,
        storage=storage,
        sampler=make_sampler(spec),
        pruner=make_pruner(spec),
    )


def load_study(name: str, storage_url: str) -> optuna.Study:
    """An existing study, for reading; StudyError naming the studies there when it is absent."""
    storage = open_storage(storage_url, create_dirs=False)
    names = optuna.get_all_study_names(storage)
    if name not in names:
        known = ", ".join(sorted(names)) or "none"
        hint = difflib.get_close_matches(name, names, n=1)
        suggestion = f"did you mean '{hint[0]}'? " if hint else ""
        raise StudyError(f"no study '{name}' in {storage_url}; {suggestion}studies there: {known}")
    return optuna.load_study(study_name=name, storage=storage)


def feasible_trials(study: optuna.Study) -> list[FrozenTrial]:
    """COMPLETE trials that satisfy every constraint, best first."""
    trials = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if all(value <= 0 for value in t.constraints.values())
    ]
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    return sorted(trials, key=lambda t: t.value, reverse=maximize)  # type: ignore[arg-type]


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The best feasible COMPLETE trial, or None."""
    trials = feasible_trials(study)
    return trials[0] if trials else None


def trial_config(trial: FrozenTrial) -> TrialConfig:
    """The full configuration a trial trained with (stored as its ``config`` attribute)."""
    return TrialConfig.from_dict(trial.user_attrs["config"])


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


class Terminated(KeyboardInterrupt):
    """The study process got SIGTERM: stop like Ctrl-C, recording the running trial."""


class StudyObserver:
    """Hooks for showing a study's progress; the default does nothing."""

    def trial_started(self, number: int, config: TrialConfig) -> None:
        """A trial is about to train with ``config``."""

    def evaluated(self, number: int, evaluation: Evaluation, value: float) -> None:
        """A trial evaluated; ``value`` is what the pruner sees."""

    def trial_finished(self, trial: FrozenTrial) -> None:
        """A trial ended (any state); its attributes are final."""

    def waiting(self, running: int) -> None:
        """The study's last trials are running elsewhere (or are stale); this run waits."""


@dataclass
class RunOutcome:
    """What one ``run_study`` call did."""

    study_name: str
    trials_run: int = 0
    stopped_reason: str = ""  # why the run ended before n_trials, if it did
    interrupted: bool = False
    terminated: bool = False  # interrupted by SIGTERM rather than Ctrl-C
    repeated_error: str | None = None
    states: dict[str, int] = field(default_factory=dict)


def counted_trials(study: optuna.Study) -> int:
    """Trials that count towards n_trials (COMPLETE and PRUNED)."""
    return len(study.get_trials(deepcopy=False, states=COUNTED_STATES))


def _heartbeat_interval(storage: optuna.storages.BaseStorage) -> int | None:
    """The storage's heartbeat interval in seconds; None when it keeps no heartbeat.

    Studies hold their RDB storage wrapped in a cache; both speak Optuna's heartbeat interface.
    """
    interval = getattr(storage, "get_heartbeat_interval", None)
    return interval() if interval is not None else None


@contextlib.contextmanager
def _heartbeat(study: optuna.Study, trial_id: int) -> Iterator[None]:
    """Record the trial's heartbeat every interval while it runs (RDB storages with heartbeat).

    A study process that dies (SIGKILL, power loss) stops beating; the next ``autotune run``
    finds the trial stale, records it as interrupted and queues its parameters once more.
    """
    storage = study._storage
    interval = _heartbeat_interval(storage)
    if interval is None:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):  # a missed beat is not worth a crash
                storage.record_heartbeat(trial_id)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name="autotune-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def recover_stale_trials(study: optuna.Study) -> int:
    """Fail trials whose study process stopped beating, as ``interrupted``; return how many.

    Their parameters are queued once more (RetryHeartbeatStaleTrialCallback in the storage).
    """
    storage = study._storage
    if _heartbeat_interval(storage) is None:
        return 0
    # the heartbeat interface's own query (underscored in Optuna, but the one
    # fail_stale_trials uses): these are the trials it is about to fail
    stale = storage._get_stale_trial_ids(study._study_id)  # type: ignore[attr-defined]
    for trial_id in stale:
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            storage.set_trial_user_attr(trial_id, "fail_kind", "interrupted")
            storage.set_trial_user_attr(
                trial_id,
                "fail_msg",
                "its study process stopped without recording it (killed or lost); "
                "its parameters were queued again",
            )
    if stale:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
    return len(stale)


@dataclass
class MemoryWalls:
    """Micro-batch sizes that ran out of memory, by (precision, compile, channels_last,
    data_pipeline): the device pipeline holds the whole training set in device memory too.

    A configuration at or above a wall is not trained again: it is recorded as ``oom``
    straight away, so the study does not pay for the same out-of-memory twice.
    """

    walls: dict[tuple[str, str, bool, str], tuple[int, int]] = field(default_factory=dict)

    @staticmethod
    def _key(config: TrialConfig) -> tuple[str, str, bool, str]:
        return config.precision, config.compile, config.channels_last, config.data_pipeline

    def add(self, config: TrialConfig, trial_number: int) -> None:
        key = self._key(config)
        if key not in self.walls or config.batch_size < self.walls[key][0]:
            self.walls[key] = (config.batch_size, trial_number)

    def blocks(self, config: TrialConfig) -> str | None:
        """Why ``config`` would run out of memory, or None."""
        wall = self.walls.get(self._key(config))
        if wall is None or config.batch_size < wall[0]:
            return None
        return (
            f"not run: batch {config.batch_size} >= {wall[0]}, which ran out of memory in trial "
            f"{wall[1]} at {config.precision}, compile {config.compile}, "
            f"{config.data_pipeline} pipeline"
        )

    @classmethod
    def from_study(cls, study: optuna.Study) -> MemoryWalls:
        walls = cls()
        for trial in study.get_trials(deepcopy=False):
            attrs = trial.user_attrs
            if (
                attrs.get("fail_kind") == "oom"
                and not attrs.get("oom_skipped")
                and "config" in attrs
            ):
                walls.add(TrialConfig.from_dict(attrs["config"]), trial.number)
        return walls


def _record_result(trial: optuna.Trial, result: TrialResult, precision: str) -> None:
    attrs: dict[str, Any] = {
        "accuracy": result.accuracy,
        "train_seconds": result.train_seconds,
        "overhead_seconds": result.overhead_seconds,
        "warmup_seconds": result.warmup_seconds,
        "samples_per_second": result.samples_per_second,
        "effective_batch_size": result.effective_batch_size,
        "samples_seen": result.samples_seen,
        "optimizer_steps": result.optimizer_steps,
        "epochs_trained": result.evaluations[-1].epoch,
        "peak_memory_bytes": result.peak_memory_bytes,
        "compiled_graphs": result.compiled_graphs,
        "device_name": result.device_name,
        "torch_version": result.torch_version,
        "accuracy_curve": [[round(e.epoch, 4), e.accuracy] for e in result.evaluations],
    }
    if result.loss_scale is not None:
        attrs["loss_scale"] = result.loss_scale
        attrs["skipped_steps"] = result.skipped_steps
    attrs.update(_where_the_time_went(result, device_name=result.device_name, precision=precision))
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


def _where_the_time_went(result: TrialResult, device_name: str, precision: str) -> dict[str, Any]:
    """Time breakdown, bottleneck, compile time, FLOP/s, MFU and GPU telemetry of a trial."""
    attrs: dict[str, Any] = {}
    if result.time_breakdown:
        total = sum(result.time_breakdown.values())
        if total > 0:
            fractions = {
                phase: seconds / total for phase, seconds in result.time_breakdown.items()
            }
            attrs["time_breakdown"] = {phase: round(f, 4) for phase, f in fractions.items()}
            attrs["data_wait_fraction"] = fractions["data_wait"]
            attrs["bottleneck"] = timing.bottleneck(fractions, result.gpu.get("gpu_utilization"))
    if result.compile_seconds is not None:
        attrs["compile_seconds"] = result.compile_seconds
    if result.flops_per_sample:
        achieved = result.flops_per_sample * result.samples_per_second
        attrs["flops_per_sample"] = result.flops_per_sample
        attrs["achieved_flops"] = achieved  # FLOP/s, steady state
        peak = telemetry.peak_flops(device_name, precision)
        if peak is not None:
            attrs["mfu"] = achieved / peak
    attrs.update(result.gpu)
    return attrs


def _fault(trial: optuna.Trial, kind: str, message: str) -> TrialState:
    """Record a fault on the trial; the state it ends in."""
    trial.set_user_attr("fail_kind", kind)
    trial.set_user_attr("fail_msg", message)
    if kind in faults.CONFIGURATION_FAULTS:
        trial.set_constraint("fault", 1.0)  # the sampler learns from PRUNED + infeasible
        return TrialState.PRUNED
    return TrialState.FAIL


@dataclass
class _Trial:
    """One trial being run: what the loop needs to run it and say how it ended."""

    spec: Spec
    hardware: Hardware
    executor: TrialExecutor
    observer: StudyObserver
    walls: MemoryWalls

    def train(self, trial: optuna.Trial) -> tuple[TrialState, float | None]:
        """Sample, train and score ``trial``; its end state and value (None unless COMPLETE)."""
        spec, goal = self.spec, self.spec.objective
        config = space.sample(trial, spec, self.hardware)
        trial.set_user_attr("config", config.to_dict())
        self.observer.trial_started(trial.number, config)
        blocked = self.walls.blocks(config)
        if blocked is not None:
            trial.set_user_attr("oom_skipped", True)
            return _fault(trial, "oom", blocked), None
        pruned_at: list[Evaluation] = []

        def report(evaluation: Evaluation) -> bool:
            value = objective.intermediate_value(evaluation, goal)
            trial.report(value, evaluation.index)
            self.observer.evaluated(trial.number, evaluation, value)
            if objective.target_reached(evaluation, goal):
                return True
            if not evaluation.final and trial.should_prune():
                pruned_at.append(evaluation)
                return True
            return False

        started = time.monotonic()
        try:
            result = self.executor.run(config, report)
        except (KeyboardInterrupt, WorkerError):
            raise
        except Exception as error:
            trial.set_user_attr("wall_seconds", time.monotonic() - started)
            kind, message = faults.classify(error)
            faults.release_memory()
            if kind == "oom":
                self.walls.add(config, trial.number)
            if kind == "error":
                details = getattr(error, "details", "") or traceback.format_exc()
                trial.set_user_attr("fail_traceback", details[-4000:])
            return _fault(trial, kind, message), None
        trial.set_user_attr("wall_seconds", time.monotonic() - started)

        _record_result(trial, result, config.precision)
        if pruned_at:
            at = pruned_at[0]
            message = (
                f"pruned at evaluation {at.index} (epoch {at.epoch:.2f}, accuracy "
                f"{at.accuracy:.3f}) by the {spec.study.pruner} pruner"
            )
            trial.set_user_attr("fail_kind", "pruned")
            trial.set_user_attr("fail_msg", message)
            return TrialState.PRUNED, None
        score = objective.score(result, goal)
        trial.set_user_attr("charged_seconds", score.charged_seconds)
        if score.constraint is not None and score.constraint_name is not None:
            trial.set_constraint(score.constraint_name, score.constraint)
        # optuna-dashboard 0.21 does not show Optuna 5's named constraints: say it plainly
        trial.set_user_attr("feasible", score.feasible)
        if not score.feasible:
            trial.set_user_attr("infeasible_reason", score.reason)
        return TrialState.COMPLETE, score.value

    def run(self, study: optuna.Study) -> FrozenTrial:
        """Ask for a trial, train it with a heartbeat, tell how it ended."""
        with warnings.catch_warnings():
            # Optuna beats only inside Study.optimize; this loop beats itself (_heartbeat)
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
            trial = study.ask()
        with _heartbeat(study, trial._trial_id):
            try:
                state, value = self.train(trial)
            except KeyboardInterrupt as stop:
                how = "SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C (SIGINT)"
                trial.set_user_attr("fail_kind", "interrupted")
                trial.set_user_attr("fail_msg", f"the study was stopped by {how}")
                self.observer.trial_finished(study.tell(trial, state=TrialState.FAIL))
                raise
            except Exception as error:
                # a worker that cannot start (the study stops and says why), or a bug outside
                # training: either way no trial is left RUNNING
                message = (
                    str(error)
                    if isinstance(error, WorkerError)
                    else (f"{type(error).__name__}: {error}")
                )
                with contextlib.suppress(Exception):
                    _fault(trial, "error", message)
                    study.tell(trial, state=TrialState.FAIL)
                raise
        if state == TrialState.COMPLETE:
            return study.tell(trial, value)
        return study.tell(trial, state=state)


def run_study(
    study: optuna.Study,
    spec: Spec,
    hardware: Hardware,
    executor: TrialExecutor,
    observer: StudyObserver | None = None,
) -> RunOutcome:
    """Run trials until the study holds ``spec.study.n_trials`` COMPLETE or PRUNED trials.

    Several processes may run one study: each starts a trial only while the study's counted and
    running trials are short of the total, and waits for the last ones to finish. Stops early
    at ``spec.study.timeout`` seconds (a running trial finishes first), when as many trials
    failed as were wanted, or when the same unexpected error ends ``SAME_ERROR_LIMIT`` trials in
    a row before any completes in this run (a bug in the workload, not a bad configuration). An
    interruption records the running trial as ``interrupted`` and sets ``outcome.interrupted``;
    WorkerError (a worker that cannot start) propagates after the trial is recorded.
    """
    observer = observer or StudyObserver()
    outcome = RunOutcome(study_name=study.study_name)
    target = spec.study.n_trials
    deadline = time.monotonic() + spec.study.timeout if spec.study.timeout else None
    runner = _Trial(spec, hardware, executor, observer, MemoryWalls.from_study(study))
    errors: list[str] = []  # messages of unexpected errors since the last counted trial
    completed_here = False  # whether a trial of this run completed
    failures = 0
    wait_seconds = min(1.0, float(spec.study.heartbeat_interval))
    try:
        while True:
            recover_stale_trials(study)
            trials = study.get_trials(deepcopy=False)
            counted = sum(1 for t in trials if t.state in COUNTED_STATES)
            running = sum(1 for t in trials if t.state == TrialState.RUNNING)
            if counted >= target:
                if outcome.trials_run == 0:
                    outcome.stopped_reason = (
                        f"the study already has {counted} of its {target} trials; "
                        f"raise study.n_trials (or --n-trials) to run more"
                    )
                break
            if deadline is not None and time.monotonic() >= deadline:
                outcome.stopped_reason = f"the timeout of {spec.study.timeout:g} s was reached"
                break
            if counted + running >= target:
                observer.waiting(running)
                time.sleep(wait_seconds)
                continue
            trial = runner.run(study)
            outcome.trials_run += 1
            observer.trial_finished(trial)
            if trial.state == TrialState.FAIL:
                failures += 1
                if trial.user_attrs.get("fail_kind") == "error":
                    errors.append(str(trial.user_attrs.get("fail_msg")))
            elif trial.state in COUNTED_STATES:
                errors.clear()
                completed_here = completed_here or trial.state == TrialState.COMPLETE
            last = errors[-SAME_ERROR_LIMIT:]
            # the same error every time, and nothing trained to the end in this run (earlier
            # runs may have completed trials before the code broke): a bug, not a configuration
            if len(last) == SAME_ERROR_LIMIT and len(set(last)) == 1 and not completed_here:
                outcome.repeated_error = errors[-1]
                break
            if failures >= max(target, SAME_ERROR_LIMIT):
                outcome.stopped_reason = f"{failures} trials failed in this run"
                break
    except KeyboardInterrupt as stop:
        outcome.interrupted = True
        outcome.terminated = isinstance(stop, Terminated)
    trials = study.get_trials(deepcopy=False)
    for state in TrialState:
        count = sum(1 for t in trials if t.state == state)
        if count:
            outcome.states[state.name] = count
    return outcome
