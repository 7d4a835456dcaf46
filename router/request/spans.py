"""The end of a request's spans: the attempt's, and the request's with where it went and what
it used (OpenTelemetry's GenAI attributes)."""

from __future__ import annotations

from opentelemetry.trace import Span, StatusCode

from router.config import Endpoint
from router.record.records import Measures, Outcome
from router.record.telemetry import (
    ERROR_TYPE,
    GEN_AI_INPUT_TOKENS,
    GEN_AI_OUTPUT_TOKENS,
    GEN_AI_RESPONSE_MODEL,
    KIND,
    OUTCOME,
    REASON,
    ROUTE,
)
from router.request.job import Job


def end_spans(job: Job, target: Endpoint | None, status: int, measures: Measures, outcome: Outcome) -> None:
    error = measures.error if (measures.error or status >= 400) else None
    if job.attempt_span is not None and job.attempt_span.is_recording():
        end_span(job.attempt_span, error)
    span = job.span
    assert span is not None
    span.set_attribute(REASON, job.walk.reason.value)
    span.set_attribute(OUTCOME, outcome.value)
    span.set_attribute("http.response.status_code", status)
    if target is not None:
        span.set_attribute(ROUTE, target.name)
        span.set_attribute(KIND, target.kind.value)
        span.set_attribute(GEN_AI_RESPONSE_MODEL, target.model)
    if measures.input_tokens is not None:
        span.set_attribute(GEN_AI_INPUT_TOKENS, measures.input_tokens)
    if measures.output_tokens is not None:
        span.set_attribute(GEN_AI_OUTPUT_TOKENS, measures.output_tokens)
    end_span(span, error)


def end_span(span: Span | None, error: str | None) -> None:
    if span is None:
        return
    if error is not None:
        span.set_attribute(ERROR_TYPE, error)
        span.set_status(StatusCode.ERROR, error)
    span.end()
