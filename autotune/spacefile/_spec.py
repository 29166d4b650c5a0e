"""The whole space file (``Spec``) and its loading: YAML -> ``Spec``, with every problem
reported against the file and line it came from (``parse_spec``, ``load_spec``). They stay
together: ``Spec.with_overrides`` words its errors as loading does, and the line index walks
``Spec`` to find the valid keys at a path."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, PrivateAttr, ValidationError, model_validator

from autotune.knobs import DDP_KNOBS, KNOBS
from autotune.spacefile._knobs import (
    Choice,
    Frozen,
    IntRange,
    SpaceSpec,
    SpecError,
    closest,
    did_you_mean,
)
from autotune.spacefile._read import read_text, read_yaml
from autotune.spacefile._sections import ADDED_LATER, ObjectiveSpec, StudySpec
from autotune.spacefile._workload import WorkloadSpec


class Spec(Frozen):
    """A whole space file, validated."""

    study: StudySpec = Field(default_factory=StudySpec)
    workload: WorkloadSpec
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    space: SpaceSpec = Field(default_factory=SpaceSpec)

    _path: Path | None = PrivateAttr(default=None)
    _text: str = PrivateAttr(default="")

    @model_validator(mode="before")
    @classmethod
    def _joint_for_size_ranges(cls, data: Any) -> Any:
        """A file that names no strategy and gives batch_size or accumulation_steps as a range
        is a joint search: two stages time listed micro-batches only (older files keep
        working, in every command)."""
        if not isinstance(data, dict):
            return data
        study, space = data.get("study") or {}, data.get("space") or {}
        if not isinstance(study, dict) or "strategy" in study or not isinstance(space, dict):
            return data
        for name in ("batch_size", "accumulation_steps"):
            knob = space.get(name)
            if isinstance(knob, dict) and knob.get("low") != knob.get("high", knob.get("low")):
                return {**data, "study": {**study, "strategy": "joint"}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _auto_batch(cls, data: Any) -> Any:
        """``batch_size: auto``: one value, the baseline's batch (its pin, else the default),
        until the probe before stage 1 finds the list (``with_batch_sizes``)."""
        space = data.get("space") if isinstance(data, dict) else None
        if not isinstance(space, dict) or space.get("batch_size") != "auto":
            return data
        pins = (data.get("study") or {}).get("baseline") if isinstance(data, dict) else None
        start = pins.get("batch_size") if isinstance(pins, dict) else None
        start = KNOBS["batch_size"].default if start is None else start
        if not isinstance(start, int) or isinstance(start, bool) or start < 1:
            return data  # the baseline's own error says why
        auto = Choice(values=(start,), auto=True)
        return {**data, "space": {**space, "batch_size": auto}}

    @model_validator(mode="after")
    def _two_stage_sizes(self) -> Spec:
        if self.study.strategy != "two_stage":
            if self.space.batch_size_auto:
                raise ValueError(
                    "space.batch_size: auto is probed before stage 1 of a two-stage study; a "
                    "joint search samples batch_size itself: list the values (e.g. [64, 128, 256])"
                )
            return self
        for name in ("batch_size", "accumulation_steps"):
            knob = getattr(self.space, name)
            if isinstance(knob, IntRange) and not knob.is_fixed:
                raise ValueError(
                    f"space.{name}: study.strategy two_stage times each micro-batch split, so "
                    f"it needs a list of values (e.g. [32, 64, 128]), not a range; or leave "
                    f"the strategy out (a range makes the search joint)"
                )
        return self

    @model_validator(mode="after")
    def _ddp_knobs_need_ddp(self) -> Spec:
        if self.workload.gpus_per_trial > 1:
            return self
        for name in DDP_KNOBS:
            knob = getattr(self.space, name)
            if knob != Choice(values=(KNOBS[name].default,)):
                raise ValueError(
                    f"space.{name}: a DistributedDataParallel setting; it applies only to trials "
                    f"of several processes (workload.gpus_per_trial: 2 or more)"
                )
        return self

    @model_validator(mode="after")
    def _full_run_covers_trial(self) -> Spec:
        full = self.objective.full_run_epochs
        if full is not None and full < self.workload.epochs:
            raise ValueError(
                f"objective.full_run_epochs: {full:g} is shorter than a trial "
                f"(workload.epochs = {self.workload.epochs:g})"
            )
        return self

    @property
    def path(self) -> Path | None:
        """The file this spec was read from, if any."""
        return self._path

    @property
    def text(self) -> str:
        """The space file's text as read."""
        return self._text

    def user_entry_points(self) -> list[str]:
        """The ``package.module:function`` entries that are the user's code: the workload's
        (``WorkloadSpec.user_entry_points``), then the score's."""
        score = [self.objective.score] if ":" in self.objective.score else []
        return self.workload.user_entry_points() + score

    @property
    def study_name(self) -> str:
        """The study name: ``study.name``, else the space file's stem."""
        if self.study.name:
            return self.study.name
        return self._path.stem if self._path else "autotune"

    def search_payload(self, device: str | None = None) -> dict[str, Any]:
        """Everything that defines the search (workload, objective, space), as JSON values.

        ``study`` settings (trial count, timeout, storage, sampler) may change between runs of
        one study; anything here may not, because Optuna cannot mix two searches. The device
        counts by its kind only (cpu, cuda) unless ``device`` replaces it: another GPU index,
        or ``auto`` resolved to the same kind, continues the study.
        """
        payload = self.model_dump(mode="json", include={"workload", "objective", "space"})
        payload["workload"]["device"] = device or payload["workload"]["device"].split(":")[0]
        if self.space.batch_size_auto:  # the same search before and after the probe
            payload["space"]["batch_size"] = "auto"
        for section, added in ADDED_LATER.items():  # studies labelled before they existed
            for key, default in added.items():
                if payload[section].get(key, default) == default:
                    payload[section].pop(key, None)
        return payload

    def search_definition(self) -> str:
        """``search_payload()`` as indented JSON, for the diff of a refused resume."""
        return json.dumps(self.search_payload(), sort_keys=True, indent=1)

    def search_fingerprint(self) -> str:
        """A short hash of ``search_payload()``: equal hashes, the same search."""
        canonical = json.dumps(self.search_payload(), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def with_batch_sizes(self, sizes: tuple[int, ...]) -> Spec:
        """``batch_size: auto`` resolved: ``sizes``, the micro-batches the probe found."""
        space = self.space.model_copy(update={"batch_size": Choice(values=sizes, auto=True)})
        return self.model_copy(update={"space": space})

    def with_overrides(self, **sections: dict[str, Any]) -> Spec:
        """A copy with some fields replaced, e.g. ``with_overrides(study={"n_trials": 5})``
        (a None leaves its field as it is), held to the same rules as the file."""
        if "space" in sections:  # its parsed knobs would be validated as the file's shapes
            raise TypeError("with_overrides changes study, workload or objective, not space")
        updated: dict[str, Any] = {}
        within: tuple[str, ...] = ()  # the section being checked; () for the whole spec
        try:
            for section, values in sections.items():
                within = (section,)
                current: BaseModel = getattr(self, section)
                changes = {k: v for k, v in values.items() if v is not None}
                # what the file set, and the overrides: the rest stays a default, so that
                # "was this set?" (model_fields_set) keeps its answer
                merged = {**current.model_dump(exclude_unset=True), **changes}
                updated[section] = type(current).model_validate(merged)
            within = ()
            spec = Spec.model_validate({**dict(self), **updated})
        except ValidationError as err:
            raise SpecError([error_line(error, within) for error in err.errors()]) from None
        spec._path, spec._text = self._path, self._text
        changed = {key for key, value in sections.get("workload", {}).items() if value is not None}
        lines = self.workload._lines.items()
        spec.workload._lines = {key: line for key, line in lines if key not in changed}
        return spec


# Loading: YAML -> Spec (the module's docstring says how)


@dataclass
class _Lines:
    """Line numbers of YAML keys and values by key path, plus duplicate-key problems."""

    by_path: dict[tuple[Any, ...], int] = field(default_factory=dict)
    duplicates: list[tuple[tuple[Any, ...], int, int]] = field(default_factory=list)

    def find(self, loc: tuple[Any, ...]) -> int | None:
        while loc:
            if loc in self.by_path:
                return self.by_path[loc]
            loc = loc[:-1]
        return self.by_path.get((), None)


def _index_lines(node: yaml.Node | None, path: tuple[Any, ...], lines: _Lines) -> None:
    if node is None:
        return
    lines.by_path.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                lines.duplicates.append(((*path, key), seen[key], line))
            seen[key] = line
            lines.by_path[(*path, key)] = line  # the key's line, not its value's
            _index_lines(value_node, (*path, key), lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _index_lines(item, (*path, index), lines)


def _dotted(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model found at key path ``loc`` inside ``Spec``, or None."""
    model: type[BaseModel] = Spec
    for part in loc:
        annotation = model.model_fields[part].annotation if part in model.model_fields else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    """The valid keys at ``loc``: a section's fields, or the knob names in ``space``."""
    model = _model_at(loc)
    return [] if model is None else list(model.model_fields)


def _meant(loc: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The key path an unknown key at ``loc`` most likely misspells, else None."""
    meant = closest(str(loc[-1]), _keys_at(loc[:-1]))
    return (*loc[:-1], meant) if meant else None


def _required(loc: tuple[Any, ...]) -> bool:
    """Whether the key at ``loc`` must be in the space file (``workload``, say)."""
    model = _model_at(loc[:-1])
    return model is not None and model.model_fields[loc[-1]].is_required()


_KEYED_MESSAGE = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*): (.+)$", re.DOTALL)


def _locate(error: Mapping[str, Any]) -> tuple[tuple[Any, ...], str]:
    """The key path and message of one pydantic error.

    Checks that span several fields (model validators) name their key at the start of the
    message (``"eval_every: ..."``); that key is moved into the path so the line is found.
    """
    loc = tuple(error["loc"])
    if error["type"] == "invalid-json-value":  # (workload, model_args, key, tag, key, tag, ...)
        loc = loc[:3] + loc[4::2]
    message = str(error.get("msg", "")).removeprefix("Value error, ")
    keyed = _KEYED_MESSAGE.match(message)
    if error["type"] == "value_error" and keyed and _model_at(loc) is not None:
        path = tuple(keyed.group(1).split("."))
        if path[0] in _keys_at(loc):
            return (*loc, *path), keyed.group(2)
    return loc, message


def error_line(error: Mapping[str, Any], within: tuple[str, ...] = ()) -> str:
    """One pydantic error of the space file's models in the words of a space file's problem
    (``study.n_trials: must be ...``), its key path under ``within`` (the section validated)."""
    loc, message = _locate({**error, "loc": (*within, *error["loc"])})
    return _describe(error, loc, message)


def _describe(error: Mapping[str, Any], loc: tuple[Any, ...], message: str) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        key, parent = str(loc[-1]), loc[:-1]
        where = _dotted(parent) if parent else "the space file"
        meant = _meant(loc)
        hint = f"; did you mean '{meant[-1]}'?" if meant else ""
        hint += " (it is required)" if meant and _required(meant) else ""
        return f"unknown key '{key}' in {where}{hint}"
    if kind == "missing":
        return f"missing required key '{_dotted(loc)}'"
    if kind == "value_error":
        return f"{_dotted(loc)}: {message}" if loc else message
    if kind == "invalid-json-value":  # a YAML date or timestamp, say
        found = error["input"]
        return (
            f"{_dotted(loc)}: {found} is a {type(found).__name__}, not plain data (a string, "
            f"number, true/false, null, list or mapping); quote it to pass a string"
        )
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"{_dotted(loc)}: must be a mapping of keys to values, got {error['input']!r}"
    message = message.replace("Input should be", "must be").replace("String should", "must")
    words = re.findall(r"'([^']*)'", str(error.get("ctx", {}).get("expected")))  # a Literal's
    hint = did_you_mean(str(error["input"]), words) if kind == "literal_error" else ""
    return f"{_dotted(loc)}: {message}, got {error['input']!r}{hint}"


def parse_spec(text: str, path: Path | str = "<space>") -> Spec:
    """Parse and validate the text of a space file; raise SpecError listing every problem."""
    name = str(path)
    node, raw = read_yaml(text, name)
    sections = list(Spec.model_fields)
    if not isinstance(raw, dict) or not any(closest(str(key), sections) for key in raw):
        what = "empty" if raw is None else type(raw).__name__
        if isinstance(raw, dict):  # another file passed by mistake: its keys are not echoed
            keys = f"{len(raw)} other key{'s' * (len(raw) != 1)}"
            what = f"a mapping of {keys}, none of them a section"
        raise SpecError(
            [
                f"{name}: a space file is a mapping with the sections study, workload, "
                f"objective and space; this one is {what}"
            ]
        )
    lines = _Lines()
    _index_lines(node, (), lines)
    found: list[tuple[int, str]] = [
        (
            second,
            f"duplicate key '{loc[-1]}' in {_dotted(loc[:-1]) or 'the space file'}"
            f" (first at line {first})",
        )
        for loc, first, second in lines.duplicates
    ]
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as err:
        misspelt = {
            _meant(tuple(e["loc"])) for e in err.errors() if e["type"] == "extra_forbidden"
        }
        for error in err.errors():
            loc, message = _locate(error)
            if error["type"] != "missing" or loc not in misspelt:  # else said with the misspelling
                found.append((lines.find(loc) or 0, _describe(error, loc, message)))
    else:
        if not found:
            spec._path = Path(path) if not name.startswith("<") else None
            spec._text = text
            spec.workload._lines = {
                str(loc[1]): f"{name}:{line}"
                for loc, line in lines.by_path.items()
                if len(loc) == 2 and loc[0] == "workload"
            }
            return spec
    found.sort(key=lambda problem: problem[0])
    raise SpecError(
        [f"{name}:{line}: {text}" if line else f"{name}: {text}" for line, text in found]
    )


def load_spec(path: Path | str) -> Spec:
    """Read and validate a space file; raise SpecError (one line per problem) when it is bad."""
    return parse_spec(read_text(path), path)
