"""mypy on tracklane's modules under the names they are installed as: ``python .ci/typecheck.py [mypy options]``.

The folders are not named as the modules (pyproject's package-dir: pipeline/ is ``tracklane``, workers/ is
``tracklane.workers``, trainer/ is ``tracklane.trainer``), and mypy does not read package-dir: given the folders it
would name their modules ``pipeline.*`` and find no ``tracklane`` to follow the imports into (``ignore_missing_imports``
would then make every import Any, silently). So this builds a view, ``build/mypy-view/tracklane/``, of symlinks to
pipeline/'s files with workers/ and trainer/ inside it, runs mypy on it (settings from pyproject's ``[tool.mypy]``),
and prints mypy's report with the view's paths turned back into the repository's. Its exit status is mypy's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VIEW = ROOT / "build" / "mypy-view"
TOP = "tracklane"
# what is type-checked: the view's folder -> the repository's (the benchmarks are not type-checked)
FOLDERS = {"": "pipeline", "workers": "workers", "trainer": "trainer"}
SKIPPED = {"__pycache__", "README.md"}


def build_view() -> Path:
    """``build/mypy-view/tracklane``: pipeline/'s entries and the subpackages, as symlinks (rebuilt each run)."""
    top = VIEW / TOP
    top.mkdir(parents=True, exist_ok=True)
    wanted = {entry.name: entry for entry in (ROOT / FOLDERS[""]).iterdir() if entry.name not in SKIPPED}
    wanted |= {name: ROOT / folder for name, folder in FOLDERS.items() if name}
    for link in top.iterdir():  # stale links (a module renamed or removed since the last run)
        if link.name not in wanted or not link.is_symlink() or Path(os.readlink(link)) != wanted[link.name]:
            link.unlink()  # the view holds symlinks only
    for name, target in wanted.items():
        link = top / name
        if not link.is_symlink():
            link.symlink_to(target, target_is_directory=target.is_dir())
    return top


def repository_paths(text: str) -> str:
    """mypy's report with ``build/mypy-view/tracklane/workers/x.py`` written ``workers/x.py`` (and so on)."""
    prefix = re.escape(str((VIEW / TOP).relative_to(ROOT))) + "/"
    subfolders = "|".join(re.escape(name) for name in FOLDERS if name)
    text = re.sub(prefix + rf"({subfolders})/", lambda m: FOLDERS[m.group(1)] + "/", text)
    return re.sub(prefix, FOLDERS[""] + "/", text)


def main(argv: list[str]) -> int:
    top = build_view()
    done = subprocess.run([sys.executable, "-m", "mypy", *argv, str(top.relative_to(ROOT))], cwd=ROOT,
                          capture_output=True, text=True)
    sys.stdout.write(repository_paths(done.stdout))
    sys.stderr.write(repository_paths(done.stderr))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
