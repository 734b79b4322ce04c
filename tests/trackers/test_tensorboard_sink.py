"""TensorboardSink writing real event files, read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from tracklane.core.params import REDACTED, flatten_params, plain_config
from tracklane.core.records import Metrics, RunSpec
from tracklane.workers.sinks.tensorboard import TensorboardSink
from tracklane.workers.testing.readers.tensorboard_reader import read_tensorboard_dir

STEPS = 300
CONFIG = {
    "trainer": {"project_name": "p", "logger": ["console", "tensorboard"], "wandb_api_key": "sk-secret"},
    "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}}, "model": {"path": "Qwen/Qwen2.5-0.5B"}},
    "data": {"hf_token": "sk-secret", "tokenizer": None, "template": "a | b \\ c"},
}
TRAIN_KEYS = (
    [f"actor/{k}" for k in ("pg_loss", "entropy", "grad_norm", "lr", "pg_clipfrac", "ppo_kl")]
    + [f"critic/{g}/{s}" for g in ("score", "rewards", "advantages", "returns") for s in ("mean", "max", "min")]
    + [f"timing_s/{k}" for k in ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "step")]
    + [f"rollout/extra_{i}" for i in range(70)]
)
VAL_KEYS = [f"val-core/{d}/acc/mean@4" for d in ("gsm8k", "math", "aime")]


def verl_records(steps: range) -> list[Metrics]:
    """~100 keys a step like verl's trainer; validation logged as a second record every 10 steps."""
    records = []
    for step in steps:
        values: dict[str, float | int] = {k: math.sin(step * 0.1 + i) * 10 ** (i % 4) for i, k in enumerate(TRAIN_KEYS)}
        values.update({"training/global_step": step, "perf/total_num_tokens": 2**40 + step})
        if step % 7 == 3:
            values["actor/grad_norm"] = math.nan
        if step % 50 == 5:
            values["actor/ppo_kl"] = math.inf if step % 100 == 5 else -math.inf
        records.append(Metrics(step=step, values=values, time=1.7e9 + step * 2.5))
        if step % 10 == 0:
            records.append(Metrics(step=step, values={k: step / 300 for k in VAL_KEYS}, time=1.7e9 + step * 2.5 + 1))
    return records


def assert_same_points(back, records) -> None:
    """Each value arrives once, as the float32 TensorBoard stores."""
    expected = {}
    for record in records:
        for key, value in record.values.items():
            expected.setdefault(record.step, {})[key] = float(np.float32(value))
    assert back.duplicates() == []
    assert len(back.points) == sum(map(len, expected.values()))
    got = back.scalars()
    assert got.keys() == expected.keys()
    for step, values in expected.items():
        assert got[step].keys() == values.keys(), step
        for key, value in values.items():
            assert got[step][key] == value or (math.isnan(value) and math.isnan(got[step][key])), (step, key)


def make_sink(logdir: Path, config=CONFIG) -> TensorboardSink:
    run = RunSpec(project="p", experiment="e", params=plain_config(config), run_id="abc123")
    return TensorboardSink(run, TensorboardSink.resolve(run, {"TENSORBOARD_DIR": str(logdir)}, {}))


def summary_events(logdir: Path) -> list:
    return [e for path in sorted(logdir.glob("events.out.tfevents.*")) for e in EventFileLoader(str(path)).Load()
            if e.HasField("summary")]


def test_round_trip_points_and_params(tmp_path):
    """Every point arrives once at its step (NaN and +-Inf kept), params once as a text table, no secret."""
    sink = make_sink(tmp_path)
    sink.open(None)
    records = verl_records(range(STEPS))
    for start in range(0, len(records), 40):
        sink.write(records[start:start + 40])
    sink.close(0)

    back = read_tensorboard_dir(tmp_path)
    assert_same_points(back, records)
    assert back.scalars()[5]["actor/ppo_kl"] == math.inf and back.scalars()[55]["actor/ppo_kl"] == -math.inf
    assert back.params == {k: str(v) for k, v in flatten_params(plain_config(CONFIG)).items()}
    assert back.params["trainer/wandb_api_key"] == REDACTED and back.params["data/template"] == "a | b \\ c"
    assert not any(b"sk-secret" in path.read_bytes() for path in tmp_path.iterdir())


def test_one_summary_per_record(tmp_path):
    """A Summary a record, as verl's add_scalar a call: records sharing a step stay apart (merged, a key logged twice
    at one step would keep only its later value)."""
    sink = make_sink(tmp_path)
    sink.open(None)
    records = verl_records(range(20))
    sink.write(records[:5])
    sink.write(records[5:])
    sink.close(0)
    events = summary_events(tmp_path)
    params, scalars = events[0], events[1:]
    assert params.step == 0 and params.summary.value[0].tag == "hyperparameters"
    assert [e.step for e in scalars] == [r.step for r in records] and scalars[0].step == scalars[1].step == 0
    assert [len(e.summary.value) for e in scalars] == [len(r.values) for r in records]


def test_resume_opens_a_new_file_without_params(tmp_path):
    """open(resume) after a restart adds a second event file in the same dir: every step once, params once."""
    records = verl_records(range(60))
    first = make_sink(tmp_path)
    state = first.open(None)
    first.write(records[:40])  # the actor dies here, without close()

    second = make_sink(tmp_path)
    second.open(msgpack.unpackb(msgpack.packb(state)))
    second.write(records[40:])
    second.close(0)
    first.close(0)

    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    assert_same_points(read_tensorboard_dir(tmp_path), records)
    assert sum(e.summary.value[0].tag == "hyperparameters" for e in summary_events(tmp_path)) == 1


def test_writers_in_one_process_and_second_get_distinct_files(tmp_path):
    """Two sinks opened on one dir in the same second write two files, neither losing points."""
    sinks = [make_sink(tmp_path), make_sink(tmp_path)]
    for index, sink in enumerate(sinks):
        sink.open({"logdir": str(tmp_path)})
        sink.write([Metrics(step=index, values={"a": float(index)}, time=1.7e9)])
    for sink in sinks:
        sink.close(0)
        sink.close(0)  # idempotent
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    assert read_tensorboard_dir(tmp_path).points == [(0, "a", 0.0), (1, "a", 1.0)]


def test_resolve_defaults_to_verls_dir(tmp_path, monkeypatch):
    """resolve() gives an absolute tensorboard_log/<project>/<experiment>, or TENSORBOARD_DIR."""
    monkeypatch.chdir(tmp_path)
    run = RunSpec(project="p", experiment="e")
    assert TensorboardSink.resolve(run, {}, {}) == {"logdir": str(tmp_path / "tensorboard_log" / "p" / "e")}
    assert TensorboardSink.resolve(run, {"TENSORBOARD_DIR": "tb"}, {}) == {"logdir": str(tmp_path / "tb")}
    sink = TensorboardSink(run, {"logdir": str(tmp_path / "tb")})
    assert sink.where() == f"tensorboard: {tmp_path / 'tb'} (view: tensorboard --logdir {tmp_path / 'tb'})"


def test_values_float32_cannot_hold_are_counted(tmp_path):
    """1e300 and 1e-300 reach TensorBoard as float32 (inf and 0): each is counted as a cut; NaN, inf, 0 are not."""
    run = RunSpec(project="p", experiment="e")
    sink = TensorboardSink(run, {"logdir": str(tmp_path)})
    sink.open(None)
    sink.write([Metrics(step=1, values={"big": 1e300, "tiny": -1e-300, "ok": 1.5, "nan": math.nan, "inf": -math.inf,
                                        "zero": 0.0, "int": 10**40}, time=1.0)])
    sink.close(0)
    assert sink.counts.cuts == {"float32_out_of_range": 3}
    assert read_tensorboard_dir(tmp_path).scalars()[1]["big"] == math.inf


def test_does_not_import_torch(tmp_path):
    """The sink writes event files with the tensorboard package alone, never importing torch."""
    script = (
        "import sys\n"
        "from tracklane.core.records import Metrics, RunSpec\n"
        "from tracklane.workers.sinks.tensorboard import TensorboardSink\n"
        f"sink = TensorboardSink(RunSpec(project='p', experiment='e'), {{'logdir': {str(tmp_path)!r}}})\n"
        "sink.open(None); sink.write([Metrics(step=1, values={'a': 1.0}, time=0.0)]); sink.close(0)\n"
        "assert 'torch' not in sys.modules and 'tensorflow' not in sys.modules\n"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", script], check=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert read_tensorboard_dir(tmp_path).points == [(1, "a", 1.0)]
