"""What people see: the live study display (``_live``), the tables printed around it (``_tables``),
``autotune verify``'s lines and table (``_verification``), the confirmation's verdict in the one
wording every rendering says it in (``_confirmation``) and how values and commands are written
(``_text``)."""

# ruff: noqa: F401  (this package re-exports what its modules define)
from typing import TYPE_CHECKING, Any

from autotune.display._confirmation import (
    TrialConfirmation,
    confirmation_cost,
    confirmation_rows,
    confirmation_text,
    flagged_measurements,
    noisy_round,
    print_confirmation,
    round_figures,
    runs_used_note,
)
from autotune.display._plan import print_other_device, print_plan
from autotune.display._tables import (
    SPEED_COLUMNS,
    config_table,
    finished_any,
    knob_rows,
    measured_flags,
    no_answer,
    off_stage_one,
    print_summary,
    speed_rows,
)
from autotune.display._text import (
    METRIC_NOTES,
    TO_TARGET,
    command,
    describe_shares,
    fmt,
    fmt_metric,
    fmt_within,
    lr_text,
    metric_unit,
    plural,
    print_command,
    print_fact,
    print_item,
    storage_back,
    storage_waiting,
    study_options,
    value_text,
    visible,
)
from autotune.display._verification import (
    print_verification,
    print_verify_plan,
    verification_rows,
    verify_progress,
)

if TYPE_CHECKING:
    from autotune.display._live import (
        LiveObserver,
        OthersShown,
        confirmation_progress,
        live_progress,
    )

# _live observes the run loop (autotune.study._run, which imports the trainer and torch): it is
# imported on first use, so that the commands that read a study do not load torch.
_LIVE = {"LiveObserver", "OthersShown", "confirmation_progress", "live_progress"}


def __getattr__(name: str) -> Any:
    if name in _LIVE:
        from autotune.display import _live

        return getattr(_live, name)
    raise AttributeError(f"module 'autotune.display' has no attribute {name!r}")
