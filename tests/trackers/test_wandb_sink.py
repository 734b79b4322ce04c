"""WandbSink against the real wandb SDK in offline mode, read back from its run files."""

from __future__ import annotations

import math
import os
import random
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest

pytest.importorskip("wandb")

from tests.conftest import same_value
from tracklane.core.errors import MissingExtraError
from tracklane.core.params import REDACTED, plain_config
from tracklane.core.records import Metrics, RunSpec
from tracklane.workers.sinks.wandb import WandbSink
from tracklane.workers.sinks.wandb_store import CorruptRunFileError, iter_payloads
from tracklane.workers.testing.readers.wandb_reader import read_run_file, read_wandb_run, run_files

STEPS = 300
CONFIG = {
    "trainer": {"project_name": "p", "total_epochs": 2, "logger": ["console", "wandb"],
                "wandb_api_key": "sk-secret"},
    "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}, "ppo_mini_batch_size": 64},
                          "model": {"path": "Qwen/Qwen2.5-0.5B"}},
    "data": {"max_prompt_length": 512, "hf_token": "sk-secret", "tokenizer": None},
}
ACTOR = ("pg_loss", "entropy", "grad_norm", "lr", "pg_clipfrac", "ppo_kl", "pg_clipfrac_lower")
PERF = ("mfu/actor", "max_memory_allocated_gb", "max_memory_reserved_gb", "cpu_memory_used_gb")
TRAIN_KEYS = (
    [f"actor/{k}" for k in ACTOR]
    + [f"critic/{g}/{s}" for g in ("score", "rewards", "advantages", "returns") for s in ("mean", "max", "min")]
    + [f"{g}/{s}" for g in ("response_length", "prompt_length") for s in ("mean", "max", "min", "clip_ratio")]
    + [f"perf/{k}" for k in PERF]
    + [f"rollout/extra_{i}" for i in range(46)]
)
TIMING_KEYS = (
    [f"timing_s/{k}" for k in ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "step", "testing")]
    + [f"timing_per_token_ms/{k}" for k in ("gen", "ref", "adv", "update_actor")]
)
VAL_KEYS = [f"val-core/{d}/acc/mean@4" for d in ("gsm8k", "math", "aime")] + [
    f"val-aux/{d}/reward/{s}@4" for d in ("gsm8k", "math") for s in ("mean", "std", "best")
]


@pytest.fixture
def wandb_dir(offline_trackers, monkeypatch):
    """WANDB_DIR; WANDB_MODE=offline and wandb's data, cache and config folders all under tmp_path."""
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    return offline_trackers["wandb"]


def make_sink(config=CONFIG, run_id="abc123", trainer=None) -> WandbSink:
    run = RunSpec(project="p", experiment="e", params=plain_config(config), run_id=run_id)
    return WandbSink(run, WandbSink.resolve(run, os.environ, trainer or {}))


def verl_records(steps: range, seed: int = 0) -> list[Metrics]:
    """Two records per step (training scalars, then timings), as a trainer logging twice would."""
    rng = random.Random(seed)
    records = []
    for step in steps:
        train = {key: rng.gauss(0, 1) for key in TRAIN_KEYS}
        train["actor/entropy"] = float(np.float32(rng.random()))  # what clean_metrics makes of numpy
        train["training/global_step"], train["training/epoch"] = step, step // 150
        train["perf/total_num_tokens"] = rng.randrange(2**40)
        if step % 7 == 0:
            train["actor/pg_clipfrac_lower"] = math.nan
        if step % 50 == 1:
            train["actor/grad_norm"] = math.inf if step % 100 == 1 else -math.inf
        if step % 10 == 0:
            train.update({key: rng.random() for key in VAL_KEYS})
        timing = {key: rng.uniform(0, 100) for key in TIMING_KEYS}
        records += [Metrics(step=step, values=train, time=0.0), Metrics(step=step, values=timing, time=0.0)]
    return records


def expected(records: list[Metrics]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for record in records:
        out.setdefault(record.step, {}).update(record.values)
    return out


def write_in_batches(sink: WandbSink, records: list[Metrics], size: int = 7, first_seq: int = 1) -> None:
    """As a lane actor writes: batch by batch, numbered from ``first_seq``. An odd batch size splits some
    steps' two records across write() calls."""
    for index, start in enumerate(range(0, len(records), size)):
        batch = records[start : start + size]
        sink.begin_batch("", first_seq + index, batch)
        sink.write(batch)


def assert_same_scalars(got: dict[int, dict[str, float]], want: dict[int, dict[str, float]]) -> None:
    assert sorted(got) == sorted(want)
    for step, values in want.items():
        assert got[step].keys() == values.keys(), step
        for key, value in values.items():
            assert same_value(got[step][key], value), (step, key, got[step][key], value)


def test_every_step_arrives_exactly_once_with_the_values_written(wandb_dir):
    """300 steps of ~100 verl keys, written in batches, read back equal record by record, NaN and ±Inf included."""
    records = verl_records(range(STEPS))
    sink = make_sink()
    assert sink.open(None) == {"id": "abc123"}
    write_in_batches(sink, records)
    sink.close(0)

    back = read_wandb_run(wandb_dir, "abc123")
    assert back.duplicates() == []
    assert len(back.points) == sum(len(v) for v in expected(records).values())
    assert [step for step, _, _ in back.points] == sorted(step for step, _, _ in back.points)
    assert_same_scalars(back.scalars(), expected(records))
    assert back.status == "exit_code=0"


def test_config_arrives_once_and_secrets_stay_redacted(wandb_dir, tmp_path):
    """The run's config is plain_config's redacted params, logged once, and "sk-secret" is in no file wandb wrote."""
    sink = make_sink()
    sink.open(None)
    sink.write(verl_records(range(3)))
    sink.close(0)

    back = read_wandb_run(wandb_dir)
    assert back.params == plain_config(CONFIG)
    assert back.params["trainer"]["wandb_api_key"] == REDACTED
    assert back.params["data"]["hf_token"] == REDACTED
    assert config_keys_logged(run_files(wandb_dir)) == sorted(CONFIG)
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()}
    assert [p for p, data in files.items() if b"sk-secret" in data] == []
    # wandb's debug.log prints the config as well: the scan above did look at copies of it.
    assert sum(REDACTED.encode() in data for data in files.values()) >= 2


def test_exit_code_reaches_the_run_file_and_close_is_idempotent(wandb_dir):
    """close(1) records exit code 1; a second close does nothing."""
    sink = make_sink()
    sink.open(None)
    sink.write(verl_records(range(2)))
    sink.close(1)
    sink.close(1)
    assert read_wandb_run(wandb_dir).status == "exit_code=1"


@pytest.mark.slow
def test_reopen_with_resume_state_appends_to_the_same_run(wandb_dir):
    """A new sink opened with the first one's state re-attaches to the same run id, without logging config again."""
    records = verl_records(range(STEPS))
    half = len(records) // 2
    first = make_sink()
    state = first.open(None)
    write_in_batches(first, records[:half])
    first.close(0)
    state = msgpack.unpackb(msgpack.packb(state))  # as it would come back to a restarted actor

    second = make_sink()
    assert second.open(state) == state
    write_in_batches(second, records[half:], first_seq=-(-half // 7) + 1)  # the lane's numbering goes on
    second.close(0)

    files = run_files(wandb_dir, "abc123")
    assert len(files) == 2
    assert read_run_file(files[1]).params == {}
    assert config_keys_logged(files) == sorted(CONFIG)
    back = read_wandb_run(wandb_dir, "abc123")
    assert back.duplicates() == []
    assert_same_scalars(back.scalars(), expected(records))


def test_runs_of_one_process_stay_apart(wandb_dir):
    """Two sinks opened one after the other in one process write to their own run ids."""
    for run_id, step in (("first1", 3), ("second2", 5)):
        sink = make_sink(run_id=run_id)
        sink.open(None)
        sink.write([Metrics(step=step, values={"actor/pg_loss": float(step)}, time=0.0)])
        sink.close(0)
    assert read_wandb_run(wandb_dir, "first1").points == [(3, "actor/pg_loss", 3.0)]
    assert read_wandb_run(wandb_dir, "second2").points == [(5, "actor/pg_loss", 5.0)]
    with pytest.raises(ValueError, match="several wandb runs"):
        read_wandb_run(wandb_dir)


def test_reader_rejects_a_corrupted_file(wandb_dir):
    """A flipped byte in a record, or a wrong file header, is reported, never read as data."""
    sink = make_sink()
    sink.open(None)
    sink.write(verl_records(range(5)))
    sink.close(0)
    (path,) = run_files(wandb_dir)
    original = path.read_bytes()

    flip(path, original, len(original) // 2)
    with pytest.raises(CorruptRunFileError, match=r"CRC mismatch|overruns|unexpected record type"):
        read_wandb_run(wandb_dir)
    flip(path, original, 20)  # inside the first record's payload
    with pytest.raises(CorruptRunFileError, match=r"CRC mismatch in record at byte 7"):
        read_wandb_run(wandb_dir)
    flip(path, original, 0)
    with pytest.raises(CorruptRunFileError, match="not a wandb run file"):
        read_wandb_run(wandb_dir)


def test_resolve_gives_plain_settings_with_an_absolute_dir(monkeypatch, tmp_path):
    """resolve() reads only the env and trainer mappings it is given and returns msgpack-able values."""
    monkeypatch.chdir(tmp_path)
    run = RunSpec(project="p", experiment="e")
    env = {"WANDB_MODE": "offline", "WANDB_DIR": "rel/dir", "WANDB_ENTITY": "team"}
    settings = WandbSink.resolve(run, env, {"wandb_proxy": "http://proxy:3128"})
    assert settings == {
        "mode": "offline", "dir": str(tmp_path / "rel" / "dir"), "entity": "team", "proxy": "http://proxy:3128"
    }
    assert msgpack.unpackb(msgpack.packb(settings)) == settings
    assert WandbSink.resolve(run, {}, {})["dir"] == str(tmp_path)


def test_where_names_the_run_folder_and_the_sync_command(wandb_dir):
    """where() points at the run's own folder and says how to upload it (a proxy setting does not get in the way)."""
    sink = make_sink(trainer={"wandb_proxy": "http://127.0.0.1:9"})
    sink.open(None)
    sink.close(0)
    (path,) = run_files(wandb_dir)
    assert sink.where().endswith(f"`wandb sync {path.parent}`)")


def test_missing_sdk_names_the_extra(monkeypatch):
    """Without the wandb package, open() raises MissingExtraError naming tracklane[wandb]."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(MissingExtraError, match=r"tracklane\[wandb\]"):
        make_sink().open(None)


def config_keys_logged(files: list[Path]) -> list[str]:
    """Every top-level config key written across the run files, once per time it was written."""
    from wandb.proto import wandb_internal_pb2

    keys = []
    for path in files:
        for payload in iter_payloads(path):
            record = wandb_internal_pb2.Record.FromString(payload)
            kind = record.WhichOneof("record_type")
            config = record.run.config if kind == "run" else record.config if kind == "config" else None
            keys += [item.key for item in config.update if item.key != "_wandb"] if config else []
    return sorted(keys)


def flip(path: Path, original: bytes, offset: int) -> None:
    data = bytearray(original)
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


KILLED_WRITER = """
import json, sys, time
from tests.trackers.test_wandb_sink import make_sink, verl_records, STEPS
sink = make_sink(run_id="killed1")
sink.open(None)
records = verl_records(range(STEPS))
pending, durable = [], -1
for index in range(int(sys.argv[1])):
    sink.begin_batch("", index + 1, records[index * 7 : index * 7 + 7])
    sink.write(records[index * 7 : index * 7 + 7])
    pending.append((index, sink.written()))
    while pending and sink.stored(pending[0][1]):
        durable = pending.pop(0)[0]
print(json.dumps({"durable": durable}), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_durable_means_on_disk_and_a_successor_after_a_kill_stores_each_step_once(wandb_dir):
    """A process writing 40 batches is SIGKILLed with its wandb-core: every batch its sink called durable is in the
    run file, the newest rows are not (they died in wandb-core's memory), and a sink that takes the run over,
    sent everything after the durable batch again, stores every step exactly once."""
    import json
    import signal
    import subprocess

    batches = 40
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(batches)], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[2], start_new_session=True)
    try:
        durable = json.loads(child.stdout.readline())["durable"]
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    records = verl_records(range(STEPS))
    (first,) = run_files(wandb_dir, "killed1")
    kept = {step for step, _, _ in read_run_file(first).points}
    assert {r.step for r in records[: (durable + 1) * 7]} <= kept  # durable: on disk
    assert max(kept) < records[batches * 7 - 1].step  # the newest rows died with wandb-core

    successor = make_sink(run_id="killed1")
    assert successor.open({"id": "killed1"}) == {"id": "killed1"}
    sent = records[(durable + 1) * 7 : (batches + 20) * 7]
    write_in_batches(successor, sent, first_seq=durable + 2)
    successor.close(0)
    back = read_wandb_run(wandb_dir, "killed1")
    assert back.duplicates() == []
    assert_same_scalars(back.scalars(), expected(records[: (batches + 20) * 7]))
    assert back.params == plain_config(CONFIG)


@pytest.mark.slow
def test_steps_that_arrive_late_and_steps_of_another_axis_are_all_kept(wandb_dir):
    """wandb drops a row whose step is below its newest; the sink numbers rows itself and logs each key against a
    step metric, so a late step, a table of a late step and a producer's own axis all arrive with their steps."""
    from tracklane.core.records import Generations
    from tracklane.workers.testing.readers.wandb_reader import read_wandb_media

    sink = make_sink()
    sink.open(None)
    sink.write([Metrics(step=5, values={"a": 1.0, "b": 2.0}, time=0.0), Metrics(step=3, values={"a": 9.0}, time=0.0),
                Generations(step=4, samples=[("in", "out", 1.0)], key="val/generations", time=0.0),
                Metrics(step=2, values={"w/loss": 0.5}, time=0.0, axis="rollout/step"),
                Metrics(step=6, values={"a": 3.0}, time=0.0),
                Metrics(step=1, values={"w/loss": 0.7}, time=0.0, axis="rollout/step")])
    sink.close(0)
    assert sink.counts.cuts == {}
    assert sorted(read_wandb_run(wandb_dir).points) == [(1, "w/loss", 0.7), (2, "w/loss", 0.5), (3, "a", 9.0),
                                                       (5, "a", 1.0), (5, "b", 2.0), (6, "a", 3.0)]
    assert [(v.step, v.key) for v in read_wandb_media(wandb_dir).values] == [(4, "val/generations")]
