"""Optional packages are asked for in one place."""

from __future__ import annotations

import json

from autotune._imports import optional


def test_an_installed_package_is_imported_and_a_missing_one_is_none() -> None:
    assert optional("json") is json
    assert optional("autotune_no_such_package") is None
    assert optional("json.no_such_module") is None
