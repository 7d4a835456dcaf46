"""What a client asks of the gateway in its own headers (`x-tidegate-*`: a session, a task id,
a priority, a deadline, no shadow), read in one pass over the request's headers.

Most requests carry none of them, so the pass costs one prefix test per header; each reader
used to scan the headers on its own. ASGI gives header names lowercased, and the first of a
repeated header is the one read, as before. Validation stays with each header's reader
(router/request/dispatch.py, priority.py, mirror.py): a malformed value is a 400 there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_PREFIX = b"x-tidegate-"
SESSION_HEADER = b"x-tidegate-session"
TASK_ID_HEADER = b"x-tidegate-task-id"
PRIORITY_HEADER = b"x-tidegate-priority"
DEADLINE_HEADER = b"x-tidegate-deadline-ms"
NO_SHADOW_HEADER = b"x-tidegate-no-shadow"


@dataclass(frozen=True, slots=True)
class Asks:
    session: str | None = None  # x-tidegate-session
    task_id: str | None = None  # x-tidegate-task-id, as sent (dispatch checks it)
    priority: str | None = None  # x-tidegate-priority, stripped and lowercased
    deadline_ms: str | None = None  # x-tidegate-deadline-ms, stripped (priority checks it)
    no_shadow: bool = False  # x-tidegate-no-shadow set to anything but empty or 0


NOTHING_ASKED = Asks()


def asks_of(headers: Sequence[tuple[bytes, bytes]]) -> Asks:
    found: dict[bytes, bytes] | None = None
    for name, value in headers:
        if name.startswith(_PREFIX):
            if found is None:
                found = {}
            found.setdefault(name, value)
    if found is None:
        return NOTHING_ASKED
    return Asks(
        session=_text(found.get(SESSION_HEADER)),
        task_id=_text(found.get(TASK_ID_HEADER)),
        priority=_stripped(found.get(PRIORITY_HEADER), lower=True),
        deadline_ms=_stripped(found.get(DEADLINE_HEADER)),
        no_shadow=found.get(NO_SHADOW_HEADER, b"").strip() not in (b"", b"0"),
    )


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def _stripped(value: bytes | None, *, lower: bool = False) -> str | None:
    if value is None:
        return None
    text = value.decode("latin-1").strip()
    return text.lower() if lower else text
