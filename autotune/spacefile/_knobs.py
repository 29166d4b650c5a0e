"""The knobs of a space file: the shapes a knob of the registry (``autotune.knobs``) takes
(``Choice``, ``IntRange``, ``FloatRange``) and how its YAML value is read into one; the ``space``
section (``SpaceSpec``); and the base the package's models share (``Frozen``, ``SpecError``)."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from autotune.errors import UserError
from autotune.knobs import DDP_KNOBS, KNOBS, KnobInfo, Scalar


class SpecError(UserError):
    """A space file the user has to fix: one formatted line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def knobs_for(world_size: int) -> list[str]:
    """The knobs that mean something to a trial of ``world_size`` processes, in ``KNOBS`` order
    (DDP's settings only to several): what a configuration is shown with."""
    return [name for name in KNOBS if world_size > 1 or name not in DDP_KNOBS]


class Choice(Frozen):
    """A categorical knob; a single value means the knob is fixed and not searched."""

    values: tuple[Scalar, ...]
    # batch_size: auto, the micro-batches a probe before stage 1 finds (``stage1._probe``);
    # until then one value, the baseline's batch. Out of dumps: ``Spec.search_payload`` says it
    auto: bool = Field(default=False, exclude=True)

    @property
    def is_fixed(self) -> bool:
        return len(self.values) == 1


class IntRange(Frozen):
    """Integers from low to high inclusive, uniformly or log-uniformly."""

    low: int
    high: int
    log: bool = False
    step: int = 1

    @property
    def is_fixed(self) -> bool:
        return self.low == self.high


class FloatRange(Frozen):
    """Reals from low to high, uniformly, log-uniformly, or on a grid of ``step``."""

    low: float
    high: float
    log: bool = False
    step: float | None = None

    @property
    def is_fixed(self) -> bool:
        return self.low == self.high


Knob = Choice | IntRange | FloatRange


# Names people use for a knob elsewhere (other tuners, Lightning, Hugging Face), for did-you-mean.
_ALIASES = {
    **{alias: name for name, info in KNOBS.items() for alias in info.aliases},
    "epochs_per_trial": "epochs",
    "trials": "n_trials",
}


def closest(word: str, options: list[str] | tuple[str, ...]) -> str | None:
    """The valid option a misspelt ``word`` (or an alias of it) most likely meant, else None."""
    candidates = {option: option for option in options}
    candidates.update({a: k for a, k in _ALIASES.items() if k in candidates})
    match = difflib.get_close_matches(word.lower(), list(candidates), n=1, cutoff=0.6)
    return candidates[match[0]] if match else None


def did_you_mean(word: str, options: list[str] | tuple[str, ...]) -> str:
    """ "; did you mean 'x'?" for the valid option closest to a misspelt ``word``, else ""."""
    meant = closest(word, options)
    return f"; did you mean '{meant}'?" if meant else ""


def _check_scalar(info: KnobInfo, value: Any) -> Scalar:
    """Return ``value`` converted to the knob's type, or raise ValueError saying why not."""
    if info.kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{value!r} is not true or false")
        return value
    if info.kind == "choice":
        if value is False and "none" in info.choices:
            raise ValueError(f"false is not one of {', '.join(info.choices)} (use none)")
        if not isinstance(value, str) or value not in info.choices:
            hint = did_you_mean(str(value), info.choices)
            raise ValueError(f"{value!r} is not one of {', '.join(info.choices)}{hint}")
        return value
    number = _as_number(info.kind, value)
    if info.ge is not None and number < info.ge:
        raise ValueError(f"{number!r} is too small: must be >= {info.ge:g}")
    if info.gt is not None and number <= info.gt:
        raise ValueError(f"{number!r} is too small: must be > {info.gt:g}")
    if info.lt is not None and number >= info.lt:
        raise ValueError(f"{number!r} is too large: must be < {info.lt:g}")
    return number


def _as_number(kind: str, value: Any) -> int | float:
    """``value`` as an int (kind "int") or a finite float, or a ValueError saying why not."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    if kind == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise ValueError(f"{value!r} is not an integer")
        return value
    if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a number") from None
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return float(value)


_RANGE_KEYS = ("low", "high", "log", "step")


def _parse_range(info: KnobInfo, raw: dict[str, Any]) -> IntRange | FloatRange:
    if info.kind not in ("int", "float"):
        raise ValueError(
            f"a range {{low, high}} only works for numeric knobs; list the values instead "
            f"(e.g. [{', '.join(map(str, info.choices or ('false', 'true')))}])"
        )
    for key in raw:
        if key not in _RANGE_KEYS:
            raise ValueError(
                f"unknown key '{key}' in a range{did_you_mean(str(key), _RANGE_KEYS)} "
                f"(a range has low, high, log, step)"
            )
    missing = [k for k in ("low", "high") if k not in raw]
    if missing:
        raise ValueError(f"a range needs both low and high (missing {' and '.join(missing)})")
    low = _check_scalar(info, raw["low"])
    high = _check_scalar(info, raw["high"])
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise ValueError(f"log must be true or false, not {log!r}")
    if low > high:  # type: ignore[operator]  # both numbers: _check_scalar checked the kind
        raise ValueError(f"low ({low}) is greater than high ({high})")
    if log and low <= 0:  # type: ignore[operator]  # a number, as above
        raise ValueError(f"a log range needs low > 0, got low = {low}")
    step = raw.get("step")
    if step is not None:
        if log and (info.kind != "int" or step != 1):  # an int log range steps by 1 anyway
            raise ValueError("a range cannot have both log and step")
        if isinstance(step, bool) or not isinstance(step, int | float) or step <= 0:
            raise ValueError(f"step must be a positive number, not {step!r}")
        if info.kind == "int" and not float(step).is_integer():
            raise ValueError(f"step of an integer knob must be an integer, not {step!r}")
    if info.kind == "int":
        return IntRange(low=int(low), high=int(high), log=log, step=int(step or 1))
    return FloatRange(low=float(low), high=float(high), log=log, step=step)


def _parse_knob(name: str, raw: Any) -> Knob:
    """Turn the YAML value of one knob (scalar, list or range mapping) into a Knob."""
    if isinstance(raw, Choice | IntRange | FloatRange):
        return raw
    info = KNOBS[name]
    several = isinstance(raw, dict) or (isinstance(raw, list | tuple) and len(raw) > 1)
    if not info.searchable and several:
        raise ValueError("this is a setting, not a searchable knob: give one value")
    if isinstance(raw, dict):
        return _parse_range(info, raw)
    if isinstance(raw, list | tuple):
        if not raw:
            raise ValueError("empty list: give at least one value")
        values = []
        for position, item in enumerate(raw):
            try:
                values.append(_check_scalar(info, item))
            except ValueError as err:
                raise ValueError(f"item {position + 1}: {err}") from None
        duplicates = sorted({str(v) for v in values if values.count(v) > 1})
        if duplicates:
            raise ValueError(f"{', '.join(duplicates)} listed more than once")
        return Choice(values=tuple(values))
    if raw is None:
        raise ValueError("no value given (leave the key out to use the default)")
    if raw == "auto":  # batch_size's is read with the baseline's batch (``Spec``)
        raise ValueError(
            "auto is only for batch_size (micro-batches doubled up to the memory wall before "
            "stage 1); list the values"
        )
    return Choice(values=(_check_scalar(info, raw),))


class _Space(Frozen):
    """The knobs. Omitted knobs are fixed at their documented default (``KNOBS``)."""

    if TYPE_CHECKING:  # the fields, one per knob, are made from the registry below

        def __getattr__(self, name: str) -> Knob: ...

    @field_validator("*", mode="before")
    @classmethod
    def _knob(cls, raw: Any, info: Any) -> Knob:
        return _parse_knob(info.field_name, raw)

    def knobs(self) -> Iterator[tuple[str, Knob]]:
        """(name, knob) for every knob, in the order of ``KNOBS``."""
        for name in KNOBS:
            yield name, getattr(self, name)

    @property
    def batch_size_auto(self) -> bool:
        """Whether the file says ``batch_size: auto``."""
        return isinstance(self.batch_size, Choice) and self.batch_size.auto

    def searched(self) -> list[str]:
        """Names of the knobs that take more than one value."""
        return [name for name, knob in self.knobs() if not knob.is_fixed]


if TYPE_CHECKING:
    SpaceSpec = _Space
else:  # a field per knob of the registry, in its order, its default the knob's
    SpaceSpec = create_model(
        "SpaceSpec",
        __base__=_Space,
        **{name: (Knob, Choice(values=(info.default,))) for name, info in KNOBS.items()},
    )
