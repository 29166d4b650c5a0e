"""The contract autotune holds with Optuna's internals (``autotune.storage.adapter``): every
function behaves as the package needs, on the storages studies use (SQLite, in memory), so
that an Optuna release that moves one of them fails here rather than in a study."""

from __future__ import annotations

import ast
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from autotune.storage import adapter
from autotune.study import OutageRetry, open_storage
from autotune.testing import beat_long_ago

PACKAGE = Path(__file__).resolve().parents[1] / "autotune"


@pytest.fixture
def sqlite_study(tmp_path: Path) -> optuna.Study:
    storage = open_storage(f"sqlite:///{tmp_path / 'contract.db'}", heartbeat_interval=1)
    return optuna.create_study(study_name="contract", storage=storage)


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")  # ask() with beats
def test_ids_storage_and_url_of_a_sqlite_study(sqlite_study: optuna.Study, tmp_path: Path):
    first, second = sqlite_study.ask(), sqlite_study.ask()
    assert adapter.trial_id(first) != adapter.trial_id(second)
    stored = adapter.get_trial(sqlite_study, adapter.trial_id(second))
    assert (stored.number, stored.state) == (second.number, TrialState.RUNNING)
    frozen = sqlite_study.tell(first, 1.0)
    assert adapter.trial_id(frozen) == adapter.trial_id(first)  # a FrozenTrial's id too
    storage = adapter.storage_of(sqlite_study)
    assert adapter.rdb_storage(storage) is not None
    assert adapter.storage_url(storage) == f"sqlite:///{tmp_path / 'contract.db'}"
    assert adapter.heartbeat_interval(storage) == 1


def test_a_study_in_memory_has_no_url_and_no_heartbeat():
    study = optuna.create_study()
    storage = adapter.storage_of(study)
    assert adapter.rdb_storage(storage) is None
    assert adapter.storage_url(storage) is None
    assert adapter.heartbeat_interval(storage) is None
    study.ask()
    assert adapter.stale_trial_ids(study) == []


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")  # the test beats itself
def test_a_trial_whose_beat_stopped_is_stale_and_a_beating_one_is_not(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'beats.db'}"
    rdb = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(study_name="beats", storage=rdb)
    storage = adapter.storage_of(study)
    silent, beating = study.ask(), study.ask()
    storage.record_heartbeat(adapter.trial_id(silent))
    beat_long_ago(tmp_path / "beats.db")  # past the grace period, without waiting for it
    storage.record_heartbeat(adapter.trial_id(beating))
    assert adapter.stale_trial_ids(study) == [adapter.trial_id(silent)]


def test_user_attributes_of_a_trial_held_elsewhere_and_after_it_finished(sqlite_study):
    trial = sqlite_study.ask()
    adapter.set_trial_user_attr(sqlite_study, adapter.trial_id(trial), "note", {"a": 1})
    assert adapter.get_trial(sqlite_study, adapter.trial_id(trial)).user_attrs == {
        "note": {"a": 1}
    }
    sqlite_study.tell(trial, 0.5)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        adapter.set_trial_user_attr(sqlite_study, adapter.trial_id(trial), "note", 2)


def test_system_attributes_are_read_and_written_straight_to_the_database(sqlite_study):
    assert adapter.study_system_attr(sqlite_study, "autotune:lease") is None
    adapter.set_study_system_attr(sqlite_study, "autotune:lease", {"owner": "a", "beat": 1})
    again = optuna.load_study(study_name="contract", storage=sqlite_study._storage)
    assert adapter.study_system_attr(again, "autotune:lease") == {"owner": "a", "beat": 1}
    assert "autotune:lease" not in again.user_attrs  # bookkeeping, not the user's


def test_a_finished_trial_is_added_with_its_number(sqlite_study):
    sqlite_study.tell(sqlite_study.ask(), 1.0)
    made = create_trial(
        value=3.0,
        params={"x": 0.5},
        distributions={"x": FloatDistribution(0.0, 1.0)},
        user_attrs={"kept": True},
    )
    number = adapter.add_finished_trial(sqlite_study, made)
    assert number == 1
    added = sqlite_study.get_trials()[number]
    assert (added.value, added.params, added.user_attrs) == (3.0, {"x": 0.5}, {"kept": True})


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")  # the test beats itself
def test_a_retrying_storage_serves_a_study_as_optunas_own_storage_does(tmp_path: Path):
    """A study through RetryingStorage: asked, told, attributes, params, heartbeats, stale
    trials failed and retried by Optuna's own functions, and the adapter's lookups."""
    url = f"sqlite:///{tmp_path / 'patient.db'}"
    rdb = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=1)
    storage = adapter.RetryingStorage(rdb, OutageRetry(5, url=url))
    study = optuna.create_study(study_name="patient", storage=storage)
    assert adapter.storage_of(study) is storage and adapter.outage_retry_of(storage).seconds == 5
    assert adapter.rdb_storage(storage) is rdb and adapter.storage_url(storage) == url
    assert adapter.heartbeat_interval(storage) == 1
    done = study.ask({"x": FloatDistribution(0.0, 1.0)})
    done.set_user_attr("note", "kept")
    done.report(0.25, 0)
    study.tell(done, 0.5)
    silent = study.ask()
    storage.record_heartbeat(adapter.trial_id(silent))
    beat_long_ago(tmp_path / "patient.db")  # past the grace period, without waiting for it
    assert adapter.stale_trial_ids(study) == [adapter.trial_id(silent)]
    optuna.storages.fail_stale_trials(study)
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE, TrialState.FAIL]
    again = optuna.load_study(study_name="patient", storage=url).trials[0]
    assert (again.value, again.params, again.user_attrs) == (0.5, done.params, {"note": "kept"})
    assert again.intermediate_values == {0: 0.25}
    assert adapter.outage_retry_of(adapter.storage_of(optuna.create_study())).seconds == 0


def test_no_module_but_the_adapter_reads_an_underscored_name_of_an_optuna_object():
    """Underscored attributes of studies, trials and storages (``study._storage``,
    ``trial._trial_id``, ``storage._backend``) are read through the adapter only."""
    optuna_private = {"_storage", "_study_id", "_trial_id", "_backend", "_get_stale_trial_ids"}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "adapter.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in optuna_private:
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}")
            if (  # getattr(storage, "_backend", ...)
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in {"getattr", "hasattr"}
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in optuna_private
            ):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.func.id}")
    assert offenders == []
