"""One import name, ``tracklane``: nothing of ours is named by its folder, and the wheel lists every package.

The folders (pipeline/, workers/, trainer/, benchmarks/) are importable by their own names from the repository's
root (pytest puts it on the path for ``tests.*``), so a stray old name would load a second copy of a module there
and fail in an installed tracklane: these checks read the sources (``ast``) instead of waiting for that.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALLED_AS = {"pipeline": "tracklane", "workers": "tracklane.workers", "trainer": "tracklane.trainer",
                "benchmarks": "tracklane.benchmarks"}
SOURCES = [*INSTALLED_AS, "tests", "docs", ".ci"]
# these name them on purpose: this file builds them, the e2e test makes a user's folder of them
ALLOWED = {Path("tests/unit/test_old_names.py"), Path("tests/e2e/test_one_import_name.py")}


# a dotted name in a string; not a config key given a value (`trainer.logger=[]`), not verl.trainer.x
DOTTED = re.compile(r"(?<![\w./-])(?:pipeline|workers|benchmarks|trainer)\.\w+(?:[.:]\w+)*(?![\w.]*=)")


def _children(folder: str) -> set[str]:
    path = ROOT / folder
    return {p.stem for p in path.glob("*.py")} | {p.name for p in path.iterdir() if (p / "__init__.py").is_file()}


def old_names_in(source: str) -> list[tuple[int, str]]:
    """(line, name) of each module of ours a source names by a folder: imports, import_module("..."),
    ["-m", "..."] and "module:Class" / dotted strings whose first two parts are a folder and a module in it."""
    children = {folder: _children(folder) for folder in INSTALLED_AS}
    found = []

    def old(name: str) -> bool:
        top, _, rest = name.partition(".")
        return top in INSTALLED_AS and (not rest or re.split(r"[.:]", rest)[0] in children[top])

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in INSTALLED_AS]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in INSTALLED_AS:
            found.append((node.lineno, node.module or ""))
        elif isinstance(node, (ast.List, ast.Tuple)):
            items = node.elts
            for flag, module in zip(items, items[1:], strict=False):
                if isinstance(flag, ast.Constant) and flag.value == "-m":
                    text = (module.value if isinstance(module, ast.Constant) else
                            "".join(v.value for v in module.values if isinstance(v, ast.Constant))
                            if isinstance(module, ast.JoinedStr) else "")
                    bare = isinstance(module, ast.JoinedStr) or "." not in text  # dotted ones: as strings below
                    if isinstance(text, str) and text.split(".")[0] in INSTALLED_AS and bare:
                        found.append((node.lineno, text))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, m.group(0)) for m in DOTTED.finditer(node.value) if old(m.group(0))]
    return sorted(found)


def test_no_source_names_a_module_of_ours_by_its_folder():
    """Imports, ``-m`` arguments and module paths in strings use ``tracklane...``, never pipeline/workers/...."""
    offenders = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel in ALLOWED:
                continue
            offenders += [f"{rel}:{line}: {name}" for line, name in old_names_in(path.read_text(encoding="utf-8"))]
    assert offenders == []


def test_the_old_name_check_can_fail():
    """Each way of naming a module by its folder is found; config keys and tracklane's names are not."""
    source = ("import trainer.main\nfrom pipeline.core import records\nx = ['-m', 'benchmarks.chaos', '-m', 'trainer']\n"
              "y = 'workers.sinks.file:FileSink'\nz = 'trainer.progress=false'\nimport tracklane.trainer.main\n")
    assert [name for _, name in old_names_in(source)] == [
        "trainer.main", "pipeline.core", "benchmarks.chaos", "trainer", "workers.sinks.file:FileSink"]


def test_the_wheel_lists_every_package_under_its_installed_name():
    """pyproject's package list is every folder with an ``__init__.py``, renamed by its package-dir mapping: a new
    subpackage missing there would be left out of the wheel."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert setuptools["package-dir"] == {new: old for old, new in INSTALLED_AS.items()}
    folders = {".".join([INSTALLED_AS[old], *init.parent.relative_to(ROOT / old).parts])
               for old in INSTALLED_AS for init in (ROOT / old).rglob("__init__.py") if "__pycache__" not in init.parts}
    assert set(setuptools["packages"]) == folders, f"add to pyproject's packages: {sorted(folders - set(setuptools['packages']))}"
