"""The webhook's WSGI edge: ``POST /mutate`` with an AdmissionReview, bounded in size, answered
by ``review``. Served by gpuzombie.serving (TLS, read deadline, connection bound, probes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

from gpuzombie.admission.mutate import Policy
from gpuzombie.admission.review import Answer, review, status_error
from gpuzombie.admission.rules import Budget

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
"""The API server stores objects of up to 1.5 MiB; an AdmissionReview carries one (twice on UPDATE)."""
DEFAULT_REVIEW_SECONDS = 1.5
"""One review's time, from when its body has been read (a wait for a review slot included): past
it the pod is admitted unchanged with a warning, well inside the chart's timeoutSeconds (3)."""
DEFAULT_MAX_REVIEWS = 2
"""Reviews parsed and analysed at once (the rest wait, within their time): each holds up to ~10x
its body in parsed objects, and two cores gain nothing from more (one GIL)."""


def _read(environ: dict[str, Any], limit: int) -> bytes | Answer:
    length = environ.get("CONTENT_LENGTH") or ""
    if not length.isdigit():
        return status_error(411, "LengthRequired", "gpuzombie webhook: a Content-Length is required")
    if int(length) > limit:
        return status_error(413, "RequestEntityTooLarge", f"gpuzombie webhook: the body is over {limit} bytes")
    stream = environ["wsgi.input"]
    chunks, left = [], int(length)
    while left > 0:
        chunk = stream.read(min(left, 65536))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def make_app(
    policy: Policy,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    review_seconds: float | None = DEFAULT_REVIEW_SECONDS,
    max_reviews: int = DEFAULT_MAX_REVIEWS,
    log: Callable[[str], None] | None = None,
) -> Callable[..., Iterable[bytes]]:
    """The WSGI app of ``/mutate``; ``log`` gets one line per pod changed (or that would be, or that
    could not be understood, or ran out of time)."""
    slots = threading.BoundedSemaphore(max_reviews)

    def answer_of(body: bytes) -> Answer:
        budget = Budget(review_seconds)
        wait = None if budget.deadline is None else max(0.0, budget.deadline - time.monotonic())
        if not slots.acquire(timeout=wait):  # no uid read yet: the API's error, failurePolicy admits the pod
            return status_error(429, "TooManyRequests", f"gpuzombie webhook: {max_reviews} reviews already running")
        try:
            return review(body, policy, budget)
        finally:
            slots.release()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "POST":
            answer = status_error(405, "MethodNotAllowed", "gpuzombie webhook: POST an AdmissionReview")
        else:
            body = _read(environ, max_body_bytes)
            answer = body if isinstance(body, Answer) else answer_of(body)
        if log is not None and answer.note is not None:
            log(answer.note)
        data = answer.encode()
        status = f"{answer.status} {HTTPStatus(answer.status).phrase}"
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]

    return app
