"""Space files and the real ``autotune`` command: a tiny space file, the command (and an
exported script) in a subprocess, blocked imports, and what a source imports."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

# -- space files and the command --------------------------------------------------------------

TINY_SPACE = """\
study:
  name: tiny
  n_trials: {n_trials}
  n_startup_trials: 3
  pruner: {pruner}
  seed: 0
workload:
  model: autotune.testing:tiny_mlp
  data: autotune.testing:blobs
  epochs: 2
  eval_every: 1
  device: cpu
objective:
  min_accuracy: 0.5
space:
  lr: {{low: 1.0e-3, high: 1.0e-1, log: true}}
  batch_size: [16, 32]
  accumulation_steps: [1, 2]
  precision: [fp32, bf16, fp16]
  pin_memory: [false, true]
"""


def write_space(
    directory: Path, text: str | None = None, name: str = "tiny.yaml", **fields: Any
) -> Path:
    """Write a space file (the tiny one by default, formatted with ``fields``)."""
    values = {"n_trials": 4, "pruner": "none", **fields}
    path = directory / name
    path.write_text(textwrap.dedent(text) if text is not None else TINY_SPACE.format(**values))
    return path


def _environment(env: dict[str, str] | None) -> dict[str, str]:
    """This process's environment with a wide console and quiet warnings, ``env`` added."""
    return {**os.environ, "COLUMNS": "160", "PYTHONWARNINGS": "ignore", **(env or {})}


def run_cli(
    *args: str,
    cwd: Path,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    wrapper: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m autotune ARGS`` in ``cwd`` as a user would, capturing its output;
    ``env`` adds to the environment; ``wrapper`` is a command that runs it (``setpriv ...``)."""
    return subprocess.run(
        [*wrapper, sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env=_environment(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_python(
    source: str, *args: str, cwd: Path, timeout: float = 300, wrapper: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run ``python -c SOURCE ARGS`` in ``cwd`` as run_cli runs the command (a wide console,
    quiet warnings; ``wrapper`` before it), capturing its output: several commands in one
    fresh interpreter, say. Fails the test unless it exits 0."""
    done = subprocess.run(
        [*wrapper, sys.executable, "-c", source, *args],
        cwd=cwd,
        env=_environment(None),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return done


def run_script(
    script: Path, *args: str, block_autotune: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run an exported script as its user would (``python train.py ARGS`` in its folder);
    ``block_autotune`` (an ``import_blocker`` folder) makes importing autotune fail in it."""
    blocked = {"PYTHONPATH": str(block_autotune)} if block_autotune is not None else None
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=script.parent,
        env=_environment(blocked),
        capture_output=True,
        text=True,
        timeout=600,
    )


def start_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start ``python -m autotune ARGS`` in ``cwd`` as run_cli runs it, without waiting: for tests
    that signal or kill it. Its output is piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env=_environment(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def import_blocker(directory: Path, package: str) -> Path:
    """A folder under ``directory`` to put on PYTHONPATH in which ``import package`` fails with
    ImportError('no PACKAGE here'): what a machine without that package does."""
    blocker = directory / "blocker"
    (blocker / package).mkdir(parents=True)
    (blocker / package / "__init__.py").write_text(f"raise ImportError('no {package} here')\n")
    return blocker


def imported_modules(source: str) -> set[str]:
    """The top-level packages a Python source imports (an exported file, say)."""
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    return modules


def provenance(source: str) -> dict[str, object]:
    """An exported file's PROVENANCE, read as data (ast.literal_eval: no code runs)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "PROVENANCE":
            found = ast.literal_eval(node.value)
            assert isinstance(found, dict)
            return found
    raise AssertionError("the file has no PROVENANCE")


def lint(path: Path, *, formatted: bool = False) -> subprocess.CompletedProcess[str]:
    """``ruff check`` of ``path`` (a file or a folder) with this project's configuration
    (pyproject.toml); with ``formatted``, then ``ruff format --check`` of it (its diff in
    stdout)."""
    config = Path(__file__).parents[2] / "pyproject.toml"  # the repository's
    ruff, options = [sys.executable, "-m", "ruff"], ["--no-cache", "--config", str(config)]
    checked = subprocess.run([*ruff, "check", *options, str(path)], capture_output=True, text=True)
    if checked.returncode or not formatted:
        return checked
    return subprocess.run(
        [*ruff, "format", "--check", "--diff", *options, str(path)], capture_output=True, text=True
    )
