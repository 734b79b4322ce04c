"""The build's one step pyproject.toml cannot say: the wheel's ``tracklane-legacy-hook.pth``.

Everything else (metadata, the package-dir mapping, the package list) is in pyproject.toml. The .pth lets Ray
import the verl hook by its old names for a while (pipeline/_legacy_hook.py says how); it is one line of
Python that runs that file's source, which imports nothing until an old name is imported. The wheel gets it from
build_py; an editable install (``pip install -e``, as the README installs tracklane beside verl) from
editable_wheel, which builds no package files of its own: it writes the .pth where setuptools writes a
namespace package's (``_install_namespaces``, not a public hook: should setuptools rename it, an editable
install goes without the .pth, and the old names work from the checkout's root only).
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "tracklane-legacy-hook.pth"
SOURCE = Path(__file__).resolve().parent / "pipeline" / "_legacy_hook.py"


def pth_line() -> str:
    """One ``import`` line (site.py runs those): the finder's source, run in a namespace of its own."""
    source = SOURCE.read_text(encoding="utf-8") + "\ninstall_finder()\n"
    return (f"import sys; exec(compile({source!r}, {PTH!r}, 'exec'), "
            f"{{'__name__': '_tracklane_legacy_hook'}})\n")


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.mkpath(self.build_lib)
            Path(self.build_lib, PTH).write_text(pth_line(), encoding="utf-8")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        return outputs if self.editable_mode else [*outputs, str(Path(self.build_lib, PTH))]


class EditableWheelWithPth(editable_wheel):
    def _install_namespaces(self, installation_dir: str, pth_prefix: str) -> None:
        super()._install_namespaces(installation_dir, pth_prefix)
        Path(installation_dir, PTH).write_text(pth_line(), encoding="utf-8")


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
