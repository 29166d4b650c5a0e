"""Exports for the frameworks users train with: the chosen configuration as the arguments of a
Lightning ``Trainer`` (with its DataLoader, model and optimizer settings) or of a Hugging Face
``TrainingArguments``, each a Python file to paste from (``lightning.py.j2``, ``hf.py.j2``).

Every value is written with ``literal``; comments hold only autotune's own words and numbers.
A knob the framework has no setting for gets a comment saying so and what to do instead.
"""

from __future__ import annotations

import re
from typing import Any

from autotune.config import TrialConfig
from autotune.display import lr_text
from autotune.export._api import BestConfig, ExportError
from autotune.export._bundle import Import, bundle, import_block, literal
from autotune.export._header import (
    Argument,
    has_schedule,
    loader_arguments,
    provenance_rows,
    searched,
    tuned,
)
from autotune.export._script import template_environment
from autotune.knobs import CHOICES, DDP_KNOBS, KNOBS

_CUDA_INDEX = re.compile(r"^cuda:(\d+)$", re.ASCII)
# the TrialConfig fields these files write, by kind (_check): the registry's, and the run's
_NUMBERS = (
    *(name for name, info in KNOBS.items() if info.kind in ("int", "float")),
    "base_lr", "val_batch_size", "seed", "dataloader_timeout",
)  # fmt: skip
_FLAGS = tuple(name for name, info in KNOBS.items() if info.kind == "bool")


def _precision(precision: str) -> tuple[str, str, bool]:
    """What ``precision`` is to the frameworks: Lightning 2.x's precision string
    (lightning.fabric.connector._PRECISION_INPUT_STR), and its CUDA flags
    (``semantics.cuda_flags``: the matmul precision, TF32 convolutions)."""
    import torch

    from autotune import semantics

    dtype = semantics.autocast_dtype(precision)
    mixed: dict[torch.dtype | None, str] = {
        torch.bfloat16: "bf16-mixed",
        torch.float16: "16-mixed",
    }
    return mixed.get(dtype, "32-true"), *semantics.cuda_flags(precision)


# TrainingArguments(tf32=...) by CUDA flags (semantics.cuda_flags: no precision has TF32 matmuls
# alone): True turns TF32 on for matmuls and convolutions, False off for both, None leaves
# PyTorch's defaults (TF32 convolutions only)
_HF_TF32 = {
    ("high", True): ("True", "TF32 matmuls and convolutions (CUDA)"),
    ("highest", False): ("False", "no TF32 for matmuls or convolutions (CUDA)"),
    ("highest", True): ("None", "PyTorch's defaults: TF32 convolutions only (CUDA)"),
}


def _not_applicable(best: BestConfig, framework: str) -> list[str]:
    """Comment lines for the knobs ``framework`` has no setting for."""
    config = best.config
    notes = []
    if config.data_pipeline == "device":
        notes += [
            "data_pipeline device: the study kept the training set in device memory and batched",
            f"it there; {framework} loads through a DataLoader, whose settings here the study did",
            "not measure (its workers, pinning and prefetch are autotune's defaults).",
        ]
    if config.lr_scaling != "none":
        notes += [
            f"lr_scaling {config.lr_scaling}: the learning rate is already scaled to the "
            f"effective batch of {config.effective_batch_size};",
            "scale it yourself if you change the batch size or the accumulation.",
        ]
    return notes


def _check(best: BestConfig) -> None:
    """ExportError naming the first choice of ``best`` that autotune does not know (a crafted
    or damaged file): every choice reaches the file's comments, so it must be autotune's own."""
    config = best.config
    for knob, known in CHOICES.items():
        value = getattr(config, knob)
        if value not in known:
            raise ExportError(f"{knob} {value!r} is not one of {', '.join(known)}")
    if not (config.device in ("cpu", "cuda") or _CUDA_INDEX.match(config.device)):
        raise ExportError(f"device {config.device!r} is not cpu, cuda or cuda:N")
    for name in _NUMBERS:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int | float | None):
            raise ExportError(f"{name} {value!r} is not a number")
    for name in _FLAGS:
        if not isinstance(getattr(config, name), bool):
            raise ExportError(f"{name} {getattr(config, name)!r} is not true or false")


def _optimizer(best: BestConfig) -> list[Argument]:
    """Keywords of the optimizer's constructor after the parameters."""
    from autotune.semantics import scales_loss  # imports torch: only these files need it

    config = best.config
    rows = [Argument("lr", literal(config.lr), searched(best, "lr", lr_text(config)))]
    if config.optimizer == "sgd":
        momentum = literal(config.momentum or 0.0)
        rows += [
            Argument("momentum", momentum, searched(best, "momentum")),
            tuned(best, "nesterov", "nesterov"),
        ]
    rows.append(tuned(best, "weight_decay", "weight_decay"))
    # AdamW fused as the trials (GradScaler's check stays on the GPU); SGD unfused: fused SGD
    # leaves its momentum uninitialised after a skipped first step, which the trials zero
    # (semantics.make_optimizer) and a plain constructor cannot
    if scales_loss(config.precision) and config.optimizer == "adamw":
        rows.append(
            Argument("fused", "True", "GradScaler's overflow check stays on the GPU: no sync")
        )
    return rows


def _lightning(best: BestConfig) -> dict[str, Any]:
    from autotune.semantics import make_scheduler  # imports torch: only these files need it

    config = best.config
    precision = config.precision
    lightning_precision, matmul, conv_tf32 = _precision(precision)
    accelerator = "cpu" if config.device == "cpu" else "gpu"
    index = _CUDA_INDEX.match(config.device)  # cuda:N; _check refused any other device
    first = int(index.group(1)) if index else 0
    trainer = [
        Argument(
            "precision",
            literal(lightning_precision),
            searched(best, "precision", f"autotune's {precision}"),
        ),
        tuned(
            best,
            "accumulate_grad_batches",
            "accumulation_steps",
            f"micro-batches per step (effective batch {config.effective_batch_size})",
        ),
        Argument("max_epochs", literal(best.epochs), "the full run"),
        tuned(best, "benchmark", "cudnn_benchmark", "cudnn.benchmark"),
        Argument("accelerator", literal(accelerator), "where the study trained"),
    ]
    if config.distributed:  # the trial's processes: one per device, under DDP
        processes = config.world_size
        shown = literal(
            list(range(first, first + processes)) if accelerator == "gpu" else processes
        )
        trainer.append(Argument("devices", shown, f"the trial's {processes} DDP processes"))
        values = "".join(  # DDPStrategy passes them on to DistributedDataParallel
            f"    {name.removeprefix('ddp_')}={literal(getattr(config, name))},\n"
            for name in DDP_KNOBS
        )
        trainer.append(
            Argument(
                "strategy",
                f"DDPStrategy(\n{values})",
                searched(best, "ddp_bucket_cap_mb", "the trial's DDP settings"),
            )
        )
    else:
        trainer.append(Argument("devices", literal([first] if index else 1)))
    loader = [
        tuned(best, "batch_size", "batch_size", "per micro-batch"),
        Argument("shuffle", "True"),
        Argument("drop_last", "True", "as the trials: the last partial batch is left out"),
        *loader_arguments(best),
    ]
    if config.dataloader_timeout > 0:
        loader.append(
            Argument("timeout", literal(config.dataloader_timeout), "seconds to wait for a batch")
        )
    imports = {
        Import("typing", "Any"),
        Import("lightning", alias="L"),
        Import("torch"),
        Import("torch.utils.data", "DataLoader"),
        Import("torch.utils.data", "Dataset"),
    }
    scheduled = has_schedule(config)
    schedule_sources, schedule_imports = bundle([make_scheduler] if scheduled else [])
    imports |= schedule_imports
    if config.distributed:
        imports.add(Import("lightning.pytorch.strategies", "DDPStrategy"))
    compile_mode = None if config.compile in ("none", "default") else literal(config.compile)
    return {
        "imports": imports,
        "trainer": trainer,
        "loader": loader,
        "optimizer": "SGD" if config.optimizer == "sgd" else "AdamW",
        "optimizer_arguments": _optimizer(best),
        "precision": precision,
        "matmul_precision": literal(matmul),
        "tf32_matmul": matmul == "high",
        "tf32_conv": conv_tf32,
        "seed": literal(config.seed),
        "compile": config.compile != "none",
        "compile_mode": compile_mode,
        "compile_comment": searched(best, "compile"),
        "channels_last": config.channels_last,
        "channels_last_comment": searched(best, "channels_last"),
        "notes": _not_applicable(best, "Lightning"),
        "scheduled": scheduled,
        "schedule": literal(config.schedule),
        "warmup": literal(config.warmup_fraction),
        "schedule_sources": schedule_sources,
        "schedule_comment": searched(best, "schedule"),
        "warmup_comment": searched(best, "warmup_fraction"),
    }


def _hf_schedule(best: BestConfig) -> tuple[str, list[str]]:
    """(lr_scheduler_type, comment lines) nearest autotune's schedule."""
    config = best.config
    if config.schedule == "cosine":
        return "cosine", []
    if config.schedule == "onecycle":
        return "cosine", [
            "schedule onecycle: TrainingArguments has no one-cycle schedule; the nearest is",
            "cosine after a linear warm-up over the same rising fraction. For the exact schedule",
            "pass Trainer(optimizers=(optimizer, torch.optim.lr_scheduler.OneCycleLR(optimizer,",
            "max_lr=learning_rate, total_steps=steps, pct_start=warmup, cycle_momentum=False))).",
        ]
    return ("constant_with_warmup" if config.warmup_fraction > 0 else "constant"), []


def _hf_optimizer(config: TrialConfig) -> str:
    """TrainingArguments' ``optim`` for the configuration's optimizer: AdamW fused where the
    loss is scaled, as the trials trained it (GradScaler's overflow check then stays on the
    GPU). The Trainer has no fused SGD: such an SGD trains unfused there, its step reading the
    check back."""
    from autotune.semantics import scales_loss

    if config.optimizer == "sgd":
        return "sgd"
    return "adamw_torch_fused" if scales_loss(config.precision) else "adamw_torch"


def _hf(best: BestConfig) -> dict[str, Any]:
    config = best.config
    precision = config.precision
    scheduler, notes = _hf_schedule(best)
    warmup = config.warmup_fraction or (0.3 if config.schedule == "onecycle" else 0.0)
    if warmup > 0:
        notes = [  # one comment line each
            *notes,
            "warm-up: the Trainer's starts from a learning rate of 0 at its first step, the",
            "study's from learning_rate / warmup steps: one optimizer step further along, the",
            "two meet at the end of the warm-up. TrainingArguments has no setting for it.",
        ]
    precision_comment = searched(best, "precision", f"autotune's {precision}")
    lightning_precision, matmul, conv_tf32 = _precision(precision)
    arguments = [
        tuned(best, "per_device_train_batch_size", "batch_size", "per micro-batch"),
        tuned(
            best,
            "gradient_accumulation_steps",
            "accumulation_steps",
            f"effective batch {config.effective_batch_size}",
        ),
        Argument("num_train_epochs", literal(best.epochs), "the full run"),
        Argument("learning_rate", literal(config.lr), searched(best, "lr", lr_text(config))),
        Argument("optim", literal(_hf_optimizer(config)), searched(best, "optimizer")),
    ]
    if config.optimizer == "sgd":
        options = f"momentum={config.momentum or 0.0!r},nesterov={config.nesterov}"
        arguments.append(Argument("optim_args", literal(options), searched(best, "momentum")))
    arguments += [
        tuned(best, "weight_decay", "weight_decay"),
        Argument("lr_scheduler_type", literal(scheduler), searched(best, "schedule")),
        Argument(
            "warmup_steps",
            literal(warmup),
            searched(best, "warmup_fraction", "below 1: a fraction of the steps"),
        ),
        Argument("max_grad_norm", "0.0", "the study did not clip gradients (default 1.0)"),
        Argument("bf16", literal(lightning_precision == "bf16-mixed"), precision_comment),
        Argument("fp16", literal(lightning_precision == "16-mixed")),
        Argument("tf32", *_HF_TF32[matmul, conv_tf32]),
        Argument("torch_compile", literal(config.compile != "none"), searched(best, "compile")),
    ]
    if config.compile not in ("none", "default"):
        arguments.append(Argument("torch_compile_mode", literal(config.compile)))
    arguments += loader_arguments(best, "dataloader_")
    arguments.append(Argument("per_device_eval_batch_size", literal(config.val_batch_size)))
    arguments.append(Argument("seed", literal(config.seed), "the trial's seed"))
    if config.device == "cpu":
        arguments.append(Argument("use_cpu", "True", "where the study trained"))
    if config.distributed:
        arguments.append(
            Argument(
                "ddp_bucket_cap_mb",
                literal(config.ddp_bucket_cap_mb),
                f"the trial's {config.world_size} processes: torchrun --nproc-per-node "
                f"{config.world_size} YOUR_SCRIPT",
            )
        )
    outside = []
    if config.weight_decay > 0:
        outside.append(
            "weight decay: the Trainer exempts biases and norm weights; the study decayed every "
            "parameter."
        )
    if config.channels_last:
        outside.append(
            "channels_last: model = model.to(memory_format=torch.channels_last) before Trainer"
        )
    if config.cudnn_benchmark:
        outside.append("cudnn_benchmark: torch.backends.cudnn.benchmark = True before training")
    if config.device.startswith("cuda:"):
        outside.append(
            f"device {config.device}: run with CUDA_VISIBLE_DEVICES={config.device[5:]}"
        )
    if config.dataloader_timeout > 0:
        outside.append(f"dataloader_timeout {config.dataloader_timeout:g} s: no such field")
    # dataloader_drop_last would drop evaluation's last batch too: every one, where the
    # validation split is smaller than per_device_eval_batch_size (the study scored them all)
    outside.append(
        "drop_last: the trials skipped each epoch's last partial batch "
        "(here it would skip eval's too)"
    )
    return {
        "imports": {Import("typing", "Any"), Import("transformers", "TrainingArguments")},
        "arguments": arguments,
        "notes": outside + notes + _not_applicable(best, "the Trainer"),
    }


def render_framework(best: BestConfig, fmt: str) -> str:
    """The text of a ``lightning`` or ``hf`` export of ``best``: a Python file of the settings
    to paste into a LightningModule and Trainer, or into TrainingArguments."""
    model, data = (str(best.workload.get(key, "unknown")) for key in ("model", "data"))
    _check(best)
    fields = _lightning(best) if fmt == "lightning" else _hf(best)
    imports = fields.pop("imports")
    template = template_environment().get_template(f"{fmt}.py.j2")
    return template.render(
        provenance=provenance_rows(best, model, data), import_block=import_block(imports), **fields
    )
