"""One word per idea (pipeline/README.md's glossary): no identifier uses a retired word.

Identifiers only (Python's tokenizer: names, not strings or comments): a user's config value or a tracker's own
metadata key may say "source". An identifier is split into its words (``stored_by_sender`` -> stored, by, sender;
``StreamWindow`` -> stream, window) and each word checked.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("pipeline", "workers", "benchmarks")

RETIRED_WORDS = {
    "acked": "stored (the tracker's store holds it) or handed (its sink host wrote it)",
    "unacked": "unstored",
    "applied": "handed",
}
"""A word retired everywhere, and what says it now."""

RETIRED_NAMES = {"Lane": "Stream", "LaneWindow": "StreamWindow", "LaneSettings": "StreamSettings"}
"""Whole names retired: a stream was called a lane (a lane is a tracker's set of streams)."""

READERS = ("workers/sources/", "workers/testing/", "pipeline/host/source.py", "pipeline/host/registry.py",
           "pipeline/cli/", "pipeline/view/")
"""Where "source" is the glossary's: a tracker's reader (tracklane migrate and view)."""

KEPT_SOURCES = {"data_source", "data_sources", "SOURCE_RUN"}
"""Others' words: verl's for a dataset's origin (the reward's components per data source); MLflow's trace tag
``mlflow.sourceRun``."""

DURABLE_WATERMARK = re.compile(r"durable_(seq|through|upto|watermark)|(last|max|min)_durable", re.I)
""""durable" for a watermark (the word is "stored"); a disk's durability keeps its word."""


def words(name: str) -> list[str]:
    """``stored_by_sender`` -> stored, by, sender; ``StreamWindow`` -> stream, window; ``HTTPServer`` -> http, server."""
    return [w.lower() for part in name.split("_") for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", part)]


def retired_in(source: str, where: str) -> list[tuple[int, str, str]]:
    """(line, identifier, what to say instead) of each retired word ``source`` uses as an identifier; ``where``: its
    path from the repository's root (decides whether "source" is a reader there)."""
    found = []
    reader = where.startswith(READERS)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.NAME:
            continue
        name = token.string
        parts = words(name)
        instead = RETIRED_NAMES.get(name) or next((RETIRED_WORDS[w] for w in parts if w in RETIRED_WORDS), None)
        if instead is None and DURABLE_WATERMARK.search(name):
            instead = "stored"
        if instead is None and not reader and name not in KEPT_SOURCES and {"source", "sources"} & set(parts):
            instead = "sender (what logs; a source is a tracker's reader)"
        if instead is not None:
            found.append((token.start[0], name, instead))
    return found


def test_no_identifier_uses_a_retired_word():
    offenders = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            offenders += [f"{rel}:{line}: {name} (say {instead})"
                          for line, name, instead in retired_in(path.read_text(encoding="utf-8"), rel)]
    assert offenders == []


def test_the_check_fails_on_each_retired_word():
    """Each kind of retired word is found; strings, comments, readers' sources and kept words are not."""
    code = ("acked = unacked_bytes = 1  # applied, in a comment\n"
            "class Lane(LaneWindow): pass\n"
            "def ship(source, sources_seen, durable_seq, last_durable): return 'source', applied\n"
            "data_source = resources = StreamWindow = spool_durable = 0\n")
    assert [(line, name) for line, name, _ in retired_in(code, "pipeline/shipping/x.py")] == [
        (1, "acked"), (1, "unacked_bytes"), (2, "Lane"), (2, "LaneWindow"),
        (3, "source"), (3, "sources_seen"), (3, "durable_seq"), (3, "last_durable"), (3, "applied")]
    assert [name for _, name, _ in retired_in("def read(source): ...\n", "workers/sources/x.py")] == []


def test_the_glossary_names_every_retired_word():
    """pipeline/README.md's glossary says what replaced each word this check refuses."""
    glossary = (ROOT / "pipeline" / "README.md").read_text(encoding="utf-8")
    retired = glossary.split("Retired words", 1)[1].split("\n\n", 1)[0]
    for word in [*RETIRED_WORDS, *RETIRED_NAMES, "source", "durable"]:
        assert f"`{word}`" in retired, word
    for word in ("stream", "sender", "lane", "source", "handed", "stored"):
        assert f"\n| {word} |" in glossary, word
