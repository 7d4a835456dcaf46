"""Priority classes in admission (docs/tenants.md).

A request is `batch` when its key's priority is `batch`, or when the client marks it so with
`x-tidegate-priority: batch` (a client may lower its own priority, never raise it). A batch
request:
- never spills to serverless while it waits: its targets are the dedicated ones the policy
  chose, then the serverless ones only if `routing.batch.on_timeout` is `spill`;
- waits for a slot outside the pool's line, asking again every `POLL_S` (with jitter): an
  interactive request in line is always admitted first (the line is FIFO, and a request that
  is not in it cannot pass one that is), and a free slot goes to whoever asks first;
- never takes the pool's last `reserve_slots` slots (it asks for a pool that much smaller),
  so an interactive request arriving at a pool busy with batch work still finds a slot;
- waits at most `routing.batch.max_wait_s`, or the client's `x-tidegate-deadline-ms` if
  sooner, and never past the request's own timeout.
"""

from __future__ import annotations

from policies.types import T, is_dedicated
from router.config import KeyConfig, ModelConfig, Priority
from router.errors import InvalidRequest
from router.request.asks import Asks

POLL_S = 0.05
MAX_DEADLINE_MS = 3_600_000


def batch_wait_s(config: ModelConfig, key: KeyConfig | None, asks: Asks, remaining_s: float) -> float | None:
    """None for an interactive request; for a batch one, how long it may wait for a slot. Both
    headers are checked on every request (400 when malformed), whatever its priority."""
    asked = asks.priority
    if asked is not None and asked not in ("batch", "interactive"):
        raise InvalidRequest("x-tidegate-priority must be batch or interactive", param="x-tidegate-priority")
    deadline_ms = _deadline_ms(asks.deadline_ms)
    batch = (key is not None and key.priority is Priority.BATCH) or asked == "batch"
    if not batch:
        return None
    wait = min(config.routing.batch.max_wait_s, remaining_s)
    if deadline_ms is not None:
        wait = min(wait, deadline_ms / 1000.0)
    return max(0.0, wait)


def _deadline_ms(deadline: str | None) -> int | None:
    if deadline is None:
        return None
    if not deadline.isdigit() or not 1 <= int(deadline) <= MAX_DEADLINE_MS:
        raise InvalidRequest(
            f"x-tidegate-deadline-ms must be an integer from 1 to {MAX_DEADLINE_MS}",
            param="x-tidegate-deadline-ms",
        )
    return int(deadline)


def batch_targets(config: ModelConfig, targets: tuple[T, ...]) -> tuple[T, ...]:
    """A batch request's targets: the policy's dedicated ones, then serverless only when it
    may spill after waiting. With no dedicated target at all (the canary or a circuit kept it
    off dedicated), nothing is a spill: the policy's targets stand."""
    dedicated = tuple(t for t in targets if is_dedicated(t))
    if not dedicated or config.routing.batch.on_timeout == "spill":
        return targets
    return dedicated
