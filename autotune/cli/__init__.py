"""The ``autotune`` command: parses arguments, calls the modules, prints for people.

Heavy modules (torch, Optuna, scikit-learn) are imported inside the commands, so that
``autotune --help`` and a typo in a space file answer at once. The commands that train are
``_run`` (run) and ``_confirm`` (confirm, verify); those that read a study are ``_inspect``'s
(best, export, report, dashboard, studies; ``_delete`` for ``studies --delete``). Importing
them registers them.
"""

from __future__ import annotations

# importing registers the commands, in the order --help lists them
from autotune.cli import _run  # noqa: F401

# isort: split
from autotune.cli import _inspect  # noqa: F401
from autotune.cli._common import app


def main() -> None:
    """Entry point of the ``autotune`` console script."""
    app()
