"""What the engine keeps per request and what it reports per iteration (dantinox/engine.py schedules them)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np


@dataclasses.dataclass
class Request:
    """Host state of one request; `tokens[:computed]` have their keys and values in the cache."""

    rid: int
    prompt: list[int]
    max_new: int
    arrival: int
    stop: frozenset[int]
    tokens: list[int]
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # the vocabulary size when not cut
    rng: np.ndarray | None = None  # key data of its generator before its next token (None: greedy)
    state: str = "pending"  # pending -> waiting -> running -> finished (running -> waiting on preemption)
    computed: int = 0
    pages: list[int] = dataclasses.field(default_factory=list)
    digests: list[bytes] = dataclasses.field(default_factory=list)  # names of full pages of `tokens`
    registered: int = 0  # full pages of this request named in the pool
    seat: int | None = None
    swapped: Any = None  # host copy of its pages and ring rows while swapped out
    hit_tokens: int = 0
    preemptions: int = 0
    arrived_at: float | None = None
    token_times: list[float] = dataclasses.field(default_factory=list)

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt):]

    @property
    def done(self) -> bool:
        gen = self.generated
        return len(gen) >= self.max_new or bool(gen and gen[-1] in self.stop)

    def latency(self) -> tuple[float, float | None]:
        """(time to first token, mean time per output token after it), in seconds; it has emitted a token."""
        times = self.token_times
        return times[0] - self.arrived_at, ((times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None)


class Row(NamedTuple):
    """One request's part of an iteration."""

    rid: int
    kind: str  # "prefill" (prompt or recompute chunk), "decode", or "verify" (decode + drafts)
    start: int  # position of its first fed token
    tokens: int  # tokens fed (drafts included)
    drafts: int = 0
    accepted: int = 0


@dataclasses.dataclass(frozen=True)
class StepReport:
    """What one iteration did (the serving lab draws these)."""

    step: int
    rows: tuple[Row, ...]
    emitted: dict[int, list[int]]  # tokens produced per request
    admitted: tuple[int, ...]
    finished: tuple[int, ...]
    preempted: tuple[int, ...]
    hits: dict[int, int]  # prompt tokens found in the prefix cache, per admitted request
    budget: int | None  # token budget of the iteration (chunk_tokens)
    fed: int  # tokens fed this iteration
    tables: dict[int, tuple[int, ...]]  # page table of every running request after the iteration
    shared: frozenset[int]  # pages held by more than one request
    free: int  # free pages (cached ones included)
    cached_free: int  # free pages still holding a cached full page
    waiting: tuple[int, ...]
    seconds: float  # wall time of the iteration's compiled calls (to block_until_ready) and swaps
    calls: tuple[tuple[int, int], ...] = ()  # (rows B, tokens T) of each compiled call, padding included
