"""Writing files for people: all at once (never half-written), never over theirs unasked."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from autotune.errors import UserError


class OutputFileError(UserError):
    """A file that cannot be written as asked (it exists, its directory does not): one line."""


def make_folder_for(path: Path, parents: bool = False) -> list[Path]:
    """Create the folder ``path`` goes in where it is missing (a study's ``studies/``), and with
    ``parents`` the missing ones above it too (``-o runs/b/train.py``); the folders created,
    outermost first, for the caller to say. Without ``parents``, OutputFileError when more than
    the last folder is missing: a typo in a path must not make folders silently at the root.
    OSError when a folder cannot be made (a full or read-only disk)."""
    folder = path.parent if str(path.parent) else Path(".")
    missing = [f for f in (folder, *folder.parents) if not f.is_dir()][::-1]
    if len(missing) > 1 and not parents:
        raise OutputFileError(
            f"cannot write {path}: there is no directory {folder.parent} (autotune makes the "
            "last folder of a path, not the ones above it)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def write_new_file(path: Path, text: str, force: bool = False) -> None:
    """Write ``text`` to ``path`` all at once (temporary file, then rename): never half-written;
    an existing file is kept unless ``force``. OutputFileError when it cannot be written."""
    if path.is_dir():
        raise OutputFileError(f"cannot write {path}: it is a directory")
    if path.exists() and not force:
        raise OutputFileError(f"{path} exists; pass --force to replace it")
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise OutputFileError(f"cannot write {path}: there is no directory {directory}")
    try:
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", text=True)
    except OSError as err:
        raise OutputFileError(f"cannot write {path}: {err.strerror}") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # as a plain open() would have made it
        os.replace(temporary, path)
    except OSError as err:
        Path(temporary).unlink(missing_ok=True)
        raise OutputFileError(f"cannot write {path}: {err.strerror}") from None
