"""tracklane's trainer-side half: the verl-compatible ``Tracking`` facade and the async pipeline."""

from .dapo_reward_logger import DapoFilteredRewardTableLogger
from .errors import CodecError, ConfigError, MissingExtraError, SinkError, TracklaneError
from .generations_logger import ValidationGenerationsLogger
from .producer import Producer
from .records import Trajectory
from .report import LaneInfo, LaneReport, PipelineReport, ProducerReport
from .tracking import Tracking

__all__ = [
    "Tracking", "Producer", "ValidationGenerationsLogger", "DapoFilteredRewardTableLogger", "Trajectory",
    "PipelineReport", "LaneReport", "LaneInfo",
    "ProducerReport",
    "TracklaneError", "ConfigError", "MissingExtraError", "CodecError", "SinkError",
]
