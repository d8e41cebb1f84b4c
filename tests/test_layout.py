"""The project's structural rules: import direction, no torch below `loop/`, README <-> CI.

Run: python -m pytest tests/test_layout.py
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"sandbox": {"torch", "tasks", "loop"}, "tasks": {"torch", "loop"}}


def imported_modules(package: str) -> dict[str, set[str]]:
    """Top-level module names imported by each file of `package` (static)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_upper_layers_or_torch(package: str) -> None:
    if not (ROOT / package).is_dir():
        pytest.fail(f"package {package}/ is missing")
    offenders = {
        file: sorted(names & FORBIDDEN[package])
        for file, names in imported_modules(package).items()
        if names & FORBIDDEN[package]
    }
    assert offenders == {}


def test_importing_sandbox_loads_no_torch_tasks_or_loop() -> None:
    code = (
        "import sys, sandbox, sandbox.pool, sandbox.kernel\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'tasks', 'loop')]\n"
        "print(bad)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = [line.strip() for line in readme.splitlines() if "bash scripts/setup.sh" in line]
    assert len(commands) == 2, commands
    test_command = next(c for c in commands if "pytest" in c).split("  #")[0].strip()
    assert test_command in (ROOT / ".ci" / "run").read_text()
