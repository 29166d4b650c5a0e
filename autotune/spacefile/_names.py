"""What a name printed on terminals may hold: no control or format characters."""

from __future__ import annotations

import unicodedata
from typing import Annotated

from pydantic import AfterValidator


def is_unprintable(char: str) -> bool:
    """A control or format character (an escape, a newline, NUL, a bidi override, a line or
    paragraph separator): a terminal obeys it rather than showing it."""
    return unicodedata.category(char)[0] == "C" or char in "\u2028\u2029"


def _printable(value: str) -> str:
    if any(map(is_unprintable, value)):
        raise ValueError(
            "a study name cannot hold control or format characters (escape sequences, "
            "newlines, tabs, bidi overrides, NUL): it is printed on terminals"
        )
    return value


# a study's name: shown by run, studies and best, and in every command offered to copy
PrintableName = Annotated[str, AfterValidator(_printable)]
