"""Typed scoring errors. `retryable` tells the caller (the serving plane's durable outbox) whether the
same turn should be sent again later; the turn is never dropped on a retryable error.

The class attribute survives Ray's error wrapping (a RayTaskError subclasses the raised class), so a
caller that must not import this plane can test `getattr(err, "retryable", False)`.
"""

from __future__ import annotations


class ScoringError(RuntimeError):
    retryable = False


class JudgeUnavailable(ScoringError):
    """A judge vote failed after the client's retries (down, timing out, 5xx, refusing the request)."""

    retryable = True


class TeacherUnavailable(ScoringError):
    """The OPD teacher's logprobs could not be fetched."""

    retryable = True


class SinkUnavailable(ScoringError):
    """The replay sink did not durably accept the sample."""

    retryable = True
