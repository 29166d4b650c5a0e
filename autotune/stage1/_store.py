"""The speed study (``NAME.speed``): what one measurement records, and the cache it forms.

Each measurement is a finished Optuna trial of ``NAME.speed``: samples/s as its value, the
execution knobs as its parameters (on fixed axes, for optuna-dashboard), and a ``cache_key``
naming its context (machine, torch, threads, workload, entry points' source, data size) and its
knobs. Every speed study in the storage is the cache. Of failures only those that say something
of the setting (``FACTS``: out of memory, a failed compile) are reused; ``--remeasure`` ignores
the cache.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import importlib.util
import statistics
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.exceptions import ExperimentalWarning
from optuna.trial import TrialState

from autotune.faults import FaultKind
from autotune.knobs import DDP_KNOBS, KNOBS
from autotune.machine.interference import usable_cores
from autotune.spacefile import Spec
from autotune.speed import SpeedMeasurement
from autotune.stage1._plan import Cell, Settings

if TYPE_CHECKING:
    from autotune.machine.hardware import Hardware
    from autotune.workloads import Workload


SPEED_SUFFIX = ".speed"
# faults that say nothing about the configuration (a busy machine, an interruption, stage 1's
# budget running out): measured again, in the same stage where it has the time
TRANSIENT_FAULTS = (FaultKind.TIMEOUT_UNDER_LOAD.value, FaultKind.INTERRUPTED.value)
# faults that say something of the setting on this machine, and only these, are reused from
# the cache; a crash (a worker that could not start, an EOFError), an unexpected error or a
# DataLoader worker that died may not happen again, and is measured again by a later run
FACTS = tuple(
    kind.value
    for kind in (
        FaultKind.OOM,
        FaultKind.COMPILE_ERROR,
        FaultKind.INVALID_CONFIG,
        FaultKind.NONFINITE_LOSS,
        FaultKind.TRIAL_TIMEOUT,
    )
)
REMEASURE_HINT = "measured by an earlier run: re-measure with --remeasure"


def speed_study_name(study_name: str) -> str:
    """The name of the study that holds ``study_name``'s speed measurements."""
    return f"{study_name}{SPEED_SUFFIX}"


@dataclass(frozen=True)
class SpeedRecord:
    """The user attributes of one speed measurement (a trial of ``NAME.speed``)."""

    cache_key: str
    context: str  # the machine, model and data it was measured on (see context_facts)
    cell: str  # "batch 64, bf16"
    settings: str  # in words: "2 workers, prefetch 2, compile default"
    measurement: dict[str, Any] | None = None  # SpeedMeasurement's fields (None: it failed)
    interference: bool = False  # others took more than INTERFERENCE_SHARE of its cores
    round: int = 1  # 1: first measurement; 2...: a leader measured again
    fail_kind: str | None = None
    fail_msg: str | None = None
    fail_traceback: str | None = None  # fail_kind error: where it happened

    def to_attrs(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def of(cls, trial: optuna.trial.FrozenTrial) -> SpeedRecord | None:
        attrs = trial.user_attrs
        if "cache_key" not in attrs or "context" not in attrs:
            return None
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in attrs.items() if k in names})

    def result(self) -> SpeedMeasurement | None:
        if self.measurement is None:
            return None
        fields = dict(self.measurement)
        for name in ("step_seconds", "optimizer_seconds", "epoch_start_seconds"):
            fields[name] = tuple(fields[name])
        return SpeedMeasurement(**fields)


@dataclass(frozen=True, kw_only=True)
class SpeedEvent:
    """One step of stage 1, for the display: a measurement taken, reused or skipped (its
    fields named where it is made)."""

    cell: str
    settings: str
    samples_per_second: float | None = None  # None: it failed or was skipped
    spread: float | None = None
    cached: bool = False  # reused from an earlier measurement with the same key
    fault: str | None = None  # why it has no speed
    round: int = 1
    measured: bool = True  # False: not tried (a memory wall, a pipeline far behind)
    reason: str | None = None  # not tried: by which rule ("past the budget": _rules.BUDGET)

    @classmethod
    def left_out(cls, cell: str, settings: str, why: str, reason: str) -> SpeedEvent:
        """``settings`` of ``cell`` not tried, ``why`` (a memory wall, the budget, ...), by
        the rule ``reason`` names."""
        return cls(cell=cell, settings=settings, fault=why, measured=False, reason=reason)


def _source_digest(entry: str) -> str | None:
    """A hash of the source file of a ``package.module:function`` entry point's module."""
    module = entry.partition(":")[0]
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return None
    try:
        with open(found.origin, "rb") as source:
            return hashlib.sha256(source.read()).hexdigest()[:16]
    except OSError:
        return None


def context_facts(spec: Spec, hardware: Hardware, workload: Workload | None) -> dict[str, Any]:
    """What every measurement of this study depends on: the machine and torch, the threads a
    trial gets, the workload as the space file names it, the code of its entry points, and
    the data's size and shape."""
    from autotune.training import telemetry

    machine = telemetry.fingerprint(hardware)
    machine.pop("platform", None)  # a kernel update does not change a step's speed
    named = spec.workload.model_dump(
        mode="json",
        include={"model", "model_args", "data", "data_args", "inputs", "target", "loss"},
    )
    facts: dict[str, Any] = {
        "machine": machine,
        "threads": usable_cores(),  # the machine's, not the load's of the moment
        "workload": named,
        "code": {entry: _source_digest(entry) for entry in spec.workload.user_entry_points()},
    }
    if workload is not None:
        facts["data"] = {
            "train": len(workload.train_set),  # type: ignore[arg-type]  # map-style: sized
            "input_shape": list(workload.input_shape),
            "num_classes": workload.num_classes,
        }
    return facts


# -- the speed study ----------------------------------------------------------------------------

_FLAGS = CategoricalDistribution((False, True))


def _distributions(config_values: dict[str, Any]) -> dict[str, BaseDistribution]:
    """Fixed distributions of a speed trial's parameters, from the registry, so that the
    dashboard plots every trial of every run on the same axes."""
    big = max(256, *(v for v in config_values.values() if isinstance(v, int)))

    def axis(name: str) -> BaseDistribution:
        info = KNOBS[name]
        if info.kind == "bool":
            return _FLAGS
        if info.kind == "choice":
            return CategoricalDistribution(info.choices)
        if name == "batch_size":
            return IntDistribution(1, max(big, 1 << 16), log=True)
        return IntDistribution(int(info.ge or 0), big)

    return {name: axis(name) for name in config_values}


def speed_params(cell: Cell, settings: Settings) -> dict[str, Any]:
    values: dict[str, Any] = {"batch_size": cell.batch_size, "precision": cell.precision}
    # None: prefetch_factor without workers, say: it means nothing there
    values |= {name: value for name, value in (*cell.extras, *settings) if value is not None}
    if values.get("num_workers", 0) == 0:
        values.pop("persistent_workers", None)
    if not cell.distributed:  # DDP's settings mean nothing to one process
        for name in DDP_KNOBS:
            values.pop(name, None)
    return values


def known_distributions(study: optuna.Study) -> dict[str, BaseDistribution]:
    """The distribution of each parameter the speed study's trials already hold."""
    known: dict[str, BaseDistribution] = {}
    for trial in study.get_trials(deepcopy=False):
        for name, distribution in trial.distributions.items():
            known.setdefault(name, distribution)
    return known


def _fitted(
    params: dict[str, Any], known: dict[str, BaseDistribution]
) -> tuple[dict[str, Any], dict[str, BaseDistribution]]:
    """``params`` and their distributions on the axes the speed study already has: a study
    written before a knob gained a value (precision's fp32-strict) keeps its categorical
    distribution, which Optuna never lets change; a value it cannot hold is left off the
    parameters (the trial's record and cache key still say it). ``known`` learns new ones."""
    fitted: dict[str, Any] = {}
    distributions: dict[str, BaseDistribution] = {}
    for name, distribution in _distributions(params).items():
        old = known.get(name)
        if isinstance(old, CategoricalDistribution) and isinstance(
            distribution, CategoricalDistribution
        ):
            if params[name] not in old.choices:
                continue
            distribution = old
        known.setdefault(name, distribution)
        fitted[name], distributions[name] = params[name], distribution
    return fitted, distributions


def speed_trial(
    cell: Cell,
    settings: Settings,
    record: SpeedRecord,
    value: float | None,
    known: dict[str, BaseDistribution],
) -> optuna.trial.FrozenTrial:
    """A finished speed trial: COMPLETE with ``value`` (samples/s), or FAIL without one; its
    parameters on the axes ``known`` (``known_distributions``) says the study has."""
    params, distributions = _fitted(speed_params(cell, settings), known)
    return optuna.trial.create_trial(
        state=TrialState.COMPLETE if value is not None else TrialState.FAIL,
        value=value,
        params=params,
        distributions=distributions,
        user_attrs=record.to_attrs(),
    )


def open_speed_study(storage: optuna.storages.BaseStorage, study_name: str) -> optuna.Study:
    """``NAME.speed``, created when it does not exist yet."""
    name = speed_study_name(study_name)
    study = optuna.create_study(
        study_name=name, storage=storage, direction="maximize", load_if_exists=True
    )
    if not study.metric_names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            study.set_metric_names(["samples_per_second"])
    return study


@dataclass
class Pool:
    """Every usable measurement of one cache key."""

    # (speed trial number, measurement, measured under interference, its round)
    results: list[tuple[int, SpeedMeasurement, bool, int]] = field(default_factory=list)
    fault: tuple[str, str] | None = None  # (kind, message) of a measurement that failed

    def clean(self) -> list[tuple[int, SpeedMeasurement]]:
        """The measurements to trust: those without interference when there are any."""
        quiet = [(n, m) for n, m, flagged, _ in self.results if not flagged]
        return quiet or [(n, m) for n, m, _, _ in self.results]

    def flagged_only(self) -> bool:
        """Whether it has measurements and every one was taken under interference."""
        return bool(self.results) and all(flagged for _, _, flagged, _ in self.results)

    def first_round(self) -> float | None:
        """Samples/s of the first round (the median of its measurements): what decides which
        settings are measured again and the cells' order, so that a resumed stage decides as
        the first run did. Of its earliest round with a clean measurement where it has one (a
        figure taken under interference is not weighed with clean ones), else of its first
        (``flagged_only``)."""
        clean = [r for _, _, flagged, r in self.results if not flagged]
        first = min(clean, default=1)
        speeds = [
            m.samples_per_second()
            for _, m, flagged, r in self.results
            if r == first and (not flagged or not clean)
        ]
        return statistics.median(speeds) if speeds else None

    def combined(self) -> SpeedMeasurement | None:
        """The measurements pooled: every burst of every one, medians of the rest."""
        results = [m for _, m in self.clean()]
        if not results:
            return None
        first = results[0]
        return dataclasses.replace(
            first,
            step_seconds=tuple(s for m in results for s in m.step_seconds),
            optimizer_seconds=tuple(s for m in results for s in m.optimizer_seconds),
            epoch_start_seconds=tuple(s for m in results for s in m.epoch_start_seconds),
            one_time_seconds=statistics.median(m.one_time_seconds for m in results),
            peak_memory_bytes=max(m.peak_memory_bytes for m in results),
        )


def load_cache(
    storage: optuna.storages.BaseStorage,
    context: str,
    since: datetime.datetime | None,
    study_name: str,
    key: str | None = None,
) -> dict[str, Pool]:
    """Every measurement in the storage's speed studies taken in ``context`` (after
    ``since``, when given; of cache key ``key`` only, when given), by cache key.

    A measurement taken under interference is left out unless it is study ``study_name``'s
    own (its runs, resumed or side by side, and its --workers share one stage 1): what one
    study measured on a busy machine is not the truth another study reuses; it times it again.
    A failed one is left out unless its fault is one of ``FACTS``, which says where it is shown
    that --remeasure times it again.
    """
    pools: dict[str, Pool] = {}
    own = speed_study_name(study_name)
    for name in optuna.get_all_study_names(storage):
        if not name.endswith(SPEED_SUFFIX):
            continue
        study = optuna.load_study(study_name=name, storage=storage)
        for trial in study.get_trials(deepcopy=False):
            record = SpeedRecord.of(trial)
            if record is None or record.context != context:
                continue
            if key is not None and record.cache_key != key:
                continue
            if record.interference and name != own:
                continue
            if since is not None and (trial.datetime_start or since) < since:
                continue
            pool = pools.setdefault(record.cache_key, Pool())
            result = record.result()
            if trial.state == TrialState.COMPLETE and result is not None:
                pool.results.append((trial.number, result, record.interference, record.round))
            elif trial.state == TrialState.FAIL and record.fail_kind in FACTS:
                message = record.fail_msg or record.fail_kind
                pool.fault = (str(record.fail_kind), f"{message} ({REMEASURE_HINT})")
    return pools
