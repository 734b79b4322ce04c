"""Which run a verl job continues: the id recorded beside the checkpoint verl's trainer will load (resumed_run.py)."""

from __future__ import annotations

import json

from tracklane.spool.resumed_run import RUN_FILE, continued_run_id, remember_run


def _trainer(folder, mode="auto", **more):
    return {"resume_mode": mode, "default_local_dir": str(folder), **more}


def _checkpoint(folder, step):
    (folder / f"global_step_{step}").mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text(str(step))


def test_auto_continues_the_recorded_run_only_where_verl_finds_a_checkpoint(tmp_path):
    remember_run(_trainer(tmp_path), "p", "e", "abc123")
    assert json.loads((tmp_path / RUN_FILE).read_text()) == {"run_id": "abc123", "project": "p", "experiment": "e"}
    assert continued_run_id(_trainer(tmp_path), "p", "e") is None  # no checkpoint: verl trains from scratch
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("4")
    assert continued_run_id(_trainer(tmp_path), "p", "e") is None  # its folder is missing: verl starts afresh too
    _checkpoint(tmp_path, 2)
    assert continued_run_id(_trainer(tmp_path), "p", "e") == "abc123"
    assert continued_run_id(_trainer(tmp_path), "p", "other") is None  # another experiment's checkpoints
    assert continued_run_id(_trainer(tmp_path, "disable"), "p", "e") is None


def test_resume_path_reads_the_run_beside_the_named_checkpoint(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    remember_run(_trainer(old), "p", "e", "first")
    trainer = _trainer(new, "resume_path", resume_from_path=str(old / "global_step_3"))
    assert continued_run_id(trainer, "p", "e") == "first"
    assert continued_run_id({**trainer, "resume_from_path": str(old)}, "p", "e") is None  # verl asserts a global_step_


def test_only_verls_config_is_recorded_and_a_bad_record_starts_a_new_run(tmp_path):
    remember_run({"default_local_dir": str(tmp_path)}, "p", "e", "x")  # no resume_mode: not verl's trainer section
    assert not (tmp_path / RUN_FILE).exists()
    _checkpoint(tmp_path, 1)
    (tmp_path / RUN_FILE).write_text("{not json")
    assert continued_run_id(_trainer(tmp_path), "p", "e") is None
