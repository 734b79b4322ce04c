"""MkDocs hook: the reference tables of ``configuration.md``, generated from the settings dataclasses' source.

A marker ``<!-- config-reference:NAME -->`` (NAME a key of ``REFERENCES``) is replaced by a table of that
dataclass's fields: name, type, default and the docstring written right after the field. The source is read
with ``ast`` (nothing is imported), so the page says what the code says. A marker that names no reference,
a reference whose file, class or marker is missing, or a default that cannot be read fails the build.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE = "configuration.md"
MARKER = re.compile(r"<!--\s*config-reference:([\w.-]+)\s*-->")


@dataclass(frozen=True)
class Reference:
    path: str  # source file, relative to the repository root
    cls: str  # the dataclass
    section: str  # where it lives in a verl-style config


REFERENCES = {
    "async_log": Reference("pipeline/config/async_log.py", "AsyncLogConfig", "trainer.async_log"),
    "record_limits": Reference("pipeline/capture/rich.py", "RecordLimits", "trainer.record_limits"),
    "console": Reference("pipeline/config/console.py", "ConsoleConfig", "trainer.console"),
    "prometheus": Reference("pipeline/config/prometheus.py", "PrometheusConfig", "trainer.prometheus"),
    "health": Reference("pipeline/config/health.py", "HealthConfig", "trainer.health"),
}


class ConfigReferenceError(Exception):
    """The reference cannot be generated: the build must stop."""


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    default: str
    doc: str


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    names = MARKER.findall(markdown)
    unknown = sorted(set(names) - set(REFERENCES))
    if unknown:
        raise ConfigReferenceError(f"{page.file.src_uri}: unknown config-reference marker(s) {unknown}; "
                                   f"known: {sorted(REFERENCES)}")
    if page.file.src_uri == PAGE:
        missing = sorted(set(REFERENCES) - set(names))
        if missing:
            markers = ", ".join(f"<!-- config-reference:{n} -->" for n in missing)
            raise ConfigReferenceError(f"{PAGE} lacks the marker(s) {markers}")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigReferenceError(f"{PAGE}: marker(s) {twice} appear more than once")
    return MARKER.sub(lambda match: table(REFERENCES[match.group(1)]), markdown)


def table(ref: Reference) -> str:
    fields = dataclass_fields(ref)
    lines = [
        f"*Generated from `{ref.path}` (`{ref.cls}`) when the site is built.*",
        "",
        f"| `{ref.section}.` key | type | default | what it does |",
        "|---|---|---|---|",
    ]
    for f in fields:
        lines.append(f"| `{f.name}` | `{f.type}` | {f.default} | {cell(f.doc) or '–'} |")
    return "\n".join(lines) + "\n"


def dataclass_fields(ref: Reference) -> list[Field]:
    source = ROOT / ref.path
    if not source.is_file():
        raise ConfigReferenceError(f"config reference: {ref.path} does not exist")
    module = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    constants = module_constants(module)
    classes = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == ref.cls]
    if not classes:
        raise ConfigReferenceError(f"config reference: no class {ref.cls} in {ref.path}")
    body = classes[0].body
    fields: list[Field] = []
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if "ClassVar" in ast.unparse(node.annotation):
            continue
        following = body[i + 1] if i + 1 < len(body) else None
        doc = ""
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) \
                and isinstance(following.value.value, str):
            doc = inspect.cleandoc(following.value.value)
        name = node.target.id
        fields.append(Field(name, ast.unparse(node.annotation), render_default(name, node.value, constants, ref), doc))
    if not fields:
        raise ConfigReferenceError(f"config reference: {ref.cls} in {ref.path} has no annotated fields")
    return fields


def module_constants(module: ast.Module) -> dict[str, ast.expr]:
    """Module-level ``NAME = value`` (and ``NAME: T = value``) assignments, for defaults that name them."""
    out: dict[str, ast.expr] = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def render_default(name: str, node: ast.expr | None, constants: dict[str, ast.expr], ref: Reference) -> str:
    if node is None:
        return "required"
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("field", "dataclasses.field"):
        keywords = {k.arg: k.value for k in node.keywords}
        if "default" in keywords:
            node = keywords["default"]
        elif "default_factory" in keywords:
            node = factory_value(keywords["default_factory"], constants)
        else:
            return "required"
    try:
        value = evaluate(node, constants)
    except ValueError as exc:
        raise ConfigReferenceError(f"config reference: cannot read the default of {ref.cls}.{name} in {ref.path}: "
                              f"{ast.unparse(node)} ({exc})") from None
    return cell(show(name, value))


def factory_value(factory: ast.expr, constants: dict[str, ast.expr]) -> ast.expr:
    """What ``default_factory`` makes, as an expression: ``dict`` -> ``{}``, ``lambda: X`` -> ``X``."""
    if isinstance(factory, ast.Name) and factory.id in ("dict", "list", "set", "tuple"):
        return ast.Call(func=factory, args=[], keywords=[])
    if isinstance(factory, ast.Lambda):
        return factory.body
    raise ConfigReferenceError(f"config reference: unsupported default_factory {ast.unparse(factory)}")


def evaluate(node: ast.expr, constants: dict[str, ast.expr]) -> Any:
    """A default's value from literals, arithmetic, module constants and copies of them (no code is run)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [evaluate(e, constants) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** in a dict literal")
        return {evaluate(k, constants): evaluate(v, constants) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -evaluate(node.operand, constants)
    if isinstance(node, ast.BinOp):
        left, right = evaluate(node.left, constants), evaluate(node.right, constants)
        ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.Pow: lambda a, b: a**b, ast.Div: lambda a, b: a / b}
        for op, fn in ops.items():
            if isinstance(node.op, op):
                return fn(left, right)
        raise ValueError(f"operator {type(node.op).__name__}")
    if isinstance(node, ast.Name):
        if node.id not in constants:
            raise ValueError(f"{node.id} is not a module-level constant")
        return evaluate(constants[node.id], constants)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("dict", "list", "tuple", "set") \
            and not node.keywords and len(node.args) <= 1:
        if not node.args:
            return {} if node.func.id == "dict" else []
        return evaluate(node.args[0], constants)  # a copy
    if isinstance(node, (ast.DictComp, ast.ListComp)) and len(node.generators) == 1:
        # a copy of a module constant, element by element ({k: dict(v) for k, v in NAME.items()})
        iterated = node.generators[0].iter
        if isinstance(iterated, ast.Call) and isinstance(iterated.func, ast.Attribute) and iterated.func.attr == "items":
            iterated = iterated.func.value
        if isinstance(iterated, ast.Name) and not node.generators[0].ifs:
            return evaluate(iterated, constants)
    raise ValueError("not a literal, arithmetic on literals, or a copy of a module constant")


def show(name: str, value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and name.endswith("_bytes"):
        for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if value >= size and value % size == 0:
                return f"{value // size} {unit} (`{value}`)"
    return f"`{yaml(value)}`"


def yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "[" + ", ".join(yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{yaml(k)}: {yaml(v)}" for k, v in value.items()) + "}"
    return repr(value)


def cell(text: str) -> str:
    """One Markdown table cell: RST ``code`` as `code`, one line, pipes outside code spans escaped (a table
    keeps the pipes of a code span as they are)."""
    text = " ".join(re.sub(r"``(.+?)``", r"`\1`", text).split())
    parts = text.split("`")
    return "`".join(part if i % 2 else part.replace("|", "\\|") for i, part in enumerate(parts))
