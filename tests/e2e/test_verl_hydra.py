"""verl's command line switches tracklane on: the README's overrides, composed by Hydra on verl's own config.

The overrides are read from the README's "Use it from verl" block, so the block cannot drift from what
Hydra accepts. verl's ``_generated_ppo_trainer.yaml`` is composed with Hydra's compose API, as
``python -m verl.trainer.main_ppo`` composes its config, and the ``Tracking`` is built from it the way
verl's trainer builds its own (``OmegaConf.to_container(config, resolve=True)``).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("hydra")
if importlib.util.find_spec("verl") is None:
    pytest.skip("verl is not installed (.ci/run installs verl==0.9.1 --no-deps)", allow_module_level=True)

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.errors import ConfigCompositionException  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from tracklane import Tracking  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"
VERL_CONFIG_DIR = Path(importlib.util.find_spec("verl").submodule_search_locations[0]) / "trainer" / "config"


def readme_overrides() -> list[str]:
    """The Hydra overrides of the README's verl command line (the ``+...`` words of its bash block)."""
    section = README.read_text().split("## Use it from verl\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the README's 'Use it from verl' section has no bash block"
    words = shlex.split(block.group(1).replace("\\\n", " "), comments=True)
    assert "verl.trainer.main_ppo" in words, "the block runs verl's own launcher"
    return [word for word in words if word.startswith("+")]


def verl_config(overrides: list[str]):
    """verl's generated PPO config composed with ``overrides``, as Hydra composes it for main_ppo."""
    with initialize_config_dir(config_dir=str(VERL_CONFIG_DIR), version_base=None):
        return compose(config_name="_generated_ppo_trainer", overrides=overrides)


def test_the_readme_overrides_switch_tracklane_on_in_verls_config():
    """Composed on verl's config, the README's overrides give log_async and the Ray worker hook that swaps Tracking."""
    overrides = readme_overrides()
    assert overrides == ["+trainer.log_async=true",
                         "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=tracklane.verl.install"]
    config = verl_config(overrides)
    assert config.trainer.log_async is True
    hook = config.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook
    module, _, function = hook.rpartition(".")
    assert callable(getattr(importlib.import_module(module), function))


def test_without_the_plus_hydra_refuses_log_async_as_the_readme_says():
    """``trainer.log_async=true`` is not in verl's schema: Hydra's own error, quoted in the README."""
    with pytest.raises(ConfigCompositionException, match="Could not override 'trainer.log_async'"):
        verl_config(["trainer.log_async=true"])
    assert "Could not override 'trainer.log_async'" in README.read_text()


def test_async_log_settings_from_verls_command_line_reach_the_pipeline(offline_trackers, ray_session, tmp_path):
    """``+trainer.async_log.*`` on verl's command line sets the pipeline: the spool lands where the override says."""
    spool = tmp_path / "spool"
    config = verl_config([*readme_overrides(), f"+trainer.async_log.spool_dir={spool}",
                          "+trainer.async_log.flush_interval_s=0.2", "trainer.logger=[file]",
                          "trainer.project_name=hydra", "trainer.experiment_name=overrides"])
    plain = OmegaConf.to_container(config, resolve=True)  # as verl's RayPPOTrainer.fit builds its Tracking
    tracking = Tracking(config.trainer.project_name, config.trainer.experiment_name, config.trainer.logger, config=plain)
    assert tracking.log_async and tracking._cfg.flush_interval_s == 0.2
    tracking.log({"critic/score/mean": 0.5}, step=1)
    report = tracking.finish()
    assert report.complete and report.spool is not None and Path(report.spool.directory).is_relative_to(spool)
