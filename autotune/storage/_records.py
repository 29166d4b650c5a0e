"""What autotune records on a trial and on a study, defined once.

Optuna keeps free-form user attributes; autotune's are typed here. ``TrialRecord`` is every
attribute a trial can carry (its configuration, measurements, score, fault), ``StudyRecord``
every attribute of a study (the space file, the search it was created with, the machine).
Writers build a record and store ``to_attrs()``; readers go through ``TrialRecord.of(trial)`` and
``StudyRecord.of(study)``, never through key strings of their own (``_queries`` answers the
questions every reader asks of a study: its feasible trials, its best, its baseline).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Self

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import TrialConfig
from autotune.faults import FaultKind
from autotune.machine.interference import interfered
from autotune.results import TrialResult
from autotune.speed import SpeedTable

# the configurations every study measures its answer against (autotune.search.references), in the
# order they are queued: the untuned baseline, then the tuning checklist
ReferenceKind = Literal["baseline", "checklist"]
REFERENCES: tuple[ReferenceKind, ...] = ("baseline", "checklist")
# as the answer's lines name them (a trial's mark is the name without "the")
REFERENCE_NAMES: dict[ReferenceKind, str] = {
    "baseline": "the untuned baseline",
    "checklist": "the tuning checklist",
}


@dataclass(frozen=True)
class _Record:
    """A record stored as user attributes of a trial or a study: a field each, as JSON."""

    def to_attrs(self) -> dict[str, Any]:
        """The user attributes to store: every field that differs from its default, as JSON."""
        attrs: dict[str, Any] = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if value != item.default:
                attrs[item.name] = _CODECS[item.name][0](value) if item.name in _CODECS else value
        return attrs

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> Self:
        """The record in a trial's or a study's user attributes (a user's, another tool's are
        not its fields: ignored)."""
        fields = cls.__dataclass_fields__
        known = {name: value for name, value in attrs.items() if name in fields}
        for old, new in _RENAMED.items():  # trials stored before the names changed
            if old in attrs and new in fields and new not in known:
                known[new] = attrs[old]
        for name, (_, decode) in _CODECS.items():
            if known.get(name) is not None:
                known[name] = decode(known[name])
        return cls(**known)

    def store(self, holder: optuna.Trial | optuna.Study) -> None:
        """Write this record's attributes on a running trial or a study, one transaction
        each, in field order."""
        for key, value in self.to_attrs().items():
            holder.set_user_attr(key, value)


def _metric() -> Any:
    """A field that ``autotune best`` and exports show among a trial's metrics."""
    return field(default=None, metadata={"metric": True})


@dataclass(frozen=True)
class TrialRecord(_Record):
    """Every user attribute autotune stores on a trial; None (or False) when it has not.

    Fields marked as metrics are what ``autotune best`` and the exports show, in this order.
    """

    # -- when it starts
    config: TrialConfig | None = None  # the full configuration it trains with
    baseline: bool = False  # the untuned baseline (enqueued with the study)
    checklist: bool = False  # the tuning checklist (enqueued after the baseline)
    # a searched trial queued as that trial's settings at half its learning rate: the tuning
    # checklist's (or such a trial's) that trained to no useful score (study._run.halve_lr)
    halved_lr_of: int | None = None
    worker: str | None = None  # "2/4": the worker of a --workers / --gpus run that trained it
    # -- what it measured (see autotune.results.TrialResult for the meanings)
    score: float | None = _metric()  # the validation score (objective.score) at its end
    charged_seconds: float | None = _metric()  # what the objective charged (see objective)
    train_seconds: float | None = _metric()  # training wall-clock, overhead included
    overhead_seconds: float | None = _metric()  # one-time costs within train_seconds
    samples_per_second: float | None = _metric()  # steady state
    tokens_per_second: float | None = _metric()  # token inputs, padding excluded
    effective_batch_size: int | None = _metric()
    peak_memory_bytes: int | None = _metric()
    epochs_trained: float | None = _metric()
    compile_seconds: float | None = _metric()  # torch.compile's own share of the overhead
    bottleneck: str | None = _metric()  # data | compute | overhead
    data_wait_fraction: float | None = _metric()
    achieved_flops: float | None = _metric()
    mfu: float | None = _metric()
    gpu_utilization: float | None = _metric()  # NVML, 0..1, steady state
    device_name: str | None = _metric()
    torch_version: str | None = _metric()
    intra_op_threads: int | None = _metric()
    processes: int | None = _metric()  # DDP processes that trained it together; None: one
    other_cpu_share: float | None = _metric()  # others' share of its cores (interference)
    interference: bool = False  # measured while others took more than INTERFERENCE_SHARE
    warmup_seconds: float | None = None
    samples_seen: int | None = None
    optimizer_steps: int | None = None
    compiled_graphs: int | None = None
    score_curve: list[list[float]] | None = None  # [epoch, score] at each evaluation
    printed_lines: int | None = None  # the user's code printed them (not shown); the first:
    first_printed: str | None = None
    loss_scale: float | None = None  # fp16 only
    skipped_steps: int | None = None  # fp16 only
    time_breakdown: dict[str, float] | None = None  # phase -> share of a steady-state step
    flops_per_sample: float | None = None
    gpu_memory_used_bytes: float | None = None  # NVML
    wall_seconds: float | None = None  # the whole trial as the study process saw it
    # device memory its worker did not get back after it (a leak): the worker was replaced
    memory_left_bytes: int | None = None
    # seconds it waited, before its clock started, for another process of this machine
    # training on the same cores or GPU (turns); None: it did not wait
    turn_wait_seconds: float | None = None
    # a retry of a trial failed as stale while its process still trained it: what that
    # process measured before it noticed (trial, score, epochs, train_seconds, samples/s)
    earlier_attempt: dict[str, Any] | None = None
    # -- how it ended
    feasible: bool | None = None  # COMPLETE trials: whether every constraint holds
    infeasible_reason: str | None = None
    fail_kind: FaultKind | None = None  # every trial that is not COMPLETE
    fail_msg: str | None = None
    fail_traceback: str | None = None  # fail_kind error: where it happened
    oom_skipped: bool = False  # not trained: at or above a memory wall found earlier
    # -- two-stage studies: the knobs the speed stage chose, and what it predicted
    speed_knobs: list[str] | None = None  # names of the knobs taken from the speed stage
    predicted_samples_per_second: float | None = None
    speed_trials: list[int] | None = None  # the NAME.speed trials behind the prediction
    speed_tolerance: float | None = None  # how far off the prediction is still expected
    speed_mismatch: bool = False  # trained further off the prediction than that

    @property
    def reference(self) -> ReferenceKind | None:
        """Which reference this trial trains, if it is one."""
        return "baseline" if self.baseline else "checklist" if self.checklist else None

    @classmethod
    def of(cls, trial: FrozenTrial) -> TrialRecord:
        """The record of a stored trial. A COMPLETE trial has no fail_kind: a label it carries
        is a stale-trial recovery's that lost the race with its owner's finish (a finished
        trial's attributes cannot be taken back), not how it ended."""
        record = cls.from_attrs(trial.user_attrs)
        if trial.state == TrialState.COMPLETE and record.fail_kind is not None:
            return dataclasses.replace(record, fail_kind=None, fail_msg=None, fail_traceback=None)
        return record

    def metrics(self) -> dict[str, Any]:
        """The metric fields this trial has, in their order (what ``autotune best`` shows)."""
        return {
            name: getattr(self, name) for name in METRIC_FIELDS if getattr(self, name) is not None
        }

    @classmethod
    def from_result(cls, result: TrialResult, precision: str) -> TrialRecord:
        """What a trial that trained stores of its measurements: each field of both as measured,
        but for those derived here."""
        from autotune.training import telemetry, timing  # torch: only a trial's writer needs it

        breakdown: dict[str, Any] = {"time_breakdown": None}  # seconds in, shares stored
        if result.time_breakdown:
            total = sum(result.time_breakdown.values())
            if total > 0:
                fractions = {
                    phase: seconds / total for phase, seconds in result.time_breakdown.items()
                }
                breakdown = {
                    "time_breakdown": {phase: round(f, 4) for phase, f in fractions.items()},
                    "data_wait_fraction": fractions["data_wait"],
                    "bottleneck": timing.bottleneck(fractions, result.gpu.get("gpu_utilization")),
                }
        flops: dict[str, Any] = {"flops_per_sample": None}
        if result.flops_per_sample:
            achieved = result.flops_per_sample * result.samples_per_second
            peak = telemetry.peak_flops(result.device_name, precision)
            flops = {
                "flops_per_sample": result.flops_per_sample,
                "achieved_flops": achieved,  # FLOP/s, steady state, every process together
                "mfu": achieved / (peak * result.world_size) if peak is not None else None,
            }
        measured = {name: getattr(result, name) for name in _TRIAL_FIELDS & _RESULT_FIELDS}
        return dataclasses.replace(
            cls(**measured),
            **breakdown,
            **flops,
            epochs_trained=result.evaluations[-1].epoch,
            score_curve=[[round(e.epoch, 4), e.score] for e in result.evaluations],
            skipped_steps=result.skipped_steps if result.loss_scale is not None else None,
            gpu_utilization=result.gpu.get("gpu_utilization"),
            gpu_memory_used_bytes=result.gpu.get("gpu_memory_used_bytes"),
            intra_op_threads=result.intra_op_threads or None,  # 0: not recorded
            processes=result.world_size if result.world_size > 1 else None,
            interference=interfered(result.other_cpu_share),
            printed_lines=result.printed_lines or None,
        )


_TRIAL_FIELDS = frozenset(f.name for f in dataclasses.fields(TrialRecord))
_RESULT_FIELDS = frozenset(f.name for f in dataclasses.fields(TrialResult))
# stored attribute names that changed: old -> new (the score was accuracy before any other)
_RENAMED = {"accuracy": "score", "accuracy_curve": "score_curve"}
METRIC_FIELDS = tuple(f.name for f in dataclasses.fields(TrialRecord) if f.metadata.get("metric"))


@dataclass(frozen=True)
class ConfirmRun:
    """One measurement of a confirmed configuration: its original trial (repeat 0) or a run of
    the confirmation round. ``value`` is None for a run that failed (``fault`` says why)."""

    trial: int
    repeat: int
    seed: int
    value: float | None
    score: float | None  # the validation score it reached
    samples_per_second: float | None
    feasible: bool
    wall_seconds: float
    fault: str | None = None
    other_cpu_share: float | None = None  # others' share of its cores while it trained

    @property
    def interfered(self) -> bool:
        """Measured while other processes took enough of its cores to distort it."""
        return interfered(self.other_cpu_share)


REMEASURES = 2  # a confirmation run measured under interference is run again at most this often


@dataclass(frozen=True)
class ConfirmationRecord:
    """The confirmation round of a study, as stored (the study's ``confirmation`` attribute).

    ``candidates`` are the trial numbers confirmed, the leaders best first and the references
    (the untuned baseline, the tuning checklist) last; ``runs`` every measurement so far, the
    originals included. A round that was interrupted is resumed from here.
    """

    top: int
    repeats: int
    maximize: bool
    candidates: tuple[int, ...]
    baseline: int | None
    runs: tuple[ConfirmRun, ...] = ()
    checklist: int | None = None  # its trial, where the study has one
    complete: bool = False
    higher_score_better: bool = True  # the score's direction, for the tie rule

    def to_attrs(self) -> dict[str, Any]:
        """JSON for the study's user attribute."""
        data = dataclasses.asdict(self)
        data["candidates"] = list(self.candidates)
        data["runs"] = [dataclasses.asdict(run) for run in self.runs]
        return data

    @classmethod
    def from_attrs(cls, data: dict[str, Any]) -> ConfirmationRecord:
        """Inverse of ``to_attrs`` (a round stored before a field existed gets its default)."""
        runs = (
            ConfirmRun(**{_RENAMED.get(key, key): value for key, value in run.items()})
            for run in data.get("runs", ())
        )
        stored = {key: value for key, value in data.items() if key in cls.__dataclass_fields__}
        return cls(**{**stored, "candidates": tuple(data["candidates"]), "runs": tuple(runs)})

    @property
    def references(self) -> tuple[str, ...]:
        """The references the round measures, by name (``REFERENCE_NAMES``)."""
        trials = {"baseline": self.baseline, "checklist": self.checklist}
        return tuple(REFERENCE_NAMES[kind] for kind in REFERENCES if trials[kind] is not None)

    def needs_run(self, trial: int, repeat: int, remeasures: int = REMEASURES) -> bool:
        """Whether repeat ``repeat`` of ``trial`` is still to measure: it has no run yet, or only
        runs under interference and no more than ``remeasures`` of them on a machine that does
        not stay busy (a retake is left); in a complete round, none is. A run that trained to
        an infeasible score is not taken again: its seed is the same, and a load changes its
        time, not what it learns."""
        runs = [run for run in self.runs if (run.trial, run.repeat) == (trial, repeat)]
        if self.complete:
            return False
        if not runs:
            return True
        learnt = all(run.feasible or run.fault is not None for run in runs)
        retake = learnt and all(run.interfered for run in runs) and len(runs) <= remeasures
        return retake and self.busy_retakes() < remeasures  # else the machine stays busy

    def busy_retakes(self) -> int:
        """The round's last retakes in a row that were measured under interference too: once
        ``remeasures`` of them, the machine stays busy and later runs are kept as measured.
        Read from the stored runs, so that every process (and a resumed round) decides alike."""
        seen: set[tuple[int, int]] = set()
        busy = 0
        for run in self.runs:
            if (run.trial, run.repeat) in seen:
                busy = busy + 1 if run.interfered else 0
            seen.add((run.trial, run.repeat))
        return busy

    def runs_left(self, remeasures: int = REMEASURES) -> int:
        """Runs of the round still to measure (``needs_run``), retakes included; a run
        measured again counts once."""
        repeats = range(1, self.repeats + 1)
        return sum(self.needs_run(t, r, remeasures) for t in self.candidates for r in repeats)

    def with_run(self, run: ConfirmRun) -> ConfirmationRecord:
        """A copy with one more measurement."""
        return dataclasses.replace(self, runs=(*self.runs, run))


@dataclass(frozen=True)
class StudyRecord(_Record):
    """Every user attribute autotune stores on a study when it creates it."""

    space_file: str | None = None  # the space file's text
    space_file_path: str | None = None  # as given to `autotune run`
    space_file_dir: str | None = None  # absolute: where module:function entry points were found
    space_hash: str | None = None
    search_fingerprint: str | None = None  # the resume guard's label of the search
    search_definition: str | None = None  # what the fingerprint is of, for a readable diff
    effective_space: str | None = None  # the space after hardware filtering (older studies)
    metric: str | None = None  # ObjectiveSpec.metric_name: accuracy_per_second, ...
    score_name: str | None = None  # what trials are scored by (None: accuracy, made before)
    score_higher_is_better: bool | None = None  # the score's direction (None: accuracy's)
    created_on: str | None = None  # the device's name
    autotune_version: str | None = None
    num_classes: int | None = None
    input_shape: list[int] | None = None  # one sample's
    model_kwargs: dict[str, Any] | None = None  # what the model function was called with
    batch_layout: dict[str, Any] | None = None  # BatchLayout.to_record(): inputs and target
    classes_last: bool | None = None  # the model's logits hold the classes last
    hardware: dict[str, Any] | None = None  # telemetry.fingerprint of the machine
    confirmation: ConfirmationRecord | None = None  # the confirmation round, once it started
    strategy: str | None = None  # two_stage | joint (None: made before there was a choice)
    # batch_size: auto, as the probe before stage 1 resolved it once for every process and
    # resume (Optuna refuses a changed distribution): the micro-batches, and its one line
    batch_sizes: list[int] | None = None
    batch_size_auto: str | None = None
    # two_stage: stage 1's table as its last run printed it, reused measurements included
    speed_table: SpeedTable | None = None
    # two_stage: execution knobs sampled in stage 2. The last field, so the last attribute a
    # new study's labelling writes: a process joining a study being created waits for it
    # (``_open._settled_record``); it once waited for the fingerprint alone, read no strategy
    # and ran a joint search in a two-stage study
    learning_knobs: list[str] | None = None

    @classmethod
    def of(cls, study: optuna.Study) -> StudyRecord:
        """The record of a stored study."""
        return cls.from_attrs(study.user_attrs)


# the fields stored as JSON of their own: (written as, read back as)
_CODECS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "config": (TrialConfig.to_dict, TrialConfig.from_dict),
    "fail_kind": (str, FaultKind),
    "confirmation": (ConfirmationRecord.to_attrs, ConfirmationRecord.from_attrs),
    "speed_table": (SpeedTable.to_attrs, SpeedTable.from_attrs),
}
