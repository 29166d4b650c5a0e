"""``autotune studies --delete NAME``: a study taken out of its storage, and its stage-1
measurements (``NAME.speed``) with it where no other study may reuse them.

Every speed study of a storage is stage 1's cache (``stage1._store.load_cache``): a study reuses
the measurements of another's taken in the same context (machine, torch, threads, model, data),
in place, not copied. So a speed study is deleted only once no study left in the storage may
read it: one that measured stage 1 in one of its contexts, or a two-stage study whose own
context is not known (its speed study holds nothing: it reused every measurement, or has not
run stage 1 yet). One that is kept goes with the last study that may reuse it.
"""

from __future__ import annotations

import time
from typing import Any

import optuna
from optuna.artifacts import get_all_artifact_meta
from optuna.trial import TrialState

from autotune import study as studies
from autotune.display import plural
from autotune.stage1._claims import CLAIM_STALE_SECONDS, CLAIMS_ATTR
from autotune.stage1._store import SPEED_SUFFIX
from autotune.storage import adapter


def delete_study(name: str, storage: str) -> list[str]:
    """Delete study ``name`` of ``storage`` (a URL), then every speed study whose study is gone
    that no study left may reuse; the lines that say what went and what stayed. StudyError (one
    line) where ``name`` is no study there, is a study's own speed study, or runs now (a trial
    or a stage-1 measurement of a live process, or its confirmation round)."""
    from autotune.export import study_spec

    shown = studies.display_url(storage)
    found = studies.load_study(name, storage)  # no such study: its line, with the names there
    spec = study_spec(found)  # its heartbeat: a trial is running while it beats (no spec: all)
    interval = spec.study.heartbeat_interval if spec is not None else None
    backend = studies.open_storage(storage, "write", heartbeat_interval=interval)
    names = optuna.get_all_study_names(backend)
    parent = name.removesuffix(SPEED_SUFFIX)
    if name.endswith(SPEED_SUFFIX) and parent in names:
        raise studies.StudyError(
            f"{name} holds study {parent}'s stage-1 measurements: it goes with its study "
            f"(autotune studies --delete {parent})"
        )
    study = optuna.load_study(study_name=name, storage=backend)
    # the confirmation round's lock, held by another process: its round runs now
    refuse = _refuse(_running_error(name, "its confirmation round"))
    with studies.study_lock(study), studies.study_lock(study, "confirm", refuse):
        why = _running(study, names)
        if why is not None:
            raise _running_error(name, why)
        if name.endswith(SPEED_SUFFIX):
            readers = _readers(backend, name, names)
            if readers:
                raise studies.StudyError(
                    f"{name} holds stage 1's measurements that {', '.join(readers)} may reuse "
                    f"(the same machine, model and data): it goes with the last study that may"
                )
        trials = len(study.get_trials(deepcopy=False))
        attached = len(get_all_artifact_meta(study))
        optuna.delete_study(study_name=name, storage=backend)
    said = [f"Deleted study {name} ({plural(trials, 'trial')}) from {shown}."]
    if attached:
        said.append(
            f"Kept the {plural(attached, 'file')} attached to it for optuna-dashboard "
            "(exports, reports): they stay in the artifact store."
        )
    return said + _speed_studies(backend, studies.speed_study_name(name))


def _speed_studies(storage: Any, own: str) -> list[str]:
    """Delete the speed studies whose study is gone and that no study left may reuse; a line
    for each deleted, and one for ``own`` (the deleted study's) where it is kept."""
    said = []
    names = optuna.get_all_study_names(storage)
    for name in sorted(names):
        if not name.endswith(SPEED_SUFFIX) or name.removesuffix(SPEED_SUFFIX) in names:
            continue
        readers = _readers(storage, name, names)
        if readers:
            said += [_kept(name, readers)] if name == own else []
            continue
        speed = optuna.load_study(study_name=name, storage=storage)
        count = len(speed.get_trials(deepcopy=False))
        optuna.delete_study(study_name=name, storage=storage)
        said.append(
            f"Deleted {name}: its {plural(count, 'stage-1 measurement')}, which no study "
            f"left here may reuse."
        )
    return said


def _kept(name: str, readers: list[str]) -> str:
    """Why speed study ``name`` stays: the studies that may reuse it."""
    return (
        f"Kept {name} (stage 1's measurements): {', '.join(readers)} may reuse them (the same "
        f"machine, model and data); it goes with the last study that may."
    )


def _contexts(storage: Any, speed_name: str, names: list[str]) -> set[str]:
    """The contexts (machine, model, data, ...) of the measurements in speed study
    ``speed_name``; none where it does not exist."""
    if speed_name not in names:
        return set()
    speed = optuna.load_study(study_name=speed_name, storage=storage)
    records = (studies.SpeedRecord.of(trial) for trial in speed.get_trials(deepcopy=False))
    return {record.context for record in records if record is not None}


def _readers(storage: Any, speed_name: str, names: list[str]) -> list[str]:
    """The studies among ``names`` that may reuse the measurements of speed study
    ``speed_name`` (the module's rule)."""
    theirs = _contexts(storage, speed_name, names)
    readers = []
    for name in names:
        own = studies.speed_study_name(name)
        if name.endswith(SPEED_SUFFIX) or own == speed_name:
            continue
        study = optuna.load_study(study_name=name, storage=storage)
        if studies.StudyRecord.of(study).strategy == "joint":  # it has no stage 1
            continue
        contexts = _contexts(storage, own, names)
        if not contexts or contexts & theirs:
            readers.append(name)
    return readers


def _running(study: optuna.Study, names: list[str]) -> str | None:
    """What of ``study`` runs now: a trial whose heartbeat is alive, or a stage-1 setting
    claimed by a live process; None where nothing does."""
    running = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
    live = len(running) - len(adapter.stale_trial_ids(study))
    if live > 0:
        return f"{plural(live, 'trial')} training"
    speed_name = studies.speed_study_name(study.study_name)
    if speed_name in names:
        speed = optuna.load_study(study_name=speed_name, storage=adapter.storage_of(study))
        claims = speed.user_attrs.get(CLAIMS_ATTR) or {}
        beats = [float(claim.get("beat", 0)) for claim in claims.values()]
        if any(time.time() - beat < CLAIM_STALE_SECONDS for beat in beats):
            return "its stage 1 is being measured"
    return None


def _running_error(name: str, why: str) -> studies.StudyError:
    return studies.StudyError(f"study {name} is running ({why}): let it end first")


def _refuse(error: Exception) -> Any:
    """A ``study_lock`` ``on_wait`` that raises ``error`` instead of waiting for the lock."""

    def refuse(*_: Any) -> None:
        raise error

    return refuse
