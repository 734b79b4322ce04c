"""MkDocs hook: the benchmark figures (``benchmarks/figures/*.png``) served as ``figures/<name>.png``.

The plots live beside the benchmarks that draw them; this adds them to the site without a copy in
``docs/``, so ``![...](figures/capacity.png)`` in a page is checked by ``mkdocs build --strict`` like any link.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "benchmarks" / "figures"


def on_files(files: Files, config: Any, **_: Any) -> Files:
    pngs = sorted(FIGURES.glob("*.png"))
    if not pngs:
        raise FileNotFoundError(f"no figures in {FIGURES}: the performance page shows them")
    for png in pngs:
        files.append(File(f"figures/{png.name}", src_dir=str(FIGURES.parent), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files
