"""tracklane's trainer-side half: the verl-compatible ``Tracking`` facade and the async pipeline."""

from .errors import CodecError, ConfigError, MissingExtraError, SinkError, TracklaneError
from .generations_logger import ValidationGenerationsLogger
from .records import Trajectory
from .report import LaneInfo, LaneReport, PipelineReport
from .tracking import Tracking

__all__ = [
    "Tracking", "ValidationGenerationsLogger", "Trajectory", "PipelineReport", "LaneReport", "LaneInfo",
    "TracklaneError", "ConfigError", "MissingExtraError", "CodecError", "SinkError",
]
