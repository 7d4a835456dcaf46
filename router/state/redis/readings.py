"""Shared values read entry by entry (the refresh's canary percents, rankings, parity verdicts,
circuits and pool counts): one value nobody can parse skips that entry, and a key of the wrong
type keeps that value as it was last read, each named once in the log (until it reads again).
Neither ends the refresh nor degrades the store; only Redis being unreachable does."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from redis.exceptions import RedisError, ResponseError

log = logging.getLogger("tidegate.state")
T = TypeVar("T")
_UNREADABLE = (ValueError, TypeError, UnicodeDecodeError, AttributeError, IndexError, KeyError)
_MAX_WARNED = 1000  # named problems remembered, so one that persists is logged once


class Readings:
    def __init__(self) -> None:
        self._warned: set[str] = set()

    def mapping(
        self, what: str, answer: Any, parse: Callable[[bytes], T], before: Mapping[str, T]
    ) -> dict[str, T]:
        """A hash's fields, each parsed; `before` when the key itself is unusable."""
        if isinstance(answer, ResponseError):
            self.warn(what, f"Redis refuses it ({answer}): the last values read stay in force")
            return dict(before)
        if isinstance(answer, BaseException):
            raise answer if isinstance(answer, RedisError) else RedisError(str(answer))
        try:
            fields = as_mapping(answer)
        except _UNREADABLE:
            self.warn(what, f"an unreadable reply ({str(answer)[:80]}): the last values read stay in force")
            return dict(before)
        found: dict[str, T] = {}
        for field, value in fields.items():
            try:
                name = field.decode() if isinstance(field, bytes) else str(field)
                found[name] = parse(value)
            except _UNREADABLE:
                self.warn(f"{what} {field!r}", f"the value {value!r:.80} is unreadable and skipped")
        return found

    def value(self, what: str, answer: Any, parse: Callable[[Any], T]) -> T | None:
        """One reply parsed; None (skipped, named once) when it cannot be."""
        if isinstance(answer, BaseException) and not isinstance(answer, ResponseError):
            raise answer if isinstance(answer, RedisError) else RedisError(str(answer))
        try:
            if isinstance(answer, BaseException):
                raise ValueError(str(answer))
            return parse(answer)
        except _UNREADABLE as exc:
            self.warn(what, f"an unreadable reply ({exc}): skipped")
            return None

    def warn(self, what: str, why: str) -> None:
        key = f"{what}: {why}"
        if key in self._warned:
            return
        if len(self._warned) >= _MAX_WARNED:
            self._warned.clear()
        self._warned.add(key)
        log.warning("state store: %s: %s", what, why)


def as_mapping(reply: Any) -> dict[bytes, bytes]:
    """A hash's fields from HGETALL: a map in RESP3 (and from redis-py), pairs in RESP2."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))
