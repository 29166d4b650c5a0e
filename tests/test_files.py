"""Files written for people: all at once, and only where a file can be."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.files import OutputFileError, make_folder_for, write_new_file


def test_a_file_is_written_only_where_a_file_can_be(tmp_path: Path):
    with pytest.raises(OutputFileError, match="there is no directory"):
        write_new_file(tmp_path / "no" / "dir.py", "text")
    with pytest.raises(OutputFileError, match="it is a directory"):
        write_new_file(tmp_path, "text")
    assert list(tmp_path.iterdir()) == []  # no half-written files


def test_the_last_folder_of_a_path_is_made_never_the_ones_above_it_unasked(tmp_path: Path):
    """Issue 41: `export -o /nonexistent/dir/t.py` made folders from the root down, silently."""
    assert make_folder_for(tmp_path / "runs" / "train.py") == [tmp_path / "runs"]
    assert make_folder_for(tmp_path / "runs" / "train.py") == []  # there already
    with pytest.raises(OutputFileError, match=r"there is no directory .*typo"):
        make_folder_for(tmp_path / "typo" / "deeper" / "train.py")
    assert not (tmp_path / "typo").exists()
    deep = tmp_path / "a" / "b" / "t.py"  # asked for (export -o): made, and named to be said
    assert make_folder_for(deep, parents=True) == [tmp_path / "a", tmp_path / "a" / "b"]
    assert deep.parent.is_dir()
