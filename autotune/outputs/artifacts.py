"""Where a study's artifacts (exported scripts, HTML reports) are kept for optuna-dashboard.

A SQLite study keeps them in ``artifacts/`` beside its database file: one machine, one folder.
Any other storage (PostgreSQL) is shared by machines that see different working directories, so
its artifacts go only where the user names them, with ``--artifacts`` or ``$AUTOTUNE_ARTIFACTS``:
a folder every machine sees (Optuna's ``FileSystemArtifactStore``), or ``s3://bucket`` (Optuna's
``Boto3ArtifactStore``; boto3 is the user's to install, and reads its credentials the usual way).
Nothing is ever put silently into the current directory.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.errors import UserError

if TYPE_CHECKING:
    import optuna
    from optuna.artifacts._protocol import ArtifactStore

ARTIFACTS_ENV = "AUTOTUNE_ARTIFACTS"  # the default of --artifacts

# S3 bucket names: 3 to 63 lowercase letters, digits, dots and hyphens
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass(frozen=True)
class ArtifactLocation:
    """An artifact store the study's files go to: a folder, or an S3 bucket (``bucket`` set)."""

    folder: Path | None = None
    bucket: str | None = None

    def __str__(self) -> str:
        return f"s3://{self.bucket}" if self.bucket else str(self.folder)


def _parse(where: str) -> ArtifactLocation:
    """``s3://bucket`` or a folder path; a bad bucket name or an S3 key prefix is a UserError."""
    if "://" not in where:
        if not where.strip():
            raise UserError("--artifacts: empty; give a folder, or s3://bucket")
        return ArtifactLocation(folder=Path(where).expanduser())
    scheme, _, rest = where.partition("://")
    if scheme != "s3":
        raise UserError(
            f"--artifacts {where}: unknown scheme '{scheme}://'; give a folder, or s3://bucket"
        )
    bucket, _, prefix = rest.partition("/")
    if prefix.strip("/"):
        raise UserError(
            f"--artifacts {where}: Optuna's S3 store writes to the top of a bucket, with no key "
            f"prefix; give s3://{bucket}"
        )
    if not _BUCKET.fullmatch(bucket):
        raise UserError(f"--artifacts {where}: '{bucket}' is not an S3 bucket name")
    location = ArtifactLocation(bucket=bucket)
    _need_boto3(location)  # said before anything is written, not after
    return location


def _need_boto3(location: ArtifactLocation) -> None:
    if importlib.util.find_spec("boto3") is None:  # Boto3ArtifactStore makes its client
        raise UserError(
            f"--artifacts {location}: an S3 artifact store needs boto3 (pip install boto3)"
        )


def locate(storage_url: str, artifacts: str | None) -> ArtifactLocation | None:
    """Where this study's artifacts go: the ``--artifacts`` the user gave, else ``artifacts/``
    beside a SQLite database file, else None (a shared storage with no store named)."""
    if artifacts:
        return _parse(artifacts)
    if storage_url.startswith("sqlite:///") and storage_url != "sqlite:///:memory:":
        return ArtifactLocation(
            folder=Path(storage_url.removeprefix("sqlite:///")).parent / "artifacts"
        )
    return None


def open_store(location: ArtifactLocation, create: bool) -> ArtifactStore | None:
    """The Optuna artifact store at ``location``. A folder is made when ``create``; else a folder
    that does not exist yet gives None (nothing attached there so far). No boto3 is a UserError."""
    from optuna.artifacts import Boto3ArtifactStore, FileSystemArtifactStore

    if location.bucket is not None:
        _need_boto3(location)
        return Boto3ArtifactStore(location.bucket)
    assert location.folder is not None
    if create:
        try:
            location.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(
                f"--artifacts {location}: cannot make the folder: {err.strerror}"
            ) from None
    elif not location.folder.is_dir():
        return None
    return FileSystemArtifactStore(str(location.folder))


def upload(study: optuna.Study, path: Path, location: ArtifactLocation) -> str:
    """Attach a file (an exported script, a report) to the study as an Optuna artifact; its id."""
    from optuna.artifacts import upload_artifact

    store = open_store(location, create=True)
    assert store is not None  # made above
    return upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=study)
