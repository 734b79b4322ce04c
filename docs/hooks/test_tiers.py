"""MkDocs hook: the test tiers of ``tests.md``, listed from the folders themselves.

The marker ``<!-- test-tiers -->`` is replaced by one section per folder of ``tests/`` that is a tier (has an
``__init__.py``): its command, what it holds (the folder's docstring) and each ``test_*.py`` with the first sentence
of its docstring. Read with ``ast`` (nothing is imported), so the page lists what is there; a tier or test file
without a docstring fails the build.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- test-tiers -->"
ORDER = ("unit", "trackers", "pipeline", "faults", "e2e")
"""The tiers from the fastest; a folder not named here comes after them."""


class TestTiersError(Exception):
    """The list cannot be made: the build must stop."""


def docstring(path: Path) -> str:
    text = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not text:
        raise TestTiersError(f"{path.relative_to(ROOT)} has no docstring to list it by")
    return " ".join(text.split())


def first_sentence(text: str, most: int = 240) -> str:
    """Up to the first full stop that ends a sentence, cut at ``most`` characters."""
    match = re.match(r"(.+?\.)(\s|$)", text)
    sentence = match.group(1) if match else text
    return sentence if len(sentence) <= most else sentence[:most].rsplit(" ", 1)[0] + " …"


def tiers(root: Path = ROOT) -> list[Path]:
    found = [p.parent for p in sorted((root / "tests").glob("*/__init__.py"))]
    return sorted(found, key=lambda p: (ORDER.index(p.name) if p.name in ORDER else len(ORDER), p.name))


def section(folder: Path) -> str:
    files = sorted(folder.glob("test_*.py"))
    rows = [f"- `{f.name}`: {first_sentence(docstring(f))}" for f in files]
    command = f".venv/bin/python -m pytest tests/{folder.name}"
    return "\n".join([f"### `tests/{folder.name}/` ({len(files)} files)", "", f"`{command}`", "",
                      docstring(folder / "__init__.py"), "", *rows, ""])


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, "\n".join(section(folder) for folder in tiers()))
