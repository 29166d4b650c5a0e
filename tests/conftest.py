"""Fixtures the test files share. Plain helpers (this machine and described ones, a plain
TrialConfig, tiny space files, the real ``autotune`` command) live in ``autotune.testing``."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.testing import make_config, write_space

__all__ = ["make_config"]  # tests/test_interference.py still imports it from here


@pytest.fixture
def tiny_space(tmp_path: Path) -> Path:
    return write_space(tmp_path)
