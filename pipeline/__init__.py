"""tracklane: the verl-compatible ``Tracking`` facade and the asynchronous pipeline behind it.

What users import is here, and only here. The rooms below are internal (each ``__init__`` says what
lives in it); their module paths may change between versions:

    tracking.py, producer.py, log_calls.py, pipe.py, sync_pipeline.py, sync_spool.py   the facade, the sync path
    verl/      verl's extra loggers, install() in verl's own processes
    cli/       the tracklane command
    shipping/  buffer -> shipper -> lanes -> lane actors (the asynchronous path)
    node/      per-node services (system metrics, the terminal)
    host/ spool/ wire/ capture/   the sink contract, the durable log, the wire format, log() calls made records
    config/    typed settings        core/   records, errors, reports: the floor
"""

from tracklane.capture.rich import RecordLimits
from tracklane.config.async_log import AsyncLogConfig
from tracklane.core.errors import CodecError, ConfigError, MissingExtraError, SinkError, TracklaneError
from tracklane.core.params import plain_config
from tracklane.core.records import Trajectory
from tracklane.core.report import LaneInfo, LaneReport, PipelineReport, ProducerReport, ReductionReport
from tracklane.node.terminal import TERMINAL
from tracklane.producer import Producer
from tracklane.tracking import Tracking, check_settings
from tracklane.verl.dapo_reward_logger import DapoFilteredRewardTableLogger
from tracklane.verl.generations_logger import ValidationGenerationsLogger

__all__ = [
    # verl's names
    "Tracking", "ValidationGenerationsLogger", "DapoFilteredRewardTableLogger",
    # logging from other processes, and rich records
    "Producer", "Trajectory",
    # what flush() and finish() return
    "PipelineReport", "LaneReport", "LaneInfo", "ProducerReport", "ReductionReport",
    # settings: trainer.async_log and trainer.record_limits as objects, checked before a run starts
    "AsyncLogConfig", "RecordLimits", "check_settings", "plain_config",
    # the trainer's terminal: a status line below the console's lines, without tearing them
    "TERMINAL",
    # errors
    "TracklaneError", "ConfigError", "MissingExtraError", "CodecError", "SinkError",
]
