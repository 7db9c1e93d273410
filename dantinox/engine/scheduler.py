"""The engine's scheduler: which requests feed how many tokens in the next iteration. Plain Python, no arrays.

One iteration (iteration-level batching, Orca, OSDI '22) spends a budget of `chunk_tokens` tokens (None: no
limit), running requests first, in admission order:
  running     each feeds the tokens it has not yet cached (a prompt chunk, or the one token it sampled last),
              cut to what is left of the budget, so a long prompt is prefilled in chunks that share iterations
              with decodes (Sarathi-Serve, arXiv:2403.02310); a decode may add prompt-lookup drafts
              (dantinox/engine/speculation.py), as many as the budget and the request's remaining
              tokens allow.
  preemption  when the KV manager has no page for a running request, the most recently admitted running
              request is preempted (possibly the one asking): it goes back to the front of the queue, its
              pages released (swapped out or to be recomputed, as the KV manager was built).
  admission   then waiting requests join in arrival order while a seat (`max_seqs` running at most), the pool
              and the budget allow; the first that does not fit stops admission (no request overtakes
              another), and nothing is admitted in an iteration that preempted. `batching="static"` admits
              only when nothing runs: a batch forms when the one before has finished.
After the runner has run the plan, `finish` names the running requests' new full pages (the prefix cache) and
takes out those that are done, their pages released.

The KV manager is anything with the methods of `KVSpace`;
tests/test_scheduler.py drives this with a fake runner.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Protocol

from dantinox.engine.records import Request, RequestState
from dantinox.engine.speculation import lookup_drafts

BATCHING = ("continuous", "static")


class KVSpace(Protocol):
    """What the scheduler asks of the KV manager (dantinox/engine/kv_manager.py)."""

    def allocate(self, req: Request, upto: int) -> bool: ...  # pages for the first `upto` tokens, or False

    def cached(self, req: Request) -> tuple[int, list[int]]: ...  # (tokens found on admission, their pages)

    # a seat and pages, or False
    def admit(self, req: Request, cached: tuple[int, list[int]], n: int) -> bool: ...

    def preempt(self, req: Request) -> None: ...  # release its pages, swapped out or to be recomputed

    def register(self, req: Request) -> None: ...  # name its new full pages for the prefix cache

    def release(self, req: Request) -> None: ...  # hand its pages and seat back


@dataclasses.dataclass
class Plan:
    """One iteration as scheduled: what each scheduled request feeds, and what changed in the queue."""

    feeds: list[tuple[Request, int, list[int]]]  # (request, tokens to feed, drafts among them), running first
    admitted: list[int]
    preempted: list[int]
    # prompt tokens found in the prefix cache, per admitted request (a swapped-in one: as first)
    hits: dict[int, int]

    @property
    def fed(self) -> int:
        return sum(n for _, n, _ in self.feeds)


class Scheduler:
    """Continuous (or static) batching under a token budget, over a KV manager that says whether pages fit."""

    def __init__(self, kv: KVSpace, max_seqs: int, chunk_tokens: int | None, speculate: int = 0,
                 ngram: int = 3, batching: str = "continuous"):
        if batching not in BATCHING:
            raise ValueError(f"batching: expected one of {', '.join(BATCHING)}, got {batching!r}")
        self.kv, self.max_seqs, self.chunk_tokens = kv, max_seqs, chunk_tokens
        self.speculate, self.ngram, self.batching = speculate, ngram, batching
        self.requests: dict[int, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # in admission order: the last is preempted first
        self.steps = 0
        self.counts = collections.Counter()  # preemptions

    def add(self, req: Request) -> None:
        self.requests[req.rid] = req

    @property
    def finished(self) -> bool:
        return all(r.state is RequestState.FINISHED for r in self.requests.values())

    def schedule(self) -> Plan:
        """The next iteration's feeds; pages are allocated (and requests preempted) as it decides."""
        now = time.perf_counter()
        for req in self.requests.values():
            if req.state is RequestState.PENDING and req.arrival <= self.steps:
                req.state, req.arrived_at = RequestState.WAITING, now
                self.waiting.append(req)
        budget = float("inf") if self.chunk_tokens is None else self.chunk_tokens
        plan = Plan([], [], [], {})
        for req in list(self.running):  # running requests first, oldest first
            if req not in self.running or budget <= 0:
                continue
            pending = len(req.tokens) - req.computed
            drafts = []
            if pending == 1 and self.speculate:
                room = req.max_new - len(req.generated) - 1  # drafts never run past max_new_tokens
                drafts = lookup_drafts(req.tokens, int(min(self.speculate, room, budget - 1)), self.ngram)
            n = int(min(pending, budget)) + len(drafts)
            while not self.kv.allocate(req, req.computed + n):
                victim = self.running[-1]
                self._preempt(victim)
                plan.preempted.append(victim.rid)
                if victim is req:
                    break
            if req in self.running:
                plan.feeds.append((req, n, drafts))
                budget -= n
        static_busy = self.batching == "static" and bool(self.running)
        while self.waiting and budget > 0 and not plan.preempted and not static_busy:
            req = self.waiting[0]
            n = self._admit(req, budget)
            if n is None:
                break
            self.waiting.pop(0)
            req.state = RequestState.RUNNING
            self.running.append(req)
            plan.admitted.append(req.rid)
            plan.hits[req.rid] = req.hit_tokens
            plan.feeds.append((req, n, []))
            budget -= n
        return plan

    def _admit(self, req: Request, budget: float) -> int | None:
        """Start `req` if a seat, pages and budget allow; returns the tokens it feeds now
        (None: not admitted)."""
        if len(self.running) >= self.max_seqs:
            return None
        cached = self.kv.cached(req)
        n = int(min(len(req.tokens) - cached[0], budget))
        return n if self.kv.admit(req, cached, n) else None

    def _preempt(self, req: Request) -> None:
        """Take `req` out of the running set, back to the front of the queue, its pages released."""
        self.running.remove(req)
        req.preemptions += 1
        self.counts["preemptions"] += 1
        self.kv.preempt(req)
        req.state = RequestState.WAITING
        self.waiting.insert(0, req)

    def finish(self) -> list[int]:
        """After the runner: name every running request's new full pages, take out the done ones;
        their ids."""
        finished = []
        for req in list(self.running):
            self.kv.register(req)
            if req.done:
                req.state = RequestState.FINISHED
                self.running.remove(req)
                self.kv.release(req)
                finished.append(req.rid)
        self.steps += 1
        return finished
