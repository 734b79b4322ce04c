"""The code's shape rules (issue 36): no class over 250 lines, no constructor over 25, no function over 50."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("pipeline", "workers", "trainer")
LIMITS = {"class": 250, "constructor": 25, "function": 50}


def _lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1  # type: ignore[attr-defined,operator]


def _offenders(root: Path = ROOT) -> list[str]:
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                where = f"{path.relative_to(root)}:{node.lineno if hasattr(node, 'lineno') else 0}"
                if isinstance(node, ast.ClassDef) and _lines(node) > LIMITS["class"]:
                    found.append(f"{where} class {node.name}: {_lines(node)} lines")
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    kind = "constructor" if node.name == "__init__" else "function"
                    if _lines(node) > LIMITS[kind]:
                        found.append(f"{where} {kind} {node.name}: {_lines(node)} lines")
    return found


def test_no_class_constructor_or_function_is_over_its_limit():
    """Every class, constructor and function in pipeline/, workers/ and trainer/ is within its line limit."""
    offenders = _offenders()
    assert not offenders, "over the limits " + str(LIMITS) + ":\n" + "\n".join(offenders)


def test_the_check_sees_an_oversized_function(tmp_path):
    """The check is not vacuous: a 51-line function in a scanned folder is reported."""
    for folder in FOLDERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "pipeline" / "big.py").write_text("def big():\n" + "    x = 1\n" * 50)
    assert _offenders(tmp_path) == ["pipeline/big.py:1 function big: 51 lines"]
