"""An export in the format asked: the standalone script (``_script``), YAML or JSON of the
configuration, or the settings of a Lightning or Hugging Face Trainer (``_frameworks``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import optuna
import yaml

from autotune.export._api import BestConfig, ExportError
from autotune.export._bundle import literal
from autotune.export._frameworks import render_framework
from autotune.export._script import render_script

FORMATS = {  # each format, and what it writes
    "script": "training script",
    "yaml": "YAML",
    "json": "JSON",
    "lightning": "Lightning settings",
    "hf": "Hugging Face TrainingArguments",
}


def render(
    best: BestConfig,
    fmt: str,
    study: optuna.Study | None = None,
    script_name: str = "train.py",
    rebuild_workload: bool = False,
    script_dir: Path | None = None,
) -> str:
    """The text of an export in ``fmt`` (script, yaml, json, lightning or hf); ``rebuild_workload``
    lets a script export import and run the study's own model and data code (``workload_code``);
    ``script_dir`` is where the script will be, so that it finds the user's modules from there
    (without it, the folders the study found them in are written as they are)."""
    if fmt == "json":
        data = best.to_dict()
        found = _non_finite(data)
        if found is not None:  # JSON has no NaN or infinity; writing null would change a value
            raise ExportError(
                f"{found[0]} is {found[1]}, which JSON cannot hold: export with --format yaml "
                f"(it writes .nan and .inf) or as a script"
            )
        return json.dumps(data, indent=2, allow_nan=False) + "\n"
    if fmt == "yaml":
        header = (  # the name is the user's: a line break in it would end the comment
            f"# autotune configuration: study {literal(best.study)}, trial {best.trial}, "
            f"{best.headline}\n"
        )
        return header + yaml.safe_dump(best.to_dict(), sort_keys=False)
    if fmt in ("lightning", "hf"):
        return render_framework(best, fmt)
    if fmt == "script":
        if study is None:
            raise ValueError("a script export needs the study")
        return render_script(study, best, script_name, rebuild_workload, script_dir)
    raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")


def _non_finite(value: Any, where: str = "") -> tuple[str, float] | None:
    """(dotted path, value) of the first NaN or infinity in plain data, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list | tuple):
        items = list(enumerate(value))
    else:
        return None
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None
