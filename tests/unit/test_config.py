"""Config: verl-style dicts and OmegaConf accepted; bad keys, values and backends refused with clear errors."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tracklane import ConfigError, Tracking
from tracklane.config.async_log import REMOVED_KEYS, AsyncLogConfig, async_log_config, trainer_section
from tracklane.config.prometheus import PrometheusConfig, prometheus_config
from tracklane.core.params import REDACTED, flatten_params, plain_config
from tracklane.host.registry import check_installed
from tracklane.host.sink import Sink


def test_defaults():
    """An absent trainer.async_log gives the documented defaults."""
    cfg = async_log_config(None)
    assert cfg == AsyncLogConfig() and cfg.overflow == "spill" and cfg.flush_interval_s == 0.5


def test_unknown_key_is_named():
    """A misspelt tuning key is refused, naming it and the valid keys."""
    with pytest.raises(ConfigError, match=r"unknown key\(s\) trainer.async_log.flush_intervall; valid keys: queue_max_bytes"):
        async_log_config({"flush_intervall": 1})


@pytest.mark.parametrize("section, message", [
    ({"overflow": "spill_over"}, "overflow must be one of spill, drop_oldest, block"),
    ({"queue_max_bytes": 0}, "queue_max_bytes must be > 0"),
    ({"flush_interval_s": "fast"}, "flush_interval_s must be a number"),
    ({"compression_level": 40}, "compression_level must be in 1..22"),
    ({"max_batch_bytes": 10, "lane_max_bytes": 5}, "max_batch_bytes must not exceed lane_max_bytes or queue_max_bytes"),
    ({"actor_options": [1]}, "actor_options must be a mapping"),
    ({"background_priority": "low"}, 'background_priority must be "idle", "normal" or a nice level 1..19'),
    ({"background_priority": 20}, "background_priority must be .* got 20"),
])
def test_bad_values(section, message):
    """Each ill-typed or out-of-range value is refused with a message naming the key."""
    with pytest.raises(ConfigError, match=message):
        async_log_config(section)


def test_omegaconf_config():
    """trainer.log_async and trainer.async_log are read from an OmegaConf object like from a dict."""
    conf = OmegaConf.create({"trainer": {"log_async": True, "async_log": {"flush_interval_s": 2.0}}})
    trainer = trainer_section(conf)
    assert trainer["log_async"] is True and async_log_config(trainer["async_log"]).flush_interval_s == 2.0
    assert trainer_section({"data": {}}) == {} and trainer_section(None) == {}


def test_unknown_backend_names_valid_ones():
    """An unknown backend raises ValueError listing the valid backend names."""
    valid = "console, wandb, mlflow, swanlab, tensorboard, file"
    with pytest.raises(ValueError, match=f"unknown backend 'neptune'; valid backends are: {valid}"):
        Tracking("p", "e", ["console", "neptune"])


def test_missing_extra_names_pip_extra():
    """A backend whose SDK is absent raises an ImportError that names the pip extra to install."""

    class Absent(Sink):
        name, sdk_module, extra = "absent", "no_such_tracker_sdk", "absent"

    with pytest.raises(ImportError, match=r"pip install 'tracklane\[absent\]'"):
        check_installed(Absent)


@pytest.mark.parametrize("section", [{"spool": False}, {"spool": True}, {"state_dir": "/tmp/lanes"},
                                     {"spool": False, "state_dir": "/tmp/lanes"}])
def test_the_removed_spool_switch_and_state_dir_are_warned_and_ignored(section, caplog):
    """A config naming spool or state_dir (removed, issue 36: every shipped batch is on local disk) still loads:
    each key warned once, saying why, and the settings are the defaults."""
    with caplog.at_level("WARNING", logger="tracklane"):
        cfg = async_log_config({**section, "flush_interval_s": 2.0})
    assert cfg == AsyncLogConfig(flush_interval_s=2.0)
    warned = [r.getMessage() for r in caplog.records if " was removed " in r.getMessage()]
    assert sorted(warned) == sorted(f"tracklane: trainer.async_log.{key} was removed ({REMOVED_KEYS[key]}); ignored"
                                    for key in section)
    assert not hasattr(cfg, "spool") and not hasattr(cfg, "state_dir")


def test_bad_async_key_fails_before_anything_starts():
    """A bad trainer.async_log key fails the constructor, even in sync mode."""
    with pytest.raises(ConfigError, match="unknown key"):
        Tracking("p", "e", "console", config={"trainer": {"async_log": {"nope": 1}}})


@pytest.mark.parametrize("section, message", [
    ({"prot": 9100}, r"unknown key\(s\) trainer.prometheus.prot; valid keys: host, port, final_scrape_s"),
    ({"port": 70000}, r"port must be a port number \(0-65535\), got 70000"),
    ({"port": "http"}, r"port must be a port number \(0-65535\), got 'http'"),
    ({"port": True}, r"port must be a port number"),
    ({"host": ""}, r"host must be a host name or address"),
    ({"final_scrape_s": -1}, r"final_scrape_s must be a number of seconds >= 0, got -1"),
    ({"final_scrape_s": "soon"}, r"final_scrape_s must be a number of seconds >= 0, got 'soon'"),
    ({"final_scrape_s": float("nan")}, r"final_scrape_s must be a number of seconds >= 0, got nan"),
])
def test_bad_prometheus_settings_are_refused_before_anything_starts(section, message):
    with pytest.raises(ConfigError, match=message):
        prometheus_config(section)
    with pytest.raises(ConfigError, match=message):  # even where the prometheus backend is not chosen
        Tracking("p", "e", "console", config={"trainer": {"prometheus": section}})


def test_prometheus_settings_fall_back_to_the_environment_then_the_defaults():
    env = {"TRACKLANE_PROMETHEUS_HOST": "0.0.0.0", "TRACKLANE_PROMETHEUS_PORT": "9500",
           "TRACKLANE_PROMETHEUS_FINAL_SCRAPE_S": "2.5"}
    assert prometheus_config(None) == PrometheusConfig(host="127.0.0.1", port=9464, final_scrape_s=10.0)
    assert prometheus_config({}, env) == PrometheusConfig(host="0.0.0.0", port=9500, final_scrape_s=2.5)
    assert prometheus_config({"port": 0, "final_scrape_s": 0}, env) == \
        PrometheusConfig(host="0.0.0.0", port=0, final_scrape_s=0)  # port 0: any free one; 0 s: never wait
    assert prometheus_config(OmegaConf.create({"host": "::1"}), env).host == "::1"


def test_secrets_redacted_and_ordinary_keys_kept():
    """Keys holding api_key/password/secret or ending in token are redacted; max_token_len is not."""
    params = plain_config(OmegaConf.create({
        "trainer": {"wandb_api_key": "sk-1", "hf_token": "hf-2", "max_token_len": 4096},
        "db": {"password": "p", "client_secret": "s", "tokenizer": "gpt2"},
    }))
    assert params["trainer"] == {"wandb_api_key": REDACTED, "hf_token": REDACTED, "max_token_len": 4096}
    assert params["db"] == {"password": REDACTED, "client_secret": REDACTED, "tokenizer": "gpt2"}


def test_flatten_params_like_verl():
    """Params flatten with '/', and lists expand into list_len plus one key per item, as verl does."""
    flat = flatten_params({"a": {"b": 1, "c": [10, {"d": 2}]}, "e": {}})
    assert flat == {"a/b": 1, "a/c/list_len": 2, "a/c/0": 10, "a/c/1/d": 2, "e": "{}"}
