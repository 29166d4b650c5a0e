"""Creating, resuming and loading studies, and the guard that refuses to mix two searches.

One space file is one study. Re-running it resumes the study (``n_trials`` is the study's total);
a study created from a different search (another space, or a machine that filters the space
differently) is refused rather than silently mixed, because Optuna cannot mix distributions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import itertools
import json
import time
import warnings
from typing import TYPE_CHECKING, Any

import optuna
from optuna.exceptions import ExperimentalWarning

from autotune._version import __version__
from autotune.spacefile import Spec
from autotune.storage import adapter
from autotune.storage._outage import DEFAULT_OUTAGE_SECONDS, OutageRetry
from autotune.storage._rdb import Access, StudyError, display_url, open_storage
from autotune.storage._records import ReferenceKind, StudyRecord, TrialRecord
from autotune.study._sampling import make_pruner, make_sampler

if TYPE_CHECKING:  # torch: only creating a study needs it, not loading one
    from collections.abc import Callable

    from autotune.config import TrialConfig
    from autotune.machine.hardware import Hardware
    from autotune.workloads import Workload

PEER_CREATION_SECONDS = 5.0  # how long a study another process is creating may lack its attrs


def _effective_space_text(spec: Spec) -> str:
    return json.dumps(spec.space.model_dump(mode="json"), indent=1, sort_keys=True)


def _settled_record(study: optuna.Study) -> StudyRecord:
    """The study's record, once a process that created it a moment ago has labelled it: up to
    its last attribute (``learning_knobs``), not just its fingerprint."""
    record = StudyRecord.of(study)
    deadline = time.monotonic() + PEER_CREATION_SECONDS
    while (
        (record.search_fingerprint is None or record.learning_knobs is None)
        and not study.get_trials(deepcopy=False)  # no trials yet: another may be setting up
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)  # another `autotune run` created it a moment ago and is labelling it
        record = StudyRecord.of(study)
    return record


def _stored_strategy(record: StudyRecord) -> tuple[str, tuple[str, ...]]:
    """(strategy, learning knobs) a study was made with; joint before there was a choice."""
    return record.strategy or "joint", tuple(record.learning_knobs or ())


def _strategy_problem(study: optuna.Study, record: StudyRecord, spec: Spec) -> str | None:
    """Why ``spec``'s explicit strategy cannot continue ``study``; None when it can (an
    omitted strategy continues the study's own)."""
    strategy, knobs = _stored_strategy(record)
    asked = spec.study.model_fields_set
    name = study.study_name
    if "strategy" in asked and spec.study.strategy != strategy:
        return (
            f"study '{name}' was made with study.strategy {strategy}; the space file asks for "
            f"{spec.study.strategy}, and one study cannot mix the two searches"
        )
    if strategy == "two_stage" and tuple(spec.study.learning_knobs) != knobs:
        return (
            f"study '{name}' was made with study.learning_knobs [{', '.join(knobs)}]; the "
            f"space file says [{', '.join(spec.study.learning_knobs)}]"
        )
    return None


def with_study_strategy(study: optuna.Study, spec: Spec) -> Spec:
    """``spec`` with the strategy ``study`` was made with, when the space file names none: a
    study made before two-stage searches existed resumes as the joint search it was."""
    strategy, _ = _stored_strategy(StudyRecord.of(study))
    if strategy == spec.study.strategy or "strategy" in spec.study.model_fields_set:
        return spec
    return spec.with_overrides(study={"strategy": strategy})


def _changed_values(before: str, after: str) -> str:
    """What differs between two searches' definitions (``Spec.search_definition``), by dotted
    name: "space.num_workers.values [0, 1, 2] in the study, [0, 1] now"; "" where either is
    not JSON."""
    try:
        old, new = json.loads(before), json.loads(after)
    except ValueError:
        return ""

    def leaves(node: Any, path: str = "") -> dict[str, Any]:
        if not isinstance(node, dict):
            return {path: node}
        found: dict[str, Any] = {}
        for key, value in node.items():
            found.update(leaves(value, f"{path}.{key}" if path else str(key)))
        return found

    was, now = leaves(old), leaves(new)
    names = sorted(name for name in {*was, *now} if was.get(name) != now.get(name))
    return "; ".join(f"{name} {was.get(name)} in the study, {now.get(name)} now" for name in names)


def _resume_problem(study: optuna.Study, spec: Spec) -> str | None:
    """Why ``spec`` cannot continue ``study``, with a readable diff; None when it can."""
    record = _settled_record(study)
    stored = record.search_fingerprint
    if stored is not None and (problem := _strategy_problem(study, record, spec)):
        return problem
    if stored is None and record.autotune_version is not None:
        return (
            f"study '{study.study_name}' was left half-made by an autotune run that failed while "
            f"creating it (a full disk?); remove it with optuna delete-study --study-name "
            f"'{study.study_name}' --storage URL, or give another --study-name"
        )
    if stored is None:
        return (
            f"study '{study.study_name}' was not created by autotune (it has no "
            f"search_fingerprint); give another --study-name"
        )
    if stored == spec.search_fingerprint():
        return None
    if record.search_definition is None and stored in _fingerprints_before_1122(spec):
        return None  # the same search, labelled by an earlier autotune
    old_text, new_text = record.space_file or "", spec.text
    if old_text != new_text:
        title = "the space file changed since the study was created"
        before, after = old_text, new_text
    elif record.search_definition is not None:  # the same file: --device, or the machine
        changed = _changed_values(record.search_definition, spec.search_definition())
        title = (
            "the search differs from the one the study was created with (another --device, "
            "a --workers or --gpus share, or a machine that can run other values)"
        )
        if changed:  # by name: a diff of JSON lines showed numbers without their knob
            return f"study '{study.study_name}' cannot be resumed: {title}: {changed}"
        before, after = record.search_definition, spec.search_definition()
    else:
        title = "this machine can run a different set of values than the machine that created it"
        before, after = record.effective_space or "", _effective_space_text(spec)
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


def queue_reference(
    study: optuna.Study,
    spec: Spec,
    hardware: Hardware,
    reference: ReferenceKind,
    fits: Callable[[TrialConfig], bool] | None = None,
) -> bool:
    """Queue ``reference`` to run next, marked as such: the untuned baseline
    (``study.baseline``) or the tuning checklist (``study.checklist``, its batch the largest
    that ``fits`` under the memory walls); False when the study has none (switched off, or a
    checklist that would train the baseline again)."""
    from autotune.search import references

    if reference == "baseline":
        wanted = spec.study.baseline is not False  # a mapping of pins ({} too) wants one
        params = references.baseline_params(spec, hardware) if wanted else None
    elif spec.study.checklist:
        params = references.checklist_params(spec, hardware, fits)
    else:
        params = None
    if params is None:
        return False
    record = TrialRecord(baseline=reference == "baseline", checklist=reference == "checklist")
    if spec.study.strategy == "two_stage":  # its own execution knobs, on the study's axes
        params, config = references.as_two_stage(spec, hardware, params)
        record = dataclasses.replace(record, config=config)
    study.enqueue_trial(params, user_attrs=record.to_attrs())
    return True


def _json_or_none(value: dict[str, Any]) -> dict[str, Any] | None:
    """``value`` as it reads back from JSON (tuples become lists), or None when it cannot be
    stored (an argument that is not plain data)."""
    try:
        return dict(json.loads(json.dumps(value)))
    except (TypeError, ValueError):
        return None


def open_study(
    spec: Spec,
    storage: optuna.storages.BaseStorage,
    hardware: Hardware,
    workload: Workload | None = None,
    new_study: bool = False,
) -> optuna.Study:
    """Create the study of ``spec`` (already restricted to ``hardware``), or resume it.

    A study whose search differs is refused (StudyError with a diff). ``new_study`` starts a
    fresh study under the next free name (``name-2``, ``name-3``, ...), whether or not the
    search changed: what the user asked for is a new study, never a silent resume.
    """
    name = spec.study_name
    if name in optuna.get_all_study_names(storage):
        study = optuna.load_study(study_name=name, storage=storage)
        problem = _resume_problem(study, spec)
        if problem is None and not new_study:
            return _with_sampler(study, spec, storage)
        if not new_study:
            raise StudyError(
                f"{problem}\nrun with --new-study to start a new study, or set study.name"
            )
        taken = set(optuna.get_all_study_names(storage))
        name = next(f"{name}-{n}" for n in itertools.count(2) if f"{name}-{n}" not in taken)
    try:
        study = optuna.create_study(
            study_name=name, storage=storage, direction=spec.objective.direction
        )
    except optuna.exceptions.DuplicatedStudyError:
        # another `autotune run` created it a moment ago: join it like a resume
        return open_study(spec, storage, hardware, workload, new_study=False)
    try:
        _label(study, spec, hardware, workload)
    except BaseException:
        # a study without its labels cannot be resumed: it is removed, or, where even that
        # fails (a full disk), the next run names it as half-made (never removing it: it could
        # be another process's study, still being labelled)
        with contextlib.suppress(Exception):
            optuna.delete_study(study_name=name, storage=storage)
        raise
    return _with_sampler(study, spec, storage)


def _label(study: optuna.Study, spec: Spec, hardware: Hardware, workload: Workload | None) -> None:
    """Write what a new study records (its search, space file, machine) and queue its
    baseline."""
    from autotune.training import telemetry

    StudyRecord(autotune_version=__version__).store(study)  # first: a half-made one says so
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)  # stable in practice since 3.2
        study.set_metric_names([spec.objective.metric_name])
    text = spec.text
    StudyRecord(
        space_file=text,
        space_file_path=str(spec.path) if spec.path else None,
        space_hash=hashlib.sha256(text.encode()).hexdigest()[:16],
        search_fingerprint=spec.search_fingerprint(),
        search_definition=spec.search_definition(),
        effective_space=_effective_space_text(spec),
        # where module:function entry points were found, for exported scripts
        space_file_dir=str(spec.path.resolve().parent) if spec.path else None,
        metric=spec.objective.metric_name,
        score_name=spec.objective.score_name,
        score_higher_is_better=spec.objective.score_higher_is_better,
        created_on=hardware.device_name,
        autotune_version=__version__,
        num_classes=workload.num_classes if workload is not None else None,
        input_shape=list(workload.input_shape) if workload is not None else None,
        # for exports, which then need not import the user's code to learn them
        model_kwargs=_json_or_none(workload.model_kwargs) if workload is not None else None,
        batch_layout=workload.layout.to_record() if workload is not None else None,
        classes_last=workload.classes_last if workload is not None else None,
        hardware=telemetry.fingerprint(hardware),
        strategy=spec.study.strategy,
        learning_knobs=list(spec.study.learning_knobs),
    ).store(study)
    # the checklist is queued when trials start (``requeue_lost_references``): after stage 1,
    # whose memory walls its batch must stay under; both after batch_size: auto's probe
    if not spec.space.batch_size_auto:
        queue_reference(study, spec, hardware, "baseline")


def _with_sampler(
    study: optuna.Study, spec: Spec, storage: optuna.storages.BaseStorage
) -> optuna.Study:
    return optuna.load_study(
        study_name=study.study_name,
        storage=storage,
        sampler=make_sampler(spec),
        pruner=make_pruner(spec),
    )


def patient_storage(
    url: str,
    access: Access = "create",
    heartbeat_interval: int | None = None,
    outage_seconds: float = DEFAULT_OUTAGE_SECONDS,
) -> adapter.RetryingStorage:
    """The storage a study process writes through (``open_storage``), whose every call waits
    up to ``outage_seconds`` for a database that stopped answering (``_outage``)."""
    backend = open_storage(url, access, heartbeat_interval=heartbeat_interval)
    return adapter.RetryingStorage(backend, OutageRetry(outage_seconds, url=backend.url))


def load_study(name: str | None, storage_url: str, access: Access = "read") -> optuna.Study:
    """An existing study, read-only unless ``access`` is "write" (then its writes wait for a
    database that restarts); StudyError naming the studies there when it is absent. With no
    ``name``, the storage's only study (its stage-1 speed study aside); StudyError naming them
    where there are several, or saying there is none."""
    storage = (
        open_storage(storage_url, access)
        if access == "read"
        else patient_storage(storage_url, access)
    )
    names = optuna.get_all_study_names(storage)
    if name is None:
        name = only_study(names, storage_url)
    if name not in names:
        known = ", ".join(sorted(names)) or "none"
        hint = difflib.get_close_matches(name, names, n=1)
        suggestion = f"did you mean '{hint[0]}'? " if hint else ""
        raise StudyError(
            f"no study '{name}' in {display_url(storage_url)}; {suggestion}studies there: {known}"
        )
    return optuna.load_study(study_name=name, storage=storage)


def only_study(names: list[str], storage_url: str) -> str:
    """The one study among ``names`` that is not another's speed study (``NAME.speed``);
    StudyError where there is none or there are several."""
    from autotune.stage1._store import speed_study_name

    studies = sorted(set(names) - {speed_study_name(name) for name in names})
    where = display_url(storage_url)
    if not studies:
        raise StudyError(f"no study in {where}: run one with `autotune run SPACE.yaml`")
    if len(studies) > 1:
        raise StudyError(
            f"{where} holds {len(studies)} studies ({', '.join(studies)}): name one with --study"
        )
    return studies[0]
