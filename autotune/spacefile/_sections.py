"""The sections of a space file besides the knobs and the workload (spacefile/_workload):
``study`` (``StudySpec``, with its ``confirm`` and ``speed`` settings) and ``objective``
(``ObjectiveSpec``), with the names they accept (``SCORES``, ...)."""

from __future__ import annotations

import unicodedata
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from autotune.knobs import DDP_KNOBS, KNOBS, LOADER_KNOBS
from autotune.spacefile._knobs import Frozen, Scalar, did_you_mean
from autotune.spacefile._workload import builtin_or_function

DEFAULT_STORAGE = "sqlite:///studies/autotune.db"


def is_unprintable(char: str) -> bool:
    """A control or format character (an escape, a newline, NUL, a bidi override, a line or
    paragraph separator): a terminal obeys it rather than showing it."""
    return unicodedata.category(char)[0] == "C" or char in "\u2028\u2029"


class ConfirmSpec(Frozen):
    """The confirmation round at the end of a study: its leading configurations and the untuned
    baseline trained again side by side, interleaved, so that the answer is not a single noisy
    measurement (``confirm: false`` turns it off)."""

    enabled: bool = True
    top: int = Field(default=3, ge=1)  # the feasible trials with the best values
    repeats: int = Field(default=2, ge=1)  # more runs of each (the trial itself is one more)


class SpeedSpec(Frozen):
    """Stage 1 of the two-stage search: how each execution configuration is timed."""

    repeats: int = Field(default=2, ge=1)  # measurements of each of a cell's leaders
    bursts: int = Field(default=3, ge=1)  # timed bursts per measurement
    burst_seconds: float = Field(default=0.25, gt=0)  # each burst's target length
    # seconds stage 1 may take (half of study.timeout at most, when one is set), one eager
    # setting a cell still to come kept back; once only that is left, each cell still to time
    # gets one eager setting, and the plan says so
    max_seconds: float = Field(default=900.0, gt=0)

    def budget_seconds(self, timeout: float | None) -> float:
        """Seconds stage 1 may take in a run with ``timeout`` (study.timeout, which counts
        stage 1): ``max_seconds``, and at most half the timeout, so that trials get the rest."""
        return min(self.max_seconds, timeout / 2) if timeout else self.max_seconds


class StudySpec(Frozen):
    """How the search runs: where trials are stored, how many, which sampler and pruner."""

    name: str | None = Field(default=None, min_length=1)  # default: the file's stem
    storage: str = DEFAULT_STORAGE
    # the study's total, not "this many more"; a million is past any search (1e23 was taken)
    n_trials: int = Field(default=20, ge=1, le=1_000_000)
    timeout: float | None = Field(default=None, gt=0)  # seconds for one `autotune run`
    sampler: Literal["tpe", "random"] = "tpe"
    n_startup_trials: int = Field(default=10, ge=0)  # random trials before TPE models the space
    pruner: Literal["hyperband", "median", "successive_halving", "none"] = "hyperband"
    # trial k trains with seed + k; Optuna's sampler takes 0..2**32 - 1 (NumPy's seeds)
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    isolation: Literal["worker", "none"] = "worker"  # trials in a supervised worker process
    trial_timeout: float | None = Field(default=None, gt=0)  # seconds; the worker is killed after
    heartbeat_interval: int = Field(default=10, ge=1)  # seconds; a trial silent 3x this is stale
    # seconds the study waits for its database when it stops answering (a restart, a failover,
    # SQLite's lock held long); the running trial trains on meanwhile. 0: it does not wait
    storage_outage: float = Field(default=180, ge=0)
    # trial 0 trains the untuned configuration (PyTorch's defaults where the space allows), so
    # every study says how much faster its answer is; a mapping pins some of its knobs
    baseline: bool | dict[str, Scalar] = True
    # the trial after it trains the tuning checklist (autotune.search.references), the second
    # reference the answer is confirmed against and must beat
    checklist: bool = True
    confirm: ConfirmSpec = Field(default_factory=ConfirmSpec)
    # two_stage: execution knobs timed first (stage 1), trials only for what changes learning;
    # joint: every knob in one study of training trials
    strategy: Literal["two_stage", "joint"] = "two_stage"
    learning_knobs: tuple[str, ...] = ()  # execution knobs that change learning here: stage 2
    speed: SpeedSpec = Field(default_factory=SpeedSpec)

    @field_validator("name")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        # shown by run, studies and best, and in every command offered to copy
        if value is not None and any(map(is_unprintable, value)):
            raise ValueError(
                "a study name cannot hold control or format characters (escape sequences, "
                "newlines, tabs, bidi overrides, NUL): it is printed on terminals"
            )
        return value

    @field_validator("learning_knobs")
    @classmethod
    def _learning_knobs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            _known_knob(name, "")
            if name in LOADER_KNOBS:  # how batches are loaded: never what is learned
                raise ValueError(
                    f"{name} only says how batches are loaded, never what is learned; "
                    f"declare data_pipeline to search the pipeline in stage 2"
                )
        return value

    @field_validator("confirm", mode="before")
    @classmethod
    def _confirm_switch(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value

    @field_validator("baseline")
    @classmethod
    def _baseline_knobs(cls, value: bool | dict[str, Scalar]) -> bool | dict[str, Scalar]:
        for name in value if isinstance(value, dict) else ():
            _known_knob(name, " in the baseline")
        return value


def _known_knob(name: str, where: str) -> None:
    if name not in KNOBS:
        raise ValueError(f"unknown knob '{name}'{where}{did_you_mean(name, list(KNOBS))}")


# built-in scores: whether higher is better, and the short name per-second values are shown in
SCORES: dict[str, tuple[bool, str]] = {
    "accuracy": (True, "acc"),  # share of target elements predicted right, 0..1
    "top5": (True, "top5"),  # share with the right class among the five highest logits
    "val_loss": (False, "loss"),  # mean validation cross-entropy per target element, nats
    "perplexity": (False, "ppl"),  # exp(val_loss)
}
_ACCURACY_SCORES = ("accuracy", "top5")  # scores in 0..1 that min_/target_accuracy may bound
_PER_SECOND = ("accuracy_per_second", "score_per_second")  # older name first: the same metric
_TIME_TO = ("time_to_accuracy", "time_to_score")


class ObjectiveSpec(Frozen):
    """What the study optimizes and which trials count as acceptable answers.

    ``score`` is what a trained model is judged by on the validation split: a built-in (see
    ``SCORES``) or the user's ``package.module:function(model, val_loader, device) -> float``.
    ``score_per_second`` (its older name ``accuracy_per_second``) maximizes score / charged
    seconds, for a score where higher is better; ``time_to_score`` (``time_to_accuracy``)
    minimizes the seconds to reach ``target_score`` in the score's direction.
    ``min_accuracy`` and ``target_accuracy`` are the older names of ``min_score`` and
    ``target_score`` for the scores in 0..1 (accuracy, top5).
    """

    metric: Literal[
        "accuracy_per_second", "score_per_second", "time_to_accuracy", "time_to_score"
    ] = "accuracy_per_second"
    score: str = "accuracy"  # a built-in of SCORES, or package.module:function
    higher_is_better: bool | None = None  # None: the built-in's; True for a user's function
    min_score: float | None = None
    target_score: float | None = None
    min_accuracy: float | None = Field(default=None, ge=0, le=1)
    target_accuracy: float | None = Field(default=None, gt=0, le=1)
    full_run_epochs: float | None = Field(default=None, gt=0, le=100_000)

    @field_validator("score")
    @classmethod
    def _score(cls, value: str) -> str:
        return builtin_or_function(value, tuple(SCORES), "score")

    @model_validator(mode="after")
    def _metric_settings(self) -> ObjectiveSpec:
        for old, new in (("min_accuracy", "min_score"), ("target_accuracy", "target_score")):
            if getattr(self, old) is not None:
                if getattr(self, new) is not None:
                    raise ValueError(f"{old}: give {new} or {old} (its older name), not both")
                if self.score not in _ACCURACY_SCORES:
                    raise ValueError(
                        f"{old}: bounds an accuracy; for score {self.score} use {new}"
                    )
        builtin = SCORES.get(self.score)
        if builtin is not None and self.higher_is_better not in (None, builtin[0]):
            raise ValueError(
                f"higher_is_better: score {self.score} is "
                f"{'higher' if builtin[0] else 'lower'}-is-better; leave the setting out"
            )
        if not self.per_second:
            if self.target is None:
                needs = "target_accuracy" if self.metric == _TIME_TO[0] else "target_score"
                raise ValueError(f"{needs}: metric {self.metric} needs a target")
            if self.bar is not None:
                raise ValueError(
                    f"{self.bar_name}: does not apply to {self.metric} ({self.target_name} is "
                    f"the bar every answer must reach)"
                )
            if self.full_run_epochs is not None:
                raise ValueError(
                    f"full_run_epochs: applies only to {_PER_SECOND[self.metric == _TIME_TO[1]]} "
                    f"(a run to the target pays its one-time costs once, as the trial does)"
                )
            return self
        if self.target is not None:
            metric = _TIME_TO[0] if self.target_name == "target_accuracy" else _TIME_TO[1]
            raise ValueError(f"{self.target_name}: applies only to metric {metric}")
        if not self.score_higher_is_better:
            raise ValueError(
                f"metric: {self.metric} needs a score where higher is better, and "
                f"{self.score} is lower-is-better: use metric time_to_score with a target_score"
            )
        return self

    @property
    def per_second(self) -> bool:
        """Score per second (maximized), rather than time to a target score (minimized)."""
        return self.metric in _PER_SECOND

    @property
    def direction(self) -> Literal["maximize", "minimize"]:
        return "maximize" if self.per_second else "minimize"

    @property
    def score_higher_is_better(self) -> bool:
        """Whether a higher score is a better model."""
        builtin = SCORES.get(self.score)
        if builtin is not None:
            return builtin[0]
        return True if self.higher_is_better is None else self.higher_is_better

    @property
    def score_name(self) -> str:
        """The score's name in tables and messages: the built-in's, or the function's."""
        return self.score.rpartition(":")[2]

    @property
    def score_short(self) -> str:
        """The score's name in a unit: ``acc`` in ``acc/s``."""
        builtin = SCORES.get(self.score)
        return builtin[1] if builtin is not None else self.score_name

    @property
    def metric_name(self) -> str:
        """The metric named after the score: ``accuracy_per_second``, ``macro_f1_per_second``,
        ``time_to_val_loss``; what the study records and the dashboard shows."""
        if self.per_second:
            return f"{self.score_name}_per_second"
        return f"time_to_{self.score_name}"

    @property
    def bar(self) -> float | None:
        """The least score a per-second answer must reach (``min_score``), or None."""
        return self.min_score if self.min_score is not None else self.min_accuracy

    @property
    def bar_name(self) -> str:
        """The space file's name of ``bar``."""
        return "min_accuracy" if self.min_accuracy is not None else "min_score"

    @property
    def target(self) -> float | None:
        """The score a time-to-target trial must reach (``target_score``), or None."""
        return self.target_score if self.target_score is not None else self.target_accuracy

    @property
    def goal(self) -> float | None:
        """The score the study holds its answer to: ``bar`` for a per-second metric, else
        ``target``; None where it sets none."""
        return self.bar if self.per_second else self.target

    @property
    def target_name(self) -> str:
        """The space file's name of ``target``."""
        return "target_accuracy" if self.target_accuracy is not None else "target_score"

    def reaches(self, score: float, bound: float) -> bool:
        """Whether ``score`` is at ``bound`` or better, in the score's direction."""
        return score >= bound if self.score_higher_is_better else score <= bound


# fields added after studies were labelled: left out of their search label (Spec.search_payload)
# at their default, so that those studies resume
ADDED_LATER: dict[str, dict[str, Any]] = {
    "workload": {
        "inputs": None,
        "target": None,
        "loss": "cross_entropy",
        "batch_fn": None,
        "gpus_per_trial": 1,
        "class_dim": None,
    },
    "space": {name: {"values": [KNOBS[name].default]} for name in DDP_KNOBS},
    "objective": {
        "score": "accuracy",
        "higher_is_better": None,
        "min_score": None,
        "target_score": None,
    },
}
