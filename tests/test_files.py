"""Files written for people: all at once, and only where a file can be."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.files import OutputFileError, write_new_file


def test_a_file_is_written_only_where_a_file_can_be(tmp_path: Path):
    with pytest.raises(OutputFileError, match="there is no directory"):
        write_new_file(tmp_path / "no" / "dir.py", "text")
    with pytest.raises(OutputFileError, match="it is a directory"):
        write_new_file(tmp_path, "text")
    assert list(tmp_path.iterdir()) == []  # no half-written files
