"""A study's chosen configuration as data and as building blocks for a user's training loop.

``load_best`` reads the best feasible trial of a study (or one named trial) into a ``BestConfig``;
``load_config`` reads one back from an exported YAML/JSON file. ``BestConfig.make_loader`` and
``make_trainer`` apply its knobs to the user's own data and model, with the study's workload:
its collate function, its loss and where its batches hold the inputs and the target.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from autotune.config import TrialConfig
from autotune.display import TrialConfirmation, confirmation_text, fmt
from autotune.errors import UserError
from autotune.spacefile import DEFAULT_STORAGE, ObjectiveSpec, Spec, SpecError, parse_spec
from autotune.study import (
    StudyError,
    StudyRecord,
    TrialRecord,
    answer_of,
    is_feasible,
    knob_origin,
    load_study,
)
from autotune.study._answer import headline

if TYPE_CHECKING:  # torch: only the building blocks need it, not reading a study's answer
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    from autotune.pipeline import Collate, DeviceBatches
    from autotune.training.trainer import LossFn, Trainer


# 2: metrics hold "score" (named by score_name), not "accuracy"; 3: "value" is the headline (the
# confirmed median where the round measured the trial), "trial_value" the trial's own; 4: it
# says its "objective"
EXPORT_FORMAT_VERSION = 4


class ExportError(UserError):
    """A configuration that cannot be exported as asked (a user error): one line."""


@dataclass(frozen=True)
class StudyObjective:
    """What the study's value measures, readable without its space file: "time_to_rmse"
    (minimized) of score ``tabular:rmse`` (lower is better) to ``target_score`` 0.8."""

    metric: str  # the value's name: "accuracy_per_second", "time_to_rmse"
    direction: str  # the value's: "maximize" (score per second) or "minimize" (time to target)
    score: str  # the score function: a built-in ("accuracy") or package.module:function
    score_higher_is_better: bool
    target_score: float | None = None  # time_to_*: the score a trial must reach
    min_score: float | None = None  # *_per_second: the least score an answer must reach

    @classmethod
    def of(cls, objective: ObjectiveSpec) -> StudyObjective:
        """The space file's objective section, resolved (a built-in score's direction)."""
        per_second = objective.per_second
        return cls(
            metric=objective.metric_name,
            direction=objective.direction,
            score=objective.score,
            score_higher_is_better=objective.score_higher_is_better,
            target_score=None if per_second else objective.target,
            min_score=objective.bar if per_second else None,
        )


@dataclass(frozen=True, kw_only=True)
class BestConfig:
    """A study's chosen trial: its full configuration, where it came from, what it measured."""

    study: str
    trial: int
    metric: str
    value: float  # the trial's own measurement; its to_dict() "trial_value"
    params: dict[str, Any] = field(default_factory=dict)  # the searched knobs' values
    config: TrialConfig
    metrics: dict[str, Any] = field(default_factory=dict)  # score, samples_per_second, ...
    full_run_epochs: float | None = None  # objective.full_run_epochs, if the space file set it
    workload: dict[str, Any] = field(default_factory=dict)  # the space file's workload section
    # the confirmation round's verdict on this trial (None when the study has none yet)
    confirmation: TrialConfirmation | None = None
    round_state: str = "none"  # the study's answer's (study.Answer): why it is not confirmed
    feasible: bool = True  # the trial met every requirement (min_score): an answer
    speed_knobs: tuple[str, ...] = ()  # two-stage: the knobs the speed stage chose
    reference: str | None = None  # "baseline", "checklist": its knobs were set, not searched
    score_name: str = "accuracy"  # what metrics["score"] is: objective.score's name
    batch_layout: dict[str, Any] | None = None  # the study's BatchLayout.to_record(), if any
    classes_last: bool = False  # the study's model gives its logits' classes last
    workload_dir: str | None = None  # where its module:function entries were found
    objective: StudyObjective | None = None  # None: an export of format 3 or older

    def origin(self, knob: str) -> str:
        """ "searched", "timed in stage 1", "untuned", "checklist" or "" (fixed): see
        study.knob_origin."""
        return knob_origin(knob, self.params, self.speed_knobs, self.reference)

    def confirmation_text(self, storage: str = DEFAULT_STORAGE) -> str:
        """One line on how sure the study (in ``storage``) is of this answer."""
        found, study = self.confirmation, self.study
        return confirmation_text(found, study, storage=storage, round_state=self.round_state)

    @property
    def headline_value(self) -> float:
        """The value a person reads first: the confirmation round's median where the round
        measured this trial, else its trial's one measurement (``value``)."""
        return self._headline[0]

    @property
    def headline_source(self) -> str:
        """What ``headline_value`` is: "median of 3 confirmed runs", or "one measurement"."""
        return self._headline[1]

    @property
    def _headline(self) -> tuple[float, str]:
        found = self.confirmation
        median, runs = (found.median, found.runs) if found else (None, 0)
        value, source = headline(median, runs, self.value)
        return value if value is not None else self.value, source

    @property
    def headline(self) -> str:
        """ "accuracy_per_second 4.271: median of 3 confirmed runs" (it is quoted in
        parentheses: none of its own)."""
        return f"{self.metric} {fmt(self.headline_value)}: {self.headline_source}"

    @property
    def epochs(self) -> int:
        """Epochs of the full run: objective.full_run_epochs, else the trials' epochs."""
        return max(1, round(self.full_run_epochs or self.config.epochs))

    def to_dict(self) -> dict[str, Any]:
        """Plain data: what ``autotune best --json`` prints and the YAML/JSON export holds; its
        "value" is the headline every rendering shows (``value_source`` says which), the
        trial's own measurement is "trial_value"."""
        plain: dict[str, Any] = {"autotune_export": EXPORT_FORMAT_VERSION}
        for name, value in dataclasses.asdict(self).items():
            plain[name] = value
            if name == "value":
                plain.update(value=self.headline_value, value_source=self.headline_source)
                plain["trial_value"] = value
                plain["objective"] = None  # its place: beside the value it explains
            if name == "reference":  # as exports before the checklist said
                plain["baseline"] = value == "baseline"
        confirmation = self.confirmation.to_dict() if self.confirmation else {}
        return {**plain, "confirmation": confirmation, "speed_knobs": list(self.speed_knobs)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BestConfig:
        """Inverse of ``to_dict``; ValueError saying what is wrong with ``data``."""
        if not isinstance(data, dict) or "config" not in data or "study" not in data:
            raise ValueError("not an autotune export (it has no study and config)")
        return cls(
            study=str(data["study"]),
            trial=int(data["trial"]),
            metric=str(data["metric"]),
            value=float(data.get("trial_value", data["value"])),  # format 2: "value" only
            config=TrialConfig.from_dict(dict(data["config"])),
            params=dict(data.get("params") or {}),
            metrics=_renamed_metrics(dict(data.get("metrics") or {})),
            full_run_epochs=data.get("full_run_epochs"),
            workload=dict(data.get("workload") or {}),
            confirmation=TrialConfirmation.from_dict(data.get("confirmation")),
            round_state=str(data.get("round_state") or "none"),
            feasible=bool(data.get("feasible", True)),
            speed_knobs=tuple(data.get("speed_knobs") or ()),
            reference=data.get("reference") or ("baseline" if data.get("baseline") else None),
            score_name=str(data.get("score_name") or "accuracy"),
            batch_layout=data.get("batch_layout"),
            classes_last=bool(data.get("classes_last", False)),
            workload_dir=data.get("workload_dir"),
            objective=StudyObjective(**data["objective"]) if data.get("objective") else None,
        )

    @functools.cached_property
    def study_collate_fn(self) -> Collate | None:
        """The collate function the study's data function gave (``DataSplits.collate_fn``), or
        None (DataLoader's default): your data function is called once, the first time this is
        read, with the study's ``data_args``, to learn it."""
        from autotune.workloads import WorkloadError, data_collate, study_workload

        try:
            return data_collate(*study_workload(self.workload, self.workload_dir))
        except WorkloadError as err:
            raise ExportError(str(err)) from None

    def make_loader(
        self, dataset: Dataset, seed: int | None = None, collate_fn: Collate | None = None
    ) -> DataLoader | DeviceBatches:
        """A shuffled training DataLoader with the tuned batch size and loader knobs (in a
        process group, of this process's share of every epoch); its ``collate_fn`` is the
        study's (``study_collate_fn``) unless you pass one."""
        from autotune.machine import ranks
        from autotune.pipeline import make_train_loader

        if ranks.world_size() != self.config.world_size:  # 1/N of each epoch, unannounced
            raise ValueError(
                f"the configuration trains as {self.config.world_size} processes and this "
                f"process is in a group of {ranks.world_size()}: call it in each process "
                f"torchrun started (after init_process_group), or use "
                f"config.replace(world_size=1)"
            )
        seed = self.config.seed if seed is None else seed
        collate = collate_fn if collate_fn is not None else self.study_collate_fn
        return make_train_loader(dataset, self._here(), seed, collate, ranks.rank())

    def make_val_loader(
        self, dataset: Dataset, collate_fn: Collate | None = None
    ) -> DataLoader | DeviceBatches:
        """An in-order validation DataLoader; its ``collate_fn`` is the study's unless you pass
        one."""
        from autotune.pipeline import make_val_loader

        collate = collate_fn if collate_fn is not None else self.study_collate_fn
        return make_val_loader(dataset, self._here(), collate)

    def _here(self) -> TrialConfig:
        """The configuration on this process's device: in a process group on CUDA, its own GPU
        (``cuda:LOCAL_RANK``, made the current device), not the trial's ``cuda:0`` for all."""
        import torch

        from autotune.machine import ranks

        device = ranks.local_device(self.config.device)
        if device == self.config.device:
            return self.config
        torch.cuda.set_device(device)
        return self.config.replace(device=device)

    def make_trainer(
        self,
        model: nn.Module,
        total_steps: int,
        loss_fn: LossFn | None = None,
        threads: int | None = None,
    ) -> Trainer:
        """A Trainer applying precision, compile, channels_last, optimizer, schedule and
        accumulation to ``model``; ``total_steps`` optimizer steps set the schedule's length.

        It sets torch's intra-op threads for the process as the trials chose theirs: the cores
        other processes leave idle now (``interference.trial_threads``), or ``threads``. A pool
        larger than the idle cores waits for a busy core at every parallel region: beside
        other work on a 2-core machine, torch's default of 2 trained 20x slower than 1.

        It trains with the study's loss unless ``loss_fn`` is given (yours is imported), and
        ``trainer.train_step(batch)`` takes a batch as your DataLoader gives it.

        On CUDA this also sets the process-wide TF32 and cudnn.benchmark flags as tuned. A
        configuration of several processes (``config.world_size``) wraps the model in
        DistributedDataParallel (``trainer.ddp``) with the tuned DDP settings: call it in each
        process of a group of that size (torchrun, then init_process_group); on CUDA each
        process trains on its own GPU, ``cuda:LOCAL_RANK``, as do its loaders.
        """
        import torch

        from autotune.machine.interference import trial_threads
        from autotune.training.trainer import Trainer, set_backend_flags
        from autotune.workloads import WorkloadError, runnable_layout, study_loss, study_workload

        try:
            spec, folder = study_workload(self.workload, self.workload_dir)
            loss_fn = loss_fn or study_loss(spec, folder, self.classes_last)
            layout = runnable_layout(self.batch_layout, folder)
        except WorkloadError as err:
            raise ExportError(str(err)) from None
        config = self._here()
        if config.device.startswith("cuda"):
            set_backend_flags(config)
        torch.set_num_threads(threads or trial_threads())
        return Trainer(model, config, total_steps, loss_fn, layout, spec)


def _renamed_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics as this version names them: an export of format 1 held the score as
    "accuracy"."""
    if "accuracy" in metrics and "score" not in metrics:
        metrics["score"] = metrics.pop("accuracy")
    return metrics


def select_trial(study: optuna.Study, number: int | None = None) -> FrozenTrial:
    """Trial ``number``, or the study's answer (the confirmation round's winner, else the best
    feasible COMPLETE trial); ExportError when there is none."""
    if number is not None:
        matches = [t for t in study.get_trials(deepcopy=False) if t.number == number]
        if not matches:
            raise ExportError(f"study '{study.study_name}' has no trial {number}")
        trial = matches[0]
        if trial.state != TrialState.COMPLETE:
            raise ExportError(
                f"trial {number} of '{study.study_name}' is {trial.state.name}, not COMPLETE"
            )
    else:
        if len(study.directions) > 1:
            raise ExportError(
                f"study '{study.study_name}' has several objectives and no single best trial: "
                f"pick one with --trial N"
            )
        answer = answer_of(study)
        if answer is None:
            raise ExportError(
                f"study '{study.study_name}' has no feasible trial yet (none completed at the "
                f"objective's bar); --trial N picks one of its trials all the same"
            )
        trial = answer.trial
    if TrialRecord.of(trial).config is None:
        name = study.study_name
        if name.endswith(".speed"):
            raise ExportError(
                f"'{name}' holds the speed stage's measurements of study "
                f"'{name.removesuffix('.speed')}', not configurations to use; give --study "
                f"{name.removesuffix('.speed')}"
            )
        raise ExportError(
            f"trial {trial.number} of '{study.study_name}' has no autotune configuration "
            f"(was the study made by autotune?)"
        )
    return trial


def study_spec(study: optuna.Study) -> Spec | None:
    """The space file a study was created from, parsed; None when it holds none readable."""
    record = StudyRecord.of(study)
    if not record.space_file:
        return None
    try:
        return parse_spec(record.space_file, record.space_file_path or "space file")
    except SpecError:
        return None


def best_config(study: optuna.Study, trial: FrozenTrial) -> BestConfig:
    """The BestConfig of one trial of an autotune study."""
    spec = study_spec(study)
    # the (first) objective's value; a multi-objective trial has no single .value
    value = trial.values[0] if trial.values else float("nan")
    record = TrialRecord.of(trial)
    study_record, answer = StudyRecord.of(study), answer_of(study)
    assert record.config is not None, "select_trial() gives trials with a configuration"
    return BestConfig(
        study=study.study_name,
        trial=trial.number,
        metric=study_record.metric or "value",
        value=float(value),
        config=record.config,
        params=dict(trial.params),
        metrics=record.metrics(),
        confirmation=TrialConfirmation.of(answer, trial.number),
        round_state=answer.round_state if answer is not None else "none",
        feasible=is_feasible(trial),
        speed_knobs=tuple(record.speed_knobs or ()),
        reference=record.reference,
        score_name=study_record.score_name or "accuracy",
        full_run_epochs=spec.objective.full_run_epochs if spec else None,
        workload=spec.workload.model_dump(mode="json") if spec else {},
        batch_layout=study_record.batch_layout,
        classes_last=bool(study_record.classes_last),
        workload_dir=space_file_dir(study_record),
        objective=StudyObjective.of(spec.objective) if spec else None,
    )


def space_file_dir(record: StudyRecord) -> str | None:
    """The folder of the study's space file, where its ``module:function`` entries were found."""
    if record.space_file_dir is None and record.space_file_path:  # older studies: the path
        # only, relative to where `autotune run` ran
        return str(Path(record.space_file_path).resolve().parent)
    return record.space_file_dir


def load_best(study: str, storage: str = DEFAULT_STORAGE, trial: int | None = None) -> BestConfig:
    """The best feasible configuration of a study (or trial ``trial``) as a BestConfig."""
    try:
        found = load_study(study, storage)
    except StudyError as err:
        raise ExportError(str(err)) from None
    return best_config(found, select_trial(found, trial))


def load_config(path: Path | str) -> BestConfig:
    """Read a configuration written by ``autotune export --format yaml|json``."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
        data = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
        return BestConfig.from_dict(data)
    except FileNotFoundError:
        raise ExportError(f"{file}: no such file") from None
    except (OSError, ValueError, TypeError, KeyError, yaml.YAMLError) as err:
        raise ExportError(f"{file}: not an autotune configuration: {err}") from None
