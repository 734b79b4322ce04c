"""The docs check themselves: the modules and files they name exist, the data-path diagrams name the registry's
trackers, and the configuration page names exactly the settings the code checks.

Unit tier: no Ray, no tracker, no subprocess. Docs and sources are read as text (``ast``, ``tokenize``); only the
registry, the settings and the docs' own config hook are imported.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import io
import re
import sys
import tokenize
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path

import pytest

from tracklane import check_settings
from tracklane.core.errors import ConfigError
from tracklane.host.registry import BACKENDS

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("pipeline", "workers", "trainer", "benchmarks", "tests")
# A path is often written from inside one of these: "shipping/hub.py" is pipeline/shipping/hub.py.
BASES = ("", "pipeline", "workers", "trainer")
# Our folder names that are also third-party packages the docs quote files of (verl/utils/tracking.py).
THEIRS = ("verl",)

DOTTED = re.compile(r"(?<![\w./-])(?:import |from |-m )?(?:tracklane|pipeline|workers|trainer|benchmarks|tests)"
                    r"(?:\.\w+)+(?::\w+)?")
# A dotted name's package -> the folder its modules are in (pyproject's package-dir); the folders' own names are
# no module names any more (a doc naming one is stale).
FOLDER_OF = {"tracklane.workers": "workers", "tracklane.trainer": "trainer", "tracklane.benchmarks": "benchmarks",
             "tracklane": "pipeline", "tests": "tests"}
OLD_TOPS = ("pipeline", "workers", "trainer", "benchmarks")
PATH = re.compile(r"(?<![\w./<>*$~-])(?:[\w.-]+/)*[\w-]+\.(?:py|md)(?![\w*<>-])"  # a file
                  r"|(?<![\w./<>*$~-])(?:[\w-]+/)+(?![\w*<>.-])")  # a folder: "workers/sinks/", not a glob
FILE_SUFFIXES = ("py", "md", "yaml", "yml", "json", "jsonl", "toml", "txt", "log")
MERMAID = re.compile(r"```mermaid\n(.*?)```", re.S)
LABEL = re.compile(r'\["(.*?)"\]')
CONFIG_PAGE = ROOT / "docs" / "configuration.md"


# -- what is read --------------------------------------------------------------------------------------------------

def doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md")), *sorted(root.glob("pipeline/README.md"))]


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a Markdown file, or of a Python file's docstrings and comments (not its code)."""
    source = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        yield from enumerate(source.splitlines(), 1)
        return
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):  # every string statement: module, class, function and field docstrings
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield from ((n, lines[n - 1]) for n in range(node.lineno, node.end_lineno + 1))  # type: ignore[operator]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def project_prose(root: Path) -> Iterator[tuple[str, int, str]]:
    """(file, line, text) of every doc and every docstring and comment under the project's folders."""
    sources = [*doc_files(root), *(p for top in TOPS for p in sorted((root / top).rglob("*.py")))]
    for path in sources:
        for number, text in prose(path):
            yield str(path.relative_to(root)), number, text


# -- check 1: every module and file a doc names exists -------------------------------------------------------------

def stale_references(lines: Iterable[tuple[str, int, str]], root: Path) -> list[str]:
    """``file:line: why`` for each project module or file named in ``lines`` that does not exist under ``root``."""
    stale = []
    for where, number, text in lines:
        for match in DOTTED.finditer(text):
            why = dotted_problem(match.group(0), root)
            stale += [f"{where}:{number}: {why}"] if why else []
        for match in PATH.finditer(text):
            if not path_exists(match.group(0), root):
                stale.append(f"{where}:{number}: no file or folder {match.group(0)}")
    return stale


def dotted_problem(found: str, root: Path) -> str | None:
    """Why a dotted name (``tracklane.verl.install``, ``tracklane.cli.main:main``) names nothing, or None."""
    context, _, name = found.rpartition(" ")
    parts = name.replace(":", ".").split(".")
    if parts[-1] in FILE_SUFFIXES:
        return None  # a file name ("tests.md"): the path check's business
    if parts[0] in OLD_TOPS:
        return old_name_problem(name, parts, context, root)
    package = ".".join(parts[:2]) if ".".join(parts[:2]) in FOLDER_OF else parts[0]
    path = root / FOLDER_OF[package]
    first = package.count(".") + 1
    for i, part in enumerate(parts[first:], first):
        if path.is_dir() and ((path / part).is_dir() or (path / f"{part}.py").is_file()):
            path = path / part
            continue
        module = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        missing = missing_attribute(module, parts[i:])
        if missing and i == 1 and not context:
            return None  # tracklane.run_id, tracklane.exit_code: the tags and parameters tracklane writes, no module
        return f"{name}: {'.'.join(parts[:i])} has no {missing}" if missing else None
    return None  # every part is a package or module that exists


def old_name_problem(name: str, parts: list[str], context: str, root: Path) -> str | None:
    """A name starting with a folder's name: stale where it names a module of ours by that folder (the modules are
    tracklane's now), fine where it is something else (``trainer.async_log``: verl's config section)."""
    if parts[0] == "trainer" and not context:
        return None  # trainer.async_log, trainer.progress=false: verl's config section
    folder = root / parts[0]
    below = parts[1]
    if (folder / below).is_dir() or (folder / f"{below}.py").is_file() or (
            parts[0] == "pipeline" and not missing_attribute(folder / "__init__.py", [below])):
        new = FOLDER_OF_NEW[parts[0]] + name[len(parts[0]):]
        return f"{name}: a module's old name; it is {new}"
    if context and parts[0] != "trainer":
        return f"{name}: {parts[0]} is no module name (a folder's; its modules are tracklane's)"
    return None


FOLDER_OF_NEW = {folder: package for package, folder in FOLDER_OF.items()}


def missing_attribute(module: Path, attributes: list[str]) -> str | None:
    """The first of ``attributes`` (an attribute, then its attributes) the module's source does not define.
    Read with ``ast``, not imported: tracklane.trainer.main imports torch (1.7 s), and a doc check runs no project code."""
    if not module.is_file():
        return attributes[0]
    body = ast.parse(module.read_text(encoding="utf-8")).body
    for attribute in attributes:
        node = defined_names(body).get(attribute)
        if node is None:
            return attribute
        if not isinstance(node, ast.ClassDef):
            return None  # a function, a value or an import: what lies below it is not in this file
        body = node.body
    return None


def defined_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body binds, including under ``if``/``try`` (``if TYPE_CHECKING:`` imports)."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update((t.id, node) for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            names.update(defined_names([*node.body, *node.orelse, *getattr(node, "finalbody", [])]))
    return names


@cache
def our_files(root: Path) -> tuple[frozenset[str], frozenset[str]]:
    """The project's file names, and its folder names that a path may start with (pipeline, shipping, sinks ...)."""
    files = frozenset(p.name for top in (*TOPS, "docs") for p in (root / top).rglob("*") if p.is_file())
    folders = {*TOPS, "docs"} | {p.name for base in BASES[1:] for p in (root / base).glob("*/")
                                 if p.is_dir() and not p.name.startswith((".", "__"))}
    return files, frozenset(folders)


def path_exists(text: str, root: Path) -> bool:
    """Whether a path a doc names exists: from the root or from pipeline/, workers/, trainer/; a bare file name
    anywhere in the project. A path starting in no folder of ours is another project's (wandb/sdk/...): not ours
    to check; one of ``THEIRS`` is checked in that package when it is installed."""
    files, folders = our_files(root)
    if "/" not in text:
        return not text.endswith(".py") or text in files  # a bare .md name is a link: mkdocs checks those
    if any((root / base / text).exists() for base in BASES):
        return True
    first = text.split("/")[0]
    if first not in folders:
        return True
    if first in THEIRS:
        spec = importlib.util.find_spec(first)
        return spec is None or any((Path(p).parent / text).exists() for p in spec.submodule_search_locations or [])
    return False


def test_every_module_and_file_the_docs_name_exists():
    """Every project module, attribute and file named in a doc, a docstring or a comment exists."""
    stale = stale_references(project_prose(ROOT), ROOT)
    assert not stale, "stale references:\n" + "\n".join(stale)


def test_a_doc_naming_what_does_not_exist_is_reported_with_file_and_line():
    """A missing file, module, attribute or bare file name is reported; names outside the project are not."""
    text = [
        ("doc.md", 3, "see pipeline/core/no_such_module.py and core/records.py"),
        ("doc.md", 4, "python -m tracklane.benchmarks.no_such_bench; tracklane.core.records.NoSuchRecord"),
        ("x.py", 9, "(no_such_codec.py) trainer.async_log.flush_interval_s, wandb/sdk/x.py, verl.utils.tracking"),
        ("x.py", 10, "tracklane.cli.main:no_such_main, tracklane.verl.install, tests/no_such_dir/"),
    ]
    assert stale_references(text, ROOT) == [
        "doc.md:3: no file or folder pipeline/core/no_such_module.py",
        "doc.md:4: tracklane.benchmarks.no_such_bench: tracklane.benchmarks has no no_such_bench",
        "doc.md:4: tracklane.core.records.NoSuchRecord: tracklane.core.records has no NoSuchRecord",
        "x.py:9: no file or folder no_such_codec.py",
        "x.py:10: tracklane.cli.main:no_such_main: tracklane.cli.main has no no_such_main",
        "x.py:10: no file or folder tests/no_such_dir/",
    ]


def test_renaming_a_module_a_doc_names_fails_the_check(tmp_path):
    """A doc naming a module passes while the module is there and is reported once it is renamed."""
    (tmp_path / "pipeline" / "core").mkdir(parents=True)
    (tmp_path / "pipeline" / "core" / "records.py").write_text("class Metrics:\n    step: int\n")
    doc = tmp_path / "README.md"
    doc.write_text("The records: `core/records.py` (`tracklane.core.records.Metrics`).\n")
    lines = [("README.md", n, t) for n, t in prose(doc)]
    assert stale_references(lines, tmp_path) == []
    (tmp_path / "pipeline" / "core" / "records.py").rename(tmp_path / "pipeline" / "core" / "record_types.py")
    our_files.cache_clear()  # the project's file names are read once per root
    assert stale_references(lines, tmp_path) == [
        "README.md:1: tracklane.core.records.Metrics: tracklane.core has no records",
        "README.md:1: no file or folder core/records.py",
    ]


def test_python_prose_is_docstrings_and_comments_only(tmp_path):
    """Code is not prose: a name in a string argument is not checked, one in a docstring or comment is."""
    module = tmp_path / "m.py"
    module.write_text('"""Doc: a.py."""\nx = "b.py"  # c.py\n\n\ndef f():\n    """d.py\n    e.py"""\n')
    assert sorted(text.strip() for _, text in prose(module)) == ['"""Doc: a.py."""', '"""d.py', '# c.py', 'e.py"""']


# -- check 2: the data-path diagrams name the registry's trackers --------------------------------------------------

def diagram_tracker_lists(text: str) -> list[list[str]]:
    """The tracker lists of a page's mermaid diagrams: a node label naming at least three registry backends,
    its comma-separated words outside the lines that are paths (``workers/sinks/*``)."""
    lists = []
    for block in MERMAID.findall(text):
        for label in LABEL.findall(block):
            lines = [line for line in label.split("<br/>") if "/" not in line]
            words = [w.strip() for line in lines for w in line.split(",") if w.strip()]
            if len(set(words) & set(BACKENDS)) >= 3:
                lists.append(words)
    return lists


def test_the_data_path_diagrams_name_exactly_the_registrys_trackers():
    """Each diagram's tracker list is the registry's backends, in its order: a new tracker is drawn too."""
    found = {str(p.relative_to(ROOT)): diagram_tracker_lists(p.read_text(encoding="utf-8")) for p in doc_files(ROOT)}
    assert {page for page, lists in found.items() if lists} >= {"README.md", "docs/index.md", "docs/architecture.md"}
    wrong = {page: words for page, lists in found.items() for words in lists if words != list(BACKENDS)}
    assert not wrong, f"the registry has {list(BACKENDS)}; the diagrams: {wrong}"


def test_a_diagram_missing_a_tracker_is_caught():
    """A diagram that leaves a tracker out yields a list that differs from the registry's."""
    names = [n for n in BACKENDS if n != "prometheus"]
    page = f'```mermaid\nflowchart LR\n    s["workers/sinks/*<br/>{", ".join(names)}"]\n```\n'
    assert diagram_tracker_lists(page) == [names] and names != list(BACKENDS)


# -- check 3: the configuration page and the settings the code checks ----------------------------------------------

@cache
def config_hook():
    """docs/hooks/config_reference.py: what generates the page's tables (section -> dataclass)."""
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "docs" / "hooks" / "config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def checked_sections() -> set[str]:
    """The ``trainer.<section>`` names ``check_settings`` reads (its ``trainer.get("...")`` calls)."""
    source = ast.parse((ROOT / "pipeline" / "tracking.py").read_text(encoding="utf-8"))
    function = next(n for n in ast.walk(source) if isinstance(n, ast.FunctionDef) and n.name == "check_settings")
    calls = [n for n in ast.walk(function) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    return {str(call.args[0].value) for call in calls if ast.unparse(call.func) == "trainer.get"
            and call.args and isinstance(call.args[0], ast.Constant)}


def page_sections(page: str) -> dict[str, str]:
    """The page's ``## `trainer.<section>` `` parts by section name (its ### parts included)."""
    parts = re.split(r"^## ", page, flags=re.M)[1:]
    return {m.group(1): part for part in parts if (m := re.match(r"`trainer\.(\w+)`", part))}


def schema(section: str) -> list[str]:
    """The setting names of a section, from the dataclass ``check_settings`` builds for it."""
    ref = config_hook().REFERENCES[section]
    folder, *parts = Path(ref.path).with_suffix("").parts
    module = importlib.import_module(".".join([FOLDER_OF_NEW[folder], *parts]))
    return [f.name for f in dataclasses.fields(getattr(module, ref.cls))]


def test_the_configuration_page_covers_every_section_the_code_checks():
    """Every section check_settings checks has a generated table, a heading and a row on the page, and back."""
    page = CONFIG_PAGE.read_text(encoding="utf-8")
    references = {ref.section.removeprefix("trainer."): name for name, ref in config_hook().REFERENCES.items()}
    assert set(references) == checked_sections(), "a section checked but not generated on the page, or back"
    assert set(page_sections(page)) == set(references)
    for section, marker in references.items():
        assert f"<!-- config-reference:{marker} -->" in page_sections(page)[section]
    overview = page.split("\n## ", 1)[0]
    assert set(re.findall(r"^\| \[?`trainer\.(\w+)`", overview, re.M)) == {"log_async", *references}


@pytest.mark.parametrize("section", sorted(config_hook().REFERENCES))
def test_every_setting_on_the_configuration_page_is_checked(section):
    """The generated table lists exactly the dataclass's settings, and check_settings refuses a key it lacks."""
    ref = config_hook().REFERENCES[section]
    assert [f.name for f in config_hook().dataclass_fields(ref)] == schema(section)
    name = ref.section.removeprefix("trainer.")
    with pytest.raises(ConfigError, match=rf"unknown key\(s\) trainer\.{name}\.not_a_setting"):
        check_settings({"trainer": {name: {"not_a_setting": 1}}})


def named_settings(text: str, sections: dict[str, str]) -> set[tuple[str, str]]:
    """(section, key) for each ``trainer.<section>.<key>`` in ``text`` and each key in the first column of a
    table under a section's heading (the tuning notes): the names written by hand."""
    refs = config_hook().REFERENCES
    known = {ref.section.removeprefix("trainer."): name for name, ref in refs.items()}
    named = {(known[s], k) for s, k in re.findall(r"trainer\.(\w+)\.(\w+)", text) if s in known}
    for section, part in sections.items():
        for cell in re.findall(r"^\| ([^|]*`[^|]*) \|", part, re.M):
            named |= {(known.get(section, section), key) for key in re.findall(r"`(\w+)`", cell)}
    return named


def test_the_docs_name_no_setting_the_code_lacks():
    """Every setting named by hand, on the configuration page or as trainer.<section>.<key> in any doc, exists."""
    page = CONFIG_PAGE.read_text(encoding="utf-8")
    text = "\n".join(p.read_text(encoding="utf-8") for p in doc_files(ROOT))
    named = named_settings(text, page_sections(page))
    unknown = sorted((s, k) for s, k in named if k not in schema(s))
    assert not unknown, f"settings the docs name that the code lacks: {unknown}"


def test_a_setting_the_code_lacks_is_caught():
    """A tuning-notes row or a qualified name for a removed setting is found as named."""
    page = "## `trainer.async_log`\n\n| key(s) | how |\n|---|---|\n| `no_such_knob`, `flush_interval_s` | x |\n"
    named = named_settings(page + "set trainer.console.no_such_key", page_sections(page))
    assert named == {("async_log", "no_such_knob"), ("async_log", "flush_interval_s"), ("console", "no_such_key")}


def test_a_doc_naming_a_module_by_its_folder_is_reported():
    """A module named by its folder (the name it had before tracklane became the one import name) is stale; verl's
    config sections are not."""
    old = "pipe" + "line"  # written so, or the renaming kit would rename it here too
    text = [("doc.md", 1, f"from {old}.core.records import Metrics; {old}.Tracking; trainer.async_log, tracklane.run_id"),
            ("doc.md", 2, f"{old}.verl.dropin.install, import {old}.nothing_of_ours")]
    assert stale_references(text, ROOT) == [
        f"doc.md:1: {old}.core.records: a module's old name; it is tracklane.core.records",
        f"doc.md:1: {old}.Tracking: a module's old name; it is tracklane.Tracking",
        f"doc.md:2: {old}.verl.dropin.install: a module's old name; it is tracklane.verl.dropin.install",
        f"doc.md:2: {old}.nothing_of_ours: {old} is no module name (a folder's; its modules are tracklane's)",
    ]


def health_rule_rows(page: str) -> dict[str, str]:
    """The rules table of docs/health.md: rule -> its defaults cell."""
    table = page.split("<!-- health-rules -->", 1)[1].split("<!-- /health-rules -->", 1)[0]
    rows = [line.split("|")[1:-1] for line in table.strip().splitlines()[2:]]
    return {cells[0].strip().strip("`"): cells[-1].strip() for cells in rows}


def test_the_health_page_lists_every_rule_with_its_defaults():
    """docs/health.md's table has exactly the rules of core/health_rules.py, each with the defaults the code has."""
    from tracklane.core.health_rules import DEFAULTS, RuleSettings

    rows = health_rule_rows((ROOT / "docs" / "health.md").read_text(encoding="utf-8"))
    assert set(rows) == set(DEFAULTS)
    plain = RuleSettings()
    for rule, settings in DEFAULTS.items():
        said = dict(re.findall(r"`(\w+)` ([\d.]+)", rows[rule]))
        differs = {f: getattr(settings, f) for f in RuleSettings.__slots__
                   if f != "enabled" and getattr(settings, f) != getattr(plain, f)}
        assert {f: float(v) for f, v in said.items()} == {f: float(v) for f, v in differs.items()}, rule
