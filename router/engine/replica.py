"""A vLLM V1 replica's scheduler, step by step, in model seconds: the one engine the planner
(tidegate/offline/planner/model.py) and the simulator (tidegate/sim/engine.py) both drive.

Each step, as vLLM V1's scheduler builds it: every decoding sequence gets one token; then the
running sequences still prefilling get their next prompt chunk, first come first served; then
waiting sequences are admitted in FIFO order while fewer than `max_num_seqs` run, the step's
token budget (`max_num_batched_tokens`) lasts and the KV cache holds their prompt. A sequence
whose prefill completes in a step samples its first token at the step's end. Each decode token
takes a KV slot; when the cache is full the newest running sequence is preempted (its KV freed,
recomputed later as a prompt of everything it had), as vLLM does.

Steps with no prompt in them are all alike, so a run of them is one event: the replica jumps to
the next sequence to finish (or to be watched, or to fill the cache), and a sequence arriving
mid-run cuts the run at the end of the step in progress. Cost: O(log n) per arrival, finish and
prefill step, not per token.

Use: `submit` and `release` as requests come and go; whenever `version` changes, the step in
progress ends at `step_end_at` (math.inf: idle); call `end_step(step_end_at)` then, and read
`drain()`: ("admitted" | "first" | "token" | "done", key) in the order they happened.
`cached_tokens` is the prefix-cache hook: that much of the prompt skips its prefill.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from router.engine.spec import EngineSpec

_DONE, _WAKE = 0, 1


@dataclass(slots=True)
class _Sequence:
    key: int
    order: int
    to_prefill: int  # prompt tokens still to compute
    kv_prompt: int  # KV slots the prompt takes once admitted
    output: float  # tokens to produce in all (math.inf: until released)
    produced: int = 0
    base: int = 0  # while decoding: produced = replica.virtual - base
    epoch: int = 0  # bumped when it leaves decoding: stale targets are skipped
    state: str = "waiting"
    wakes: list[int] = field(default_factory=list)  # produced counts someone waits for


class Replica:
    def __init__(self, spec: EngineSpec) -> None:
        self._decode_steps: dict[int, float] = {}  # per batch size, for this spec
        self._rates: dict[int, float] = {}
        self.spec = spec
        self._waiting: deque[_Sequence] = deque()
        self._prefilling: deque[_Sequence] = deque()
        self._decoding: dict[int, _Sequence] = {}  # admission order: the last is preempted first
        self._sequences: dict[int, _Sequence] = {}
        self._targets: list[tuple[int, int, int, int, int]] = []  # (virtual, kind, order, key, epoch)
        self._events: list[tuple[str, int]] = []
        self._order = 0
        self.virtual = 0  # decode steps taken: each decoding sequence got one token per step
        self.kv_used = 0.0
        self.version = 0
        self.step_end_at = math.inf
        self._run_start = 0.0
        self._run_steps = 0
        self._run_step_s = 0.0
        self._run_chunks: list[tuple[_Sequence, int]] = []
        self.steps = 0
        self.prefill_tokens = 0
        self.preemptions = 0

    @property
    def spec(self) -> EngineSpec:
        return self._spec

    @spec.setter
    def spec(self, spec: EngineSpec) -> None:
        """New figures (the simulator's PUT /sim/config) take effect at the next step."""
        self._spec = spec
        self._decode_steps.clear()
        self._rates.clear()

    # what the consumer reads ------------------------------------------------------------------

    @property
    def running(self) -> int:
        return len(self._decoding) + len(self._prefilling)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def decoding(self) -> int:
        return len(self._decoding)

    def drain(self) -> list[tuple[str, int]]:
        events, self._events = self._events, []
        return events

    def produced(self, key: int) -> int:
        s = self._sequences.get(key)
        if s is None:
            return 0
        return self.virtual - s.base if s.state == "decoding" else s.produced

    # what the consumer does -------------------------------------------------------------------

    def submit(
        self,
        now: float,
        key: int,
        prompt_tokens: int,
        output_tokens: float = math.inf,
        cached_tokens: int = 0,
    ) -> None:
        """A request arrives at `now`; it joins the next step."""
        prompt = max(1, prompt_tokens)
        s = _Sequence(key, self._order, max(1, prompt - cached_tokens), prompt, max(1.0, output_tokens))
        self._order += 1
        self._sequences[key] = s
        self._waiting.append(s)
        self._interrupt(now)

    def watch(self, now: float, key: int, produced: int) -> None:
        """Emit ("token", key) once the sequence has produced `produced` tokens (the simulator
        streams by it); at once if it already has."""
        s = self._sequences.get(key)
        if s is None:
            return
        if self.produced(key) >= produced:
            self._events.append(("token", key))
            return
        s.wakes.append(produced)
        if s.state == "decoding":
            self._push(s.base + produced, _WAKE, s)
            self._cut(now, s.base + produced - self.virtual)

    def release(self, now: float, key: int) -> None:
        """The request is gone (finished or cancelled): free its slot and its KV."""
        s = self._sequences.pop(key, None)
        if s is None:
            return
        if s.state == "waiting":
            self._waiting.remove(s)
        elif s.state == "prefilling":
            self._prefilling.remove(s)
            self._run_chunks = [(c, n) for c, n in self._run_chunks if c is not s]
            self.kv_used -= s.kv_prompt + s.produced
        elif s.state == "decoding":
            self._leave_decoding(s)
        s.state = "gone"
        self._interrupt(now)

    def end_step(self, now: float) -> None:
        """The step (or run of alike steps) in progress ended at `now` (= `step_end_at`)."""
        steps, chunks = self._run_steps, self._run_chunks
        self.steps += steps
        self.virtual += steps
        self.kv_used += len(self._decoding) * steps
        for s, tokens in chunks:
            s.to_prefill -= tokens
            if s.to_prefill <= 0 and s.state == "prefilling":
                self._prefilling.remove(s)
                self._first_token(s)
        self._pop_targets()
        self._preempt_to_fit()
        self._schedule(now)

    # the scheduler ----------------------------------------------------------------------------

    def _interrupt(self, now: float) -> None:
        """Something changed: an idle replica starts a step now; a run of decode steps ends
        after the step in progress, so the change is seen at the next step."""
        if self.step_end_at == math.inf:
            self._schedule(now)
        elif not self._sequences:  # the last one left: nothing to finish the step for
            self._run_steps, self._run_chunks, self.step_end_at = 0, [], math.inf
            self.version += 1
        else:
            self._cut(now, 1)

    def _cut(self, now: float, steps: int) -> None:
        """End the run after `steps` steps, or after the step in progress if that is later."""
        if self._run_steps <= 1 or steps >= self._run_steps:
            return
        in_progress = math.floor((now - self._run_start) / self._run_step_s + 1e-9) + 1
        cut = max(1, steps, in_progress)
        if cut < self._run_steps:
            self._run_steps = cut
            self.step_end_at = self._run_start + cut * self._run_step_s
            self.version += 1

    def _schedule(self, now: float) -> None:
        spec = self.spec
        budget = spec.max_num_batched_tokens - len(self._decoding)
        chunks: list[tuple[_Sequence, int]] = []
        for s in self._prefilling:
            if budget <= 0:
                break
            take = min(s.to_prefill, budget)
            chunks.append((s, take))
            budget -= take
        while (
            self._waiting and budget > 0 and self.running < spec.max_num_seqs and self._fits(self._waiting[0])
        ):
            s = self._waiting.popleft()
            s.state = "prefilling"
            self.kv_used += s.kv_prompt + s.produced
            self._prefilling.append(s)
            self._events.append(("admitted", s.key))
            take = min(s.to_prefill, budget)
            chunks.append((s, take))
            budget -= take
        self._run_chunks = chunks
        self._run_start = now
        self.version += 1
        if chunks:
            prompt = sum(n for _, n in chunks)
            self.prefill_tokens += prompt
            self._run_steps, self._run_step_s = 1, spec.step_s(len(self._decoding), prompt)
        elif self._decoding:
            self._run_steps, self._run_step_s = self._decode_run(), self._decode_step_s(len(self._decoding))
        else:
            self._run_steps, self._run_step_s = 0, 0.0
            self.step_end_at = math.inf
            return
        self.step_end_at = now + self._run_steps * self._run_step_s

    def _decode_step_s(self, decoding: int) -> float:
        """A decode-only step, computed once per batch size (the planner asks millions of times)."""
        found = self._decode_steps.get(decoding)
        if found is None:
            found = self._decode_steps[decoding] = self._spec.step_s(decoding)
        return found

    def prefill_rate(self) -> float:
        """`EngineSpec.prefill_rate` at this replica's decode batch (cached per batch size)."""
        decoding = len(self._decoding)
        found = self._rates.get(decoding)
        if found is None:
            found = self._rates[decoding] = self._spec.prefill_rate(decoding)
        return found

    def _decode_run(self) -> int:
        """Alike decode steps until the next target, or until the KV cache is full."""
        steps = math.inf
        while self._targets:
            virtual, _, _, key, epoch = self._targets[0]
            s = self._sequences.get(key)
            if s is None or s.epoch != epoch or s.state != "decoding":
                heapq.heappop(self._targets)
                continue
            steps = max(1, virtual - self.virtual)
            break
        room = (self.spec.kv_capacity_tokens - self.kv_used) / len(self._decoding)
        return int(max(1, min(steps, room, 1 << 40)))

    def _fits(self, s: _Sequence) -> bool:
        if self.running == 0:
            return True  # alone, it runs whatever it needs (vLLM refuses longer prompts at the door)
        return self.kv_used + s.kv_prompt + s.produced <= self.spec.kv_capacity_tokens

    def _first_token(self, s: _Sequence) -> None:
        first = s.produced == 0
        s.produced += 1
        self.kv_used += 1
        if first:
            self._events.append(("first", s.key))
        s.state = "decoding"
        s.base = self.virtual - s.produced
        self._decoding[s.key] = s
        if s.output != math.inf:
            self._push(s.base + s.output, _DONE, s)
        for produced in list(s.wakes):
            if produced <= s.produced:
                s.wakes.remove(produced)
                self._events.append(("token", s.key))
            else:
                self._push(s.base + produced, _WAKE, s)

    def _push(self, virtual: float, kind: int, s: _Sequence) -> None:
        heapq.heappush(self._targets, (int(virtual), kind, s.order, s.key, s.epoch))

    def _pop_targets(self) -> None:
        targets = self._targets
        while targets and targets[0][0] <= self.virtual:
            virtual, kind, _, key, epoch = heapq.heappop(targets)
            s = self._sequences.get(key)
            if s is None or s.epoch != epoch or s.state != "decoding":
                continue
            if kind == _WAKE:
                s.wakes.remove(virtual - s.base)
                self._events.append(("token", key))
                continue
            s.produced = self.virtual - s.base
            self._leave_decoding(s)
            s.state = "done"
            del self._sequences[key]  # a finished sequence is forgotten (release is then a no-op)
            self._events.append(("done", key))

    def _leave_decoding(self, s: _Sequence) -> None:
        s.produced = self.virtual - s.base
        del self._decoding[s.key]
        s.epoch += 1
        self.kv_used -= s.kv_prompt + s.produced

    def _preempt_to_fit(self) -> None:
        """Free the newest running sequences while the next decode step would overflow the cache."""
        while len(self._decoding) > 1 and self.kv_used + len(self._decoding) > self.spec.kv_capacity_tokens:
            newest = self._decoding[next(reversed(self._decoding))]
            self._leave_decoding(newest)
            newest.state = "waiting"
            newest.to_prefill = newest.kv_prompt + newest.produced  # recomputed from scratch
            self._waiting.appendleft(newest)
            self.preemptions += 1
