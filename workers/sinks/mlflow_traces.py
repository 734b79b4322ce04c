"""Write rollout traces into one MLflow run, each stored exactly once (the MLflow sink's trace half).

Traces are stored exactly once per run: a trace whose ``tracklane.trace_id`` the run holds is skipped (a lane hands a
batch again after an actor restart), and the MLflow trace id is derived from the run and that id, so a write cut off
halfway is completed, not doubled, by the next one. They are built as entities and stored with ``TracingClient``
(``log_spans``, then ``start_trace``) rather than ``MlflowClient.start_trace``: that one exports through the process's
global tracer to the global tracking URI, in the background, and only logs a warning when the store refuses the trace.
What each trace holds is in ``workers/sinks/mlflow.py``'s docstring. MLflow's errors are left to the caller
(the sink translates them).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any

import orjson

from tracklane.core.records import Trace

log = logging.getLogger("tracklane")

TRACES_PER_PAGE = 500  # the most one search_traces page may ask a server for (mlflow/server/handlers.py)
TRACE_ID_TAG = "tracklane.trace_id"
"""Trace tag: ``trace_record_id`` of the record the trace was made from."""
TRACE_KEY_TAG = "tracklane.key"
"""Trace tag: the record's key, ``rollout_trace/<op>``."""


def trace_record_id(record: Trace) -> str:
    """A trace record's own id, the same each time it is sent: sha256 hex of its name, start, end, worker and key."""
    fields = [record.name, record.start_ns, record.end_ns, str(record.attributes.get("worker", "")), record.key]
    return hashlib.sha256(orjson.dumps(fields)).hexdigest()


class MlflowTraces:
    """The traces of one MLflow run: which it holds already, and the new ones written as MLflow traces."""

    def __init__(self, client: Any, tracking_uri: str, run_id: str) -> None:
        self._client = client  # the sink's MlflowClient
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self._tracing: Any = None  # mlflow.tracing.client.TracingClient of tracking_uri
        self._experiment = ""  # the run's experiment id, where its traces go
        self._trace_ids: set[str] = set()  # trace_record_id of every trace the run holds

    @property
    def loaded(self) -> bool:
        """Whether ``load`` has read which traces the run holds."""
        return self._tracing is not None

    def load(self) -> None:
        """Which traces the run holds already (from an earlier actor): their ids, a page of 500 a request, without
        spans; a run with none costs one search. At the first traces written, not at open(): a run that logs no
        traces costs no request."""
        from mlflow.tracing.client import TracingClient

        self._experiment = self._client.get_run(self.run_id).info.experiment_id
        token = None
        while True:
            page = self._client.search_traces(locations=[self._experiment], run_id=self.run_id, include_spans=False,
                                              max_results=TRACES_PER_PAGE, page_token=token)
            self._trace_ids.update(trace.info.tags[TRACE_ID_TAG] for trace in page if TRACE_ID_TAG in trace.info.tags)
            token = page.token
            if not token:
                break
        self._tracing = TracingClient(self.tracking_uri)  # last: a read cut off is done again at the next write

    def new(self, records: Sequence[Trace]) -> dict[str, Trace]:
        """The records whose trace the run does not hold yet, by id (a batch handed again after an actor restart
        repeats traces; skipping them loses nothing, so they are counted nowhere)."""
        new: dict[str, Trace] = {}
        for record in records:
            record_id = trace_record_id(record)
            if record_id in self._trace_ids or record_id in new:
                log.debug("mlflow: run %s holds trace %s (%s) already; skipped", self.run_id, record_id, record.name)
                continue
            new[record_id] = record
        return new

    def write(self, new: dict[str, Trace]) -> None:
        """The records of ``new`` (by id) as traces of the run: all spans, then each trace's info."""
        spans = {record_id: _root_span(record, self._mlflow_trace_ids(record_id)) for record_id, record in new.items()}
        self._log_spans(list(spans.values()))
        for record_id, record in new.items():
            self._start_trace(record, record_id, spans[record_id])
            self._trace_ids.add(record_id)

    def _mlflow_trace_ids(self, record_id: str) -> tuple[int, int]:
        """(OTel trace id, span id) of a record's trace in this run: derived, not random, so that a trace written
        again after a write cut off halfway lands on the same trace and span (the store merges them)."""
        digest = hashlib.sha256(f"{self.run_id}/{record_id}".encode()).digest()
        return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1

    def _log_spans(self, spans: list[Any]) -> None:
        """The batch's spans in one request, into the tracking store (sqlite; a server >= 3.4 on a database)."""
        if not self._try_log_spans(spans):
            _forget_server_version()  # MLflow's "no" may be the one it kept from a server it could not reach: ask again
            self._try_log_spans(spans)  # still "no" (a file store, an older server): _start_trace uploads them instead

    def _try_log_spans(self, spans: list[Any]) -> bool:
        """Whether the tracking store took the spans (False: it keeps none, they go to the trace's artifact)."""
        from mlflow.exceptions import MlflowException

        try:
            self._tracing.log_spans(self._experiment, spans)
        except NotImplementedError:  # a file store; a server < 3.4, or one whose version MLflow could not ask
            return False
        except MlflowException as exc:
            if exc.get_http_status_code() == 501:  # a server on a file store
                return False
            raise
        return True

    def _start_trace(self, record: Trace, record_id: str, span: Any) -> None:
        """The trace's info (state, tags, the run it belongs to); after its spans, as MLflow's exporter does: only
        this write tags the trace with its id, so a trace cut off before it is written again."""
        from mlflow.tracing.constant import SpansLocation, TraceTagKey

        info = self._tracing.start_trace(_trace_info(record, record_id, span, self._experiment, self.run_id))
        if info.tags.get(TraceTagKey.SPANS_LOCATION) != SpansLocation.TRACKING_STORE.value:
            self._upload_spans(info, span)

    def _upload_spans(self, info: Any, span: Any) -> None:
        """The spans as the trace's artifact, where a store keeps them (what ``TracingClient._upload_trace_data``
        writes, but with this sink's tracking URI: MLflow's own call resolves ``mlflow-artifacts:`` with the global one)."""
        from mlflow.entities import TraceData
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
        from mlflow.tracing.utils import TraceJSONEncoder
        from mlflow.tracing.utils.artifact_utils import get_artifact_uri_for_trace

        repository = get_artifact_repository(get_artifact_uri_for_trace(info), tracking_uri=self.tracking_uri)
        repository.upload_trace_data(json.dumps(TraceData(spans=[span]).to_dict(), cls=TraceJSONEncoder,
                                                ensure_ascii=False))


def _forget_server_version() -> None:
    """Let MLflow's REST store ask the server its version again. It asks once per process and keeps the answer,
    None too: asked while the server was down, it would refuse ``log_spans`` (NotImplementedError) from then on."""
    from mlflow.store.tracking.rest_store import RestStore

    cache_clear = getattr(RestStore._get_server_version, "cache_clear", None)  # functools.lru_cache (mlflow 3.17)
    if cache_clear is not None:
        cache_clear()


def _root_span(record: Trace, ids: tuple[int, int]) -> Any:
    """The record as the one span of its trace, built with ``Span.from_dict`` (MLflow's trace-file format: ids in
    base64, every attribute value JSON text) rather than MLflow's global tracer."""
    from mlflow.entities import Span, SpanStatusCode
    from mlflow.tracing.constant import TRACE_REQUEST_ID_PREFIX, SpanAttributeKey
    from mlflow.tracing.utils import dump_span_attribute_value

    trace_id, span_id = ids
    metadata = record.metadata_object()
    attributes: dict[str, Any] = {SpanAttributeKey.REQUEST_ID: f"{TRACE_REQUEST_ID_PREFIX}{trace_id:032x}",
                                  SpanAttributeKey.SPAN_TYPE: "UNKNOWN", "mlflow.chat.messages": record.messages}
    if "inputs" in metadata:
        attributes[SpanAttributeKey.INPUTS] = metadata["inputs"]
    if "output" in metadata:
        attributes[SpanAttributeKey.OUTPUTS] = metadata["output"]
    if "exception_type" in metadata:
        attributes["exception_type"] = metadata["exception_type"]
    status = SpanStatusCode.ERROR if record.status == "error" else SpanStatusCode.OK
    return Span.from_dict({
        "trace_id": base64.b64encode(trace_id.to_bytes(16, "big")).decode(),
        "span_id": base64.b64encode(span_id.to_bytes(8, "big")).decode(),
        "parent_span_id": None, "name": record.name,
        "start_time_unix_nano": record.start_ns, "end_time_unix_nano": record.end_ns,
        "status": {"code": status.to_otel_proto_status_code_name(), "message": str(metadata.get("exception_type", ""))},
        "attributes": {key: dump_span_attribute_value(value) for key, value in attributes.items()},
    })


def _trace_info(record: Trace, record_id: str, span: Any, experiment_id: str, run_id: str) -> Any:
    """The trace's info: linked to the run (metadata ``mlflow.sourceRun``, as MLflow links a trace made in an active
    run), tagged as verl tags it, previews of the span's inputs and outputs for the trace list."""
    from mlflow.entities import TraceData, TraceInfo, TraceLocation, TraceState
    from mlflow.tracing.constant import TRACE_SCHEMA_VERSION, TRACE_SCHEMA_VERSION_KEY, TraceMetadataKey, TraceTagKey
    from mlflow.tracing.utils.truncation import set_request_response_preview

    tags = {str(key): str(value) for key, value in record.attributes.items()}  # verl: set_trace_tag(str(k), str(v))
    tags.update({TraceTagKey.TRACE_NAME: record.name, TRACE_KEY_TAG: record.key, TRACE_ID_TAG: record_id})
    info = TraceInfo(
        trace_id=span.trace_id, trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=record.start_ns // 1_000_000, execution_duration=(record.end_ns - record.start_ns) // 1_000_000,
        state=TraceState.ERROR if record.status == "error" else TraceState.OK,
        trace_metadata={TRACE_SCHEMA_VERSION_KEY: str(TRACE_SCHEMA_VERSION), TraceMetadataKey.SOURCE_RUN: run_id},
        tags=tags,
    )
    set_request_response_preview(info, TraceData(spans=[span]))
    return info
