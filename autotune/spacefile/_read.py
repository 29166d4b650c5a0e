"""A space file's text and YAML, read within bounds: a hostile or broken file (a YAML "billion
laughs" of nested aliases, a multi-gigabyte file, a device that never ends) is one line, never
the machine's memory and time. What the YAML means is ``_spec``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from autotune.spacefile._knobs import SpecError

MAX_SPACE_FILE_BYTES = 1_000_000
MAX_SPACE_VALUES = 20_000  # keys, values and items once every alias is expanded


def read_text(path: Path | str) -> str:
    """The text of the space file at ``path``; SpecError (one line) where it cannot be one."""
    file = Path(path)
    try:
        with file.open("rb") as stream:  # bounded: a device or pipe may never end
            data = stream.read(MAX_SPACE_FILE_BYTES + 1)
        if len(data) > MAX_SPACE_FILE_BYTES:
            raise SpecError([_too_large(str(file))])
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise SpecError([f"{file}: no such file"]) from None
    except IsADirectoryError:
        raise SpecError([f"{file}: is a directory, not a space file"]) from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError([f"{file}: cannot read: {err}"]) from None
    return text


def read_yaml(text: str, name: str) -> tuple[yaml.Node | None, Any]:
    """``text`` composed (its nodes, for their lines) and loaded; SpecError (one line, at the
    file's line and column where YAML says) for a file too large or not YAML."""
    if len(text) > MAX_SPACE_FILE_BYTES:
        raise SpecError([_too_large(name)])
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None and _expanded_values(node, MAX_SPACE_VALUES) > MAX_SPACE_VALUES:
            raise SpecError(
                [
                    f"{name}: its aliases expand to more than {MAX_SPACE_VALUES:,} values (or to "
                    f"themselves); a space file needs a few dozen, so it was not read further"
                ]
            )
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
        problem = getattr(err, "problem", None) or str(err)
        if name.endswith(".py"):  # the workload's module given in place of its space file
            problem += (
                "; a space file is YAML: name this module's functions in it "
                f"(workload.model: {name.rsplit('/', 1)[-1][:-3]}:function)"
            )
        raise SpecError([f"{where}: invalid YAML: {problem}"]) from None
    return node, raw


def _expanded_values(node: yaml.Node, limit: int) -> int:
    """How many nodes ``node`` stands for once aliases are expanded, counting only up to ``limit``.

    Shared (aliased) nodes are sized once and their size reused, so the work is linear in the
    file however far its aliases would expand; a node that contains itself counts as unbounded.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(current: yaml.Node) -> int:
        key = id(current)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:  # an alias to an ancestor: infinitely deep once expanded
            return limit + 1
        open_nodes.add(key)
        total = 1
        if isinstance(current, yaml.MappingNode):
            children = [child for pair in current.value for child in pair]
        elif isinstance(current, yaml.SequenceNode):
            children = list(current.value)
        else:
            children = []
        for child in children:
            total += size(child)
            if total > limit:
                break
        open_nodes.discard(key)
        sizes[key] = min(total, limit + 1)
        return sizes[key]

    return size(node)


def _too_large(name: str) -> str:
    return (
        f"{name}: too large for a space file (more than {MAX_SPACE_FILE_BYTES:,} bytes); "
        f"is this the right file?"
    )
