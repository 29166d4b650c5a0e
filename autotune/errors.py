"""The one base class of every error a user can cause and fix.

A bad space file, an unknown model or study, a missing GPU, a file that exists already: each is
raised as a subclass of ``UserError`` with a message of one line (or a few, for a diff), and the
command-line interface prints it without a traceback and exits non-zero. Anything else that
escapes is a bug, and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix (a file, an argument, the machine): shown as one line."""


class WorkerError(UserError):
    """The worker could not start (e.g. the workload fails to load there)."""


class ReportFailed(Exception):
    """The study process could not take a trial's evaluation (its database failed, or stopped
    answering for longer than it waits): the study's own fault, never the configuration's, so
    every stage raises it on rather than recording a fault of the trial. ``error`` is what
    failed."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"recording an evaluation failed: {error}")
        self.error = error
