"""Exports for Lightning and Hugging Face: each knob reaches its framework setting, the files
are valid, lint-clean Python that imports no autotune, names stay data, and (where the library
is installed) the real Trainer and TrainingArguments are built from them."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from typer.testing import CliRunner

from autotune.cli import app
from autotune.export import BestConfig, ExportError, best_config, render, select_trial
from autotune.semantics import make_optimizer, make_scheduler, scales_loss
from autotune.testing import blobs, imported_modules, learning_rates, lint, provenance, tiny_mlp

SPACE = """\
study: {name: frameworks, n_trials: 1, pruner: none, strategy: joint, confirm: false}
workload:
  model: autotune.testing:tiny_mlp
  data: autotune.testing:blobs
  data_args: {image: true}
  epochs: 1
objective: {full_run_epochs: 3}
space:
  lr: 0.02
  batch_size: [16, 32]
"""

HOSTILE_NAMES = [
    'q""";__import__("os").system("touch pwned");"""',
    "q''';__import__('os').system('touch pwned');'''",
    'line\nbreak\n__import__("os").system("touch pwned")\n#',
    "{{ jinja }} {% if x %} # not a comment",
    "x[/y] run[fast]" + "z" * 150,
    "line\u2028separator\u2029paragraph\x85next",
    "\udcff a lone surrogate, as a file system name decodes",
    "\x00 nul \x1b[31m escape \u202e reversed",
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, prepare_study) -> tuple[optuna.Study, str]:
    """One real study for the module, and its storage URL."""
    study, url, _, _ = prepare_study(SPACE, tmp_path_factory.mktemp("frameworks"))
    return study, url


@pytest.fixture(scope="module")
def best(prepared) -> BestConfig:
    study, _ = prepared
    return best_config(study, select_trial(study))


def changed(best: BestConfig, **changes: Any) -> BestConfig:
    return dataclasses.replace(best, config=best.config.replace(**changes))


def call_keywords(source: str, function: str) -> dict[str, Any]:
    """The keyword arguments of the call ``function`` returns, read as data (no code runs)."""
    tree = ast.parse(source)
    found = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    returned = next(n for n in ast.walk(found) if isinstance(n, ast.Return))
    assert isinstance(returned.value, ast.Call)
    call = returned.value
    if not any(k.arg for k in call.keywords):  # Trainer(**{**tuned, **overrides})
        tuned = next(
            n.value
            for n in ast.walk(found)
            if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "tuned"
        )
        assert isinstance(tuned, ast.Call)
        call = tuned
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}


def function_source(source: str, name: str) -> str:
    tree = ast.parse(source)
    found = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.unparse(found)


# configurations unlike the study's, each knob set so that it matters
VARIANTS: dict[str, dict[str, Any]] = {
    "study": {},
    "bf16-sgd-cosine-workers": {
        "precision": "bf16",
        "optimizer": "sgd",
        "momentum": 0.875,
        "nesterov": True,
        "weight_decay": 0.125,
        "schedule": "cosine",
        "warmup_fraction": 0.25,
        "num_workers": 3,
        "pin_memory": True,
        "prefetch_factor": 5,
        "persistent_workers": True,
        "accumulation_steps": 4,
        "compile": "max-autotune",
        "channels_last": True,
        "cudnn_benchmark": True,
        "device": "cuda:1",
        "seed": 4242,
    },
    "fp16-onecycle": {"precision": "fp16", "schedule": "onecycle", "compile": "default"},
    "ddp-gpus": {  # a trial of two processes on cuda:2 and cuda:3, under DDP
        "world_size": 2,
        "device": "cuda:2",
        "ddp_bucket_cap_mb": 50,
        "gradient_as_bucket_view": True,
        "static_graph": True,
    },
    "tf32-warmup-device": {
        "precision": "tf32",
        "warmup_fraction": 0.5,
        "data_pipeline": "device",
        "lr_scaling": "sqrt",
        "device": "cuda",
    },
}


@pytest.mark.parametrize("fmt", ["lightning", "hf"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_files_parse_and_import_no_autotune(best, fmt, variant):
    text = render(changed(best, **VARIANTS[variant]), fmt)
    compile(text, f"{fmt}_settings.py", "exec")
    framework = "lightning" if fmt == "lightning" else "transformers"
    assert "autotune" not in imported_modules(text)
    assert framework in imported_modules(text)
    assert provenance(text)["study"] == "frameworks"
    assert provenance(text)["trial"] == best.trial


def test_every_variant_is_lint_and_format_clean(best, tmp_path: Path):
    """``ruff check`` and ``ruff format --check`` with this project's configuration, as the
    exported script is held: the files are pasted into users' code."""
    for fmt in ("lightning", "hf"):
        for variant, changes in VARIANTS.items():
            (tmp_path / f"{fmt}_{variant}.py").write_text(render(changed(best, **changes), fmt))
    linted = lint(tmp_path, formatted=True)
    assert linted.returncode == 0, linted.stdout + linted.stderr


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        ("fp32", "32-true"),
        ("fp32-strict", "32-true"),
        ("tf32", "32-true"),
        ("bf16", "bf16-mixed"),
        ("fp16", "16-mixed"),
    ],
)
def test_lightning_precision_strings(best, precision, expected):
    text = render(changed(best, precision=precision), "lightning")
    assert call_keywords(text, "make_trainer")["precision"] == expected
    set_up = function_source(text, "set_up")
    tf32 = "torch.set_float32_matmul_precision('high')" in set_up
    assert tf32 == (precision == "tf32")
    # TF32 convolutions are PyTorch's default, which fp32 keeps and only fp32-strict leaves
    assert ("torch.backends.cudnn.allow_tf32 = True" in set_up) == (precision != "fp32-strict")


def test_lightning_maps_every_knob(best):
    text = render(changed(best, **VARIANTS["bf16-sgd-cosine-workers"]), "lightning")
    assert call_keywords(text, "make_trainer") == {
        "precision": "bf16-mixed",
        "accumulate_grad_batches": 4,
        "max_epochs": 3,  # objective.full_run_epochs
        "benchmark": True,
        "accelerator": "gpu",
        "devices": [1],
    }
    assert call_keywords(text, "train_dataloader") == {
        "batch_size": best.config.batch_size,
        "shuffle": True,
        "drop_last": True,  # as the trials: a user's run kept it and scored 0.848 against 0.925
        "num_workers": 3,
        "pin_memory": True,
        "prefetch_factor": 5,
        "persistent_workers": True,
    }
    model = function_source(text, "prepare_model")
    assert "model.to(memory_format=torch.channels_last)" in model
    assert "torch.compile(model, mode='max-autotune')" in model
    optimizers = function_source(text, "configure_optimizers")
    assert "torch.optim.SGD(module.parameters(), lr=0.02, momentum=0.875, nesterov=True, " \
        "weight_decay=0.125)" in optimizers  # fmt: skip
    assert "make_scheduler(optimizer, 'cosine', 0.25, total_steps)" in optimizers
    assert "'interval': 'step'" in optimizers
    assert "L.seed_everything(4242, workers=True)" in function_source(text, "set_up")

    plain = render(best, "lightning")  # the study: AdamW, constant, eager, in-process loading
    assert call_keywords(plain, "make_trainer")["accelerator"] == "cpu"
    assert call_keywords(plain, "make_trainer")["devices"] == 1
    assert "prefetch_factor" not in call_keywords(plain, "train_dataloader")
    assert "return model" in function_source(plain, "prepare_model")
    assert "torch.compile" not in function_source(plain, "prepare_model")
    assert "torch.optim.AdamW(" in function_source(plain, "configure_optimizers")
    assert "return {'optimizer': optimizer}" in function_source(plain, "configure_optimizers")

    # fp16: AdamW fused as the trials; SGD unfused (fused SGD's momentum starts uninitialised
    # where GradScaler skips the first step: the trials zero it, a constructor cannot)
    for optimizer, fused in (("adamw", True), ("sgd", False)):
        half = render(changed(best, precision="fp16", optimizer=optimizer), "lightning")
        assert ("fused=True" in function_source(half, "configure_optimizers")) is fused

    onecycle = render(changed(best, schedule="onecycle", compile="default"), "lightning")
    optimizers = function_source(onecycle, "configure_optimizers")
    assert "make_scheduler(optimizer, 'onecycle', 0.0, total_steps)" in optimizers
    assert "torch.compile(model)" in function_source(onecycle, "prepare_model")


def test_hf_maps_every_knob(best):
    text = render(changed(best, **VARIANTS["bf16-sgd-cosine-workers"]), "hf")
    assert call_keywords(text, "training_arguments") == {
        "per_device_train_batch_size": best.config.batch_size,
        "gradient_accumulation_steps": 4,
        "num_train_epochs": 3,
        "learning_rate": 0.02,
        "optim": "sgd",
        "optim_args": "momentum=0.875,nesterov=True",
        "weight_decay": 0.125,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 0.25,
        "max_grad_norm": 0.0,
        "bf16": True,
        "fp16": False,
        "tf32": None,
        "torch_compile": True,
        "torch_compile_mode": "max-autotune",
        "dataloader_num_workers": 3,
        "dataloader_pin_memory": True,
        "dataloader_prefetch_factor": 5,
        "dataloader_persistent_workers": True,
        "per_device_eval_batch_size": best.config.val_batch_size,
        "seed": 4242,
    }
    # knobs with no field: said in a comment, never dropped silently
    assert "# channels_last: model = model.to(memory_format=torch.channels_last)" in text
    assert "# cudnn_benchmark: torch.backends.cudnn.benchmark = True" in text
    # evaluation sees every validation sample, as the study scored them: nothing drops its last
    assert "dataloader_drop_last" not in call_keywords(text, "training_arguments")
    assert "# drop_last: the trials skipped each epoch's last partial batch" in text
    assert "CUDA_VISIBLE_DEVICES=1" in text
    assert "# weight decay: the Trainer exempts biases and norm weights" in text
    assert "weight decay:" not in render(best, "hf")  # the study's weight decay is 0
    # the Trainer's warm-up starts at 0, the study's one step further: said, as it cannot match
    assert "# warm-up: the Trainer's starts from a learning rate of 0" in text
    assert "warm-up:" not in render(best, "hf")  # the study has no warm-up

    plain = call_keywords(render(best, "hf"), "training_arguments")
    assert plain["optim"] == "adamw_torch" and "optim_args" not in plain
    # fp16: AdamW fused, as the trials trained it (GradScaler's check stays on the GPU)
    fp16 = call_keywords(render(changed(best, precision="fp16"), "hf"), "training_arguments")
    assert fp16["optim"] == "adamw_torch_fused" and fp16["fp16"] is True
    assert plain["lr_scheduler_type"] == "constant" and plain["use_cpu"] is True
    assert "dataloader_prefetch_factor" not in plain and "torch_compile_mode" not in plain

    schedules = {
        ("constant", 0.0): "constant",
        ("constant", 0.5): "constant_with_warmup",
        ("cosine", 0.0): "cosine",
    }
    for (schedule, warmup), expected in schedules.items():
        written = render(changed(best, schedule=schedule, warmup_fraction=warmup), "hf")
        assert call_keywords(written, "training_arguments")["lr_scheduler_type"] == expected
        assert call_keywords(written, "training_arguments")["warmup_steps"] == warmup
    # one-cycle has no TrainingArguments schedule: the nearest, and a comment saying so
    onecycle = render(changed(best, schedule="onecycle"), "hf")
    assert call_keywords(onecycle, "training_arguments")["lr_scheduler_type"] == "cosine"
    assert call_keywords(onecycle, "training_arguments")["warmup_steps"] == 0.3
    assert "TrainingArguments has no one-cycle schedule" in onecycle
    # tf32=None leaves TrainingArguments to PyTorch's defaults, which the study's fp32 is
    expected = {
        "fp16": (False, True, None),
        "tf32": (False, False, True),
        "fp32": (False, False, None),
        "fp32-strict": (False, False, False),
    }
    for precision, flags in expected.items():
        written = call_keywords(
            render(changed(best, precision=precision), "hf"), "training_arguments"
        )
        assert (written["bf16"], written["fp16"], written["tf32"]) == flags


@pytest.mark.parametrize(
    ("fmt", "function", "framework", "override"),
    [
        ("lightning", "make_trainer", "L", {"max_epochs": 1, "logger": False}),
        ("hf", "training_arguments", "TrainingArguments", {"num_train_epochs": 1}),
    ],
)
def test_an_override_wins_over_a_tuned_argument(best, fmt, function, framework, override):
    """The first thing a user changes is the number of epochs: it must not raise 'got
    multiple values for keyword argument'. The framework (not installed here) is stood in for
    by a callable that returns what it was called with."""
    text = render(changed(best, **VARIANTS["bf16-sgd-cosine-workers"]), fmt)
    tuned = call_keywords(text, function)
    assert set(override) & set(tuned) or fmt == "lightning"
    namespace: dict[str, Any] = {"Any": Any}

    def called(**keywords: Any) -> dict[str, Any]:
        return keywords

    namespace[framework] = (
        type("Lightning", (), {"Trainer": staticmethod(called)}) if framework == "L" else called
    )
    exec(function_source(text, function), namespace)  # the function alone, as rendered
    built = namespace[function](**override)
    assert built == {**tuned, **override}


def test_knobs_without_a_setting_get_a_comment(best):
    device = changed(best, data_pipeline="device", lr_scaling="linear", base_batch_size=64)
    for fmt in ("lightning", "hf"):
        text = render(device, fmt)
        assert "# data_pipeline device: the study kept the training set in device memory" in text
        assert "# lr_scaling linear: the learning rate is already scaled" in text
        # on the learning rate's own line too, worded as the script words it
        assert "per 64 examples, scaled linear to the effective batch of" in text


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_strings_stay_data(best, tmp_path: Path, name):
    hostile = dataclasses.replace(best, study=name, metrics={**best.metrics, "device_name": name})
    for fmt in ("lightning", "hf"):
        text = render(hostile, fmt)
        path = tmp_path / f"{fmt}.py"
        path.write_text(text)
        compile(text, str(path), "exec")
        assert lint(path).returncode == 0, lint(path).stdout
        found = provenance(text)
        assert found["study"] == name and name in str(found["measured_on"])
    assert not (tmp_path / "pwned").exists()


CRAFTED = [
    {"precision": "fp8\nimport os"},
    {"compile": "x"},
    {"device": "cuda:0\n#"},
    {"lr_scaling": "?"},
    {"batch_size": "32\nimport os"},  # it reaches a comment as the effective batch
    {"nesterov": "yes"},
]


@pytest.mark.parametrize("change", CRAFTED)
def test_a_crafted_value_is_refused_in_one_line(best, change):
    """A study's stored configuration is not checked when read; values reach comments."""
    for fmt in ("lightning", "hf"):
        with pytest.raises(ExportError) as refused:
            render(changed(best, **change), fmt)
        assert len(str(refused.value).splitlines()) == 1


def test_the_cli_writes_both_formats(prepared, tmp_path: Path):
    """``autotune export --format lightning|hf``, run in this process (Typer's CliRunner)."""
    _, url = prepared
    verbosity = optuna.logging.get_verbosity()  # the command quiets Optuna: for itself only
    for fmt in ("lightning", "hf"):
        out = tmp_path / f"{fmt}.py"
        with contextlib.chdir(tmp_path):
            done = CliRunner().invoke(app, ["export", "--study", "frameworks", "--storage", url,
                                            "--format", fmt, "-o", str(out)])  # fmt: skip
        optuna.logging.set_verbosity(verbosity)
        assert done.exit_code == 0 and done.exception is None, done.stderr
        assert out.read_text().startswith('"""') and "Wrote" in done.stdout


def _exec(text: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "settings"}
    exec(compile(text, "settings.py", "exec"), namespace)
    return namespace


CONSTRUCTED = ["study", "bf16-sgd-cosine-workers", "fp16-onecycle"]


@pytest.mark.parametrize("variant", [*CONSTRUCTED, "tf32-warmup-device"])
def test_lightnings_schedule_is_the_trials(best, monkeypatch, variant):
    """configure_optimizers steps the learning rate as a trial of the run's optimizer steps
    does (semantics.make_scheduler); Lightning itself stubbed: only its names are read."""
    stub = types.ModuleType("lightning")
    stub.LightningModule = stub.Trainer = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lightning", stub)
    settings = _exec(render(changed(best, **VARIANTS[variant]), "lightning"))
    module = torch.nn.Linear(4, 2)
    module.trainer = types.SimpleNamespace(estimated_stepping_batches=40)  # type: ignore[assignment]
    returned = settings["configure_optimizers"](module)
    config = best.config.replace(**VARIANTS[variant])
    trial = make_optimizer(torch.nn.Linear(4, 2), config.optimizer, config.lr, 0.0)
    expected = learning_rates(
        trial, make_scheduler(trial, config.schedule, config.warmup_fraction, 40), 40
    )
    scheduler = returned.get("lr_scheduler", {}).get("scheduler")
    assert learning_rates(returned["optimizer"], scheduler, 40) == expected


@pytest.mark.parametrize("variant", CONSTRUCTED)
def test_lightning_builds_and_fits_from_the_file(best, tmp_path: Path, variant):
    lightning = pytest.importorskip("lightning")
    config = {**VARIANTS[variant], "device": "cpu", "compile": "none"}
    if config.get("precision") != "bf16":  # Lightning's CPU autocast is bf16-mixed only
        config["precision"] = "fp32"
    config["num_workers"] = min(config.get("num_workers", 0), 1)  # 2 cores
    settings = _exec(render(changed(best, **config), "lightning"))
    splits = blobs(n_train=64, n_val=16, image=True)

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_mlp(splits.num_classes, tuple(splits.train[0][0].shape))

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            return torch.nn.functional.cross_entropy(self.net(inputs), targets)

        def train_dataloader(self):
            return settings["train_dataloader"](splits.train)

        def configure_optimizers(self):
            return settings["configure_optimizers"](self)

    previous = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        settings["set_up"]()
        trainer = settings["make_trainer"](
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_train_batches=3,
            default_root_dir=str(tmp_path),
        )
        assert trainer.accumulate_grad_batches == best.config.replace(**config).accumulation_steps
        assert trainer.max_epochs == 3
        assert trainer.precision == {"bf16": "bf16-mixed", "fp32": "32-true"}[config["precision"]]
        module = settings["prepare_model"](Module())
        trainer.fit(module)
    finally:
        torch.set_float32_matmul_precision(previous[0])
        torch.backends.cudnn.allow_tf32 = previous[1]
    assert trainer.global_step >= 1


@pytest.mark.parametrize("variant", CONSTRUCTED)
def test_hf_training_arguments_build_from_the_file(best, tmp_path: Path, variant):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it (transformers[torch])
    config = {**VARIANTS[variant], "device": "cpu"}
    settings = _exec(render(changed(best, **config), "hf"))
    args = settings["training_arguments"](output_dir=str(tmp_path), report_to="none")
    expected = best.config.replace(**config)
    assert args.per_device_train_batch_size == expected.batch_size
    assert args.gradient_accumulation_steps == expected.accumulation_steps
    assert args.learning_rate == expected.lr and args.seed == expected.seed
    assert args.dataloader_num_workers == expected.num_workers
    assert args.bf16 == (expected.precision == "bf16")
    assert args.fp16 == (expected.precision == "fp16")
    assert args.torch_compile == (expected.compile != "none")
    trainer = transformers.Trainer(model=torch.nn.Linear(4, 2), args=args)
    optimizer = trainer.create_optimizer()
    if expected.optimizer == "sgd":
        assert isinstance(optimizer, torch.optim.SGD)
        group = optimizer.param_groups[0]
        assert group["momentum"] == expected.momentum and group["nesterov"] is True
    else:
        assert isinstance(optimizer, torch.optim.AdamW)
        assert bool(optimizer.defaults.get("fused")) == scales_loss(expected.precision)
    # evaluation covers the whole validation split (smaller than one evaluation batch here),
    # as the study scored it: nothing of it is dropped
    evaluated = transformers.Trainer(model=_Scored(), args=args, eval_dataset=_points(600))
    assert evaluated.evaluate()["eval_loss"] == pytest.approx(1.0)


class _Scored(torch.nn.Module):
    """A model as the Trainer takes one: returns its loss (here each sample's label: 1.0)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": labels.float().mean() + 0 * self.weight, "logits": x}


def _points(count: int) -> list[dict[str, torch.Tensor]]:
    return [{"x": torch.zeros(4), "labels": torch.tensor(1)} for _ in range(count)]


def test_a_trial_of_several_processes_exports_its_devices_and_ddp_settings(best):
    """A trial of two processes on cuda:2 and cuda:3: Lightning gets those devices and a
    DDPStrategy holding the tuned DDP settings (it passes them on to DistributedDataParallel);
    Hugging Face the bucket size and the launch line."""
    distributed = changed(best, **VARIANTS["ddp-gpus"])
    text = render(distributed, "lightning")
    make = next(
        n
        for n in ast.parse(text).body
        if isinstance(n, ast.FunctionDef) and n.name == "make_trainer"
    )
    tuned = next(  # tuned = dict(...): what Trainer(**{**tuned, **overrides}) gets
        n.value
        for n in ast.walk(make)
        if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "tuned"
    )
    assert isinstance(tuned, ast.Call)
    keywords = {k.arg: k.value for k in tuned.keywords if k.arg}
    assert ast.literal_eval(keywords["devices"]) == [2, 3]
    assert ast.unparse(keywords["strategy"]) == (
        "DDPStrategy(bucket_cap_mb=50, gradient_as_bucket_view=True, static_graph=True)"
    )
    assert "from lightning.pytorch.strategies import DDPStrategy" in text
    hf = render(distributed, "hf")
    assert call_keywords(hf, "training_arguments")["ddp_bucket_cap_mb"] == 50
    assert "torchrun --nproc-per-node 2" in hf
    plain = render(best, "lightning")  # one process: no strategy
    assert call_keywords(plain, "make_trainer")["devices"] == 1 and "DDPStrategy" not in plain
    assert "ddp_bucket_cap_mb" not in call_keywords(render(best, "hf"), "training_arguments")
