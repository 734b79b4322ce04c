"""PNG figures for the benchmarks: grouped bars, heatmaps, lines. Agg backend: no display needed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)


def bars(path: Path, title: str, groups: Sequence[str], series: dict[str, Sequence[float | None]], ylabel: str,
         target: float | None = None, log_y: bool = False) -> Path:
    """Grouped bars: one group per label in ``groups``, one bar per series; missing values left out."""
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(groups) * max(1, len(series)) / 2), 4))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + i * width for g, v in enumerate(values) if _finite(v)]
        ax.bar(xs, [v for v in values if _finite(v)], width, label=name)
    ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))], groups, rotation=20, ha="right")
    if target is not None:
        ax.axhline(target, color="k", linestyle="--", linewidth=1, label=f"target {target:g}")
    if log_y:
        ax.set_yscale("log")
    return _save(fig, ax, path, title, ylabel)


def heatmap(path: Path, title: str, rows: Sequence[str], cols: Sequence[str], values: list[list[float | None]],
            row_label: str, col_label: str, digits: int = 2) -> Path:
    fig, ax = plt.subplots(figsize=(1.3 * len(cols) + 2, 0.6 * len(rows) + 1.8))
    grid = [[v if _finite(v) else math.nan for v in row] for row in values]
    image = ax.imshow(grid, cmap="viridis_r", aspect="auto")
    fig.colorbar(image, ax=ax)
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel(col_label)
    for r, row in enumerate(grid):
        for c, value in enumerate(row):
            ax.text(c, r, "-" if value != value else f"{value:.{digits}f}", ha="center", va="center",
                    color="w", fontsize=8)
    return _save(fig, ax, path, title, row_label, legend=False)


def lines(path: Path, title: str, xs: Sequence[float], series: dict[str, Sequence[float | None]], xlabel: str,
          ylabel: str, log_x: bool = False, log_y: bool = False) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, values in series.items():
        points = [(x, v) for x, v in zip(xs, values, strict=True) if _finite(v)]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    ax.set_xlabel(xlabel)
    if log_x:
        ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    return _save(fig, ax, path, title, ylabel)


def _finite(value: float | None) -> bool:
    return value is not None and value == value and not math.isinf(value)


def _save(fig, ax, path: Path, title: str, ylabel: str, legend: bool = True) -> Path:
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
