"""The space file: frozen pydantic models of ``space.yaml``, and ``load_spec`` with line numbers.

A space file has four sections::

    study:     name, storage, n_trials, timeout, sampler, pruner, seed
    workload:  model, data, epochs per trial, evaluation interval, device
    objective: metric, score, higher_is_better, min_score, target_score, full_run_epochs
    space:     the knobs; each is a fixed scalar, a list (categorical) or {low, high, log, step}

Everything is validated once, here. A problem the user made is reported as one line naming the
file, the line and the key path (``quick.yaml:7: space.lr: low (0.1) is greater than high
(0.001)``), with the closest valid key for a typo. Nothing in this package knows about Optuna.

The package is split in three modules, everything other modules use re-exported here:

- ``_knobs``: the shapes a knob of the registry (``autotune.knobs``) takes (``Choice``,
  ``IntRange``, ``FloatRange``), how a knob's YAML value is read, the ``space`` section
  (``SpaceSpec``) and ``SpecError``;
- ``_sections``: the ``study``, ``workload`` and ``objective`` sections (``StudySpec``,
  ``WorkloadSpec``, ``ObjectiveSpec``) and the names they accept (``SCORES``, ``LOSSES``, ...);
- ``_spec``: the whole file (``Spec``) and its loading (``parse_spec``, ``load_spec``), which
  puts file:line on every error; ``Spec.with_overrides`` words its errors the same way.
"""

from autotune.knobs import DDP_KNOBS, KNOBS, KnobInfo
from autotune.spec._knobs import (
    Choice,
    FloatRange,
    IntRange,
    Knob,
    SpaceSpec,
    SpecError,
    knobs_for,
)
from autotune.spec._names import is_unprintable
from autotune.spec._sections import ConfirmSpec, ObjectiveSpec, StudySpec, WorkloadSpec
from autotune.spec._spec import Spec, load_spec, parse_spec

# isort: split
# the other names importable from autotune.spec before the split, not in __all__ as then
from autotune.spec._knobs import Scalar  # noqa: F401
from autotune.spec._sections import (  # noqa: F401
    DEFAULT_STORAGE,
    LOSSES,
    MODEL_FAMILY_NAMES,
    SCORES,
    STRATEGIES,
    SpeedSpec,
)
from autotune.spec._spec import MAX_SPACE_FILE_BYTES, MAX_SPACE_VALUES  # noqa: F401

__all__ = [
    "DDP_KNOBS",
    "KNOBS",
    "Choice",
    "ConfirmSpec",
    "FloatRange",
    "IntRange",
    "Knob",
    "KnobInfo",
    "ObjectiveSpec",
    "SpaceSpec",
    "Spec",
    "SpecError",
    "StudySpec",
    "WorkloadSpec",
    "is_unprintable",
    "knobs_for",
    "load_spec",
    "parse_spec",
]
