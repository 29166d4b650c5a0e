"""Optional packages, imported in one place (as Optuna's ``_imports.try_import``): a feature
that needs one asks here, and says in one line what to install where it is missing."""

from __future__ import annotations

import importlib
from types import ModuleType


def optional(module: str) -> ModuleType | None:
    """``module`` imported, or None where it (or something it imports) is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
