"""The ``autotune`` command: parses arguments, calls the modules, prints for people.

Heavy modules (torch, Optuna, scikit-learn) are imported inside the commands, so that
``autotune --help`` and a typo in a space file answer at once. Importing a module registers its
commands; which module holds which: ARCHITECTURE.md.
"""

from __future__ import annotations

# importing registers the commands, in the order --help lists them
from autotune.cli import _run  # noqa: F401

# isort: split
from autotune.cli import _inspect, _studies  # noqa: F401
from autotune.cli._common import app


def main() -> None:
    """Entry point of the ``autotune`` console script."""
    app()
