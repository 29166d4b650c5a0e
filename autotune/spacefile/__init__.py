"""The space file: frozen pydantic models of ``space.yaml``, and ``load_spec`` with line numbers.

A space file has four sections::

    study:     name, storage, n_trials, timeout, sampler, pruner, seed
    workload:  model, data, epochs per trial, evaluation interval, device
    objective: metric, score, higher_is_better, min_score, target_score, full_run_epochs
    space:     the knobs; each is a fixed scalar, a list (categorical) or {low, high, log, step}

Everything is validated once, here. A problem the user made is reported as one line naming the
file, the line and the key path (``quick.yaml:7: space.lr: low (0.1) is greater than high
(0.001)``), with the closest valid key for a typo. Nothing in this package knows about Optuna.

Its modules: ARCHITECTURE.md.
"""

# re-exports: what other modules import from autotune.spacefile
from autotune.knobs import DDP_KNOBS, KNOBS  # noqa: F401
from autotune.spacefile._knobs import Choice, FloatRange, IntRange, Knob, SpecError, knobs_for  # noqa: F401
from autotune.spacefile._sections import (  # noqa: F401
    DEFAULT_STORAGE,
    SCORES,
    ObjectiveSpec,
    is_unprintable,
)
from autotune.spacefile._spec import Spec, error_line, load_spec, parse_spec  # noqa: F401
from autotune.spacefile._workload import (  # noqa: F401
    LOSSES,
    MODEL_FAMILY_NAMES,
    WorkloadSpec,
    is_argument_name,
)
