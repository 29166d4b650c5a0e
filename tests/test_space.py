"""Sampling TrialConfigs: conditional knobs, lr scaling, and filtering by hardware and data."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import optuna
import pytest

from autotune.search.space import NothingFits, draw_from_table, restrict, sample, suggestions
from autotune.spacefile import Choice, SpecError, parse_spec
from autotune.speed import SpeedChoice, SpeedTable
from autotune.testing import AMPERE, CPU, TEST_CPU, VOLTA
from autotune.workloads import load

HEADER = "workload: {model: digits_cnn, data: digits, epochs: 3}\nstudy: {seed: 100}\n"


def spec_with(space: str):
    return parse_spec(HEADER + "space:\n" + space, "space.yaml")


def test_conditional_knobs_are_only_sampled_where_they_mean_something():
    spec = spec_with(
        """
  num_workers: [0, 2]
  prefetch_factor: [2, 4]
  persistent_workers: [false, true]
  optimizer: [sgd, adamw]
  momentum: {low: 0.0, high: 0.95}
  nesterov: [false, true]
"""
    )
    # FixedTrial raises if asked for a parameter it does not hold: absent keys prove the
    # conditional knobs were not sampled.
    config = sample(
        optuna.trial.FixedTrial({"num_workers": 0, "optimizer": "adamw"}), spec, TEST_CPU
    )
    assert config.prefetch_factor is None and config.persistent_workers is False
    assert config.momentum is None and config.nesterov is False

    with_workers = optuna.trial.FixedTrial(
        {
            "num_workers": 2,
            "prefetch_factor": 4,
            "persistent_workers": True,
            "optimizer": "sgd",
            "momentum": 0.0,
        }
    )
    config = sample(with_workers, spec, TEST_CPU)
    assert (config.num_workers, config.prefetch_factor, config.persistent_workers) == (2, 4, True)
    assert config.momentum == 0.0 and config.nesterov is False  # no momentum: no Nesterov

    nesterov = optuna.trial.FixedTrial(
        {"num_workers": 0, "optimizer": "sgd", "momentum": 0.9, "nesterov": True}
    )
    assert sample(nesterov, spec, TEST_CPU).nesterov is True


def test_fixed_knobs_are_not_optuna_parameters_and_seed_follows_trial_number():
    spec = spec_with("  batch_size: 48\n  lr: {low: 0.001, high: 0.1, log: true}\n")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(3):
        trial = study.ask()
        config = sample(trial, spec, TEST_CPU)
        assert set(trial.params) == {"lr"}
        assert config.batch_size == 48 and 0.001 <= config.lr <= 0.1
        assert config.seed == 100 + trial.number
        assert config.epochs == 3 and config.device == "cpu"
        study.tell(trial, 1.0)


@pytest.mark.parametrize(
    ("rule", "expected"),
    [("none", 0.1), ("linear", 0.1 * 512 / 256), ("sqrt", 0.1 * math.sqrt(2))],
)
def test_lr_scaling_rules(rule, expected):
    spec = spec_with(
        f"  lr: 0.1\n  lr_scaling: {rule}\n  base_batch_size: 256\n"
        "  batch_size: 128\n  accumulation_steps: 4\n"
    )
    config = sample(optuna.trial.FixedTrial({}), spec, TEST_CPU)
    assert config.effective_batch_size == 512
    assert config.base_lr == 0.1
    assert config.lr == pytest.approx(expected)


def test_ranges_are_sampled_within_bounds_and_on_their_grid():
    spec = parse_spec(  # a batch_size range: two stages time listed sizes only
        HEADER.replace("{seed: 100}", "{seed: 100, strategy: joint}")
        + "space:\n"
        + "  batch_size: {low: 16, high: 256, log: true}\n"
        "  num_workers: {low: 0, high: 4, step: 2}\n"
        "  weight_decay: {low: 0.0, high: 0.1, step: 0.05}\n",
        "space.yaml",
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen_workers = set()
    for _ in range(30):
        trial = study.ask()
        config = sample(trial, spec, TEST_CPU)
        assert 16 <= config.batch_size <= 256
        assert config.num_workers in (0, 2, 4)
        assert min(abs(config.weight_decay - g) for g in (0.0, 0.05, 0.1)) < 1e-9
        seen_workers.add(config.num_workers)
        study.tell(trial, 0.0)
    assert seen_workers == {0, 2, 4}


def test_batch_sizes_larger_than_the_training_set_are_dropped():
    spec = spec_with("  batch_size: [64, 1024, 4096]\n")
    workload = load(spec.workload)  # digits: 1,437 training images
    restriction = restrict(spec, TEST_CPU, workload)
    assert restriction.spec.space.batch_size == Choice(values=(64, 1024))
    (dropped,) = restriction.dropped
    assert dropped.values == (4096,) and "larger than the training set (1437" in dropped.reason
    with pytest.raises(SpecError, match=r"space\.batch_size: no value can run"):
        restrict(spec_with("  batch_size: 4096\n"), TEST_CPU, workload)
    # a trial of two processes: batch_size is per process, each drawing half of every epoch
    pair = parse_spec(
        HEADER.replace("epochs: 3", "epochs: 3, gpus_per_trial: 2")
        + "space:\n  batch_size: [64, 512, 1024]\n",
        "space.yaml",
    )
    halves = restrict(pair, TEST_CPU, workload)
    assert halves.spec.space.batch_size == Choice(values=(64, 512))
    (dropped,) = halves.dropped
    assert dropped.values == (1024,) and dropped.reason == (
        "larger than each of the 2 processes' share of the training set (718 of 1437 samples; "
        "batch_size is per process)"
    )


def test_a_trial_of_several_gpus_needs_them_visible_and_of_one_model():
    """gpus_per_trial: 2 trains on cuda:0 and cuda:1: both must be there, and of one model (a
    DDP step waits for the slowest GPU, so a mixed pair times neither)."""
    pair = parse_spec(
        HEADER.replace("epochs: 3", "epochs: 3, gpus_per_trial: 2")
        + "space:\n  batch_size: [64]\n",
        "space.yaml",
    )
    h100, a100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
    two = dataclasses.replace(AMPERE, gpu_count=2, gpu_names=(h100, h100))
    assert restrict(pair, two).spec.workload.device == "cuda:0"
    for hardware, said in (
        (dataclasses.replace(two, gpu_count=1, gpu_names=(h100,)), "this process sees 1"),
        (
            dataclasses.replace(two, gpu_names=(h100, a100)),
            f"the 2 GPUs from cuda:0 on are of 2 models ({a100}, {h100}); give a trial GPUs "
            f"of one model",
        ),
    ):
        with pytest.raises(SpecError, match=re.escape(said)):
            restrict(pair, hardware)


def test_cpu_drops_gpu_only_values_and_says_why():
    spec = spec_with(
        "  precision: [fp32, fp32-strict, tf32, bf16, fp16]\n"
        "  compile: [none, default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs]\n"
        "  pin_memory: [false, true]\n"
        "  cudnn_benchmark: [false, true]\n"
    )
    restriction = restrict(spec, TEST_CPU)
    space = restriction.spec.space
    assert space.precision == Choice(values=("fp32", "bf16"))
    assert space.compile == Choice(values=("none", "default", "max-autotune-no-cudagraphs"))
    assert space.pin_memory == Choice(values=(False,))
    assert space.cudnn_benchmark == Choice(values=(False,))
    dropped = {(d.knob, d.values) for d in restriction.dropped}
    assert dropped == {
        ("precision", ("fp16",)),
        ("precision", ("fp32-strict",)),
        ("precision", ("tf32",)),
        ("compile", ("reduce-overhead", "max-autotune")),
        ("pin_memory", (True,)),
        ("cudnn_benchmark", (True,)),
    }
    for item in restriction.dropped:
        assert item.reason and item.describe().startswith(item.knob)
    # the restricted spec keeps where it came from
    assert restriction.spec.path == spec.path and restriction.spec.text == spec.text


def test_sampler_never_sees_dropped_values():
    spec = spec_with("  precision: [fp32, bf16, fp16]\n  pin_memory: [false, true]\n")
    restricted = restrict(spec, TEST_CPU).spec
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        config = sample(trial, restricted, TEST_CPU)
        assert config.precision in ("fp32", "bf16") and config.pin_memory is False
        study.tell(trial, 0.0)


def test_gpu_keeps_what_it_supports():
    spec = spec_with(
        "  precision: [fp32, tf32, bf16, fp16]\n  compile: [none, reduce-overhead]\n"
        "  pin_memory: [false, true]\n"
    )
    ampere = restrict(spec, AMPERE)
    assert ampere.dropped == ()
    assert ampere.spec.space == spec.space
    volta = restrict(spec, VOLTA)
    assert volta.spec.space.precision == Choice(values=("fp32", "fp16"))


def test_missing_compiler_drops_every_compile_mode():
    no_compiler = dataclasses.replace(TEST_CPU, compile_problem="no C++ compiler")
    spec = spec_with("  compile: [none, default]\n")
    restriction = restrict(spec, no_compiler)
    assert restriction.spec.space.compile == Choice(values=("none",))
    assert restriction.dropped[0].reason == "no C++ compiler"


def test_dataloader_workers_are_held_to_a_few_a_core():
    """Issue 41: num_workers: [0, 100000] was accepted, and stage 1 had forked about 500
    processes after 30 s. More workers than the cores is a real choice for loading that waits
    on disks; more than 4 a core is not."""
    restriction = restrict(spec_with("  num_workers: [0, 2, 8, 9, 100000]\n"), TEST_CPU)
    assert restriction.spec.space.num_workers == Choice(values=(0, 2, 8))  # 2 cores: up to 8
    (dropped,) = restriction.dropped
    assert dropped.values == (9, 100000)
    assert dropped.reason == "over 4 DataLoader processes a core (2 cores, this machine)"
    with pytest.raises(SpecError, match=r"space\.num_workers: no value can run"):
        restrict(spec_with("  num_workers: 100000\n"), TEST_CPU)


def test_knob_left_without_values_is_an_error():
    spec = spec_with("  precision: fp16\n  cudnn_benchmark: true\n")
    with pytest.raises(SpecError) as caught:
        restrict(spec, TEST_CPU)
    assert len(caught.value.problems) == 2
    assert caught.value.problems[0].startswith("space.yaml: space.precision: no value can run")
    assert "fp16" in caught.value.problems[0]


def test_device_pipeline_is_offered_only_for_in_memory_data(image_folder: Path):
    text = f"""
workload:
  model: mlp
  data: imagefolder
  data_args: {{root: {image_folder}}}
space:
  batch_size: 4
  data_pipeline: [dataloader, device]
  num_workers: [0, 2]
"""
    spec = parse_spec(text, "s.yaml")
    folder = restrict(spec, CPU, load(spec.workload))
    assert folder.spec.space.data_pipeline.values == ("dataloader",)
    assert "loads sample by sample" in folder.dropped[0].reason
    in_memory = parse_spec(
        text.replace("imagefolder", "shapes").replace(
            f"{{root: {image_folder}}}", "{n_train: 20, n_val: 10}"
        ),
        "s.yaml",
    )
    kept = restrict(in_memory, CPU, load(in_memory.workload))
    assert kept.spec.space.data_pipeline.values == ("dataloader", "device")


def test_a_two_stage_draw_returns_the_speed_stage_choice_its_knobs_came_from():
    """The effective batch is drawn; its split and execution knobs are the table's choice for
    it (the one a trial finishes soonest with), returned with the configuration."""
    spec = spec_with(
        "  batch_size: [16, 32]\n  accumulation_steps: [1, 2]\n  num_workers: [0, 2]\n"
    )

    def row(batch: int, accumulation: int, workers: int, seconds: float) -> SpeedChoice:
        settings = (("num_workers", workers),)
        return SpeedChoice(
            batch, accumulation, "fp32", (), settings, 100.0, seconds, 0.0, 0.04, 2, (7,)
        )

    slow, fast = row(32, 1, 0, 9.0), row(16, 2, 2, 5.0)
    table = SpeedTable(choices=(slow, fast))
    drawn = {"effective_batch_size": 32, "precision": "fp32"}
    config, choice = draw_from_table(
        suggestions(optuna.trial.FixedTrial(drawn)), spec, TEST_CPU, table
    )
    assert choice is fast
    assert (config.batch_size, config.accumulation_steps, config.num_workers) == (16, 2, 2)
    with pytest.raises(NothingFits, match="effective batch 64"):
        draw_from_table(
            suggestions(optuna.trial.FixedTrial({**drawn, "effective_batch_size": 64})),
            spec,
            TEST_CPU,
            table,
        )
