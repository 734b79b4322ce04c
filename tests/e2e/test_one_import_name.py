"""One import name: the built wheel installs ``tracklane`` and nothing else to import, and an async run works from a
folder whose own modules are named as tracklane's folders are (pipeline, trainer, workers, benchmarks).

The wheel is built from a copy of the checkout (a build/ of setuptools' own in the checkout could hold modules
since removed), installed without dependencies into a fresh venv that borrows this venv's installed packages
(their folder as a path line, so this venv's editable tracklane is not among them), and run there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OLD_FOLDERS = ("pipeline", "trainer", "workers", "benchmarks")
JUNK = 'raise ImportError("the user\'s own {name}, not tracklane\'s: tracklane must never import it")\n'


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built (no isolation: this venv's setuptools) from the checkout's tracked and unignored files."""
    work = tmp_path_factory.mktemp("wheel")
    listed = _run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"]).stdout.split("\0")
    for rel in filter(None, listed):
        if (ROOT / rel).is_file():
            (work / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, work / "src" / rel)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"),
          str(work / "src")])
    (built,) = (work / "dist").glob("tracklane-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> tuple[Path, set[str]]:
    """A fresh venv with the wheel in it, and what the install added to its site-packages."""
    home = tmp_path_factory.mktemp("venv") / "v"
    _run([sys.executable, "-m", "venv", "--without-pip", str(home)])
    python = home / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    before = set(os.listdir(site))
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)])
    added = set(os.listdir(site)) - before
    # this venv's packages (Ray, the trackers' SDKs): a path line, whose own .pth files (the editable tracklane's
    # finder among them) are not run
    (site / "zz_borrowed_packages.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python, added


def test_the_wheel_has_one_top_level_import_name(wheel):
    """The wheel's RECORD: one package at the top, ``tracklane``; besides it only metadata (no .pth)."""
    with zipfile.ZipFile(wheel) as archive:
        record = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        paths = [line.split(",")[0] for line in archive.read(record).decode().splitlines() if line]
        top_level = archive.read(record.replace("RECORD", "top_level.txt")).decode().split()
    tops = {p.split("/")[0] for p in paths}
    names = {t.removesuffix(".py") for t in tops if not t.endswith((".dist-info", ".data"))}
    assert names == {"tracklane"}
    assert top_level == ["tracklane"]
    for folder in ("workers", "trainer", "benchmarks"):  # the other folders are inside it
        assert f"tracklane/{folder}/__init__.py" in paths
    assert "tracklane/view/static/index.html" in paths  # the package data followed


def test_the_install_adds_one_import_name(venv):
    """In the fresh venv's site-packages: ``tracklane`` and its metadata, nothing else."""
    _, added = venv
    assert {a for a in added if not a.endswith(".dist-info") and a != "__pycache__"} == {"tracklane"}


@pytest.fixture
def shadowing_folder(tmp_path) -> Path:
    """A folder of a user's, with modules named as tracklane's folders; each refuses to be imported."""
    folder = tmp_path / "user"
    folder.mkdir()
    for name in ("pipeline", "trainer", "benchmarks"):
        (folder / f"{name}.py").write_text(JUNK.format(name=name))
    (folder / "workers").mkdir()
    (folder / "workers" / "__init__.py").write_text(JUNK.format(name="workers"))
    return folder


RUN = textwrap.dedent('''
    import json, sys
    import ray
    from tracklane import Tracking

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True,
             runtime_env={"worker_process_setup_hook": "tracklane.verl.install"})
    config = {"trainer": {"log_async": True, "async_log": {"spool_dir": "spool", "flush_interval_s": 0.2}}}
    tracking = Tracking("shadow", "one_name", ["console", "file"], config=config)
    for step in range(1, 6):
        tracking.log({"critic/score/mean": step / 10, "actor/pg_loss": -step}, step=step)
    report = tracking.finish()
    ray.shutdown()
    print("RESULT " + json.dumps({
        "complete": report.complete,
        "tracklane": sys.modules["tracklane"].__file__,
        "ours_by_folder_names": sorted(m for m in sys.modules if m.split(".")[0] in
                                       ("pipeline", "trainer", "workers", "benchmarks")),
    }))
''')


def test_an_async_run_from_a_folder_with_pipeline_trainer_and_workers(venv, shadowing_folder):
    """log_async, console and file, Ray's lane actors: the run completes and the file holds every step, though
    the folder it runs from has modules named pipeline, trainer and workers (which raise when imported)."""
    python, _ = venv
    (shadowing_folder / "run.py").write_text(RUN)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_ADDRESS="local", TRACKLANE_SYSTEM_METRICS_S="0",
               VERL_FILE_LOGGER_ROOT=str(shadowing_folder / "runs"))
    done = _run([str(python), "run.py"], cwd=shadowing_folder, env=env)
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["complete"] is True
    assert result["ours_by_folder_names"] == []
    assert not Path(result["tracklane"]).is_relative_to(ROOT)  # the wheel's, in the venv
    lines = [json.loads(line) for line in (shadowing_folder / "runs" / "shadow" / "one_name.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "critic/score/mean" in line.get("data", {})]
    assert [line["step"] for line in steps] == [1, 2, 3, 4, 5]
    assert [line["data"]["critic/score/mean"] for line in steps] == [0.1, 0.2, 0.3, 0.4, 0.5]
