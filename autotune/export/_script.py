"""The standalone training script: the chosen configuration rendered into ``train.py.j2``.

The script imports torch (and the user's own ``module:function`` entry points), never autotune:
built-in workloads and the trials' loaders (``pipeline``) are pasted into it (``_bundle``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2
import optuna

from autotune.display import fmt
from autotune.export._api import BestConfig, ExportError, study_spec
from autotune.export._bundle import Import, bundle, import_block, literal
from autotune.export._header import comment_text, has_schedule, knob_notes, provenance_rows
from autotune.machine import interference
from autotune.spacefile import SCORES, SpecError, parse_spec
from autotune.study import StudyRecord

_PLAIN_FILE_NAME = re.compile(r"^[\w.+-]+$", re.ASCII)  # shown as it is in the docstring


def _infeasible_reason(best: BestConfig, spec: Any) -> str:
    """Why ``best`` is not an answer, in autotune's words (numbers only, no user text)."""
    goal, score = spec.objective, best.metrics.get("score")
    floor = goal.bar
    if floor is not None and isinstance(score, float) and score < floor:
        return f"validation {goal.score_name} {fmt(score)} is below {goal.bar_name} {floor:g}"
    return "it violated a constraint: a fault, or a requirement it missed"


def template_environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("autotune", "templates"),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # Python source, not HTML
    )
    environment.filters["literal"] = literal
    environment.filters["comment"] = comment_text  # one line of printable ASCII
    return environment


def _unreadable_spec(study: optuna.Study) -> str:
    """Why ``study_spec`` found no space file in ``study``, on one line."""
    text = StudyRecord.of(study).space_file
    try:
        parse_spec(text or "", "its space file")
    except SpecError as err:
        if text:  # the study's own file was accepted when it ran: somebody changed it since
            problem = " ".join(err.problems[0].split())
            return f"holds a space file autotune refuses ({problem}); was its database edited?"
    return "does not hold a readable space file"


def render_script(
    study: optuna.Study,
    best: BestConfig,
    script_name: str = "train.py",
    rebuild_workload: bool = False,
    script_dir: Path | None = None,
) -> str:
    """A standalone training script (imports no autotune) for ``best``'s configuration, to be
    written in ``script_dir`` (see ``render``)."""
    # the workload's layout and the bundled code import torch: YAML and JSON need neither
    from autotune import semantics
    from autotune.export._workload import recorded_layout, split_return, workload_code
    from autotune.training import clocks
    from autotune.training.timing import TrainClock
    from autotune.training.trainer import seed_everything
    from autotune.workloads import batches, loss_function

    spec = study_spec(study)
    if spec is None:
        raise ExportError(
            f"study '{study.study_name}' {_unreadable_spec(study)}; export it with --format yaml "
            f"or json instead"
        )
    layout = recorded_layout(study)
    # logits with the classes last are read through logits_of, as other structures are
    classes_last = bool(StudyRecord.of(study).classes_last)
    structured = not layout.is_pair or spec.workload.loss != "cross_entropy" or classes_last
    config = best.config
    goal = spec.objective
    workload_imports, workload_fields = workload_code(
        study, spec, config.data_pipeline == "device", rebuild_workload, script_dir
    )
    imports = {
        *map(Import, ("argparse", "json", "random", "shlex", "torch")),
        Import("numpy", alias="np"),
        Import("pathlib", "Path"),
        *workload_imports,
    }
    if config.distributed:  # torchrun's processes
        imports |= {
            *map(Import, ("gc", "os")),
            Import("torch.distributed", alias="dist"),
            Import("torch.nn.parallel", "DistributedDataParallel"),
        }
    # what training means, the trials' own functions (autotune.semantics), and how the study
    # moved a batch to the device and took its loss (autotune.workloads): pasted
    training: list[Any] = [
        semantics.make_optimizer,
        semantics.set_cuda_flags,
        semantics.TrainingSteps,
        seed_everything,
        batches.to_device,
        # the trials' intra-op threads: the cores others leave idle
        interference.own_cores,
        interference.idle_cores,
        interference.process_ticks,
        # the trials' clocks and their rule for the steady speed
        TrainClock,
        clocks.Epochs,
        clocks.SteadyPace,
        clocks.warmup_steps,
    ]
    if not config.distributed:  # others' share of its cores while it trains, as a trial's
        training.append(interference.CpuMeter)  # (a rank would count its peers on the cores)
    has_scheduler = has_schedule(config)
    if has_scheduler:
        training.append(semantics.make_scheduler)
    if config.compile in semantics.CUDA_GRAPH_MODES:
        training.append(semantics.keep_grads_outside_graphs)
    if goal.score in SCORES:
        training += [semantics.validation_sums, semantics.builtin_score]
    if not workload_fields["loss_import"]:  # a built-in loss
        loss = loss_function(spec.workload.loss, classes_last=classes_last)
        training.append(loss)
        workload_fields["loss_function"] = loss.__name__
    training_sources, training_imports = bundle(training)
    imports |= training_imports
    compile_mode = None if config.compile == "none" else config.compile
    return (
        template_environment()
        .get_template("train.py.j2")
        .render(
            # model and data are dotted names (spec checks them), safe in a docstring
            title=f"Train {spec.workload.model} on {spec.workload.data} with the configuration "
            f"autotune found.",
            provenance=provenance_rows(best, spec.workload.model, spec.workload.data),
            script_name=script_name if _PLAIN_FILE_NAME.match(script_name) else "<this file>",
            import_block=import_block(imports - {Import("sys")}),  # sys: before them
            interrupted_imports=True,
            best=best,
            config=config,
            constants=knob_notes(best),
            trial_threads=best.metrics.get("intra_op_threads"),
            **workload_fields,
            training_sources=training_sources,
            has_scheduler=has_scheduler,
            scales_loss=semantics.scales_loss(config.precision),
            compile_mode=compile_mode,
            train_model="train_model" if compile_mode or config.distributed else "model",
            grads_in_place=config.compile in semantics.CUDA_GRAPH_MODES,
            structured=structured,
            infeasible_reason=_infeasible_reason(best, spec),
            split_return=split_return(layout) if structured and not layout.batch_fn_name else None,
            score_kind=goal.score if goal.score in SCORES else "function",
            top_k=semantics.TOP_K if goal.score == "top5" else 1,
            classes_last=classes_last,
            score_label=goal.score_name,
        )
    )
