"""Every key the Redis store writes, in one place. A script touches the keys of one hash slot
only (the `{...}` hash tags: a pool, a route, a task, `canary`), so the same store runs on a
single Redis and on Redis Cluster."""

from __future__ import annotations

from router.state.latency import SLICE_S, Metric


def _rollup(step_s: int) -> str:
    return "" if step_s == SLICE_S else str(step_s)


class Keys:
    def __init__(self, prefix: str = "tidegate") -> None:
        self.prefix = prefix
        self.canary_percent = f"{prefix}:canary"  # model -> live canary percent (hash)
        self.started_at = f"{prefix}:started_at"  # when the first replica on this Redis started (Unix s)
        self.rankings = f"{prefix}:probe"  # model -> applied probe ranking (hash)
        self.parity = f"{prefix}:parity"  # model -> applied parity verdicts (hash)
        self.made_keys = f"{prefix}:keys"  # name -> a client key made through the admin API (hash)

    def slots(self, pool: str) -> str:
        """The pool's leases: a sorted set of tokens scored by their expiry (server ms)."""
        return f"{self.prefix}:slots:{{{pool}}}"

    def pending(self, pool: str) -> list[str]:
        """The pool's pending prompt tokens: a hash by lease token, and their sum."""
        return [f"{self.prefix}:pending:{{{pool}}}", f"{self.prefix}:pendsum:{{{pool}}}"]

    def line(self, pool: str) -> list[str]:
        """slots, queue, seen, pending prompt tokens (hash by lease token), their sum."""
        return [
            self.slots(pool),
            f"{self.prefix}:queue:{{{pool}}}",
            f"{self.prefix}:seen:{{{pool}}}",
            *self.pending(pool),
        ]

    def acquire(self, pool: str, token: str) -> list[str]:
        """The pool's line keys and the tombstone `token` gets if its acquire is given up."""
        return [*self.line(pool), f"{self.prefix}:gone:{{{pool}}}:{token}"]

    def prefill(self, pool: str) -> str:
        return f"{self.prefix}:prefill:{{{pool}}}"

    def breaker(self, route: str) -> str:
        return f"{self.prefix}:breaker:{route}"

    def counts(self, route: str, start: int, step_s: int = SLICE_S) -> str:
        return f"{self.prefix}:cnt{_rollup(step_s)}:{route}:{start}"

    def latency(self, route: str, metric: Metric, start: int, step_s: int = SLICE_S) -> str:
        return f"{self.prefix}:lat{_rollup(step_s)}:{route}:{metric.value}:{start}"

    def canary(self, model: str) -> list[str]:
        """The canary leader lease, a model's run and its history: one hash slot ({canary})."""
        tag = f"{self.prefix}:{{canary}}"
        return [f"{tag}:leader", f"{tag}:run:{model}", f"{tag}:history:{model}"]

    def leader(self, role: str) -> str:
        """The canary controller's lease shares the {canary} hash slot with the runs it fences."""
        return self.canary("")[0] if role == "canary" else f"{self.prefix}:leader:{role}"

    def task(self, name: str) -> str:
        """A task's hash, or a request's (its own task, or a pointer to its named task)."""
        return f"{self.prefix}:task:{{{name}}}"

    def early(self, caller: str, window: int) -> str:
        """How much early feedback `caller` has had kept in one window."""
        return f"{self.prefix}:early:{{{caller}}}:{window}"

    def spend(self, ledger: str) -> str:
        return f"{self.prefix}:spend:{{{ledger}}}"

    def members(self, pool: str) -> str:
        """A DNS pool's slot sets and when each address was last resolved (hash)."""
        return f"{self.prefix}:members:{{{pool}}}"
