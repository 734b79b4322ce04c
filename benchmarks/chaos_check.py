"""The chaos run's end check: what every tracker holds, read back from its own store, against what was logged.

Kafka's transactions test, per tracker: set equality, no duplicates, order. For every tracker:

- **points**: each (key, step) the trainer or a producer logged, its value encoding its step (``value_of``):
  present exactly once, missing, or stored twice; a point the run never logged, or with another value, is
  *unexpected*; a record (one ``log()`` call) only partly stored is *torn*.
- **validation generations** (a record every ``rich_every`` steps of each sender): the same, per record,
  from each tracker's table (samples name their sender and step).
- **the poison image**: in every tracker once, except MLflow, which must not have it.
- **order**: where the store keeps the order things arrived in (the file's lines, TensorBoard's event files,
  wandb's run file, SwanLab's store, the console's lines; not MLflow, which sorts by step and timestamp), each
  key's steps increase within each incarnation of a sender (a trainer process, a producer actor) and, for the
  trainer, across its resume. Across a producer's re-creation the order is reported, not required: the
  successor starts logging at once, while what its predecessor shipped may still be on its way.

A record is *must* unless a kill's grace window holds it: logged (by the time written down before its
``log()``) less than ``flush_interval_s`` + ``grace_margin_s`` before the SIGKILL of its process (the trainer,
or a producer, whose actor dies with the trainer too). A must record missing anywhere is a loss unless the report
names exactly as many as dropped (a full disk's cost: a dead producer's batches its disk refused, that a lane had
not taken; a lane's memory bound); a window record may be missing. Then the report's words are matched against
what is missing, per tracker, in records (a record
is one ``log*()`` call: a step's metrics, or a validation-generations record):

- every producer incarnation the final report names (its sender id: a producer killed on its own, one that died
  with a SIGKILLed trainer and that the resumed run found in its spool, one that closed normally): its
  ``unshipped`` is exactly how many of its window records are missing (one that died with a SIGKILLed trainer may
  miss more by the calls it wrote down after that kill: its actor outlives the trainer by milliseconds, and such a
  call may never have reached tracklane's producer, so no report can name it); a producer killed while the last
  trainer ran must be named, and so must one whose window records are missing (a tail no report names is a
  loss nobody counted);
- a SIGKILLed trainer's own window records: allowed losses, not named by any report (counted);
- everything else the report says is lost (``dropped_records`` of the lane, of rank 0 and of each producer: a
  full disk's cost) is exactly how many must records are missing;
- ``failed_records`` is 1 in MLflow (the poison) and 0 elsewhere, and nothing is left unstored.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracklane.benchmarks.chaos_child import GEN_KEY, POISON_NAME, PRODUCER_KEY, PROJECT, TRAINER_KEY, value_of

ORDERED = {"file", "tensorboard", "wandb", "swanlab", "console"}
"""Trackers whose store keeps the order batches arrived in."""
OUR_KEY = re.compile(r"^(train/k\d\d|p\d+/v\d\d)$")


@dataclass(frozen=True, slots=True)
class Logged:
    """One ``log()`` call of one sender: the trainer (``train``) or a producer (``p<j>``), in one incarnation."""

    sender: str
    gen: int
    step: int
    time: float


@dataclass(frozen=True, slots=True)
class Window:
    """A kill's grace window: records of these (sender, gen) logged at or after ``start`` may be missing."""

    kind: str
    at: float
    start: float
    incarnations: frozenset[tuple[str, int]]
    reported: bool
    """The kill happened in the trainer whose report ends the run (so the report can name the tail)."""


@dataclass(slots=True)
class Place:
    """Where the run's trackers wrote."""

    work: Path
    run_id: str
    experiment: str
    mlflow_uri: str
    console_files: list[Path] = field(default_factory=list)

    @property
    def file(self) -> Path:
        return self.work / "metrics.jsonl"


@dataclass(slots=True)
class Expected:
    """What was logged, by whom and when, and which kill windows hold which records."""

    logged: list[Logged]
    windows: list[Window]
    keys: int
    producer_keys: int
    rich_every: int
    senders: dict[tuple[str, int], str] = field(default_factory=dict)
    """(producer, gen) -> its sender id (as the report names it)."""

    def keys_of(self, sender: str) -> list[str]:
        if sender == "train":
            return [TRAINER_KEY.format(i) for i in range(self.keys)]
        return [f"{sender}/{PRODUCER_KEY.format(i)}" for i in range(self.producer_keys)]

    def window_of(self, record: Logged) -> Window | None:
        for window in self.windows:
            if (record.sender, record.gen) in window.incarnations and record.time >= window.start:
                return window
        return None


# -- reading each tracker back ------------------------------------------------------------------------
def read_points(tracker: str, place: Place) -> list[tuple[int, str, float]]:
    """Every stored (step, key, value) of the run's own keys, in the order the store keeps (MLflow: by step)."""
    points: list[tuple[int, str, float]]
    if tracker == "file":
        from tracklane.workers.sinks.file import METRICS_FILE, tracklane_dir

        points = []
        own = Path(tracklane_dir(str(place.file)), METRICS_FILE)  # a producer's own axis is beside verl's lines
        for path in (place.file, *([own] if own.is_file() else [])):
            with open(path, encoding="utf-8") as lines:
                for line in lines:
                    if line.strip():
                        row = json.loads(line)
                        if row.get("step") is not None:
                            points += [(row["step"], key, value) for key, value in row["data"].items()]
    elif tracker == "tensorboard":
        points = _tensorboard_points(place.work / "tensorboard")
    elif tracker == "wandb":
        from tracklane.workers.testing.readers.wandb_reader import read_wandb_run

        points = read_wandb_run(place.work / "wandb", place.run_id).points
    elif tracker == "swanlab":
        from tracklane.workers.testing.readers.swanlab_reader import read_swanlab_run

        points = read_swanlab_run(place.work / "swanlog", run_id=place.run_id).points
    elif tracker == "mlflow":
        from tracklane.workers.testing.readers.mlflow_reader import read_mlflow_run

        points = read_mlflow_run(place.mlflow_uri, _mlflow_run(place)).points
    elif tracker == "console":
        points = [point for _, point in _console_lines(place)]
    else:
        raise ValueError(f"no reader for {tracker}")
    return [(int(step), key, value) for step, key, value in points if OUR_KEY.match(key)]


def _tensorboard_points(logdir: Path) -> list[tuple[int, str, float]]:
    """Scalar events file by file (oldest first), each tag's events in the order written (not sorted by step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tracklane.workers.testing.readers.tensorboard_reader import KEEP_ALL

    points: list[tuple[int, str, float]] = []
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(path), size_guidance=KEEP_ALL, purge_orphaned_data=False)
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            points += [(event.step, tag, event.value) for event in acc.Scalars(tag)]
    return points


def _mlflow_run(place: Place) -> str:
    from tracklane.workers.testing.readers.mlflow_reader import find_mlflow_run_ids

    runs = find_mlflow_run_ids(place.mlflow_uri, PROJECT, place.experiment)
    if len(runs) != 1:
        raise LookupError(f"expected one MLflow run named {place.experiment!r}, found {len(runs)}")
    return runs[0]


_CONSOLE_HEAD = re.compile(r"^(?:step|[\w./-]+):(-?\d+) - ")


def _console_lines(place: Place) -> Iterable[tuple[str, tuple[int, str, float]]]:
    """(line, point) for each ``key:value`` of the console's verl-format lines, every trainer's stdout in turn."""
    for path in place.console_files:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            head = _CONSOLE_HEAD.match(line)
            if not head:
                continue
            for part in line[head.end():].split(" - "):
                key, _, value = part.partition(":")
                try:
                    yield line, (int(head[1]), key, float(value))
                except ValueError:  # a rich record's summary line
                    continue


def read_generations(tracker: str, place: Place, keys: list[str]) -> Counter:
    """(sender, step) -> how many times the tracker stored that validation-generations record (by its first
    sample; MLflow keeps one file per key and step, so it cannot show a record twice)."""
    inputs: list[str] = []
    if tracker == "file":
        folder = Path(f"{place.file.with_suffix('')}_generations")
        for path in sorted(folder.glob("*.jsonl")):
            inputs += [json.loads(line)["input"] for line in path.read_text(encoding="utf-8").splitlines() if line]
    elif tracker == "tensorboard":
        from tracklane.workers.testing.readers.tensorboard_reader import parse_markdown_table, read_tensorboard_rich

        texts = read_tensorboard_rich(place.work / "tensorboard").texts
        for key in keys:
            for markdowns in texts.get(f"{key}/text_summary", {}).values():
                inputs += [row[1] for md in markdowns for row in parse_markdown_table(md)]
    elif tracker == "wandb":
        from tracklane.workers.testing.readers.wandb_reader import read_wandb_media

        for value in read_wandb_media(place.work / "wandb", place.run_id).values:
            if value.key in keys:
                table = json.loads(value.file.read_text(encoding="utf-8"))
                column = table["columns"].index("input")
                inputs += [row[column] for row in table["data"]]
    elif tracker == "swanlab":
        from tracklane.workers.testing.readers.swanlab_reader import read_swanlab_media

        for entry in read_swanlab_media(place.work / "swanlog", run_id=place.run_id).entries:
            if entry.key in keys:
                table = json.loads(entry.path.read_text(encoding="utf-8"))
                inputs += [row.get("input") for row in table["rowData"]]
    elif tracker == "mlflow":
        from tracklane.workers.testing.readers.mlflow_reader import list_mlflow_artifacts, read_mlflow_steps

        run = _mlflow_run(place)
        folders = {path.split("/")[1] for path in list_mlflow_artifacts(place.mlflow_uri, run, "generations")}
        for folder in folders:
            for rows in read_mlflow_steps(place.mlflow_uri, run, f"generations/{folder}").values():
                inputs += [row["input"] for row in rows]
    elif tracker == "console":
        found: Counter = Counter()
        for path in place.console_files:
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                match = re.match(r"^step:(-?\d+) - ([\w./-]+): \d+ samples", line)
                if match and match[2] in keys:
                    found[(_sender_of_key(match[2]), int(match[1]))] += 1
        return found
    out: Counter = Counter()
    for text in inputs:
        sender, step, index = str(text).split("|")
        if index == "0":
            out[(sender, int(step))] += 1
    return out


def _sender_of_key(key: str) -> str:
    return key.split("/")[0] if key != GEN_KEY else "train"


def read_poison(tracker: str, place: Place) -> int:
    """How many times the tracker stored the poison image."""
    if tracker == "file":
        from tracklane.workers.sinks.media import safe_name

        return len(list(Path(f"{place.file.with_suffix('')}_media", "images", safe_name(POISON_NAME)).glob("*.png")))
    if tracker == "tensorboard":
        from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_rich

        images = read_tensorboard_rich(place.work / "tensorboard").images.get(POISON_NAME, {})
        return sum(len(events) for events in images.values())
    if tracker == "wandb":
        from tracklane.workers.testing.readers.wandb_reader import read_wandb_media

        return sum(1 for v in read_wandb_media(place.work / "wandb", place.run_id).values if v.key == POISON_NAME)
    if tracker == "swanlab":
        from tracklane.workers.testing.readers.swanlab_reader import read_swanlab_media

        media = read_swanlab_media(place.work / "swanlog", run_id=place.run_id)
        return sum(len(entries) for entries in media.of(POISON_NAME).values())
    if tracker == "mlflow":
        from tracklane.workers.testing.readers.mlflow_reader import list_mlflow_artifacts

        files = list_mlflow_artifacts(place.mlflow_uri, _mlflow_run(place), "images")
        return sum(1 for path in files if path.startswith("images/poison") and path.endswith(".png"))
    if tracker == "console":
        return sum(path.read_text(encoding="utf-8", errors="replace").count(f" - {POISON_NAME}: image")
                   for path in place.console_files)
    raise ValueError(tracker)


# -- the check ------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Tally:
    """What one tracker holds of what was logged, record by record."""

    logged_points: set[tuple[int, str]] = field(default_factory=set)
    must_points: int = 0
    present_points: int = 0
    """Points (must or window) stored exactly once."""
    missing_points: int = 0
    """Must points not stored."""
    window_lost_points: int = 0
    duplicated: int = 0
    """Points and generation records stored more than once."""
    torn_records: int = 0
    missing_records: list[Logged] = field(default_factory=list)
    """Must records (a step's metrics, a generations record) not (wholly) stored."""
    window_missing: Counter = field(default_factory=Counter)
    """Window -> its records not stored."""
    tail_missing: Counter = field(default_factory=Counter)
    """(sender, gen) -> its window records not stored."""
    raced: Counter = field(default_factory=Counter)
    """(sender, gen) -> of those, a producer's written down after the SIGKILL of the trainer it died with: its actor
    outlives the trainer by some milliseconds, so such a call may never have reached tracklane (nothing to name)."""
    examples: dict[str, list] = field(default_factory=lambda: {k: [] for k in ("missing", "duplicated", "torn")})

    def add(self, record: Logged, window: Window | None, counts: list[int], generations: int | None) -> None:
        """One logged record: ``counts`` of its keys in the store, ``generations`` how often its generations
        record is there (None: it logged none)."""
        duplicated = sum(1 for n in counts if n > 1) + (1 if generations and generations > 1 else 0)
        self.duplicated += duplicated
        if duplicated:
            _example(self.examples["duplicated"], (record.sender, record.gen, record.step))
        if 0 < sum(1 for n in counts if n) < len(counts):
            self.torn_records += 1
            _example(self.examples["torn"], (record.sender, record.gen, record.step, counts))
        self.present_points += sum(1 for n in counts if n == 1)
        gone_points = sum(1 for n in counts if n == 0)
        gone_records = (1 if gone_points else 0) + (1 if generations == 0 else 0)
        if window is None:
            self.must_points += len(counts)
            self.missing_points += gone_points
            if gone_records:
                self.missing_records.extend([record] * gone_records)
                _example(self.examples["missing"], (record.sender, record.gen, record.step, round(record.time, 3)))
        else:
            self.window_lost_points += gone_points
            self.window_missing[window] += gone_records
            self.tail_missing[(record.sender, record.gen)] += gone_records
            if window.kind == "trainer_kill" and record.time > window.at and record.sender != "train":
                self.raced[(record.sender, record.gen)] += gone_records


def tally(expected: Expected, stored: Counter, generations: Counter) -> Tally:
    """Every logged record against what the store holds."""
    out = Tally()
    for record in expected.logged:
        keys = expected.keys_of(record.sender)
        out.logged_points.update((record.step, key) for key in keys)
        has_generations = record.step % expected.rich_every == 0
        out.add(record, expected.window_of(record), [stored.get((record.step, key), 0) for key in keys],
                generations.get((record.sender, record.step), 0) if has_generations else None)
    return out


def strays(points: list[tuple[int, str, float]], logged: set[tuple[int, str]], generations: Counter,
           expected: Expected, tracker: str) -> dict[str, Any]:
    """What the store holds that was never logged, or with another value than the one logged."""
    logged_generations = {(r.sender, r.step) for r in expected.logged if r.step % expected.rich_every == 0}
    unexpected = sorted({(step, key) for step, key, _ in points if (step, key) not in logged})
    wrong = [(step, key, value) for step, key, value in points if (step, key) in logged
             and not _same(value, value_of(step, int(key[-2:])), tracker)]
    other_generations = sorted(set(generations) - logged_generations)
    return {"unexpected_points": unexpected, "wrong_values": wrong, "unexpected_generations": other_generations}


def check_tracker(tracker: str, place: Place, expected: Expected, report: dict[str, Any] | None,
                  poisoned: bool, generation_keys: list[str]) -> dict[str, Any]:
    """Every figure and verdict for one tracker (``failures``: what is wrong, empty when it passed)."""
    try:
        points = read_points(tracker, place)
        generations = read_generations(tracker, place, generation_keys)
        poison = read_poison(tracker, place) if poisoned else 0
    except Exception as exc:  # a store that cannot be read fails the run, with why
        return {"tracker": tracker, "failures": [f"read failed: {type(exc).__name__}: {exc}"]}
    found = tally(expected, Counter((step, key) for step, key, _ in points), generations)
    stray = strays(points, found.logged_points, generations, expected, tracker)
    failures: list[str] = []
    missing_failure = (f"{len(found.missing_records)} record(s) ({found.missing_points} point(s)) logged before any "
                       f"kill window are missing, e.g. {found.examples['missing'][:3]}")
    if found.missing_records:
        failures.append(missing_failure)
    if found.duplicated:
        failures.append(f"{found.duplicated} point(s)/record(s) stored more than once, e.g. "
                        f"{found.examples['duplicated'][:3]}")
    if found.torn_records:
        failures.append(f"{found.torn_records} record(s) stored only in part, e.g. {found.examples['torn'][:2]}")
    for what, items in stray.items():
        if items:
            failures.append(f"{len(items)} {what.replace('_', ' ')}, e.g. {items[:3]}")
    order = _order(points, expected) if tracker in ORDERED else {"kept": None, "why": "the store sorts by step"}
    if order.get("broken"):
        failures.append(f"order broken: {order['broken'][:3]}")
    out: dict[str, Any] = {
        "tracker": tracker, "failures": failures, "logged_points": len(found.logged_points),
        "must_points": found.must_points, "present_points": found.present_points,
        "missing_points": found.missing_points, "window_lost_points": found.window_lost_points,
        "duplicated": found.duplicated, "torn_records": found.torn_records,
        "missing_records": len(found.missing_records), **{what: len(items) for what, items in stray.items()},
        "order": order, "generations": {"expected": sum(1 for r in expected.logged if r.step % expected.rich_every == 0),
                                        "stored": sum(generations.values())},
        "windows": [{"kind": w.kind, "at": round(w.at, 3), "lost_records": found.window_missing.get(w, 0),
                     "incarnations": sorted(f"{s}-g{g}" for s, g in w.incarnations)} for w in expected.windows]}
    if poisoned:
        want = 0 if tracker == "mlflow" else 1
        out["poison"] = {"stored": poison, "expected": want}
        if poison != want:
            failures.append(f"the poison image is stored {poison} time(s), expected {want}")
    out["named"] = _match_report(tracker, expected, report, found, poisoned,
                                 failures)
    if found.missing_records and any(row["what"].startswith("dropped") and row["named"] == row["missing"]
                                     for row in out["named"]):
        # Every missing record is one the report names as dropped: the cost of a full disk (a dead producer's
        # batches that were only in Ray, a lane's memory bound), counted, which the promise allows.
        failures.remove(missing_failure)
        out["counted_disk_cost_records"] = len(found.missing_records)
    return out


def _match_report(tracker: str, expected: Expected, report: dict[str, Any] | None, found: Tally, poisoned: bool,
                  failures: list[str]) -> list[dict[str, Any]]:
    """Each loss the final report names against what is missing in this tracker (records): a line per check."""
    if report is None:
        return []
    tail_missing, missing_records = found.tail_missing, found.missing_records
    rows: list[dict[str, Any]] = []
    producers = report.get("producers", {})
    killed = {incarnation: window for window in expected.windows for incarnation in window.incarnations}
    in_windows = 0  # window records missing beyond a tail, named among the dropped (a full disk's cost)
    for (name, gen), sender in sorted(expected.senders.items()):
        lost = tail_missing.get((name, gen), 0)
        window = killed.get((name, gen))
        entry = producers.get(sender)
        if entry is None:
            if window is not None and window.kind == "producer_kill" and window.reported:
                failures.append(f"the report names no producer {name}-g{gen} ({sender}), killed while the last "
                                f"trainer ran; {lost} of its record(s) are missing")
            elif lost:  # killed in a trainer SIGKILLed later, and its successor's report does not carry it
                failures.append(f"producer {name}-g{gen} ({sender}, {window.kind if window else 'not killed'}): "
                                f"{lost} of its window record(s) are missing and no report names them")
            rows.append({"what": f"{name}-g{gen} tail ({window.kind if window else 'no kill'})", "sender": sender,
                         "named": None, "missing": lost})
            continue
        named = entry.get("unshipped", 0)
        rows.append({"what": f"{name}-g{gen} unshipped", "sender": sender, "named": named, "missing": lost,
                     "died": entry.get("died"), "killed_by": window.kind if window else None})
        # Batches its full disk refused that this lane never got may lie in its window too: the report names them
        # among the dropped (lost_by_lane), matched there.
        beyond = min(max(0, lost - named), entry.get("lost_by_lane", {}).get(tracker, 0))
        in_windows += beyond
        raced = found.raced.get((name, gen), 0)  # calls its dying actor may never have taken: named or not
        if not lost - raced <= named + beyond <= lost and not _went_with_the_trainer(tracker, window, named, lost):
            failures.append(f"producer {name}-g{gen} ({sender}, {window.kind if window else 'not killed'}): the "
                            f"report says {named} record(s) not shipped, {lost} of its window record(s) are missing")
    lane = report.get("lanes", {}).get(tracker, {})
    dropped = (lane.get("dropped_records", 0) + report.get("dropped_records", 0)
               + sum(p.get("dropped", 0) + p.get("lost_by_lane", {}).get(tracker, 0) for p in producers.values()))
    rows.append({"what": "dropped (lane, rank 0, producers: a full disk's cost)", "named": dropped,
                 "missing": len(missing_records) + in_windows})
    if dropped != len(missing_records) + in_windows:
        failures.append(f"the report names {dropped} record(s) dropped (lane, rank 0, producers), "
                        f"{len(missing_records)} record(s) logged before any kill window are missing "
                        f"(+ {in_windows} in kill windows beyond the counted tails)")
    if tracker in report.get("lanes", {}):
        failed = lane.get("failed_records", 0)
        want = 1 if (poisoned and tracker == "mlflow") else 0
        rows.append({"what": "failed (the poison record in MLflow)", "named": failed, "missing": want})
        if failed != want:
            failures.append(f"the report counts {failed} failed record(s) for {tracker}, expected {want}")
        if lane.get("unstored_records"):
            failures.append(f"{lane['unstored_records']} record(s) still not stored at finish()")
    return rows


def _went_with_the_trainer(tracker: str, window: Window | None, named: int, lost: int) -> bool:
    """The console's store is the trainer's own stdout: lines an answer had carried to a trainer that was then
    SIGKILLed die with it, beyond the tail the report counts (the report died with it too). Allowed within the
    trainer's kill window, and only there."""
    return tracker == "console" and window is not None and window.kind == "trainer_kill" and lost >= named


def _order(points: list[tuple[int, str, float]], expected: Expected) -> dict[str, Any]:
    """Each key's steps in storage order: increasing within each incarnation, and across the trainer's resume;
    a producer's steps going back across its re-creation are counted apart (reported, not required)."""
    gen_of: dict[tuple[str, int], int] = {(r.sender, r.step): r.gen for r in expected.logged}
    by_key: dict[str, list[int]] = {}
    for step, key, _ in points:
        by_key.setdefault(key, []).append(step)
    broken: list[tuple] = []
    across: list[tuple] = []
    for key, steps in by_key.items():
        sender = "train" if key.startswith("train/") else key.split("/")[0]
        last: dict[int, int] = {}  # gen -> its last step seen
        previous: tuple[int, int] | None = None  # (gen, step) of the point before
        for step in steps:
            gen = gen_of.get((sender, step), -1)
            if gen in last and step <= last[gen]:
                broken.append((key, f"g{gen}", last[gen], step))
            elif previous is not None and step <= previous[1]:
                (broken if sender == "train" else across).append((key, f"g{previous[0]}->g{gen}", previous[1], step))
            last[gen] = step
            previous = (gen, step)
    return {"kept": not broken, "broken": broken[:10], "broken_count": len(broken),
            "producer_order_across_restarts": {"kept": not across, "examples": across[:5], "count": len(across)}}


def _same(got: float, want: float, tracker: str) -> bool:
    return got == want or (tracker == "tensorboard" and abs(got - want) <= abs(want) * 1e-7)


def _example(into: list, item: Any) -> None:
    if len(into) < 5:
        into.append(item)
