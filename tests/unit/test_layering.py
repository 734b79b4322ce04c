"""Imports point one way, in tiers, with no circle: every import counts, module-level, lazy and TYPE_CHECKING alike."""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "workers", "trainer", "benchmarks")
# folder -> the name its modules are installed under (pyproject's package-dir): one import name, tracklane
INSTALLED_AS = {"pipeline": "tracklane", "workers": "tracklane.workers", "trainer": "tracklane.trainer",
                "benchmarks": "tracklane.benchmarks"}

# pipeline's rooms from the floor up: a room imports only rooms on lower floors (and itself). The facade is the
# top-level modules (tracking, producer, log_calls, pipe, sync_pipeline, sync_spool, backend_view); the face is __init__,
# __main__ and the hook's old name.
FLOORS: dict[str, int] = {
    "core": 0, "testing": 0, "alerting": 0,
    "config": 1,
    "capture": 2, "wire": 2, "host": 2, "spool": 2,
    "node": 3,
    "shipping": 4,
    "facade": 5, "view": 5,
    "verl": 6, "cli": 6,
    "face": 7,
}
FACE = {"tracklane", "tracklane.__main__"}
# What a plug-in (a sink, a source, a reader) may stand on: the contract and the floors under it.
WORKERS_MAY_IMPORT = {"core", "config", "capture", "wire", "host", "spool"}


def _module_name(path: Path) -> str:
    folder, *parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join([INSTALLED_AS[folder], *(parts[:-1] if parts and parts[-1] == "__init__" else parts)])


def folder(module: str) -> str:
    """The folder a module of ours is in: ``tracklane.workers.sinks.file`` -> workers, ``tracklane.core`` ->
    pipeline."""
    for name, dotted in INSTALLED_AS.items():
        if dotted != "tracklane" and (module == dotted or module.startswith(dotted + ".")):
            return name
    return "pipeline"


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The module of ours a dotted name lands in (``tracklane.core.records.Metrics`` -> ``tracklane.core.records``)."""
    modules = _modules()
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, anywhere in the file."""
    graph: dict[str, set[str]] = {}
    for module, path in _modules().items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            targets |= {target for name in names if (target := _resolve(name)) and target != module}
        graph[module] = targets
    return graph


def room(module: str) -> str:
    """pipeline's room of a module: its folder, "facade" for a top-level module, "face" for the public face."""
    if module in FACE:
        return "face"
    parts = module.split(".")
    return parts[1] if (ROOT / "pipeline" / parts[1]).is_dir() else "facade"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_anywhere():
    """No circle of imports in pipeline, workers, trainer or benchmarks, lazy and TYPE_CHECKING imports included."""
    assert _cycles(import_graph()) == []


def test_cycle_finder_finds_a_cycle():
    """The circle check can fail: a two-module loop and a three-module loop are both found."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(_cycles(graph)) == [["a", "b"], ["c", "d", "e"]]


def test_pipeline_rooms_import_only_downward():
    """Every import inside pipeline/ goes to the same room or a lower floor; every room has a floor."""
    graph = import_graph()
    pipeline_modules = [m for m in graph if folder(m) == "pipeline"]
    assert {room(m) for m in pipeline_modules} <= set(FLOORS)
    upward = [f"{m} ({room(m)}) -> {t} ({room(t)})" for m in pipeline_modules for t in graph[m]
              if folder(t) == "pipeline" and room(t) != room(m) and FLOORS[room(t)] >= FLOORS[room(m)]]
    assert upward == []


def test_pipeline_never_imports_workers_trainer_or_benchmarks():
    """Nothing in pipeline/ imports workers/, trainer/ or benchmarks/: plug-ins are found by name in the registry."""
    graph = import_graph()
    offenders = [f"{m} -> {t}" for m in graph if folder(m) == "pipeline" for t in graph[m]
                 if folder(t) != "pipeline"]
    assert offenders == []


def test_workers_stand_on_the_contract():
    """A plug-in imports only pipeline's contract and the floors under it; sources and readers may use sinks."""
    graph = import_graph()
    sinks = "tracklane.workers.sinks"
    offenders = [f"{m} -> {t}" for m in graph if folder(m) == "workers" for t in graph[m]
                 if (folder(t) == "pipeline" and t != "tracklane" and room(t) not in WORKERS_MAY_IMPORT)
                 or t == "tracklane" or folder(t) in ("trainer", "benchmarks")
                 or (m.startswith(sinks) and not (t.startswith(sinks) or folder(t) == "pipeline"))]
    assert offenders == []


def test_trainer_uses_only_the_public_face():
    """The trainer imports tracklane as a user does: ``from tracklane import ...``, never an internal room."""
    graph = import_graph()
    offenders = [f"{m} -> {t}" for m in graph if folder(m) == "trainer" for t in graph[m]
                 if folder(t) in ("pipeline", "workers", "benchmarks") and t != "tracklane"]
    assert offenders == []


def test_benchmarks_use_public_faces():
    """The benchmarks import tracklane through its faces (``tracklane``, and ``tracklane.spool`` / ``tracklane.wire``
    for reading a spool's batches) and its shipped test helpers, never an internal module."""
    graph = import_graph()
    public = {"tracklane", "tracklane.spool", "tracklane.wire"}
    offenders = [f"{m} -> {t}" for m in graph if folder(m) == "benchmarks" for t in graph[m]
                 if folder(t) == "pipeline" and t not in public and room(t) != "testing"]
    assert offenders == []


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
    """`import tracklane` loads no workers module, no Ray, no tracker SDK, no test helper, and nothing of ours by
    a folder's name (run from the repository's root, where the folders could be imported so)."""
    code = ("import sys, tracklane; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('ray', 'wandb', 'mlflow', 'swanlab', 'tensorboard', *" + repr(PACKAGES) + ") "
            "or m.startswith(('tracklane.workers', 'tracklane.testing'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
