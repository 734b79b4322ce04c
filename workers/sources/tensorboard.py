"""TensorBoard: the event files of one log directory, read with tensorboard's own ``EventAccumulator`` (2.21).

The run is the directory's own event files (TensorBoard shows each sub-directory as another run), each read
whole (no sampling: size guidance 0; no purging of "orphaned" steps, so a step written twice, as after a
restart, is carried twice). What each event becomes:

    scalar (``simple_value``, as torch's ``add_scalar`` and the tracklane sink write it; or a tensor of the
      "scalars" plugin, as tf.summary writes it)        -> Metrics, with the event's step and wall time
    text (plugin "text"; torch's ``add_text`` appends "/text_summary" to the tag, dropped here) -> Text
    histogram                                            -> Histogram: TensorBoard keeps the bins only
    image                                                -> Image (PNG; another encoding is re-encoded)
    audio, graphs, other plugins' tensors                -> not carried, counted

Histogram bins: torch's ``make_histogram`` and the tracklane sink lead with an empty bucket whose limit is the
left edge (so ``len(bucket_limit) == len(bucket)``); TensorFlow's buckets end at their limits and its last limit
is DBL_MAX: both are read, the huge limits replaced by the histogram's min and max.

Hyper-parameters: the tracklane sink's markdown table (text tag ``hyperparameters``), and the hparams plugin's
session start info (torch's ``add_hparams`` writes it in a sub-directory named after the time: those are
read too, only for it). Project and experiment default to the directory's parent's name and its own
(``tensorboard_log/<project>/<experiment>``, verl's layout). TensorBoard keeps scalars as float32.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tracklane.core.errors import ConfigError
from tracklane.core.records import Image, Record, RunSpec, Text
from tracklane.host.sink import import_sdk
from tracklane.host.source import Source, SourceRun, option
from tracklane.workers.sinks.tensorboard import PARAMS_TAG, TEXT_SUFFIX, parse_params_table
from tracklane.workers.sources.shaping import Point, binned_histogram, in_step_order, metrics_records, png

KEEP_ALL = {"scalars": 0, "tensors": 0, "histograms": 0, "compressedHistograms": 0, "images": 0, "audio": 0}
_HUGE = 1e300  # TensorFlow's outermost bucket limits are +-DBL_MAX
_STORED_AS = {"generations": "text", "trajectories": "text", "text": "text", "histogram": "histogram", "image": "image"}
"""What the tracklane TensorBoard sink writes each kind as (tables as markdown text); artifacts: nothing."""


class TensorboardSource(Source):
    name = "tensorboard"
    sdk_module = "tensorboard"
    extra = "tensorboard"
    value_note = "as float32, as TensorBoard stores scalars"

    def __init__(self, logdir: str) -> None:
        super().__init__()
        self.logdir = os.path.abspath(logdir)
        self._loaded: list[Any] | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any], env: Mapping[str, str]) -> TensorboardSource:
        return cls(option(options, "logdir", cls.name))

    @classmethod
    def of_target(cls, settings: Mapping[str, Any], run: RunSpec) -> TensorboardSource:
        return cls(settings["logdir"])

    def _accumulators(self) -> list[Any]:
        """One loaded accumulator per event file of the directory, oldest file first."""
        if self._loaded is None:
            import_sdk(type(self))
            files = sorted(Path(self.logdir).glob("*tfevents*"))
            if not files:
                raise ConfigError(f"no TensorBoard event files in {self.logdir}")
            self._loaded = [load_events(path) for path in files]
        return self._loaded

    def run(self) -> SourceRun:
        params: dict[str, Any] = {}
        for acc in self._accumulators() + [load_events(p) for p in sorted(Path(self.logdir).glob("*/*tfevents*"))]:
            params.update(_hparams(acc))
            if PARAMS_TAG in acc.Tags()["tensors"]:
                for event in acc.Tensors(PARAMS_TAG):
                    params.update(parse_params_table(event.tensor_proto.string_val[0].decode("utf-8")))
        path = Path(self.logdir)
        return SourceRun(project=path.parent.name or "tensorboard", experiment=path.name or "run", params=params,
                         where=f"tensorboard log directory {self.logdir}")

    def records(self) -> Iterator[Record]:
        points: list[Point] = []
        rich: list[Record] = []
        for acc in self._accumulators():
            tags = acc.Tags()
            for tag in tags["scalars"]:
                points += [(e.step, e.wall_time, tag, e.value) for e in acc.Scalars(tag)]
            for tag in tags["tensors"]:
                self._tensor(acc, tag, points, rich)
            for tag in tags["histograms"]:
                rich += [_histogram(tag, e) for e in acc.Histograms(tag)]
            for tag in tags["images"]:
                rich += [Image(step=e.step, name=tag, png=png(e.encoded_image_string), time=e.wall_time)
                         for e in acc.Images(tag)]
            for tag in tags["audio"]:
                self.skip("audio", len(acc.Audio(tag)))
            if tags["graph"] or tags["meta_graph"]:
                self.skip("graphs")
        return iter(in_step_order([*metrics_records(points), *rich]))

    def _tensor(self, acc: Any, tag: str, points: list[Point], rich: list[Record]) -> None:
        plugin = acc.SummaryMetadata(tag).plugin_data.plugin_name
        if tag == PARAMS_TAG:
            return
        if plugin == "text":
            name = tag[: -len(TEXT_SUFFIX)] if tag.endswith(TEXT_SUFFIX) else tag
            rich += [Text(step=e.step, name=name, text=_text(e.tensor_proto), time=e.wall_time) for e in acc.Tensors(tag)]
        elif plugin == "scalars":
            from tensorboard.util import tensor_util

            points += [(e.step, e.wall_time, tag, tensor_util.make_ndarray(e.tensor_proto).item())
                       for e in acc.Tensors(tag)]
        else:
            self.skip(f"{plugin or 'untyped'} tensors", len(acc.Tensors(tag)))

    # -- how TensorBoard stores what the TensorBoard sink hands it -----------------------------
    @classmethod
    def stored_value(cls, value: float) -> float:
        import numpy as np

        with np.errstate(over="ignore"):  # past float32's range: +-Inf, as TensorBoard stores it
            return float(np.float32(value))

    @classmethod
    def stored_as(cls, kind: str) -> str | None:
        return _STORED_AS.get(kind)


def load_events(path: Path) -> Any:
    """One event file read whole: every event kept (size 0: no sampling), none purged as "orphaned"."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance=KEEP_ALL, purge_orphaned_data=False)
    acc.Reload()
    return acc


def _text(tensor: Any) -> str:
    return "\n".join(value.decode("utf-8") for value in tensor.string_val)


def _histogram(tag: str, event: Any) -> Record:
    value = event.histogram_value
    limits, buckets = list(value.bucket_limit), list(value.bucket)
    if buckets and buckets[0] == 0 and len(limits) == len(buckets):  # torch / tracklane: a leading empty bucket
        edges, counts = limits, buckets[1:]
    else:  # TensorFlow: each bucket ends at its limit, the first starts at min
        edges, counts = [value.min, *limits], buckets
    if edges and edges[-1] >= _HUGE:
        edges[-1] = value.max
    if edges and edges[0] <= -_HUGE:
        edges[0] = value.min
    return binned_histogram(event.step, event.wall_time, tag, edges, counts, minimum=value.min, maximum=value.max,
                            total=value.num, sum_=value.sum, sum_squares=value.sum_squares)


def _hparams(acc: Any) -> dict[str, Any]:
    """The hparams plugin's session start info (torch's ``add_hparams``), if the file has it."""
    try:
        content = acc.PluginTagToContent("hparams")
    except KeyError:
        return {}
    from tensorboard.plugins.hparams import plugin_data_pb2

    out: dict[str, Any] = {}
    for blob in content.values():
        data = plugin_data_pb2.HParamsPluginData.FromString(blob)
        if data.WhichOneof("data") == "session_start_info":
            for key, value in data.session_start_info.hparams.items():
                kind = value.WhichOneof("kind")
                out[key] = getattr(value, kind) if kind in ("number_value", "string_value", "bool_value") else None
    return out

