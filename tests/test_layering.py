"""Imports point one way: pipeline/ reaches workers/ only by name where used; benchmarks never use tests/."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module_level_imports(path: Path) -> list[str]:
    """Modules imported at module level (outside functions; `if TYPE_CHECKING:` blocks excluded)."""
    names = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_pipeline_never_imports_workers_at_module_level():
    """No module of pipeline/ (testing helpers included) imports workers/ at module level."""
    offenders = {str(path.relative_to(ROOT)): name for path in (ROOT / "pipeline").rglob("*.py")
                 for name in _module_level_imports(path) if name == "workers" or name.startswith("workers.")}
    assert offenders == {}


def test_benchmarks_never_import_tests():
    """benchmarks/ is installed and tests/ is not: nothing in benchmarks imports tests, even inside a function."""
    offenders = []
    for path in (ROOT / "benchmarks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}: {name}" for name in names if name.split(".")[0] == "tests"]
    assert offenders == []


def test_import_pipeline_loads_no_sink_ray_or_sdk():
    """`import pipeline` loads no workers module, no Ray, no tracker SDK and no test helper."""
    code = ("import sys, pipeline; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('workers', 'ray', 'wandb', 'mlflow', 'swanlab', 'tensorboard') or m.startswith('pipeline.testing')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
