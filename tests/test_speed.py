"""The two-stage search: timed bursts, the speed plan, the speed study and its cache, and
learning trials that train with stage 1's choices."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import optuna
import pytest
from optuna.trial import TrialState
from typer.testing import Result

from autotune import stops
from autotune.config import TrialConfig
from autotune.executor import InProcessExecutor
from autotune.faults import FaultKind, TrialFault
from autotune.results import Reporter, TrialResult
from autotune.search.references import untuned_config
from autotune.search.space import restrict
from autotune.spacefile import SpecError, parse_spec
from autotune.speed import BurstPlan, SpeedChoice, SpeedMeasurement, SpeedTable
from autotune.stage1._plan import FULL_PRODUCT_LIMIT, Cell, Settings, SpeedPlan
from autotune.stage1._probe import doubled
from autotune.study import (
    RunOutcome,
    SpeedRecord,
    StageInputs,
    StudyError,
    StudyRecord,
    TrialRecord,
    counted_trials,
    speed_study_name,
    trial_config,
)
from autotune.testing import AMPERE, CPU, blobs_workload, make_config, start_cli
from autotune.training import bursts
from autotune.workloads import Workload

QUICK = BurstPlan(warmup_micro_batches=2, bursts=2, burst_seconds=0.02)

TWO_STAGE = """\
study:
  name: two
  n_trials: {n_trials}
  n_startup_trials: 2
  pruner: none
  speed: {{bursts: 2, burst_seconds: 0.02}}
{study_extra}
workload:
  model: autotune.testing:tiny_mlp
  model_args: {model_args}
  data: autotune.testing:blobs
  data_args: {data_args}
  epochs: 1
  device: cpu
objective: {{min_accuracy: 0.3}}
space:
  lr: {{low: 1.0e-3, high: 1.0e-1, log: true}}
  batch_size: {batch_sizes}
  accumulation_steps: [1, 2]
  precision: {precisions}
  data_pipeline: [dataloader, device]
  num_workers: {workers}
"""


def two_stage(
    n_trials: int = 3,
    batch_sizes: str = "[16, 32]",
    model_args: str = "{}",
    data_args: str = "{}",
    study_extra: str = "",
    precisions: str = "[fp32, bf16]",
    workers: str = "[0, 1]",
) -> str:
    return TWO_STAGE.format(
        precisions=precisions,
        workers=workers,
        n_trials=n_trials,
        batch_sizes=batch_sizes,
        model_args=model_args,
        data_args=data_args,
        study_extra=study_extra,
    )


class CountingExecutor(InProcessExecutor):
    """The in-process executor, counting what it measures."""

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        self.measured: list[TrialConfig] = []

    def measure(self, config: TrialConfig, plan: BurstPlan) -> SpeedMeasurement:
        self.measured.append(config)
        return super().measure(config, plan)


class SyntheticExecutor:
    """Stage 1's executor without training, for the tests of what the stage does with its
    measurements (its rules, its budget, its order): each measurement is made up, a step of
    ``step_seconds(config)`` (a millisecond unless told) and a cold compile of
    ``compile_seconds``, each taking ``seconds_each`` of the fake ``clock``'s time, or what
    ``load(n)`` says of the n-th: (its seconds, others' share of its cores meanwhile). One
    longer than its plan's time limit is stopped there, as the worker stops it. What it was
    asked is kept in ``measured``, as CountingExecutor keeps it, and the ``interrupt_at``-th
    is a Ctrl-C. Trials train for real in this process on ``workload`` where one is given
    (stage 2 after a made-up stage 1)."""

    def __init__(
        self,
        step_seconds: Callable[[TrialConfig], float] = lambda config: 0.001,
        compile_seconds: float = 5.0,
        clock: FakeClock | None = None,
        seconds_each: float = 0.0,
        workload: Workload | None = None,
        interrupt_at: int | None = None,
        load: Callable[[int], tuple[float, float | None]] | None = None,
    ) -> None:
        self.step_seconds = step_seconds
        self.load = load or (lambda n: (seconds_each, None))
        self.compile_seconds = compile_seconds
        self.clock = clock
        self.trials = InProcessExecutor(workload) if workload is not None else None
        self.interrupt_at = interrupt_at
        self.measured: list[TrialConfig] = []

    def measure(self, config: TrialConfig, plan: BurstPlan) -> SpeedMeasurement:
        if self.interrupt_at is not None and len(self.measured) + 1 == self.interrupt_at:
            raise KeyboardInterrupt
        self.measured.append(config)
        seconds, others = self.load(len(self.measured))
        limit = plan.time_limit_seconds
        if self.clock is not None:
            self.clock.seconds += min(seconds, limit or seconds)
        if limit is not None and seconds > limit:
            busy = others is not None and others > 0.15
            kind = FaultKind.TIMEOUT_UNDER_LOAD if busy else FaultKind.TRIAL_TIMEOUT
            raise TrialFault(kind, f"no result after {limit:g} s")
        step = self.step_seconds(config)
        compiled = config.compile != "none"
        return SpeedMeasurement(
            batch_size=config.batch_size,
            micro_batches_per_epoch=256 // config.batch_size,  # blobs' training split
            step_seconds=(step,) * plan.bursts,
            optimizer_seconds=(step / 4,) * plan.bursts,
            epoch_start_seconds=(step,) * plan.bursts,
            one_time_seconds=self.compile_seconds if compiled else 0.0,
            compile_seconds=self.compile_seconds if compiled else None,
            peak_memory_bytes=0,
            device_name="synthetic",
            torch_version="synthetic",
            intra_op_threads=1,
            other_cpu_share=others,
        )

    def train(self, config: TrialConfig, report: Reporter) -> TrialResult:
        assert self.trials is not None, "given no workload, it trains no trial"
        return self.trials.train(config, report)

    def close(self) -> None:
        if self.trials is not None:
            self.trials.close()


def command(*args: str, cwd: Path) -> Result:
    """``autotune ARGS`` in ``cwd``, in this process (Typer's CliRunner, as wide as run_cli's
    console): for a command whose output and exit status are what a test looks at, not its
    process (a signal, a crash, what it imports). A bug raises here, as it would there."""
    from typer.testing import CliRunner

    from autotune.cli import app

    with contextlib.chdir(cwd):
        return CliRunner().invoke(app, list(args), env={"COLUMNS": "160"}, catch_exceptions=False)


def _workload(directory: Path, space: str) -> Workload:
    from autotune.workloads import load

    spec = parse_spec(space, directory / "space.yaml")
    return load(spec.workload, base_dir=directory)


# -- the measurement ------------------------------------------------------------------------------


def test_a_measurement_times_bursts_of_real_steps():
    workload = blobs_workload()
    result = bursts.measure(make_config(batch_size=32, accumulation_steps=4), workload, QUICK)
    assert len(result.step_seconds) == len(result.epoch_start_seconds) == QUICK.bursts
    assert all(seconds > 0 for seconds in result.step_seconds)
    assert result.micro_batches_per_epoch == len(workload.train_set) // 32
    assert result.compile_seconds is None and result.intra_op_threads >= 1
    # the optimizer step is timed apart: accumulating gradients saves a share of it
    assert 0 < max(result.optimizer_seconds) < max(result.step_seconds)
    assert result.samples_per_second(4) > result.samples_per_second(1)


def test_a_measurement_fails_as_a_trial_would():
    workload = blobs_workload()
    with pytest.raises(TrialFault) as too_big:
        bursts.measure(make_config(batch_size=10_000), workload, QUICK)
    assert too_big.value.kind == FaultKind.INVALID_CONFIG

    from autotune.testing import tiny_mlp

    splits_workload = blobs_workload()
    oom = Workload(
        "oom",
        splits_workload.train_set,
        splits_workload.val_set,
        splits_workload.num_classes,
        splits_workload.input_shape,
        lambda: tiny_mlp(
            splits_workload.num_classes or 0, splits_workload.input_shape, oom_at_batch=32
        ),
    )
    with pytest.raises(TrialFault) as out_of_memory:
        bursts.measure(make_config(batch_size=32), oom, QUICK)
    assert out_of_memory.value.kind == FaultKind.OOM
    bursts.measure(make_config(batch_size=16), oom, QUICK)  # below the wall it runs


# -- the plan -------------------------------------------------------------------------------------


def _plan(space: str, hardware=CPU) -> SpeedPlan:
    spec = restrict(parse_spec(space, "space.yaml"), hardware).spec
    return SpeedPlan(spec, untuned_config(spec, hardware))


def test_the_plan_tries_conditional_knobs_only_where_they_mean_something():
    plan = _plan(two_stage())
    cell = Cell(16, "fp32")
    pipelines = plan.pipeline_settings(cell)
    assert {
        "data_pipeline": "device",
        "num_workers": 0,
        "pin_memory": False,
        "prefetch_factor": None,
        "persistent_workers": False,
    } in pipelines
    assert len(pipelines) == 3  # device; dataloader with 0 workers; with 1 (prefetch 2)
    with_workers = [p for p in pipelines if p["num_workers"] == 1]
    assert with_workers == [
        {
            "data_pipeline": "dataloader",
            "num_workers": 1,
            "pin_memory": False,
            "prefetch_factor": 2,
            "persistent_workers": False,
        }
    ]
    assert plan.exhaustive(cell) and len(plan.all_settings(cell)) == 3
    assert [c.batch_size for c in plan.cells()] == [16, 32, 16, 32]  # fp32, bf16
    assert plan.accumulations == (1, 2)


def test_many_settings_are_searched_in_two_passes_with_a_feeding_pipeline():
    space = two_stage().replace(
        "num_workers: [0, 1]",
        "num_workers: [0, 1, 2]\n  persistent_workers: [false, true]\n"
        "  pin_memory: [false, true]\n  compile: [none, default]\n"
        "  cudnn_benchmark: [false, true]",
    )
    plan = _plan(space, AMPERE)
    cell = Cell(16, "fp32")
    count = len(plan.pipeline_settings(cell)) * len(plan.compute_settings(cell))
    assert count > FULL_PRODUCT_LIMIT and not plan.exhaustive(cell)
    assert plan.reference_pipeline(cell)["data_pipeline"] == "device"
    no_device = _plan(space.replace("[dataloader, device]", "dataloader"), AMPERE)
    reference = no_device.reference_pipeline(cell)
    assert reference["num_workers"] == 2 and reference["persistent_workers"] is True
    assert reference["pin_memory"] is True


def test_on_a_gpu_stage_one_times_the_half_precisions_first():
    """A budget that runs short gives the groups it cannot reach one eager setting a cell: on
    a GPU those are the slow precisions, fp32 and TF32; on a CPU the space's order holds."""
    space = two_stage(precisions="[fp32, tf32, bf16, fp16]")
    gpu = [c.precision for c in _plan(space, AMPERE).cells() if c.batch_size == 16]
    assert gpu == ["fp16", "bf16", "tf32", "fp32"]
    cpu = [c.precision for c in _plan(two_stage()).cells() if c.batch_size == 16]
    assert cpu == ["fp32", "bf16"]  # as listed (a GPU would time bf16 first)


def test_a_precision_the_gpu_order_does_not_name_is_timed_last(monkeypatch):
    """A precision added to the registry needs no place in stage 1's GPU order: it comes after
    the ones the order names, in the space's order."""
    from autotune.stage1 import _plan as _speed_plan

    monkeypatch.setattr(_speed_plan, "GPU_PRECISION_ORDER", ("fp16", "bf16"))
    space = two_stage(precisions="[tf32, fp32, bf16, fp16]")
    gpu = [c.precision for c in _plan(space, AMPERE).cells() if c.batch_size == 16]
    assert gpu == ["fp16", "bf16", "tf32", "fp32"]


def test_stage_one_predicts_the_checklist_precision_at_the_largest_micro_batch_fastest():
    import dataclasses

    from autotune.testing import TEST_CPU

    def predicted(space: str, hardware) -> list[tuple[str, int]]:
        spec = restrict(parse_spec(space, "space.yaml"), hardware).spec
        plan = SpeedPlan.for_hardware(spec, hardware)
        return [(c.precision, c.batch_size) for c in plan.predicted()]

    four = two_stage(precisions="[fp32, tf32, bf16, fp16]")
    assert predicted(four, AMPERE) == [
        ("fp16", 32), ("bf16", 32), ("fp16", 16), ("bf16", 16),
        ("tf32", 32), ("tf32", 16), ("fp32", 32), ("fp32", 16),
    ]  # fmt: skip
    native = dataclasses.replace(TEST_CPU, bf16_native=True)  # a CPU with bf16 units
    bf16_first = [("bf16", 32), ("bf16", 16), ("fp32", 32), ("fp32", 16)]
    assert predicted(two_stage(), native) == bf16_first
    assert predicted(two_stage(), TEST_CPU)[:2] == [("fp32", 32), ("fp32", 16)]  # emulated bf16


def test_a_cell_times_cudnn_benchmark_off_before_on_so_a_worker_switches_once():
    # cuDNN's plans outlive a run: each switch of the flag costs the worker a fresh process
    # (trainer.cudnn_plans_differ), so the order must not alternate as a plain product does
    space = two_stage().replace(
        "num_workers: [0, 1]",
        "num_workers: [0, 1]\n  compile: [none, default]\n  channels_last: [false, true]\n"
        "  cudnn_benchmark: [true, false]",
    )
    plan = _plan(space, AMPERE)
    cell = Cell(16, "fp32")
    flags = [setting["cudnn_benchmark"] for setting in plan.compute_settings(cell)]
    assert flags == sorted(flags) and flags.count(False) == flags.count(True) == 4
    firsts = [dict(s)["cudnn_benchmark"] for s in plan.first_round(cell)]
    switches = sum(1 for a, b in itertools.pairwise(firsts) if a != b)
    assert switches <= 2  # the compute pass switches once, the pipeline pass once at most


def test_a_cell_begins_with_the_cudnn_benchmark_flag_its_worker_process_ran_last(
    tmp_path: Path, prepare_study
):
    """A cell that ends with cudnn.benchmark on leaves a worker process that ran it on: the
    next cell times its settings with it on first, and switches (a fresh process) once."""
    from autotune.stage1._stage import Stage

    space = two_stage().replace(
        "num_workers: [0, 1]", "num_workers: [0, 1]\n  cudnn_benchmark: [false, true]"
    )
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), AMPERE).spec
    stage = Stage(
        StageInputs(study, spec, AMPERE, InProcessExecutor(blobs_workload()), on_event=print)
    )
    cell = Cell(16, "fp32")
    planned = stage.plan.first_round(cell)
    flags = [dict(s)["cudnn_benchmark"] for s in planned]
    assert flags[0] is False and True in flags  # the plan's own order: off, then on
    assert stage._same_process_first(cell, planned) == planned  # nothing ran yet
    stage.last_measured = stage.plan.config(cell, planned[flags.index(True)])
    ordered = stage._same_process_first(cell, planned)
    assert sorted(ordered) == sorted(planned)
    after = [dict(s)["cudnn_benchmark"] for s in ordered]
    assert after == sorted(after, reverse=True)  # on first: one switch, not two
    assert [s for s in ordered if not dict(s)["cudnn_benchmark"]] == [
        s for s in planned if not dict(s)["cudnn_benchmark"]
    ]


def test_stage_one_on_a_gpu_switches_cudnn_benchmark_once_a_cell(tmp_path: Path, prepare_study):
    """The stage as a GPU runs it (configurations for cuda, measured synthetically): each
    cell begins with the flag the last one ended with, so two cells switch twice, not three
    times (each switch is a fresh worker process on a GPU)."""
    from autotune.study import run_speed_stage

    space = two_stage(n_trials=1, precisions="fp32", workers="[0]").replace(
        "num_workers: [0]", "num_workers: [0]\n  cudnn_benchmark: [false, true]"
    )
    space = space.replace("speed: {bursts: 2,", "speed: {repeats: 1, bursts: 2,")  # no rematch
    executor = SyntheticExecutor()  # what a GPU would be asked
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), AMPERE).spec
    run_speed_stage(StageInputs(study, spec, AMPERE, executor))
    asked = executor.measured
    assert all(c.device.startswith("cuda") for c in asked)
    by_cell = [[c.cudnn_benchmark for c in asked if c.batch_size == b] for b in (16, 32)]
    assert all(set(flags) == {False, True} for flags in by_cell), by_cell
    assert by_cell[1][0] == by_cell[0][-1]  # the second cell begins where the first ended
    flags = [c.cudnn_benchmark for c in asked]
    # off, then on, in the first cell; on, then off, in the second: two switches, not three
    assert sum(1 for a, b in itertools.pairwise(flags) if a != b) == 2, flags


def test_a_range_of_an_execution_knob_is_enumerated_and_a_wide_one_refused():
    plan = _plan(two_stage().replace("num_workers: [0, 1]", "num_workers: {low: 0, high: 2}"))
    assert plan.values["num_workers"] == (0, 1, 2)
    with pytest.raises(SpecError, match="num_workers: the speed stage tries every value"):
        _plan(two_stage().replace("num_workers: [0, 1]", "num_workers: {low: 0, high: 500}"))


def test_two_stage_needs_listed_micro_batches_and_sound_learning_knobs():
    ranged = two_stage(batch_sizes="{low: 16, high: 64}")
    assert parse_spec(ranged, "space.yaml").study.strategy == "joint"  # no strategy named
    explicit = two_stage(batch_sizes="{low: 16, high: 64}", study_extra="  strategy: two_stage")
    with pytest.raises(SpecError, match=r"batch_size: study\.strategy two_stage times each"):
        parse_spec(explicit, "space.yaml")
    assert parse_spec(two_stage(), "space.yaml").study.strategy == "two_stage"  # the default
    with pytest.raises(SpecError, match="num_workers only says how batches are loaded"):
        parse_spec(two_stage(study_extra="  learning_knobs: [num_workers]"), "space.yaml")
    with pytest.raises(SpecError, match="unknown knob 'compil'"):
        parse_spec(two_stage(study_extra="  learning_knobs: [compil]"), "space.yaml")


# -- the table ------------------------------------------------------------------------------------


def _choice(batch: int, steps: int, seconds: float, precision: str = "fp32") -> SpeedChoice:
    return SpeedChoice(
        batch_size=batch,
        accumulation_steps=steps,
        precision=precision,
        extras=(),
        settings=(("data_pipeline", "device"),),
        samples_per_second=1000 / seconds,
        charged_seconds=seconds,
        one_time_seconds=0.0,
        spread=0.05,
        measurements=1,
        speed_trials=(0,),
    )


def test_the_table_gives_the_split_a_trial_finishes_soonest_with():
    table = SpeedTable(
        choices=(_choice(16, 2, 3.0), _choice(32, 1, 2.0), _choice(16, 1, 4.0)),
        unrunnable=(((64, 1, "fp32", ()), "oom", "batch 64: out of memory"),),
    )
    assert table.fastest(32, "fp32") == _choice(32, 1, 2.0)
    assert table.fastest(16, "fp32") == _choice(16, 1, 4.0)
    assert table.fastest(64, "fp32") is None
    kind, why = table.why_not(64, "fp32")
    assert kind == "oom" and "batch 64: out of memory" in why
    assert table.exact(16, 2, "fp32") == _choice(16, 2, 3.0)
    assert table.fastest(32, "bf16") is None


def test_the_table_stored_with_its_study_reads_back_as_it_was():
    """Through JSON and back (``StudyRecord.speed_table``): declared values, a cell left
    unmeasured (no speed, infinite seconds) and one that could not run keep their tuples."""
    unmeasured = SpeedChoice(32, 1, "bf16", (("compile", "default"),), (("num_workers", 0),))
    table = SpeedTable(
        choices=(_choice(16, 2, 3.0), unmeasured),
        unrunnable=(((64, 1, "bf16", (("compile", "default"),)), "oom", "batch 64: oom"),),
    )
    study = optuna.create_study(storage=optuna.storages.RDBStorage("sqlite://"))
    StudyRecord(speed_table=table).store(study)
    stored = StudyRecord.of(study).speed_table
    assert stored == table and stored is not None
    assert stored.exact(32, 1, "bf16", (("compile", "default"),)) == unmeasured
    assert stored.runs_out_of_memory(64, "bf16")


# -- the stage ------------------------------------------------------------------------------------


class TwoStageRun(NamedTuple):
    study: optuna.Study
    url: str  # its storage
    outcome: RunOutcome
    measured: list[TrialConfig]  # what stage 1 timed, in order


@pytest.fixture(scope="module")
def two_stage_run(tmp_path_factory: pytest.TempPathFactory, prepare_study) -> TwoStageRun:
    """The study ``two_stage()`` describes, run once in this process with stage 1 measured for
    real, for the tests that only read it (a test that adds to a study makes its own)."""
    directory = tmp_path_factory.mktemp("two-stage")
    space = two_stage()
    executor = CountingExecutor(_workload(directory, space))
    study, url, outcome, _ = prepare_study(space, directory, executor=executor)
    assert outcome is not None
    return TwoStageRun(study, url, outcome, executor.measured)


PAIR = ("fp32", "bf16")


def test_stage_one_times_every_setting_and_stage_two_trains_with_its_choice(
    two_stage_run: TwoStageRun,
):
    study, url, outcome, measured = two_stage_run
    table = outcome.speed_table
    assert table is not None and outcome.trials_run == 3
    # every cell's reference first (the checklist's: the device pipeline), the checklist's
    # precision (bf16 where this CPU has it natively) first, the largest micro-batch first
    references = [(c.precision, c.batch_size, c.data_pipeline) for c in measured[:4]]
    order = ("bf16", "fp32") if CPU.bf16_native else ("fp32", "bf16")
    assert references == [(p, b, "device") for p in order for b in (32, 16)]
    assert all(c.accumulation_steps == 1 for c in measured)
    assert len(list(table)) == 8  # 2 micro-batches x 2 accumulations x 2 precisions

    speed = optuna.load_study(study_name=speed_study_name("two"), storage=url)
    records = [SpeedRecord.of(t) for t in speed.trials]
    assert len(records) == len(measured)
    # at bf16, a pipeline is left out only when it was under half the fastest at fp32
    first = {
        (
            t.params["batch_size"],
            t.params["precision"],
            t.params["data_pipeline"],
            t.params.get("num_workers", 0),
        ): t.value
        for t, r in zip(speed.trials, records, strict=True)
        if r is not None and r.round == 1
    }
    # each micro-batch times every pipeline (device; dataloader with 0 or 1 worker) at the
    # precision it goes through first; at the other, a pipeline is left out only when it ran
    # under half the fastest there, or when that precision is far behind (one setting a cell)
    pipelines = {("device", 0), ("dataloader", 0), ("dataloader", 1)}
    for batch in (16, 32):
        found = {p: {k[2:]: v for k, v in first.items() if k[:2] == (batch, p)} for p in PAIR}
        complete = [p for p in PAIR if set(found[p]) == pipelines]
        assert len(complete) >= 1, found
        full, other = complete[0], next(p for p in PAIR if p != complete[0])
        fastest = max(v for v in found[full].values() if v)
        for pipeline in pipelines - set(found[other]):
            slow = found[full][pipeline] is not None and found[full][pipeline] < 0.5 * fastest
            assert slow or len(found[other]) == 1, (batch, other, pipeline, found)
    assert all(r is not None and r.measurement for r in records)
    assert {t.params["batch_size"] for t in speed.trials} == {16, 32}
    assert speed.metric_names == ["samples_per_second"]

    for trial in study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED)):
        config, record = trial_config(trial), TrialRecord.of(trial)
        if record.reference is not None:  # the references keep knobs of their own
            assert record.predicted_samples_per_second is None and record.speed_trials is None
            # ... on the study's axes: the dashboard plots every trial's parameters together
            assert set(trial.params) == {"effective_batch_size", "lr", "precision"}
            assert "batch_size" in (record.speed_knobs or [])
            if record.baseline:  # PyTorch's defaults
                assert config.data_pipeline == "dataloader" and config.num_workers == 0
            continue
        assert "num_workers" not in trial.params and "batch_size" not in trial.params
        effective = trial.params["effective_batch_size"]
        choice = table.fastest(effective, config.precision)
        assert choice is not None and record.speed_knobs
        assert {k: getattr(config, k) for k in choice.knobs()} == choice.knobs()
        assert record.predicted_samples_per_second == pytest.approx(choice.samples_per_second)
        assert set(record.speed_trials or []) <= {t.number for t in speed.trials}
    assert StudyRecord.of(study).strategy == "two_stage"


def test_the_report_shows_the_execution_settings_stage_one_chose_for_each_trial(
    two_stage_run: TwoStageRun,
):
    """A stage-2 trial samples effective_batch_size, precision and lr; its micro-batch and
    pipeline come from stage 1 and show in the report's All trials (issue 44 item 2)."""
    from autotune import display
    from autotune.outputs import report

    names, rows = report.trial_rows(two_stage_run.study)
    assert {"batch_size", "data_pipeline"} <= set(names)
    searched = [t for t in two_stage_run.study.trials if "effective_batch_size" in t.params]
    assert searched
    by_number = {row.number: row for row in rows}
    for trial in searched:
        config, row = trial_config(trial), by_number[trial.number]
        for name in ("batch_size", "data_pipeline"):
            assert row.params[names.index(name)] == display.fmt(getattr(config, name))


def test_the_cache_is_reused_and_missed_on_another_model_or_with_remeasure(
    tmp_path: Path, prepare_study
):
    # stage 1's measurements made up (and quiet: one taken under interference is measured
    # again by a later run, see below); stage 2's trials trained
    def executor(space: str) -> SyntheticExecutor:
        return SyntheticExecutor(workload=_workload(tmp_path, space))

    space = two_stage(n_trials=1, precisions="fp32", workers="[0]")
    first = executor(space)
    prepare_study(space, tmp_path, executor=first)
    assert first.measured

    more = space.replace("n_trials: 1", "n_trials: 2")
    again = executor(more)
    _, _, outcome, _ = prepare_study(more, tmp_path, executor=again)
    assert again.measured == [] and outcome.trials_run == 1  # every measurement reused

    # another study on the same machine and model, under another name: reused too
    other = more.replace("name: two", "name: other")
    reused = executor(other)
    prepare_study(other, tmp_path, executor=reused)
    assert reused.measured == []

    # another model (a wider MLP) is another context: measured afresh
    wider = other.replace("name: other", "name: wider").replace(
        "model_args: {}", "model_args: {hidden: 64}"
    )
    missed = executor(wider)
    prepare_study(wider, tmp_path, executor=missed)
    settings = {(c.batch_size, c.data_pipeline) for c in first.measured}
    assert len(settings) == 4  # 2 micro-batches x (device, dataloader)
    assert {(c.batch_size, c.data_pipeline) for c in missed.measured} == settings

    remeasured = executor(more)
    prepare_study(
        more.replace("n_trials: 2", "n_trials: 3"), tmp_path, executor=remeasured, remeasure=True
    )
    assert {(c.batch_size, c.data_pipeline) for c in remeasured.measured} == settings


def walled(n_trials: int, study_extra: str) -> str:
    """``two_stage`` at fp32 without workers, of a model that runs out of memory from
    micro-batch 32 (when it trains for real)."""
    return two_stage(
        n_trials=n_trials,
        batch_sizes="[16, 32, 64]",
        model_args="{oom_at_batch: 32}",
        study_extra=study_extra,
        precisions="fp32",
        workers="[0]",
    )


def test_a_memory_wall_stops_larger_micro_batches_and_their_trials(tmp_path: Path, prepare_study):
    space = walled(n_trials=8, study_extra="  baseline: false")
    executor = CountingExecutor(_workload(tmp_path, space))
    study, url, outcome, _ = prepare_study(space, tmp_path, executor=executor)
    measured = [(c.batch_size, c.data_pipeline) for c in executor.measured]
    # each cell's reference (the device pipeline) from the largest micro-batch down, until
    # one fits; then the other pipeline from the smallest up: its wall at 32 spares 64
    assert measured[:3] == [(64, "device"), (32, "device"), (16, "device")]
    assert set(measured) == {*measured[:3], (16, "dataloader"), (32, "dataloader")}
    assert measured.count((32, "dataloader")) == measured.count((64, "device")) == 1
    table = outcome.speed_table
    assert table is not None
    assert {c.batch_size for c in table} == {16}
    assert table.why_not(64, "fp32")[0] == "oom"
    speed = optuna.load_study(study_name=speed_study_name("two"), storage=url)
    failed = [t for t in speed.trials if t.state == TrialState.FAIL]
    assert failed and all(t.user_attrs["fail_kind"] == "oom" for t in failed)
    (checklist,) = [t for t in study.trials if TrialRecord.of(t).checklist]
    assert trial_config(checklist).batch_size == 16  # the largest that fits, not 64
    assert checklist.state == TrialState.COMPLETE
    # no split of 64 or more fits under the wall: no trial draws one (none is refused)
    assert all(t.params["effective_batch_size"] < 64 for t in study.trials)
    assert all(t.state == TrialState.COMPLETE for t in study.trials)


def test_a_wall_only_trials_meet_costs_no_more_trials(tmp_path: Path, prepare_study):
    """Stage 1 made up, so it sees no wall (as where a trial's optimizer state or evaluation
    needs more memory than stage 1 timed); the trials train a model that runs out of memory
    from micro-batch 32. Once a trial found that wall, a two-stage trial takes the next
    fastest split below it (16 x 2 for 32, not 32 x 1), and the sampler draws no effective
    batch with no split left under it (before: the table's fastest split was picked at the
    wall, and each such trial was refused, a counted trial of the budget)."""
    space = walled(
        n_trials=10, study_extra="  baseline: false\n  checklist: false\n  sampler: random"
    ).replace("data_pipeline: [dataloader, device]", "data_pipeline: dataloader")
    executor = SyntheticExecutor(workload=_workload(tmp_path, space))
    study, _, outcome, _ = prepare_study(space, tmp_path, executor=executor)
    assert outcome is not None and outcome.speed_table is not None
    assert {c.batch_size for c in outcome.speed_table} == {16, 32, 64}  # no wall seen
    wall, ran_out = 10**9, []
    for trial in study.trials:
        record, config = TrialRecord.of(trial), trial_config(trial)
        assert config.batch_size < wall and not record.oom_skipped, "drawn at a known wall"
        if config.batch_size < 32:
            assert trial.state == TrialState.COMPLETE
        else:  # a wall found, 64 then perhaps 32: at most two trials (before: 7 of 10 here)
            assert record.fail_kind == FaultKind.OOM
            wall = config.batch_size
            ran_out.append(trial.number)
    assert 1 <= len(ran_out) <= 2
    after = [trial_config(t) for t in study.trials[ran_out[-1] + 1 :]]
    assert {(c.batch_size, c.accumulation_steps) for c in after} == {(16, 1), (16, 2)}


def test_batch_size_auto_stops_at_the_wall_a_small_gain_or_the_training_set():
    oom = ("oom", "CUDA out of memory")

    # recorded speeds (samples/s, or a fault) by micro-batch, as the probe reads them; a size
    # not listed runs out of memory
    def probed(speeds: dict[int, float | tuple[str, str]], limit: int | None = None):
        return doubled(16, limit, lambda batch: speeds.get(batch, oom))

    assert probed({16: 900.0, 32: 1700.0, 64: 3000.0, 128: oom}) == (
        [16, 32, 64],
        "batch_size auto: 16 to 64 (128 ran out of memory; 96, 80, 72 too)",
    )
    # a doubling that adds under 10%: the probe stops, the smaller batch kept
    assert probed({16: 900.0, 32: 1700.0, 64: 1768.0}) == (
        [16, 32],
        "batch_size auto: 16 to 32 (64 gained 4%)",
    )
    assert probed({16: 900.0, 32: 1000.0, 64: oom})[0] == [16, 32]  # 11%: paid
    assert probed({16: 900.0, 32: 600.0})[1] == "batch_size auto: 16 (32 ran 33% slower)"
    # a worker killed on a CPU is its memory wall; any other fault stops it, saying so
    killed = probed({16: 900.0, 32: ("killed", "SIGKILL")})[1]
    assert killed.endswith("(32 ran out of memory; 24 too)")  # halfway to it: bisected
    assert probed({16: 900.0, 32: ("error", "boom")})[1].endswith("(32 failed: boom)")
    assert probed({16: oom}) == ([16], "batch_size auto: 16 (16 ran out of memory)")
    # a doubling that seems to gain under 10% is measured once more, both sizes: on the
    # figures pooled with the first (noise, not a wall) it may go on, or stop as it was
    again = {16: 900.0, 32: 1500.0, 64: 1800.0, 128: 1850.0}
    remeasured: list[int] = []

    def pooled(batch: int) -> float:
        remeasured.append(batch)
        return again[batch]

    first = {16: 900.0, 32: 850.0, 64: 1800.0, 128: 1700.0}
    assert doubled(16, None, lambda batch: first[batch], pooled) == (
        [16, 32, 64],
        "batch_size auto: 16 to 64 (128 gained 3%)",
    )
    assert remeasured == [16, 32, 64, 128]
    # the training set caps it
    assert probed({16: 900.0, 32: 1800.0, 64: 3600.0}, limit=50) == (
        [16, 32],
        "batch_size auto: 16 to 32 (64 is more than the 50 training samples)",
    )


class WallExecutor(SyntheticExecutor):
    """Stage 1 made up (each step a millisecond: doubling the batch doubles samples/s) with
    a memory wall at ``wall``."""

    def __init__(self, wall: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.wall = wall

    def measure(self, config: TrialConfig, plan: BurstPlan) -> SpeedMeasurement:
        if config.batch_size >= self.wall:
            self.measured.append(config)
            raise TrialFault(FaultKind.OOM, "out of memory")
        return super().measure(config, plan)


def test_batch_size_auto_is_probed_once_then_stage_one_and_the_references_use_its_list(
    tmp_path: Path, prepare_study
):
    space = two_stage(
        n_trials=3,
        batch_sizes="auto",
        study_extra="  baseline: {batch_size: 8}",
        precisions="fp32",
        workers="[0]",
    ).replace("  accumulation_steps: [1, 2]\n", "")
    # its first measurement taken while others had the cores: the probe times it again
    busy_first = lambda n: (0.0, 0.8 if n == 1 else None)  # noqa: E731
    probe = WallExecutor(40, workload=_workload(tmp_path, space), load=busy_first)
    study, _, outcome, _ = prepare_study(space, tmp_path, executor=probe)
    found = "batch_size auto: 8 to 32 (64 ran out of memory; 48, 40 too)"
    record = StudyRecord.of(study)
    assert (record.batch_sizes, record.batch_size_auto) == ([8, 16, 32], found)
    measured = [(c.batch_size, c.data_pipeline) for c in probe.measured]
    # the probe timed each cell's reference (the device pipeline) doubling from the
    # baseline's batch, then halfway to the wall; stage 1 took those as their first rounds
    doubling = [(8, "device")] * 2 + [(16, "device"), (32, "device"), (64, "device")]
    assert measured[:7] == [*doubling, (48, "device"), (40, "device")]
    rest = measured[7:]
    for batch in (8, 16, 32):
        assert rest.count((batch, "dataloader")) == 2
        assert rest.count((batch, "device")) == (batch != 8)  # 8's second round: the probe's
    assert outcome.speed_table is not None and outcome.speed_table.batch_size_auto == found
    assert {c.batch_size for c in outcome.speed_table} == {8, 16, 32}
    # the references queued after it: the baseline at its batch, the checklist at the largest
    (baseline,) = [t for t in study.trials if TrialRecord.of(t).baseline]
    (checklist,) = [t for t in study.trials if TrialRecord.of(t).checklist]
    assert baseline.number == 0 and trial_config(baseline).batch_size == 8
    assert trial_config(checklist).batch_size == 32
    assert all(t.state == TrialState.COMPLETE for t in study.trials), [
        (t.state, t.params, t.user_attrs.get("fail_msg")) for t in study.trials
    ]
    # resumed, remeasured and on a machine where more would fit: the same list, no probe
    more = space.replace("n_trials: 3", "n_trials: 4")
    resumed = WallExecutor(1024, workload=_workload(tmp_path, more))
    again, _, outcome, _ = prepare_study(more, tmp_path, executor=resumed, remeasure=True)
    assert StudyRecord.of(again).batch_sizes == [8, 16, 32]
    assert outcome.speed_table is not None and outcome.speed_table.batch_size_auto == found
    assert len(again.trials) == 4
    assert {c.batch_size for c in resumed.measured} == {8, 16, 32}


def test_an_interrupted_stage_one_resumes_where_it_stopped(tmp_path: Path, prepare_study):
    space = two_stage(n_trials=2, workers="[0]")
    # stage 1 made up (what is looked at is where it resumes), stage 2 trained
    stopped = SyntheticExecutor(workload=_workload(tmp_path, space), interrupt_at=5)
    study, _, outcome, _ = prepare_study(space, tmp_path, executor=stopped)
    assert outcome.interrupted and len(stopped.measured) == 4
    started = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)
    assert study.get_trials(states=started) == []  # stage 2 never started

    resumed = SyntheticExecutor(workload=_workload(tmp_path, space))
    study, url, outcome, _ = prepare_study(space, tmp_path, executor=resumed)
    assert outcome.trials_run == 2
    # every setting measured, and none twice for the same round: the resumed run went on
    # where the first stopped (which settings are close enough to be measured again is the
    # machine's call, so rounds are counted per setting, not in total)
    speed = optuna.load_study(study_name=speed_study_name("two"), storage=url)
    rounds: dict[str, list[int]] = {}
    for trial in speed.trials:
        record = SpeedRecord.of(trial)
        assert record is not None
        rounds.setdefault(record.cache_key, []).append(record.round)
    # 2 micro-batches x 2 pipelines at fp32; at bf16 those not far behind at fp32, or one
    # setting at batch 32 where bf16 itself is far behind
    assert 5 <= len(rounds) <= 8
    assert all(sorted(r) == list(range(1, len(r) + 1)) for r in rounds.values()), rounds
    assert len(stopped.measured) + len(resumed.measured) == len(speed.trials)


def test_a_measurement_an_older_autotune_stored_still_reads():
    """Older speed studies stored each measurement's samples/s by accumulation: nothing reads
    it, and it is no longer written; such a record still reads."""
    attrs = {
        "cache_key": "k",
        "context": "c",
        "cell": "batch 64, fp32",
        "settings": "no workers",
        "samples_per_second_by_accumulation": {"1": 100.0},
    }
    trial = optuna.trial.create_trial(state=TrialState.COMPLETE, value=1.0, user_attrs=attrs)
    record = SpeedRecord.of(trial)
    assert record is not None and record.cell == "batch 64, fp32"
    assert "samples_per_second_by_accumulation" not in record.to_attrs()


def test_declared_learning_knobs_are_sampled_in_stage_two(tmp_path: Path, prepare_study):
    space = two_stage(
        n_trials=3,
        study_extra="  learning_knobs: [batch_size, data_pipeline]",
        precisions="fp32",
        workers="[0]",
    )
    executor = SyntheticExecutor(workload=_workload(tmp_path, space))  # stage 1 made up
    study, _, outcome, _ = prepare_study(space, tmp_path, executor=executor)
    table = outcome.speed_table
    assert table is not None
    for trial in study.trials[1:]:
        config = trial_config(trial)
        assert {"batch_size", "accumulation_steps", "data_pipeline"} <= set(trial.params)
        assert "effective_batch_size" not in trial.params
        choice = table.exact(
            config.batch_size,
            config.accumulation_steps,
            config.precision,
            (("data_pipeline", config.data_pipeline),),
        )
        assert choice is not None and config.num_workers == choice.knobs()["num_workers"]


def test_a_study_keeps_its_strategy(tmp_path: Path, prepare_study):
    joint = two_stage(n_trials=1, study_extra="  strategy: joint")
    prepare_study(joint, tmp_path)
    # the file without a strategy continues the joint study as it was
    study, _, outcome, _ = prepare_study(
        joint.replace("  strategy: joint", "").replace("n_trials: 1", "n_trials: 2"), tmp_path
    )
    assert outcome.speed_table is None
    assert "batch_size" in study.trials[1].params
    assert "effective_batch_size" not in study.trials[1].params
    explicit = joint.replace("strategy: joint", "strategy: two_stage")
    with pytest.raises(StudyError, match=r"was made with study\.strategy joint"):
        prepare_study(explicit, tmp_path, run=False)


def test_the_speed_study_opens_with_optunas_own_command(two_stage_run: TwoStageRun):
    shown = subprocess.run(
        [
            str(Path(sys.executable).parent / "optuna"),
            "trials",
            "--study-name",
            "two.speed",
            "--storage",
            two_stage_run.url,
            "-f",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert '"params_batch_size"' in shown.stdout or "batch_size" in shown.stdout


def test_a_crash_in_stage_one_is_recorded_and_the_worker_replaced(tmp_path: Path, prepare_study):
    space = two_stage(
        n_trials=1,
        batch_sizes="[16]",
        model_args="{crash_at_step: 2}",
        precisions="fp32",
        workers="[0]",
    )
    study, url, outcome, executor = prepare_study(space, tmp_path, isolation="worker")
    assert outcome.stage_failed is not None and "worker process died" in outcome.stage_failed
    assert counted_trials(study) == 0  # no trial trained what cannot run
    speed = optuna.load_study(study_name="two.speed", storage=url)
    kinds = {t.user_attrs["fail_kind"] for t in speed.trials}
    assert kinds == {"worker_crashed"} and len(speed.trials) == 2  # device, dataloader
    assert executor is not None and len(executor.started_pids) == 2  # a fresh one each


def test_the_command_runs_two_stages_and_says_which_knobs_came_from_where(tmp_path: Path):
    space = tmp_path / "two.yaml"
    space.write_text(
        two_stage(
            n_trials=3,
            precisions="fp32",
            workers="[0]",
            # the answer: a stage 2 trial; the worker process is not what is looked at here
            study_extra="  confirm: false\n  baseline: false\n  isolation: none",
        )
    )
    first = command("run", str(space), cwd=tmp_path)
    assert first.exit_code == 0, first.stdout + first.stderr
    out = first.stdout
    assert "timing" in out and "(stage 1: speed)" in out and "(stage 2: learning)" in out
    assert "Stage 1: the fastest settings per micro-batch" in out
    more = r"( \(\d more measurements? of the leaders\))?"
    assert re.search(r"stage 1: 4 settings timed" + more + ", in", out)
    best = command("best", "--study", "two", cwd=tmp_path)
    assert best.exit_code == 0, best.stderr
    lines = {line.split()[0]: line for line in best.stdout.splitlines() if line.strip()}
    assert "timed in stage 1" in lines["data_pipeline"] and "searched" in lines["lr"]
    again = command("run", str(space), "--n-trials", "4", cwd=tmp_path)
    assert again.exit_code == 0, again.stderr
    assert "0 settings timed, 4 reused" in again.stdout
    wrong = command("best", "--study", "two.speed", cwd=tmp_path)
    assert wrong.exit_code == 1
    assert "holds the speed stage's measurements of study 'two'" in wrong.stdout + wrong.stderr


def _speed_trials(directory: Path) -> int:
    """Measurements stored so far in ``two.speed`` (0 while it does not exist yet), counted
    in Optuna's tables through a read-only sqlite3 connection: cheap enough to ask often, and
    never a writer beside the run's own."""
    db = directory / "studies" / "autotune.db"
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
            (count,) = connection.execute(
                "SELECT COUNT(*) FROM trials JOIN studies USING (study_id) WHERE study_name = ?",
                ("two.speed",),
            ).fetchone()
        return int(count)
    except sqlite3.Error:  # not created yet, or being written: ask again
        return 0


@pytest.mark.slow
def test_ctrl_c_in_stage_one_keeps_its_measurements_for_the_next_run(tmp_path: Path):
    space = tmp_path / "two.yaml"
    slow = two_stage(
        n_trials=1,
        batch_sizes="[16]",
        model_args="{step_delay_seconds: 0.1}",  # about 2 s a measurement
        data_args="{n_train: 128}",  # the trial after it: 8 steps
        precisions="fp32",
        workers="[0]",
        study_extra="  confirm: false\n  isolation: none",
    )
    space.write_text(slow)
    process = start_cli("run", str(space), cwd=tmp_path)
    deadline = time.monotonic() + 120
    while _speed_trials(tmp_path) < 1:  # the first setting is measured, the second runs
        assert time.monotonic() < deadline and process.poll() is None, process.poll()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "Stage 1's finished measurements are saved and will be reused" in stdout
    assert _speed_trials(tmp_path) == 1  # the interrupted one is not recorded

    again = command("run", str(space), cwd=tmp_path)  # no signal now: in this process
    assert again.exit_code == 0, again.stderr
    shown = " ".join(again.stdout.split())
    more = r"( \(\d more measurements? of the leaders\))?"
    assert re.search(r"stage 1: 1 setting timed" + more + ", 1 reused", shown)


def test_the_speed_stage_times_the_ddp_settings_the_space_file_offers():
    from autotune.knobs import DDP_KNOBS, SPEED_KNOBS

    assert DDP_KNOBS and set(DDP_KNOBS) <= set(SPEED_KNOBS)


def test_a_measurement_taken_under_interference_is_its_studys_only(
    tmp_path: Path, prepare_study, monkeypatch
):
    """What one study measured on a busy machine serves that study (its resumed runs, its
    workers) but is not the truth another study reuses: that one times it again."""
    from autotune.study import run_speed_stage

    def stage_one(space: str) -> SyntheticExecutor:
        """Stage 1 of the study ``space`` names, in tmp_path's storage; what it measured."""
        study, _, _, _ = prepare_study(space, tmp_path, run=False)
        spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
        executor = SyntheticExecutor()
        run_speed_stage(StageInputs(study, spec, CPU, executor, _workload(tmp_path, space)))
        return executor

    space = two_stage(n_trials=1, batch_sizes="[16]", precisions="fp32", workers="[0]")
    monkeypatch.setattr("autotune.stage1._take.interfered", lambda share: True)  # a busy machine
    busy = stage_one(space)
    assert busy.measured
    resumed = stage_one(space.replace("n_trials: 1", "n_trials: 2"))
    assert resumed.measured == []  # the same study: its own measurements serve

    monkeypatch.setattr("autotune.stage1._take.interfered", lambda share: False)  # a quiet one
    other = space.replace("name: two", "name: other")
    quiet = stage_one(other)
    assert {c.data_pipeline for c in quiet.measured} == {c.data_pipeline for c in busy.measured}
    third = stage_one(other.replace("name: other", "name: third"))
    assert third.measured == []  # quiet measurements are every study's


# -- each distinct graph compiled once ----------------------------------------------------------


@pytest.mark.slow
def test_stage_one_keeps_a_compiled_graph_for_the_settings_that_share_it(monkeypatch):
    """Settings that differ only in how batches are fed run the graph their first setting
    compiled (no new graph, no compile) while they follow it at its intra-op thread count;
    another count (Dynamo guards on it), another graph in between, or a trial (or another
    stage) compiles cold, and says so."""
    from autotune.training import context
    from autotune.training.context import compiled_graphs

    threads = [2]  # the thread count the machine's load gives each measurement
    monkeypatch.setattr(context, "trial_threads", lambda: threads[0])
    workload = blobs_workload()
    plan = BurstPlan(warmup_micro_batches=2, bursts=2, burst_seconds=0.02, keep_compiled="s1")
    compiled = make_config(batch_size=32, compile="default")

    def measured(config: TrialConfig, plan: BurstPlan = plan) -> tuple[bool, int]:
        """Whether ``config``'s measurement ran warm, and the graphs compiled in it."""
        before = compiled_graphs()
        measurement = bursts.measure(config, workload, plan)
        assert measurement.intra_op_threads == threads[0]
        return measurement.compile_warm, compiled_graphs() - before

    assert measured(compiled) == (False, 1)
    assert measured(compiled.replace(data_pipeline="device")) == (True, 0)
    threads[0] = 1  # the machine grew busy: the same graph at another thread count
    assert measured(compiled.replace(data_pipeline="device")) == (False, 1)
    # another micro-batch is another graph, and the first one after it compiles again
    assert measured(compiled.replace(batch_size=16)) == (False, 1)
    assert measured(compiled) == (False, 1)
    # a trial's measurement (no stage) compiles cold, whatever the stage kept
    assert measured(compiled, QUICK) == (False, 1)


@pytest.mark.slow
def test_stage_one_compiles_each_distinct_graph_once_and_charges_its_cold_compile(
    tmp_path: Path, prepare_study, monkeypatch
):
    from autotune.study import run_speed_stage
    from autotune.training import context
    from autotune.training.context import compiled_graphs, graph_key

    # one thread count whatever the load (another compiles again: the test above)
    monkeypatch.setattr(context, "trial_threads", lambda: 1)

    space = two_stage(n_trials=1, batch_sizes="[32]", precisions="fp32", workers="[0]")
    space = space.replace("num_workers: [0]\n", "num_workers: [0]\n  compile: [none, default]\n")
    # each compiled measurement: graphs compiled in it (torch's own count), whether it failed
    outcomes: list[tuple[int, bool]] = []

    class GraphCounting(CountingExecutor):
        def measure(self, config: TrialConfig, plan: BurstPlan) -> SpeedMeasurement:
            before, failed = compiled_graphs(), True
            try:
                measured = super().measure(config, plan)
                failed = False
                return measured
            finally:
                if config.compile != "none":
                    outcomes.append((compiled_graphs() - before, failed))

    executor = GraphCounting(_workload(tmp_path, space))
    study, url, _, _ = prepare_study(space, tmp_path, run=False)
    spec = parse_spec(space, tmp_path / "space.yaml")
    table = run_speed_stage(StageInputs(study, restrict(spec, CPU).spec, CPU, executor))
    compiled = [c for c in executor.measured if c.compile == "default"]
    assert len(compiled) >= 2  # the device and the dataloader pipeline, compiled
    assert len({graph_key(c) for c in compiled}) == 1
    # compiled cold once, and again only after a measurement that failed (a busy machine stops
    # one past its limit) dropped the graph; a later one may add a graph where Dynamo's guards
    # see the other pipeline's batches differently (seen in some runs, [2, 1]), never the whole
    # again: the stored records below say which was cold
    first = outcomes[0][0]
    assert first >= 1
    for (new, _), (_, failed_before) in zip(outcomes[1:], outcomes, strict=False):
        assert new < first or failed_before, outcomes
    speed = optuna.load_study(study_name=speed_study_name("two"), storage=url)
    results = [
        r.result()
        for r in (SpeedRecord.of(t) for t in speed.trials)
        if r is not None and r.result() is not None
    ]
    timed = [m for m in results if m is not None and m.compile_seconds is not None]
    cold = [m for m in timed if not m.compile_warm]
    # cold: a timed measurement with no graph kept before it (the first, or after a failure)
    kept = [False, *(not failed for _, failed in outcomes[:-1])]
    assert len(cold) == sum(
        1 for (_, failed), k in zip(outcomes, kept, strict=True) if not (failed or k)
    )
    assert len(timed) == sum(1 for _, failed in outcomes if not failed)
    for warm in timed:  # every setting of the graph is charged the compile a trial pays
        charged = [c.compile_seconds for c in cold]
        assert any(warm.compile_seconds == pytest.approx(seconds) for seconds in charged)
        assert warm.one_time_seconds >= 0.9 * min(seconds or 0 for seconds in charged)
    assert len(list(table)) == 2  # accumulation 1 and 2


def test_a_compile_mode_is_worth_measuring_only_where_it_can_pay_back():
    from autotune.stage1._rules import unpaid_compile

    # 30 epochs of 10 s at 1.5x save 100 s: a 60 s compile pays back, a 120 s one cannot
    assert unpaid_compile("default", 60.0, 10.0, 1.5, 30) is None
    why = unpaid_compile("max-autotune", 120.0, 10.0, 1.5, 30)
    assert why is not None and "max-autotune" in why and "100 s saved over 30 epochs" in why
    # slower than eager: nothing to pay back with
    assert unpaid_compile("default", 0.5, 10.0, 0.9, 1000) is not None


def test_a_precision_far_behind_at_its_first_cell_times_one_setting_in_the_others():
    from autotune.stage1._rules import CellResult, StageRules

    spec = restrict(parse_spec(two_stage(), Path("space.yaml")), CPU).spec
    rules = StageRules(spec)
    device = (("data_pipeline", "device"),)
    loader = (("data_pipeline", "dataloader"),)

    def cell(rules: StageRules, batch: int, precision: str, *speeds: float) -> None:
        pairs = zip((device, loader), speeds, strict=True)
        rules.learn(Cell(batch, precision), [CellResult(s, v, None, None) for s, v in pairs])

    cell(rules, 16, "fp32", 3000.0, 2500.0)
    cell(rules, 32, "fp32", 4000.0, 3900.0)
    assert rules.far_behind(Cell(32, "fp32")) is None  # timed first: nothing to be behind
    cell(rules, 16, "bf16", 500.0, 900.0)  # 30% of fp32's fastest at batch 16
    behind = rules.far_behind(Cell(32, "bf16"))
    assert behind is not None
    why, settings = behind
    assert settings == loader  # its first cell's fastest
    assert why.startswith("not tried: bf16 runs at 30% of fp32 at batch 16")
    # half as fast is behind, not far behind: every cell of it is timed in full
    close = StageRules(spec)
    cell(close, 16, "fp32", 3000.0, 2500.0)
    cell(close, 16, "bf16", 1500.0, 1400.0)
    assert close.far_behind(Cell(32, "bf16")) is None


def test_a_compile_mode_stopped_or_failed_at_a_cell_is_not_tried_after_it_saying_which():
    """A mode stopped at the compile limit was still compiling, not broken: the reason given
    for leaving it out of the later cells says so; one whose compile failed says that."""
    from autotune.stage1._rules import CellResult, StageRules

    spec = restrict(parse_spec(two_stage(), Path("space.yaml")), CPU).spec
    rules = StageRules(spec)
    eager = (("compile", "none"),)
    results = [
        CellResult(eager, 1000.0, None, None),
        CellResult((("compile", "max-autotune"),), None, None, "trial_timeout"),
        CellResult((("compile", "default"),), None, None, "compile_error"),
    ]
    rules.learn(Cell(16, "fp32"), results)
    assert rules.dropped_modes["max-autotune"] == (
        "not tried: compile max-autotune was still compiling at batch 16, fp32 when it could "
        "no longer pay back over the full run"
    )
    assert rules.dropped_modes["default"] == "not tried: compile default failed at batch 16, fp32"


def test_channels_last_no_faster_under_a_compile_mode_is_not_tried_in_later_cells():
    from autotune.stage1._rules import CellResult, StageRules

    spec = restrict(parse_spec(two_stage(), Path("space.yaml")), CPU).spec
    rules = StageRules(spec)

    def setting(mode: str, layout: bool) -> tuple[tuple[str, object], ...]:
        return (("compile", mode), ("channels_last", layout))

    speeds = {
        ("none", False): 1000.0,
        ("none", True): 900.0,  # eager: the rule does not judge it
        ("default", False): 2000.0,
        ("default", True): 1960.0,  # Inductor picks its layouts: no faster with the flag
        ("max-autotune", False): 2100.0,
        ("max-autotune", True): 2300.0,  # faster: kept
    }
    results = [CellResult(setting(*k), v, None, None) for k, v in speeds.items()]
    rules.learn(Cell(16, "fp32"), results)
    why = rules.why(Cell(32, "fp32"), setting("default", True), compute_pass=True)
    assert why is not None and "channels_last under compile default" in why and "-2%" in why
    assert rules.reason(why) == "with channels_last no faster"  # counted by its rule
    assert rules.why(Cell(32, "fp32"), setting("default", False), compute_pass=True) is None
    assert rules.why(Cell(32, "fp32"), setting("max-autotune", True), compute_pass=True) is None
    assert rules.why(Cell(32, "fp32"), setting("none", True), compute_pass=True) is None


def test_stage_one_times_a_precision_far_behind_with_one_setting_after_its_first_cell(
    tmp_path: Path, prepare_study
):
    from autotune.study import run_speed_stage

    def slow_bf16(config: TrialConfig) -> float:  # as if bf16 had no units of its own
        pipeline = {"device": 1.0, "dataloader": 1.2 + 0.1 * config.num_workers}
        return 0.001 * pipeline[config.data_pipeline] * (5 if config.precision == "bf16" else 1)

    space = two_stage(n_trials=1, batch_sizes="[16, 32, 64]", workers="[0, 1]")
    executor = SyntheticExecutor(slow_bf16)
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    events: list = []
    table = run_speed_stage(StageInputs(study, spec, CPU, executor, on_event=events.append))
    bf16 = [c for c in executor.measured if c.precision == "bf16"]
    # its first cell gone through, its fastest (64: every cell's reference was timed first),
    # times its other settings, as the other rules allow
    assert len([c for c in bf16 if c.batch_size == 64]) >= 2
    later = [c for c in bf16 if c.batch_size < 64]
    assert sorted(c.batch_size for c in later) == [16, 32]  # one setting each: the first
    # cell's fastest in its first round (the rules decide on first rounds, as a resumed stage)
    firsts = {(c.data_pipeline, c.num_workers) for c in bf16 if c.batch_size == 64}
    chosen = {(c.data_pipeline, c.num_workers) for c in later}
    assert len(chosen) == 1 and chosen <= firsts
    fp32 = [c for c in executor.measured if c.precision == "fp32"]
    assert {c.batch_size for c in fp32} == {16, 32, 64}
    assert all(len([c for c in fp32 if c.batch_size == b]) >= 2 for b in (16, 32, 64))
    said = [e for e in events if "bf16 runs at" in (e.fault or "")]
    assert {e.cell for e in said} == {"batch 16, bf16", "batch 32, bf16"}
    # its trials still get a measured speed at every micro-batch
    assert {c.batch_size for c in table if c.precision == "bf16"} == {16, 32, 64}
    # run again (a resumed study): the cells far behind keep the setting they timed, no other
    again = SyntheticExecutor(slow_bf16)
    resumed: list = []
    assert run_speed_stage(StageInputs(study, spec, CPU, again, on_event=resumed.append)) == table
    assert again.measured == []
    said = [e for e in resumed if "bf16 runs at" in (e.fault or "")]
    assert {e.cell for e in said} == {"batch 16, bf16", "batch 32, bf16"}


def test_a_compile_that_cannot_pay_back_is_not_tried_in_the_cells_after_the_first(
    tmp_path: Path, prepare_study
):
    from autotune.study import run_speed_stage

    # a tiny model: an epoch takes milliseconds, a compile seconds, over the trial's one epoch
    space = two_stage(n_trials=1, batch_sizes="[16, 32]", precisions="fp32", workers="[0]")
    space = space.replace("num_workers: [0]\n", "num_workers: [0]\n  compile: [none, default]\n")
    space = space.replace("[dataloader, device]", "device")  # eager and compiled alone

    def twice_as_fast_compiled(config: TrialConfig) -> float:
        return 0.0005 if config.compile != "none" else 0.001

    executor = SyntheticExecutor(twice_as_fast_compiled, compile_seconds=5.0)
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    events: list = []
    table = run_speed_stage(StageInputs(study, spec, CPU, executor, on_event=events.append))
    # the first cell gone through is the fastest eager one: 32 (each cell's reference first)
    measured = {(c.batch_size, c.compile) for c in executor.measured}
    assert measured == {(32, "none"), (32, "default"), (16, "none")}
    skipped = [
        e for e in events if e.cell.startswith("batch 16") and "compile default" in e.settings
    ]
    assert skipped and all("cannot pay back" in (e.fault or "") for e in skipped)
    assert all(not e.measured for e in skipped)
    assert all(dict(c.settings)["compile"] == "none" for c in table if c.batch_size == 16)
    # the compiled runner-up trains twice as fast but finishes later: "next best" says slower
    eager = table.exact(32, 1, "fp32")
    assert eager is not None and eager.runner_up is not None
    assert eager.runner_up < 0.5 * eager.samples_per_second


def test_a_compile_may_take_what_it_could_save_over_the_full_run_or_the_budget_left():
    from autotune.stage1._rules import MEASUREMENT_SLACK_SECONDS, StageRules

    space = two_stage().replace(
        "objective: {min_accuracy: 0.3}", "objective: {min_accuracy: 0.3, full_run_epochs: 30}"
    )
    rules = StageRules(restrict(parse_spec(space, Path("space.yaml")), CPU).spec)
    assert rules.compile_limit("none", 1.0) is None  # eager is bounded by trial_timeout
    unknown = rules.compile_limit("default", None)  # no eager epoch timed yet: the budget
    assert unknown is not None and unknown.budget and 890 < unknown.seconds <= 900
    limit = rules.compile_limit("max-autotune", 2.0)
    assert limit is not None and not limit.budget
    assert limit.seconds == pytest.approx(30 * 2.0 + MEASUREMENT_SLACK_SECONDS)
    assert "compile max-autotune was still compiling after 90 s: it cannot pay back" in limit.why
    assert "(an eager run of 30 epochs trains 60 s)" in limit.why
    slow = rules.compile_limit("default", 100.0)  # it could pay back longer than the budget
    assert slow is not None and slow.budget and "budget of 900 s ran out" in slow.why


@pytest.mark.slow
def test_a_compile_still_running_when_it_can_no_longer_pay_back_is_stopped_and_dropped(
    tmp_path: Path, prepare_study, monkeypatch: pytest.MonkeyPatch
):
    from autotune.stage1 import _rules as _speed_rules
    from autotune.study import run_speed_stage
    from autotune.worker import WorkerExecutor

    # an eager epoch takes milliseconds: the compile may take the slack alone
    monkeypatch.setattr(_speed_rules, "MEASUREMENT_SLACK_SECONDS", 1.0)
    space = two_stage(
        n_trials=1,
        batch_sizes="[16, 32]",
        precisions="fp32",
        workers="[0]",
        model_args="{endless_compile: true}",
    )
    space = space.replace("num_workers: [0]\n", "num_workers: [0]\n  compile: [none, default]\n")
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    executor = WorkerExecutor(spec.workload, tmp_path)
    events: list = []
    try:
        table = run_speed_stage(StageInputs(study, spec, CPU, executor, on_event=events.append))
    finally:
        executor.close()
    stopped = [e for e in events if e.measured and e.samples_per_second is None]
    # the first cell gone through: the cells go fastest reference first (batch 32's, or on a
    # busy machine batch 16's), their references all timed before
    references = {e.cell: e.samples_per_second for e in events[:2]}
    assert sorted(references) == ["batch 16, fp32", "batch 32, fp32"]
    first = max(references, key=lambda cell: references[cell] or 0.0)
    assert [(e.cell, e.settings) for e in stopped] == [(first, "no workers, compile default")]
    assert "compile default was still compiling after 1 s: it cannot pay back" in stopped[0].fault
    assert len(executor.started_pids) == 2  # its worker was killed, and another started
    # the mode is not tried again: not with the other pipeline, not in the next cell
    skipped = [e for e in events if "compile default" in e.settings and not e.measured]
    assert {e.cell for e in skipped} == {"batch 16, fp32", "batch 32, fp32"}
    assert all("still compiling after 1 s" in (e.fault or "") for e in skipped)
    assert all(dict(c.settings)["compile"] == "none" for c in table)
    # recorded as the configuration's timeout (a later stage does not compile it again), or,
    # where other processes took the cores meanwhile, as one the machine's load may explain
    speed = optuna.load_study(study_name=speed_study_name("two"), storage=study._storage)
    failed = [SpeedRecord.of(t) for t in speed.trials if t.state == TrialState.FAIL]
    assert [r.settings for r in failed if r] == ["no workers, compile default"]
    assert failed[0] is not None and failed[0].fail_kind in (
        FaultKind.TRIAL_TIMEOUT.value,
        FaultKind.TIMEOUT_UNDER_LOAD.value,
    )


# -- stage 1's budget -----------------------------------------------------------------------------


def test_the_plan_says_what_stage_one_will_time_and_its_budget():
    from autotune.display._plan import stage_one_plan

    spec = restrict(parse_spec(two_stage(workers="[0, 1]"), Path("space.yaml")), CPU).spec
    said = stage_one_plan(spec, CPU)
    # 2 micro-batches x 2 precisions, 3 pipelines each, a rematch of 2 leaders each
    assert said.startswith("20 measurements of 4 cells (a micro-batch and a precision each); ")
    assert "at most 15 min (study.speed.max_seconds)" in said
    first = "bf16" if CPU.bf16_native else "fp32"  # the checklist's precision on this CPU
    assert said.endswith(
        "each cell timed first with the tuning checklist's settings (device pipeline), from "
        "batch 32, "
        f"{first} down; then the fastest cells' other settings"
    )
    compiled = two_stage(workers="[0]").replace(
        "num_workers: [0]\n", "num_workers: [0]\n  compile: [none, default]\n"
    )
    spec = restrict(
        parse_spec(
            compiled.replace("  pruner: none\n", "  pruner: none\n  timeout: 600\n"),
            Path("space.yaml"),
        ),
        CPU,
    ).spec
    said = stage_one_plan(spec, CPU)
    # a graph per micro-batch and precision; the first cell's alone if compile cannot pay back
    assert "1 to 4 cold compiles (one per distinct graph" in said
    assert "at most 5 min (half of study.timeout 600 s, which counts stage 1" in said


def test_past_its_budget_stage_one_starts_nothing_but_its_first_measurement(
    tmp_path: Path, prepare_study, clock: FakeClock
):
    from autotune.study import run_speed_stage

    space = two_stage(n_trials=1, batch_sizes="[16, 32]", precisions="fp32", workers="[0, 1]")
    space = space.replace(
        "num_workers: [0, 1]\n", "num_workers: [0, 1]\n  compile: [none, default]\n"
    )
    space = space.replace("speed: {bursts: 2,", "speed: {max_seconds: 0.001, bursts: 2,")
    executor = SyntheticExecutor(clock=clock, seconds_each=1.0)  # each one past the budget
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    events: list = []
    table = run_speed_stage(StageInputs(study, spec, CPU, executor, on_event=events.append))
    # the stage's first measurement (trials need a speed): the largest micro-batch's
    # reference, eager; nothing after its budget
    assert [(c.batch_size, c.compile) for c in executor.measured] == [(32, "none")]
    spent = [e for e in events if "budget of 0.001 s is spent" in (e.fault or "")]
    assert {e.cell for e in spent} == {"batch 16, fp32", "batch 32, fp32"}
    ran_out = [e for e in events if "budget of 0.001 s ran out before it" in (e.fault or "")]
    assert [e.cell for e in ran_out] == ["batch 16, fp32"]  # its one eager setting
    # batch 16's trials train with batch 32's settings, and measure their own speed
    measured = table.exact(32, 1, "fp32")
    borrowed = table.exact(16, 1, "fp32")
    assert measured is not None and measured.measured and not table.unrunnable
    assert borrowed is not None and not borrowed.measured
    assert borrowed.settings == measured.settings and borrowed.samples_per_second == 0.0
    assert table.fastest(32, "fp32") == measured
    assert table.fastest(64, "fp32") == table.exact(32, 2, "fp32")


def test_what_batch_size_auto_spent_before_stage_one_counts_in_its_budget(
    tmp_path: Path, prepare_study, clock: FakeClock
):
    """The probe's measurements are stage 1's first rounds: its seconds come off the budget."""
    from autotune.study import run_speed_stage

    space = two_stage(n_trials=1, batch_sizes="[16, 32]", precisions="fp32", workers="[0, 1]")
    space = space.replace("speed: {bursts: 2,", "speed: {max_seconds: 100, bursts: 2,")
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    within = SyntheticExecutor(clock=clock, seconds_each=1.0)
    run_speed_stage(StageInputs(study, spec, CPU, within), spent=90.0)
    assert len(within.measured) > 1  # 10 s left: room for more than one
    spent = SyntheticExecutor(clock=clock, seconds_each=1.0)
    run_speed_stage(StageInputs(study, spec, CPU, spent), remeasure=True, spent=100.5)
    assert len(spent.measured) == 1  # the stage's first measurement, and nothing after


class FakeClock:
    """``time`` for stage 1's rules and measurements: ``monotonic`` moves only when told."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.sleep = time.sleep

    def monotonic(self) -> float:
        return self.seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    from autotune.stage1 import _budget as _speed_budget
    from autotune.stage1 import _take as _speed_take

    fake = FakeClock()
    monkeypatch.setattr(_speed_budget, "time", fake)
    monkeypatch.setattr(_speed_take, "time", fake)
    return fake


def test_the_budget_keeps_one_eager_setting_a_cell_for_the_cells_to_come(clock: FakeClock):
    from autotune.stage1._rules import StageRules

    space = two_stage(n_trials=1, workers="[0]").replace(
        "speed: {bursts: 2,", "speed: {max_seconds: 100, bursts: 2,"
    )
    rules = StageRules(restrict(parse_spec(space, Path("space.yaml")), CPU).spec)
    rules.cells_after = 2
    assert rules.reserve() == 0.0 and rules.budget_left() == 100.0  # nothing timed yet
    rules.took("none", 12.0, None)  # a first measurement, with its worker's start
    rules.took("none", 5.0, None)
    rules.took("none", 4.0, None)
    # two cells and the measurement running at the budget's end, each a typical (median) one
    assert rules.typical() == 5.0 and rules.reserve() == 15.0
    clock.seconds = 80.0
    assert rules.budget_left() == 5.0 and not rules.over_budget()
    rules.cells_after = 3
    assert rules.over_budget()  # 80 s spent, and 4 x 5 s kept back
    # the machine grows busy: a typical measurement is one of the last three, and so grows
    # what is kept back
    rules.took("none", 14.0, None)
    rules.took("none", 16.0, None)
    assert rules.typical() == 14.0 and rules.reserve() == 56.0


def test_a_compile_is_not_started_when_less_of_the_budget_is_left_than_it_takes(
    clock: FakeClock,
):
    from autotune.stage1._plan import COMPILE_SECONDS_GUESS
    from autotune.stage1._rules import StageRules

    space = two_stage(n_trials=1, workers="[0]").replace(
        "speed: {bursts: 2,", "speed: {max_seconds: 100, bursts: 2,"
    )
    rules = StageRules(restrict(parse_spec(space, Path("space.yaml")), CPU).spec)
    cell = next(iter(SpeedPlan(rules.spec, make_config()).cells()))
    autotuned = (("compile", "max-autotune-no-cudagraphs"),)
    # before any compile is measured: the guess
    assert rules.expected_compile("default") == COMPILE_SECONDS_GUESS["default"]
    rules.took("default", 14.0, 12.0)  # default compiled in 80% of its guess
    scale = 12.0 / COMPILE_SECONDS_GUESS["default"]
    guess = COMPILE_SECONDS_GUESS["max-autotune-no-cudagraphs"]
    assert rules.expected_compile("max-autotune-no-cudagraphs") == pytest.approx(guess * scale)
    assert rules.expected_compile("default") == 12.0  # measured: its own
    clock.seconds = 100.0 - 20.0  # 20 s left: default fits, max-autotune does not
    assert rules.why(cell, (("compile", "default"),)) is None
    said = rules.why(cell, autotuned)
    assert said is not None and "20 s of stage 1's budget of 100 s are left" in said
    assert rules.reason(said) == "past the budget"
    assert f"takes about {guess * scale:.0f} s" in said
    # an eager setting is still timed in a cell with nothing timed, and left out of one with
    clock.seconds = 100.0
    assert rules.why(cell, (("compile", "none"),)) is None
    assert "is spent" in (rules.why(cell, (("compile", "none"),), timed=True) or "")
    # a cell whose every setting compiles, nothing timed: one is timed, or it has no speed
    assert rules.why(cell, autotuned, fallback=False) is None
    clock.seconds = 80.0
    assert rules.why(cell, autotuned, fallback=False) is None
    # a graph live in the worker costs no cold compile: not refused for the budget
    assert rules.why(cell, autotuned, warm=True) is None


def test_only_a_graph_live_in_the_worker_skips_its_cold_compile_in_the_budget_rule(
    tmp_path: Path, prepare_study, clock: FakeClock
):
    """The budget left cannot hold a cold compile: a setting is left out unless the worker
    keeps its graph live (``CompiledGraph.warm``). A graph compiled earlier in the stage but
    dropped since (another graph compiled after it) compiles cold again, and so does a live
    one after a busy measurement (the thread count a graph is kept at follows the load)."""
    from autotune.stage1._stage import Stage

    space = two_stage(workers="[0]", precisions="fp32").replace(
        "num_workers: [0]\n", "num_workers: [0]\n  compile: [none, default]\n"
    )
    space = space.replace("speed: {bursts: 2,", "speed: {max_seconds: 100, bursts: 2,")
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    busy_third = SyntheticExecutor(compile_seconds=10.0, load=lambda n: (0.0, 0.5 * (n == 3)))
    stage = Stage(StageInputs(study, spec, CPU, busy_third))
    small, large = list(stage.plan.cells())[:2]  # two micro-batches: two graphs

    def setting(cell: Cell, pipeline: str, compile: str = "default") -> Settings:
        wanted = {"data_pipeline": pipeline, "compile": compile}
        found = [s for s in stage.plan.all_settings(cell) if wanted.items() <= dict(s).items()]
        return found[0]

    stage.measure(small, setting(small, "dataloader"), 1)
    clock.seconds = 95.0  # 5 s of the budget left; the compile took 10
    assert not stage.skip(small, setting(small, "device"))  # its graph, live
    stage.measure(large, setting(large, "dataloader"), 1)  # drops the first graph
    assert stage.skip(small, setting(small, "device"))
    assert not stage.skip(large, setting(large, "device"))
    stage.measure(large, setting(large, "dataloader", "none"), 1)  # eager, on a busy machine
    assert stage.skip(large, setting(large, "device"))


def test_a_cell_whose_every_setting_compiles_may_take_its_compile_past_the_budget(
    tmp_path: Path, prepare_study, clock: FakeClock
):
    from autotune.stage1._rules import MEASUREMENT_SLACK_SECONDS
    from autotune.stage1._stage import Stage

    space = two_stage(workers="[0]", precisions="fp32").replace(
        "num_workers: [0]\n", "num_workers: [0]\n  compile: [default]\n"
    )
    space = space.replace("speed: {bursts: 2,", "speed: {max_seconds: 100, bursts: 2,")
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    stage = Stage(
        StageInputs(study, spec, CPU, InProcessExecutor(blobs_workload()), on_event=print)
    )
    cell = next(iter(stage.plan.cells()))
    assert not stage._can_fall_back(cell)  # no eager setting in the space, nothing timed
    clock.seconds = 95.0  # 5 s of the budget left
    config = stage.plan.config(cell, stage.plan.first_round(cell)[0])
    limit = stage.time_limit(cell, config)
    assert limit is not None and limit.budget
    needs = stage.rules.expected_compile("default") + MEASUREMENT_SLACK_SECONDS
    assert limit.seconds == pytest.approx(needs)  # not the 5 s left: the cell needs a speed


# the execution knobs of search_spaces/cifar10_resnet18.yaml, on micro-batches the blobs fit
RESNET_LIKE = """
  pin_memory: [false, true]
  persistent_workers: [false, true]
  compile: [none, default, max-autotune-no-cudagraphs, reduce-overhead]
  channels_last: [false, true]
  cudnn_benchmark: [false, true]
"""


def _gpu_step(config: TrialConfig) -> float:
    """A step's seconds on a GPU as measured on the H100 (BENCHMARKS.md): the half
    precisions twice as fast as fp32, channels_last 20% faster, a micro-batch costing
    a fixed launch share plus its samples."""
    half = config.precision in ("fp16", "bf16")
    layout = 0.8 if config.channels_last else 1.0
    return (0.004 + 0.00005 * config.batch_size) * (0.5 if half else 1.0) * layout


def test_a_short_budget_times_the_fast_corner_first_and_every_cell_before_its_others(
    tmp_path: Path, prepare_study, clock: FakeClock
):
    """Issue 38 item 2, the H100's 90 s stage 1 of the ResNet-18 space: measurements of 3 s,
    cold compiles of 20 s. The first measurements are the tuning checklist's setting
    (channels_last, cudnn.benchmark, the data on the device, eager) at fp16 and bf16 at the
    largest micro-batch; every cell is timed once before any cell times a second setting,
    and the cells then go on fastest first; the stage ends within its budget."""
    from autotune.study import run_speed_stage

    space = two_stage(
        n_trials=1,
        batch_sizes="[16, 32, 64, 128]",
        precisions="[fp32, tf32, bf16, fp16]",
        workers="[0, 2, 4, 8]",
    ).replace("  accumulation_steps: [1, 2]\n", "")
    space = space.replace("speed: {bursts: 2,", "speed: {max_seconds: 90, bursts: 2,")
    space += RESNET_LIKE
    executor = SyntheticExecutor(_gpu_step, compile_seconds=20.0, clock=clock, seconds_each=3.0)
    study, _, _, _ = prepare_study(space, tmp_path, run=False, hardware=AMPERE)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), AMPERE).spec
    table = run_speed_stage(StageInputs(study, spec, AMPERE, executor))
    asked = executor.measured
    first = [(c.precision, c.batch_size) for c in asked[:4]]
    assert first == [("fp16", 128), ("bf16", 128), ("fp16", 64), ("bf16", 64)]
    for config in asked[:16]:  # every cell's reference: the checklist's, eager
        assert config.channels_last and config.cudnn_benchmark and config.compile == "none"
        assert config.data_pipeline == "device"
    assert len({(c.precision, c.batch_size) for c in asked[:16]}) == 16
    # then the fastest cell goes through its other settings first
    assert (asked[16].precision, asked[16].batch_size) == ("fp16", 128)
    assert len({(c.precision, c.batch_size) for c in table if c.measured}) == 16
    assert clock.seconds <= 90 + 20 + 3  # its budget, and one measurement past it at most
    from autotune.display._plan import stage_one_plan

    assert stage_one_plan(spec, AMPERE).endswith(
        "checklist's settings (device pipeline, channels_last, cudnn.benchmark), from batch "
        "128, fp16 down; then the fastest cells' other settings"
    )


def test_a_cell_that_timed_a_setting_when_the_budget_ran_out_times_no_other(
    tmp_path: Path, prepare_study, clock: FakeClock
):
    """Each measurement takes 60 s of a 100 s budget: each cell times its reference setting,
    the largest micro-batch first (the second cell's share is kept back meanwhile), and then,
    the budget spent, no other."""
    from autotune.study import run_speed_stage

    space = two_stage(n_trials=1, batch_sizes="[16, 32]", precisions="fp32", workers="[0, 1]")
    space = space.replace("speed: {bursts: 2,", "speed: {max_seconds: 100, bursts: 2,")

    executor = SyntheticExecutor(clock=clock, seconds_each=60.0)
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    events: list = []
    table = run_speed_stage(StageInputs(study, spec, CPU, executor, on_event=events.append))
    assert [c.batch_size for c in executor.measured] == [32, 16]
    assert {c.batch_size for c in table} == {16, 32}
    spent = [e for e in events if "budget of 100 s is spent" in (e.fault or "")]
    assert {e.cell for e in spent} == {"batch 16, fp32", "batch 32, fp32"}


def test_a_run_whose_timeout_ends_before_its_first_trial_fails_saying_so(tmp_path: Path):
    space = tmp_path / "two.yaml"
    space.write_text(
        two_stage(
            n_trials=3,
            precisions="fp32",
            workers="[0]",
            # stage 1 times one setting a cell, and then the 1 ms are long gone
            study_extra="  timeout: 0.001\n  isolation: none",
        )
    )
    ran = command("run", str(space), cwd=tmp_path)  # a traceback would raise here
    assert ran.exit_code == 1, ran.stdout + ran.stderr
    said = " ".join(ran.stderr.split())  # one line, however the terminal wraps it
    assert said.count("error:") == 1 and said.startswith("error: the timeout of 0.001 s")
    assert "before the first trial" in said and "study.speed.max_seconds" in said
    assert "Traceback" not in ran.stderr


@pytest.mark.slow
def test_two_runs_started_together_time_each_setting_once_and_finish_the_study(tmp_path: Path):
    """Two independent ``autotune run`` commands on one study (the README's many processes,
    the SLURM and Kubernetes examples) share stage 1: the study's claims let one of them time
    each setting, and each takes what the other measured instead of timing it again. Their
    trials take turns on the cores, and one of them runs the confirmation round."""
    space = tmp_path / "two.yaml"
    space.write_text(
        two_stage(
            n_trials=4,
            batch_sizes="[16]",
            precisions="fp32",
            workers="[0]",
            # in the command's process: the worker process is not what is looked at here
            study_extra="  confirm: {top: 2, repeats: 2}\n  isolation: none",
        )
    )
    runs = [start_cli("run", str(space), cwd=tmp_path) for _ in range(2)]
    outputs = [run.communicate(timeout=300) for run in runs]
    for run, (out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, out + err
    url = f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}"
    speed = optuna.load_study(study_name=speed_study_name("two"), storage=url)
    taken = [(r.cache_key, r.round) for r in map(SpeedRecord.of, speed.trials) if r is not None]
    assert taken and len(taken) == len(set(taken))  # no setting timed twice in one round
    # between them the two runs timed each measurement once: what one timed, the other reused
    # (or, started late on a busy machine, found the study finished and timed nothing)
    timed = 0
    for out, _ in outputs:
        said = re.search(
            r"(\d+) settings? timed( \((\d+) more measurements? of the leaders\))?",
            " ".join(out.split()),
        )
        if said is not None:
            timed += int(said.group(1)) + int(said.group(3) or 0)
    assert timed == len(taken)
    study = optuna.load_study(study_name="two", storage=url)
    assert counted_trials(study) == 4
    # one confirmation round, run by one of them; the other waited for it and read its answer
    confirming = [out for out, _ in outputs if "Confirming the" in out]
    assert len(confirming) == 1
    answers = {
        line for out, _ in outputs for line in out.splitlines() if line.startswith("Answer")
    }
    assert len(answers) == 1


def test_a_speed_study_written_before_a_precision_was_added_takes_new_measurements(
    tmp_path: Path,
):
    """Optuna never lets a categorical distribution change within a study: a speed cache
    written when precision had four values must still take fp32 and fp32-strict cells."""
    from optuna.distributions import CategoricalDistribution

    from autotune.stage1._store import known_distributions, open_speed_study, speed_trial

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'old.db'}")
    study = open_speed_study(storage, "old")
    legacy = CategoricalDistribution(("fp32", "tf32", "bf16", "fp16"))
    study.add_trial(
        optuna.trial.create_trial(
            value=100.0, params={"precision": "bf16"}, distributions={"precision": legacy}
        )
    )
    known = known_distributions(study)
    settings = (("data_pipeline", "device"),)
    record = SpeedRecord(cache_key="k", context="c", cell="c", settings="s", round=1)
    for precision in ("fp32", "fp32-strict"):
        study.add_trial(speed_trial(Cell(16, precision), settings, record, 50.0, known))
    fp32, strict = study.trials[1:]
    assert fp32.params["precision"] == "fp32" and fp32.distributions["precision"] == legacy
    assert "precision" not in strict.params  # the old axis cannot hold it: its record does
    assert strict.params["batch_size"] == 16 and SpeedRecord.of(strict) is not None


def test_a_claimed_setting_is_timed_by_its_holder_and_a_lost_holder_is_taken_over(
    tmp_path: Path,
):
    from autotune.stage1._claims import CLAIM_STALE_SECONDS, CLAIMS_ATTR, Claims
    from autotune.stage1._store import open_speed_study

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'claims.db'}")
    here, there = Claims(open_speed_study(storage, "c")), Claims(open_speed_study(storage, "c"))
    there.me = "other-host:4242"  # another machine's process on the same study
    with here.hold("k", 1) as other:
        assert other is None  # held by this process
        with there.hold("k", 1) as held_by:
            assert held_by == here.me  # the other waits
        with there.hold("k", 2) as held_by:
            assert held_by is None  # another round is another claim
    assert here.study.user_attrs[CLAIMS_ATTR] == {}  # dropped when done
    # a claim whose process stopped renewing it (killed, its machine lost) is taken over
    gone = {"by": "gone-host:1", "beat": time.time() - CLAIM_STALE_SECONDS - 1}
    here.study.set_user_attr(CLAIMS_ATTR, {"k round 1": gone, "j round 3": gone})
    with here.hold("k", 1) as other:
        assert other is None
        assert set(here.study.user_attrs[CLAIMS_ATTR]) == {"k round 1"}  # the lost ones go
    assert here.study.user_attrs[CLAIMS_ATTR] == {}
    # a Ctrl-C as the claim is written, or as it is dropped: the claim is not left behind
    # (the next run would wait 60 s for it), and the stop is raised
    write = here.study.set_user_attr

    def interrupted(key: str, value: object) -> None:  # Ctrl-C as a claim is (un)written
        here.study.set_user_attr = write  # type: ignore[method-assign]
        signal.raise_signal(signal.SIGINT)
        write(key, value)

    here.study.set_user_attr = interrupted  # type: ignore[method-assign]
    with stops.handled(), pytest.raises(KeyboardInterrupt), here.hold("k", 4):
        pytest.fail("a stop asked while claiming is raised before the block")
    assert here.study.user_attrs[CLAIMS_ATTR] == {}
    with stops.handled(), pytest.raises(KeyboardInterrupt), here.hold("k", 5):
        here.study.set_user_attr = interrupted  # type: ignore[method-assign]  # as it drops
    assert here.study.user_attrs[CLAIMS_ATTR] == {}


@pytest.mark.slow
def test_processes_on_two_machines_share_one_postgresql_stage_one(tmp_path: Path, postgres):
    """Two processes that share no machine (each its own machine folder, so no turns between
    them) on one PostgreSQL study: the claims in the speed study still time each setting
    once."""
    text = two_stage(
        n_trials=2,
        batch_sizes="[16]",
        precisions="fp32",
        workers="[0]",
        study_extra="  confirm: false\n  baseline: false\n  isolation: none",
    ).replace("name: two", "name: pg-claims")
    (tmp_path / "space.yaml").write_text(text)
    runs = [
        start_cli(
            "run",
            "space.yaml",
            "--storage",
            postgres.url,
            cwd=tmp_path,
            env={"AUTOTUNE_MACHINE_DIR": str(tmp_path / f"machine-{index}")},
        )
        for index in range(2)
    ]
    outputs = [run.communicate(timeout=300) for run in runs]
    for run, (out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, out + err
    speed = optuna.load_study(study_name=speed_study_name("pg-claims"), storage=postgres.url)
    taken = [(r.cache_key, r.round) for r in map(SpeedRecord.of, speed.trials) if r is not None]
    assert taken and len(taken) == len(set(taken))  # no setting timed twice in one round
    assert speed.user_attrs["stage1_claims"] == {}  # every claim given back
    study = optuna.load_study(study_name="pg-claims", storage=postgres.url)
    assert counted_trials(study) == 2


def test_a_machine_grown_busy_takes_stage_one_past_its_budget_by_one_measurement_at_most(
    tmp_path: Path, prepare_study, clock: FakeClock
):
    """The quickstart's budget (75 s, half its timeout), 4 cells of 3 settings: the first four
    measurements take 3 s, then another process takes 80% of the cores and each takes 15 s
    (measured today: 114 s and 121 s of 75 s). Each cell still gets a speed, no measurement
    starts past the budget, and the one running at its end is stopped a typical one later."""
    from autotune.study import run_speed_stage

    space = two_stage(n_trials=1, batch_sizes="[16, 32, 64, 128]", precisions="fp32")
    space = space.replace("speed: {bursts: 2,", "speed: {max_seconds: 75, bursts: 2,")
    starts: list[float] = []

    def load(n: int) -> tuple[float, float | None]:
        starts.append(clock.seconds)
        return (3.0, 0.01) if n <= 4 else (15.0, 0.8)

    executor = SyntheticExecutor(clock=clock, load=load)
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    events: list = []
    table = run_speed_stage(StageInputs(study, spec, CPU, executor, on_event=events.append))
    assert max(starts) < 75.0  # nothing starts past the budget
    typical = 15.0  # the median measurement by then
    assert clock.seconds <= 75.0 + typical
    assert {c.batch_size for c in table} == {16, 32, 64, 128}  # the reserve kept their share


def test_on_a_machine_busy_throughout_stage_one_ends_within_its_budget(
    tmp_path: Path, prepare_study, clock: FakeClock
):
    """Every measurement takes 10 s, its turn's wait included, of the quickstart's 75 s: the
    reserve keeps one for each cell to come and one for the last, so each cell has a speed
    and the stage ends within its "at most"."""
    from autotune.study import run_speed_stage

    space = two_stage(n_trials=1, batch_sizes="[16, 32, 64, 128]", precisions="fp32")
    space = space.replace("speed: {bursts: 2,", "speed: {max_seconds: 75, bursts: 2,")
    executor = SyntheticExecutor(clock=clock, load=lambda n: (10.0, 0.6))
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    table = run_speed_stage(StageInputs(study, spec, CPU, executor))
    assert clock.seconds <= 75.0
    assert {c.batch_size for c in table} == {16, 32, 64, 128}
    assert all(c.interference for c in table)  # and each row says how it was measured


def _faster_on_the_device(config: TrialConfig) -> float:
    """A step's seconds: the device pipeline twice as fast as a DataLoader (no rematch)."""
    return 0.0005 if config.data_pipeline == "device" else 0.001


def test_what_a_busy_machine_spoiled_is_timed_again_at_the_end_while_the_budget_lasts(
    tmp_path: Path, prepare_study, clock: FakeClock
):
    """Batch 32's fastest (its reference, the device pipeline, timed first) is measured
    while others take 80% of its cores, and batch 16's settings run past three typical
    measurements as they take all of them; later measurements are clean. At the stage's end
    batch 16 gets its measurement, and batch 32's fastest is timed again (the machine is
    quieter: its row is no longer flagged)."""
    from autotune.study import run_speed_stage

    space = two_stage(n_trials=1, batch_sizes="[16, 32]", precisions="fp32", workers="[0]")
    space = space.replace("speed: {bursts: 2,", "speed: {max_seconds: 300, bursts: 2,")

    def load(n: int) -> tuple[float, float | None]:
        if n == 1:
            return 5.0, 0.8  # measured, flagged
        if n in (2, 4):
            return 100.0, 0.9  # batch 16's, stopped
        return 5.0, 0.02

    executor = SyntheticExecutor(_faster_on_the_device, clock=clock, load=load)
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    events: list = []
    table = run_speed_stage(StageInputs(study, spec, CPU, executor, on_event=events.append))
    measured = [(c.batch_size, c.data_pipeline) for c in executor.measured]
    assert measured[:4] == [(32, "device"), (16, "device"), (32, "dataloader"), (16, "dataloader")]
    assert sorted(measured[4:]) == [(16, "device"), (32, "device")]  # once each, again
    stopped = [e.fault for e in events if "typical measurement" in (e.fault or "")]
    assert len(stopped) == 2 and "stopped after 15 s, 3 times a typical" in stopped[0]
    rows = {(c.batch_size, c.accumulation_steps): c for c in table}
    assert dict(rows[16, 1].settings)["data_pipeline"] == "device"
    assert not rows[16, 1].interference and not rows[32, 1].interference
    assert clock.seconds < 300.0


def test_on_a_machine_that_stays_busy_nothing_is_timed_again_and_rows_are_marked(
    tmp_path: Path, prepare_study
):
    from autotune.study import run_speed_stage

    space = two_stage(n_trials=1, batch_sizes="[16, 32]", precisions="fp32", workers="[0]")
    executor = SyntheticExecutor(_faster_on_the_device, load=lambda n: (0.0, 0.8))
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    table = run_speed_stage(StageInputs(study, spec, CPU, executor))
    assert len(executor.measured) == 4  # two settings a cell, once each
    assert all(c.interference for c in table)


# another process's turn on this process's cores, taken (blocking: woken the moment the study
# lets go) and kept for a minute
HOLD_THE_TURN = """
import fcntl, os, sys, time
print("ready", flush=True)
held = []
for core in sorted(os.sched_getaffinity(0)):
    lock = open(os.path.join(sys.argv[1], f"autotune-turn-core-{core}.lock"), "a+")
    fcntl.flock(lock, fcntl.LOCK_EX)
    lock.truncate(0), lock.write(str(os.getpid())), lock.flush()
    held.append(lock)
time.sleep(60)
"""


def test_stage_one_waits_for_its_turn_within_its_budget_and_says_for_whom(
    tmp_path: Path, prepare_study, monkeypatch
):
    """After the stage's first measurement another autotune process takes this machine's
    turn and keeps it: the stage waits for it until its budget (2 s) runs out, saying who and
    for how long, and leaves the rest out rather than run past its budget."""
    from autotune.machine import turns
    from autotune.study import run_speed_stage

    monkeypatch.setattr(turns, "MACHINE_DIR", tmp_path)
    space = two_stage(n_trials=1, batch_sizes="[16]", precisions="fp32", workers="[0]")
    space = space.replace("speed: {bursts: 2,", "speed: {max_seconds: 2, bursts: 2,")
    holders: list[subprocess.Popen[str]] = []

    def load(n: int) -> tuple[float, float | None]:
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_THE_TURN, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        holders.append(holder)  # takes the turn once this measurement lets it go
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # it waits for the turn by now
        return 0.0, None

    executor = SyntheticExecutor(load=load)
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    events: list = []
    said: list[str] = []
    try:
        began = time.monotonic()
        run_speed_stage(
            StageInputs(study, spec, CPU, executor, on_event=events.append, on_wait=said.append)
        )
        took = time.monotonic() - began
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
    assert len(executor.measured) == 1 and took < 2.0 + 1.0
    assert said and all(f"autotune process {holders[0].pid} trains on core" in s for s in said)
    assert said[0].startswith("waiting for its turn (0 s so far, gives up after ")
    assert "--turn-wait" not in said[0]  # the budget ends it, not the user's bound
    out = [e for e in events if "time ran out while another process held its turn" in str(e.fault)]
    assert len(out) == 1


class FailingAt(SyntheticExecutor):
    """SyntheticExecutor whose measurements of (batch size, data pipeline) in ``faults`` fail
    with the fault given."""

    def __init__(self, faults: dict[tuple[int, str], TrialFault]) -> None:
        super().__init__()
        self.faults = faults

    def measure(self, config: TrialConfig, plan: BurstPlan) -> SpeedMeasurement:
        fault = self.faults.get((config.batch_size, config.data_pipeline))
        if fault is None:
            return super().measure(config, plan)
        self.measured.append(config)
        raise fault


@pytest.mark.parametrize(
    "crash",
    [
        # the issue's: a worker that could not start, every later run reusing it
        TrialFault(FaultKind.ERROR, "EOFError: the worker could not start"),
        TrialFault(FaultKind.WORKER_CRASHED, "the worker process died (signal 9 (SIGKILL))"),
        TrialFault(FaultKind.DATALOADER_WORKER_DIED, "a DataLoader worker exited unexpectedly"),
    ],
)
def test_a_failure_is_not_a_fact_only_what_the_setting_caused_is_reused(
    tmp_path: Path, prepare_study, crash: TrialFault
):
    """A crash is measured again by the next run of the study and by other studies; out of
    memory is reused, saying how to measure it again."""
    from autotune.study import run_speed_stage

    def stage_one(executor: SyntheticExecutor, name: str, n_trials: int) -> list:
        space = two_stage(n_trials=n_trials, precisions="fp32", workers="[0]")
        space = space.replace("name: two", f"name: {name}")
        study, _, _, _ = prepare_study(space, tmp_path, run=False)
        spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
        events: list = []
        run_speed_stage(StageInputs(study, spec, CPU, executor, on_event=events.append))
        return events

    oom = TrialFault(FaultKind.OOM, "CUDA out of memory. Tried to allocate 2.00 GiB")
    stage_one(FailingAt({(16, "device"): crash, (32, "device"): oom}), "two", 1)

    again = SyntheticExecutor(_faster_on_the_device)  # (no leaders to measure again)
    events = stage_one(again, "two", 2)  # the same study, resumed
    assert [(c.batch_size, c.data_pipeline) for c in again.measured] == [(16, "device")]
    reused = [e for e in events if e.cached and e.fault is not None]
    assert [e.cell for e in reused] == ["batch 32, fp32"]
    assert reused[0].fault.startswith("CUDA out of memory")
    assert reused[0].fault.endswith("(measured by an earlier run: re-measure with --remeasure)")

    other = SyntheticExecutor()
    stage_one(other, "other", 1)  # another study on the storage: what was measured serves
    assert other.measured == []


def test_stage_one_orders_its_cells_on_clean_figures(tmp_path: Path, prepare_study):
    """A run of the stage stopped after timing batch 32's reference while others took its
    cores: stored with its interference mark, at a tenth of its speed, so below batch 16's.
    The resumed stage times that reference again on the quiet machine before it orders the
    cells (a figure taken under interference is never ranked with a clean one), and goes
    through batch 32, the faster, first."""
    from autotune.study import run_speed_stage

    space = two_stage(n_trials=1, batch_sizes="[16, 32]", precisions="fp32", workers="[0]")
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec
    busy = SyntheticExecutor(lambda config: 0.01, load=lambda n: (0.0, 0.8), interrupt_at=2)
    with pytest.raises(KeyboardInterrupt):
        run_speed_stage(StageInputs(study, spec, CPU, busy))
    assert [(c.batch_size, c.data_pipeline) for c in busy.measured] == [(32, "device")]
    quiet = SyntheticExecutor()  # a step a millisecond: batch 32 twice batch 16's samples/s
    table = run_speed_stage(StageInputs(study, spec, CPU, quiet))
    measured = [(c.batch_size, c.data_pipeline) for c in quiet.measured]
    # batch 16's reference, batch 32's again, then batch 32's other settings before 16's
    # (before: batch 16's first, ranked on the busy figure; 32's reference never again)
    assert measured[:3] == [(16, "device"), (32, "device"), (32, "dataloader")]
    assert measured.index((16, "dataloader")) > max(
        i for i, (batch, _) in enumerate(measured) if batch == 32
    )
    assert not any(c.interference for c in table)


def _dataloader_faster(config: TrialConfig) -> float:
    """A step's seconds: a DataLoader twice as fast as the device pipeline (no rematch)."""
    return 0.0005 if config.data_pipeline == "dataloader" else 0.001


class CrashingAgain(SyntheticExecutor):
    """SyntheticExecutor whose measurements of batch 32's dataloader setting crash."""

    def measure(self, config: TrialConfig, plan: BurstPlan) -> SpeedMeasurement:
        if (config.batch_size, config.data_pipeline) != (32, "dataloader"):
            return super().measure(config, plan)
        self.measured.append(config)
        raise TrialFault(FaultKind.ERROR, "EOFError: the worker could not start")


@pytest.mark.parametrize("quiet", [True, False, "crashes"])
def test_a_setting_that_lost_on_a_busy_figure_is_timed_again_or_its_row_says_so(
    tmp_path: Path, prepare_study, quiet: bool | str
):
    """A run of the stage stopped after batch 32's dataloader setting was timed while others
    took its cores, stored at a tenth of its speed (its references clean). The resumed stage
    compares it with no clean figure: on a quiet machine it is timed again and wins batch 32
    (the faster); on a machine that stays busy it is not, and batch 32's row, its clean device
    setting chosen, is marked busy (before: the device setting won on the busy figure, the
    row unmarked, and the loser never timed again). A retime that crashes is tried once, and
    the row is marked."""
    from autotune.study import run_speed_stage

    space = two_stage(n_trials=1, batch_sizes="[16, 32]", precisions="fp32", workers="[0]")
    study, _, _, _ = prepare_study(space, tmp_path, run=False)
    spec = restrict(parse_spec(space, tmp_path / "space.yaml"), CPU).spec

    def stopped_run_step(config: TrialConfig) -> float:
        return 0.01 if config.data_pipeline == "dataloader" else _dataloader_faster(config)

    def stopped_run_load(n: int) -> tuple[float, float | None]:
        return 0.0, 0.8 if n == 3 else None  # the third, 32's dataloader, under interference

    busy = SyntheticExecutor(stopped_run_step, load=stopped_run_load, interrupt_at=4)
    with pytest.raises(KeyboardInterrupt):
        run_speed_stage(StageInputs(study, spec, CPU, busy))
    stored = [(c.batch_size, c.data_pipeline) for c in busy.measured]
    assert stored == [(32, "device"), (16, "device"), (32, "dataloader")]
    kind = CrashingAgain if quiet == "crashes" else SyntheticExecutor
    again = kind(_dataloader_faster, load=lambda n: (0.0, None if quiet else 0.8))
    table = run_speed_stage(StageInputs(study, spec, CPU, again))
    rows = {(c.batch_size, c.accumulation_steps): c for c in table}
    retimed = [(c.batch_size, c.data_pipeline) for c in again.measured].count((32, "dataloader"))
    assert retimed == (1 if quiet else 0)
    pipeline = dict(rows[32, 1].settings)["data_pipeline"]
    assert pipeline == ("dataloader" if quiet is True else "device")
    assert rows[32, 1].interference == (quiet is not True)


def test_the_rules_never_judge_a_busy_figure_to_lose():
    """A setting timed only under interference (``busy``) may be slower only by the load: no
    rule rules it out on that figure (a pipeline far behind, channels_last no faster, a
    compile mode that cannot pay back, a precision far behind), while the same figures timed
    clean are ruled out; a busy figure that wins still rules the others out."""
    from autotune.stage1._rules import CellResult, StageRules

    spec = restrict(parse_spec(two_stage(), Path("space.yaml")), CPU).spec
    eager = SpeedMeasurement(16, 100, (0.01,), (0.001,), (0.01,), 0.0, None, 0, "cpu", "x")
    compiled = dataclasses.replace(eager, compile_seconds=100.0, one_time_seconds=100.0)
    device, loader = (("data_pipeline", "device"),), (("data_pipeline", "dataloader"),)
    plain, layout = (("compile", "default"),), (("compile", "default"), ("channels_last", True))

    def learned(busy: bool) -> StageRules:
        rules = StageRules(spec)
        rules.learn(
            Cell(16, "fp32"),
            [
                CellResult(device, 3000.0, eager, None),
                CellResult(loader, 1000.0, None, None, busy),  # under half the fastest
                CellResult(plain, 2000.0, compiled, None, busy),  # no faster: cannot pay back
                CellResult(layout, 1900.0, None, None, busy),  # channels_last no faster
            ],
        )
        rules.learn(Cell(16, "bf16"), [CellResult(device, 500.0, None, None, busy)])
        return rules

    clean, busy = learned(busy=False), learned(busy=True)
    at_16, at_32 = Cell(16, "bf16"), Cell(32, "bf16")
    assert clean.why(at_16, loader) is not None and busy.why(at_16, loader) is None
    assert "default" in clean.dropped_modes and "default" not in busy.dropped_modes
    assert "default" in clean.dropped_layouts and "default" not in busy.dropped_layouts
    assert clean.far_behind(at_32) is not None and busy.far_behind(at_32) is None
    winner = StageRules(spec)  # busy and the fastest: the clean loser is far behind
    winner.learn(
        Cell(16, "fp32"),
        [CellResult(device, 3000.0, None, None, True), CellResult(loader, 1000.0, None, None)],
    )
    assert winner.why(at_16, loader) is not None
