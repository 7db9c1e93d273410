"""What the engine keeps per request (built from `Engine.add`'s checked arguments) and what it reports per
iteration. Plain data, no JAX: the scheduler, the KV manager and the runner all read and advance
a `Request`."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, NamedTuple

import numpy as np

from dantinox.cache.page_pool import pages_for
from dantinox.checks import positive_int


class RequestState(enum.Enum):
    """Where a request is: pending -> waiting -> running -> finished, and running -> waiting on preemption."""

    PENDING = "pending"  # added, its arrival step not reached yet
    WAITING = "waiting"  # in the queue, not holding pages (a swapped-out one holds a host copy)
    RUNNING = "running"  # holding pages and a seat, fed every iteration
    FINISHED = "finished"  # stopped; its pages went back to the pool


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
    seed: int = 0
    # key data of its generator before its next token (None: greedy; set from `seed`)
    rng: np.ndarray | None = None
    state: RequestState = RequestState.PENDING
    computed: int = 0
    pages: list[int] = dataclasses.field(default_factory=list)
    digests: list[bytes] = dataclasses.field(default_factory=list)  # names of full pages of `tokens`
    registered: int = 0  # full pages of this request named in the pool
    seat: int | None = None  # its row in the sliding-window layers' rings
    swapped: Any = None  # (pages, host copy of its pages and ring rows) while swapped out
    hit_tokens: int = 0
    preemptions: int = 0
    arrived_at: float | None = None
    token_times: list[float] = dataclasses.field(default_factory=list)

    @classmethod
    def checked(cls, rid: int, prompt_ids: Any, max_new_tokens: Any, arrival_step: Any, stop_ids: Any,
                temperature: Any, top_k: Any, seed: Any, *, vocab_size: int, max_len: int, page_size: int,
                num_pages: int) -> Request:
        """A new request from `Engine.add`'s arguments, each checked (one line naming it where it is wrong)
        against the model's vocabulary, the engine's longest request and its pool."""
        prompt = np.asarray(prompt_ids)
        if prompt.ndim == 2 and prompt.shape[0] == 1:
            prompt = prompt[0]
        if prompt.ndim != 1 or prompt.size == 0 or not np.issubdtype(prompt.dtype, np.integer):
            raise ValueError(f"prompt_ids: expected a non-empty list of token ids, got shape {prompt.shape}")
        if prompt.min() < 0 or prompt.max() >= vocab_size:
            raise ValueError(f"prompt_ids: token ids must lie in [0, {vocab_size}), got values in "
                             f"[{prompt.min()}, {prompt.max()}]")
        new = positive_int("max_new_tokens", max_new_tokens)
        arrival = positive_int("arrival_step", arrival_step, minimum=0)
        number = not isinstance(temperature, bool) and isinstance(temperature, int | float | np.number)
        if not number or temperature < 0:
            raise ValueError(f"temperature: expected a number >= 0, got {temperature!r}")
        if top_k is not None and not 1 <= positive_int("top_k", top_k) <= vocab_size:
            raise ValueError(f"top_k: expected None or an integer in [1, {vocab_size}], got {top_k!r}")
        seed = positive_int("seed", seed, minimum=0)
        total = prompt.size + new
        if total > max_len:
            raise ValueError(f"max_new_tokens: prompt ({prompt.size}) + max_new_tokens ({new}) = {total} "
                             f"exceeds max_len={max_len}")
        if pages_for(total, page_size) > num_pages:
            raise ValueError(f"num_pages: this request needs up to {pages_for(total, page_size)} pages of "
                             f"{page_size} tokens, the pool has {num_pages}")
        tokens = [int(t) for t in prompt]
        return cls(rid, tokens, new, arrival, frozenset(int(s) for s in stop_ids), list(tokens),
                   float(temperature), top_k or vocab_size, seed)

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
        per_token = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        return times[0] - self.arrived_at, per_token


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
    # wall time of the iteration's compiled calls, to block_until_ready (swaps: stats()["swap_seconds"])
    seconds: float
    calls: tuple[tuple[int, int], ...] = ()  # (rows B, tokens T) of each compiled call, padding included
