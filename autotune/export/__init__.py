"""Export the winning configuration: a standalone training script, YAML/JSON, or Python objects.

autotune export --study quickstart -o train.py           # a script that imports no autotune
autotune export --study quickstart --format yaml -o best.yaml
autotune export --study quickstart --format lightning -o lightning_settings.py  # or --format hf

The Python objects (``autotune.load_best``, a BestConfig): the example in ``autotune``'s
docstring. Its modules: ARCHITECTURE.md.
"""

from autotune.display import TrialConfirmation, confirmation_text
from autotune.export._api import (
    BestConfig,
    ExportError,
    StudyObjective,
    best_config,
    load_best,
    load_config,
    select_trial,
    study_spec,
)
from autotune.export._formats import FORMATS, render
from autotune.export._script import render_script

__all__ = [
    "FORMATS",
    "BestConfig",
    "ExportError",
    "StudyObjective",
    "TrialConfirmation",
    "best_config",
    "confirmation_text",
    "load_best",
    "load_config",
    "render",
    "render_script",
    "select_trial",
    "study_spec",
]
