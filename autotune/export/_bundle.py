"""Python source for generated scripts: built-in code pasted with the imports it needs, entry
points imported, values written as literals."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import math
import sys
import sysconfig
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

from autotune.spacefile import is_argument_name

_STDLIB = sys.stdlib_module_names


@dataclass(frozen=True, order=True)
class Import:
    module: str
    name: str | None = None  # None: ``import module``
    alias: str | None = None

    @property
    def bound(self) -> str:
        return self.alias or self.name or self.module.split(".")[0]


def import_block(imports: set[Import]) -> str:
    """Import statements grouped (standard library, then others) and ordered as isort does."""

    def name_key(name: str) -> tuple[int, str]:
        kind = 0 if name.isupper() and len(name) > 1 else 1 if name[0].isupper() else 2
        return kind, name

    def alias(name: str, alias_name: str | None) -> str:
        return f"{name} as {alias_name}" if alias_name else name

    groups = []
    for stdlib in (True, False):
        chosen = [i for i in imports if (i.module.split(".")[0] in _STDLIB) == stdlib]
        plain = sorted({alias(i.module, i.alias) for i in chosen if i.name is None})
        lines = [f"import {p}" for p in plain]
        modules = sorted({i.module for i in chosen if i.name is not None}, key=str.lower)
        for module in modules:
            names = sorted(
                {(i.name, i.alias) for i in chosen if i.module == module and i.name},
                key=lambda n: name_key(n[0]),
            )
            lines.append(f"from {module} import {', '.join(alias(n, a) for n, a in names)}")
        if lines:
            groups.append("\n".join(lines))
    return "\n\n".join(groups)


def _module_imports(tree: ast.Module) -> dict[str, Import]:
    """Top-level imports of a module, by the name each binds."""
    found: list[Import] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            found += [Import(item.name, None, item.asname) for item in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__":
            found += [Import(node.module, item.name, item.asname) for item in node.names]
    return {each.bound: each for each in found}


def _top_level_names(node: ast.stmt) -> list[str]:
    """The names a module-level statement defines (functions, classes, assignments)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def bundle(objects: list[Any]) -> tuple[list[str], set[Import]]:
    """Sources of built-in functions and classes, with everything of autotune's they use.

    Each object's module is read once; the definitions the objects name (functions, classes,
    constants), and the ones those name in turn, are pasted in module order, with the imports
    they need. A name imported from another autotune module is pasted from that module too
    (before the code that uses it), so the script never imports autotune. This is how an
    exported script carries built-in workloads and the trials' loaders.
    """
    parsed: dict[str, tuple[str, ast.Module]] = {}
    chosen: dict[str, set[str]] = {}
    order: list[str] = []  # modules, each after the autotune modules it uses
    imports: set[Import] = set()

    def visit(module_name: str, names: list[str]) -> None:
        if module_name not in parsed:
            text = inspect.getsource(importlib.import_module(module_name))
            parsed[module_name] = text, ast.parse(text)
            chosen[module_name] = set()
        tree = parsed[module_name][1]
        definitions = {name: node for node in tree.body for name in _top_level_names(node)}
        available = _module_imports(tree)
        pending = list(names)
        while pending:
            name = pending.pop()
            if name in chosen[module_name] or name not in definitions:
                continue
            chosen[module_name].add(name)
            used = {n.id for n in ast.walk(definitions[name]) if isinstance(n, ast.Name)}
            for bound in sorted(used & available.keys()):
                found = available[bound]
                if found.module.split(".")[0] == "autotune" and found.name and not found.alias:
                    visit(found.module, [found.name])
                else:
                    imports.add(found)
            pending.extend(used & definitions.keys())
        if module_name not in order:
            order.append(module_name)

    for obj in objects:
        module = inspect.getmodule(obj)
        assert module is not None, obj  # built-ins are defined in modules
        visit(module.__name__, [obj.__name__])
    sources: list[str] = []
    for module_name in order:
        text, tree = parsed[module_name]
        lines = text.splitlines()
        for node in tree.body:
            if set(_top_level_names(node)) & chosen[module_name]:
                first = min(
                    [node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]
                )
                sources.append("\n".join(lines[first - 1 : node.end_lineno]))
    return sources, imports


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _string_literal(text: str) -> str:
    """``text`` as a double-quoted Python literal of printable ASCII only: every other character
    is an escape, so that a line separator (U+2028) cannot break a line of a YAML or Python
    file and a lone surrogate (from a file system name) cannot make the file unwritable."""

    def escaped(char: str) -> str:
        if char in _ESCAPES or " " <= char <= "~":
            return _ESCAPES.get(char, char)
        if char > "\x7f":  # \xNN, \uNNNN or \UNNNNNNNN, as Python writes them
            return char.encode("ascii", "backslashreplace").decode()
        return f"\\x{ord(char):02x}"  # a control character

    return '"' + "".join(map(escaped, text)) + '"'


def literal(value: Any) -> str:
    """Python source for plain data (what JSON holds, and tuples), that evaluates to ``value``
    exactly: strings in double quotes of ASCII only, NaN and infinity as ``float("nan")``."""
    if isinstance(value, str):
        return _string_literal(value)
    if isinstance(value, dict):
        items = ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items())
        return f"{{{items}}}"
    if isinstance(value, list):
        return f"[{', '.join(literal(v) for v in value)}]"
    if isinstance(value, tuple):
        inner = ", ".join(literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'  # nan, inf, -inf: float() reads what str() writes
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    raise TypeError(f"{type(value).__name__} is not plain data: {value!r}")


def entry_point(entry: str, search_dir: Path | None) -> tuple[str, str, str | None]:
    """(import line, call expression, folder the script puts on ``sys.path`` or None) of the
    user's ``module:function``, found without importing (so without running) it: beside the
    space file (``search_dir``), else by its top-level name (imported by
    ``--rebuild-workload``, installed, or on ``sys.path``: finding a top-level name executes
    nothing). A module that is not installed gets its folder (a namespace package: its first
    portion's) put on ``sys.path`` by the script, so that the script runs from anywhere."""
    module, _, attribute = entry.partition(":")
    import_line = f"from {module} import {attribute.split('.')[0]}"
    top = module.split(".")[0]
    if search_dir is not None and (
        (search_dir / f"{top}.py").is_file() or (search_dir / top).is_dir()
    ):
        return import_line, attribute, str(search_dir)
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    return import_line, attribute, _folder_to_add(found) if found is not None else None


def _folder_to_add(found: ModuleSpec) -> str | None:
    """The folder that holds the top-level module ``found`` (a file, a package's folder or a
    namespace package's first portion); None when it is installed or has no file (the script
    finds it by name, or says it cannot)."""
    portions = list(found.submodule_search_locations or [])
    if portions:
        where = Path(portions[0])
    elif found.has_location and found.origin:
        where = Path(found.origin)
    else:
        return None
    where = where.resolve()
    installed = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    return None if any(where.is_relative_to(root) for root in installed) else str(where.parent)


def call(expression: str, kwargs: dict[str, Any], args: tuple[Any, ...] = ()) -> str:
    """Python source of ``expression(*args, **kwargs)``, values as literals. ValueError for a
    keyword that is not an argument name (``x=1); evil(`` would be code, not a name)."""
    bad = [key for key in kwargs if not is_argument_name(key)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a Python argument name")
    arguments = [literal(value) for value in args]
    arguments += [f"{key}={literal(value)}" for key, value in kwargs.items()]
    return f"{expression}({', '.join(arguments)})"
