"""The package's shape: imports flow one way (ARCHITECTURE.md), and modules stay small enough
to read.

Every module (a subpackage counts as one) sits in a layer; a module imports only from its own
layer or the layers below, at the top of the file or inside a function alike. A new module must
be placed here, which is the moment to decide where it belongs.
"""

from __future__ import annotations

import ast
import compileall
import shutil
import subprocess
import sys
from pathlib import Path

import autotune

PACKAGE = Path(autotune.__file__).parent

# lowest first
LAYERS: list[set[str]] = [
    {"_version", "_imports", "errors", "knobs", "config", "results", "speed", "semantics"},
    # plain data, names, optional packages; what training means in plain torch
    {"spacefile", "stops", "faults", "machine", "files"},  # what the user asked (a stop too);
    # how a failure is told; the machine, what else runs on it, its turns and its shares among
    # workers; files written
    {"pipeline"},  # batches reaching the device
    {"workloads"},  # models and data
    {"training", "search", "testing"},  # one training run, measured; what the study samples
    # and judges by (the space, the references, the objective); helpers for tests
    {"supervision"},  # the child processes a trial runs in: started, spoken to, killed
    {"distributed"},  # a trial trained by several processes (DDP)
    {"executor"},  # how the study runs a trial
    {"storage"},  # where studies live: Optuna storages, records, queries, liveness
    {"stage1"},  # stage 1: the speed of execution settings, planned, timed and cached
    {"worker", "study"},  # trials in a supervised process; the study and its records
    {"display", "export"},  # what people see; the answer as a script, file or object
    {"outputs", "ending"},  # the dashboard note, files attached, the HTML report; how a run
    # ended (its exit rule)
    {"session"},  # the run as a library call: its steps, its ending, autotune.run
    {"cli", "__init__", "__main__"},  # the command line and the Python API's entrance
]


def _unit(module: str) -> str:
    """The layer unit of a dotted module name inside the package: a top-level module, or a
    subpackage as a whole."""
    parts = module.split(".")
    assert parts[0] == "autotune", module
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__" and len(parts) > 2:
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """The autotune modules ``path`` imports, anywhere in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("autotune")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if not module.startswith("autotune"):
                continue
            if module != "autotune":  # from autotune import study, export: those modules
                found.add(module)
            for alias in node.names:  # from autotune.search import space: a module of its own
                named = PACKAGE.parent / f"{module}.{alias.name}".replace(".", "/")
                if named.with_suffix(".py").exists() or named.is_dir():
                    found.add(f"{module}.{alias.name}")
    return found


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    placed = set().union(*LAYERS)
    units = {_unit(_module_name(path)) for path in _sources()}
    assert units, "no modules found"
    assert units - placed == set(), "place these modules in LAYERS"
    assert placed - units == set(), "these LAYERS entries no longer exist"


def test_imports_only_flow_down():
    layer = {unit: index for index, units in enumerate(LAYERS) for unit in units}
    upward = []
    for path in _sources():
        here = _unit(_module_name(path))
        for imported in _imports(path):
            there = _unit(imported)
            if there != here and layer[there] > layer[here]:
                upward.append(f"{path.relative_to(PACKAGE)} imports {imported} (a higher layer)")
    assert upward == []


def test_no_import_cycles_between_units():
    edges: dict[str, set[str]] = {}
    for path in _sources():
        here = _unit(_module_name(path))
        edges.setdefault(here, set()).update(_unit(m) for m in _imports(path) if _unit(m) != here)
    visiting: list[str] = []
    done: set[str] = set()

    def visit(unit: str) -> None:
        assert unit not in visiting, " -> ".join([*visiting[visiting.index(unit) :], unit])
        if unit in done:
            return
        visiting.append(unit)
        for other in sorted(edges.get(unit, ())):
            visit(other)
        visiting.pop()
        done.add(unit)

    for unit in sorted(edges):
        visit(unit)


def test_no_module_imports_another_modules_private_names():
    """A name with a leading underscore belongs to its module: one that another module needs
    is that module's interface and named so (a private module, ``study/_trial``, is imported
    whole or by its public names)."""
    private = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "autotune"
            ):
                continue
            for alias in node.names:
                module_file = PACKAGE.parent / f"{node.module}.{alias.name}".replace(".", "/")
                is_module = module_file.with_suffix(".py").exists() or module_file.is_dir()
                if alias.name.startswith("_") and alias.name[1] != "_" and not is_module:
                    private.append(f"{path.relative_to(PACKAGE)}: {node.module}.{alias.name}")
    assert private == []


def test_the_checks_see_real_imports():
    """The import reader finds what a module really imports (the oracle of the tests above)."""
    found = _imports(PACKAGE / "study" / "_trial.py")
    assert {"autotune.executor", "autotune.storage._records", "autotune.search.objective"} <= (
        found
    )
    inspect = _imports(PACKAGE / "cli" / "_inspect.py")
    assert "autotune.outputs.notes" in inspect  # imported inside a function


def test_a_lazy_packages_two_lists_of_names_agree():
    """``autotune.study`` imports its names on first use: they are listed for the type checker
    (``if TYPE_CHECKING``) and for the lazy import (``_MODULES``: name -> module). The two must
    name the same things, each from the same module."""
    import autotune.study as package

    tree = ast.parse(Path(package.__file__).read_text())
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module is not None
                module = statement.module
                typed.update({alias.name: module for alias in statement.names})
    assert typed, "no TYPE_CHECKING imports found"
    assert typed == package._MODULES
    assert set(package._MODULES) <= set(dir(package))
    for name in package._MODULES:  # each resolves, lazily, to what the type checker was told
        assert getattr(package, name) is not None


def test_the_package_imports_without_its_sources(tmp_path: Path):
    """An install of compiled files alone (a zipapp, a wheel without .py sources) imports, its
    lazy names included: nothing reads a source file at import."""
    compiled = tmp_path / "autotune"
    shutil.copytree(PACKAGE, compiled, ignore=shutil.ignore_patterns("__pycache__"))
    assert compileall.compile_dir(compiled, quiet=1, legacy=True)  # x.pyc beside x.py
    for source in compiled.rglob("*.py"):
        source.unlink()
    check = "import autotune.study as s; print(s.TrialRecord.__name__, 'open_study' in dir(s))"
    imported = subprocess.run(
        [sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert imported.stdout.split() == ["TrialRecord", "True"], imported.stderr
