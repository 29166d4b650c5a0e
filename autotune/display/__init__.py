"""What people see: the live study display (``_live``), the tables printed around it (``_tables``)
and how values and commands are written (``_text``)."""

from autotune.display._live import LiveObserver, confirmation_progress, live_progress
from autotune.display._tables import config_table, print_confirmation, print_plan, print_summary
from autotune.display._text import (
    METRIC_NOTES,
    METRIC_UNITS,
    command,
    fmt,
    fmt_metric,
    print_command,
    print_item,
    study_options,
)

__all__ = [
    "METRIC_NOTES",
    "METRIC_UNITS",
    "LiveObserver",
    "command",
    "config_table",
    "confirmation_progress",
    "fmt",
    "fmt_metric",
    "live_progress",
    "print_command",
    "print_confirmation",
    "print_item",
    "print_plan",
    "print_summary",
    "study_options",
]
