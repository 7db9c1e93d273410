"""A serving engine you can read: continuous batching of a real model over one paged KV-cache pool.

    engine = dantinox.Engine(model, num_pages=64, page_size=16, prefix_caching=True, chunk_tokens=64)
    rid = engine.add(prompt_ids, max_new_tokens=32, arrival_step=0)
    report = engine.step()          # one iteration: what was scheduled, emitted, hit, preempted
    outputs = engine.run()          # {rid: generated token ids}

Each `step()` is one iteration over the running set (iteration-level batching, Orca, OSDI '22): every
running request feeds the tokens it has not yet cached (a prompt chunk, or the one token it sampled last),
new requests join when the pool and the token budget allow, finished ones leave and free their pages.
The feeds of one iteration run as a ragged batch ([B, T] ids, a fill per row, one page table) through the
model's own paged layout, in one compiled program per shape bucket (B, T and the table width M are
rounded up to a few sizes, so a long trace compiles a handful of programs).

The four techniques, each a few lines below and each proven exact by tests/test_engine.py (every request's
tokens equal `dantinox.generate` of that request alone, greedy or seeded sampling):
  memory        a pool of `num_pages` pages (`PagePool`: free list in LRU order, reference counts). When a
                running request needs a page and none is free, the most recently admitted request is
                preempted: its pages are freed and it is recomputed later from its tokens, or (preempt="swap")
                its pages are copied to host memory and copied back when it resumes (vLLM, arXiv:2309.06180
                §4.5). No request is lost; one that could never fit is refused when it is added.
  prefix cache  a full page is named by a hash chained over its parent's hash and its tokens (vLLM's
                automatic prefix caching, docs `design/prefix_caching`); a new request takes the cached pages
                of its longest cached prefix and starts computing after them. Freed pages keep their hash and
                are reused in least-recently-freed order until the space is needed. A prompt that hits in full
                still computes its last token: its logits give the first output token.
  chunked fill  at most `chunk_tokens` tokens are fed per iteration, decodes first, so a long prompt is
                prefilled in chunks that share iterations with decodes (Sarathi-Serve, arXiv:2403.02310).
  speculation   prompt-lookup drafts (dantinox/speculation.py), verified by one forward; the longest agreed
                prefix is kept plus the model's own next token. Rejected tokens are rolled back: paged slots
                past the fill are never read, and a sliding-window ring's slots that the rejected tokens
                overwrote are restored from a copy taken before the write.

Sliding-window (ring) layers keep one ring per running request (a "seat"), beside the pool. Their prefix is
cached by copying the ring, not by sharing pages (dantinox/ring_prefixes.py). A seat holds `reach` (the most
tokens one iteration feeds a request: chunk_tokens) slots beyond its window, so at the end of every iteration
each page boundary it crossed is still covered by its ring.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dantinox.cache import empty_cache, layouts
from dantinox.checks import positive_int
from dantinox.engine_records import Request, RequestState, Row, StepReport
from dantinox.engine_step import (
    bucket_of,
    copy_in,
    copy_out,
    forward_rows_jit,
    power_of_two,
    ragged_feed,
    shape_buckets,
)
from dantinox.model import Transformer
from dantinox.page_manager import pages_for
from dantinox.page_pool import PagePool, page_digest
from dantinox.ring_prefixes import RingPrefixes
from dantinox.speculation import accept_drafts, lookup_drafts

BATCHING = ("continuous", "static")
PREEMPT = ("recompute", "swap")


class Engine:
    """Continuous batching over a paged pool, with prefix caching, chunked prefill and prompt-lookup speculation.

    `num_pages` pages of `page_size` tokens per paged layer; `chunk_tokens` tokens fed per iteration (None:
    whole prompts); `speculate` drafts verified per decode (0: off); at most `max_seqs` requests run at once.
    `batching="static"` admits a new batch only when the running one has finished (the baseline).
    `fixed_shapes=True` pads every call to max_seqs rows and the full table width, and a decode to the verify's
    1 + speculate tokens, so a run compiles at most two programs (decode or verify, prompt chunk): for small
    models and tests, where compiling dominates.
    `max_len` (default the model's max_context) is the longest request (prompt + new tokens) it accepts.
    Sliding-window layers with prefix caching hold chunk_tokens slots past their window per running request
    (so with chunk_tokens=None, max_len slots: pass a chunk size, or prefix_caching=False, to keep rings small).
    Greedy or sampled per request (`add`); a request stops after `max_new_tokens` or at a token of its `stop_ids`.
    A call with a sampling row is a program of its own (greedy calls draw no random numbers).
    """

    def __init__(self, model: Transformer, num_pages: int, page_size: int = 16, prefix_caching: bool = True,
                 chunk_tokens: int | None = 64, speculate: int = 0, max_seqs: int = 8, batching: str = "continuous",
                 preempt: str = "recompute", ngram: int = 3, fixed_shapes: bool = False, max_len: int | None = None):
        cfg = model.cfg
        if cfg.paradigm != "autoregressive":
            raise ValueError(f"model: the engine serves autoregressive models; this one has paradigm={cfg.paradigm!r}")
        self.page_size = positive_int("page_size", page_size)
        self.chunk_tokens = None if chunk_tokens is None else positive_int("chunk_tokens", chunk_tokens)
        self.speculate = positive_int("speculate", speculate, minimum=0)
        self.max_seqs = positive_int("max_seqs", max_seqs)
        self.ngram = positive_int("ngram", ngram)
        if batching not in BATCHING:
            raise ValueError(f"batching: expected one of {', '.join(BATCHING)}, got {batching!r}")
        if preempt not in PREEMPT:
            raise ValueError(f"preempt: expected one of {', '.join(PREEMPT)}, got {preempt!r}")
        self.batching, self.preempt, self.fixed_shapes = batching, preempt, fixed_shapes
        if cfg.cache_layout != "paged" or cfg.page_size != self.page_size:
            from dantinox.quality import with_changes

            model = with_changes(model, cache_layout="paged", page_size=self.page_size)
        self.cfg = model.cfg
        self.ring = tuple(not hasattr(lay.addressing, "page_size") for lay in layouts(self.cfg))
        rings = [w for w in (*self.cfg.layer_windows, *self.cfg.layer_chunks) if w is not None]
        if rings and self.speculate + 1 > min(min(rings), self.cfg.max_context):
            raise ValueError(f"speculate: 1 + {self.speculate} tokens per verify must fit the smallest ring "
                             f"({min(rings)} slots)")
        self.prefix_caching = prefix_caching
        self.graphdef, self.params = nnx.split(model)
        self.pool = PagePool(num_pages)
        self.max_len = cfg.max_context if max_len is None else positive_int("max_len", max_len)
        if self.max_len > cfg.max_context:
            raise ValueError(f"max_len: at most the model's max_context={cfg.max_context}, got {self.max_len}")
        table = np.zeros((1, 1), np.int32)  # ring layers: one row per seat, plus a scratch row for padding
        layers = empty_cache(self.cfg, self.max_seqs + 1, self.cfg.max_context, table, num_pages).layers
        # With prefix caching a seat's ring holds `reach` slots beyond its window: after an iteration feeds a
        # request at most `reach` tokens, every page boundary P it crossed still has positions [P - W, P) in
        # the ring, so a copy of the ring then is the ring a request that stops at P would have had.
        self.reach = (self.chunk_tokens or self.max_len) if prefix_caching and any(self.ring) else 0
        self.layers = tuple(
            lay.payload.zeros(self.cfg, self.max_seqs + 1, min(lay.addressing.size + self.reach, self.max_len))
            if r and self.reach and lay.addressing.size + self.reach > layer.slots else layer
            for layer, lay, r in zip(layers, layouts(self.cfg), self.ring, strict=True))
        self.ring_prefixes = RingPrefixes(self.ring, self.reach, self.page_size)
        self.max_pages = min(pages_for(self.max_len, self.page_size), num_pages)  # table width
        self.requests: dict[int, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # in admission order: the last is preempted first
        self.free_seats = list(range(self.max_seqs))
        self.steps = 0
        self.shapes: set[tuple] = set()  # (B, T, M, P, sampling) of every compiled call
        self.counts = collections.Counter()  # prompt_tokens, hit_tokens, hit_pages, drafts, accepted, ...
        self.swap_seconds = 0.0
        self.swap_bytes = 0

    # Requests.
    def add(self, prompt_ids: Any, max_new_tokens: int, arrival_step: int = 0, stop_ids: Any = (),
            temperature: float = 0.0, top_k: int | None = None, seed: int = 0) -> int:
        """Queue a request; returns its id. It becomes eligible at iteration `arrival_step`.

        temperature 0 is greedy; above it, tokens are drawn (after a top-k cut when top_k is set) from a
        generator seeded with `seed`, as `dantinox.generate(model, prompt, n, temperature=, top_k=, seed=)`
        draws them for this request alone.
        """
        rid = len(self.requests)
        self.requests[rid] = Request.checked(rid, prompt_ids, max_new_tokens, arrival_step, stop_ids, temperature,
                                             top_k, seed, vocab_size=self.cfg.vocab_size, max_len=self.max_len,
                                             page_size=self.page_size, num_pages=self.pool.num_pages)
        return rid

    @property
    def finished(self) -> bool:
        return all(r.state is RequestState.FINISHED for r in self.requests.values())

    def run(self, max_steps: int = 1_000_000) -> dict[int, list[int]]:
        """Step until every request has finished; {rid: generated token ids}."""
        while not self.finished:
            if self.steps >= max_steps:
                raise RuntimeError(f"max_steps: {max_steps} iterations did not finish the queue")
            self.step()
        return self.outputs()

    def outputs(self) -> dict[int, list[int]]:
        return {rid: r.generated for rid, r in self.requests.items()}

    # Pages.
    def _digests(self, req: Request, upto: int) -> list[bytes]:
        """Names of the full pages among the first `upto` tokens (chained, cached on the request)."""
        ps = self.page_size
        while len(req.digests) < upto // ps:
            m = len(req.digests)
            req.digests.append(page_digest(req.digests[-1] if m else b"", req.tokens[m * ps:(m + 1) * ps]))
        return req.digests[:upto // ps]

    def _grow(self, req: Request, upto: int) -> bool:
        """Give `req` pages for its first `upto` tokens; False (nothing taken) if the pool is short."""
        need = pages_for(upto, self.page_size) - len(req.pages)
        if need > self.pool.num_free:
            return False
        req.pages += [self.pool.take() for _ in range(max(0, need))]
        return True

    def _register(self, req: Request) -> None:
        """Name the request's newly completed pages, so later requests with the same prefix can share them."""
        if not self.prefix_caching:
            return
        full = req.computed // self.page_size
        named = list(enumerate(self._digests(req, full * self.page_size)[req.registered:], req.registered))
        for m, digest in named:
            self.pool.register(req.pages[m], digest)
        self.ring_prefixes.keep(self.layers, req.seat, req.computed, named)
        req.registered = max(req.registered, full)

    def _free(self, req: Request) -> None:
        for page in reversed(req.pages):  # a prefix's first pages are freed last, so evicted last
            self.pool.release(page)
        req.pages, req.registered = [], 0
        if req.seat is not None:
            self.free_seats.append(req.seat)
            req.seat = None

    def _preempt(self, req: Request) -> None:
        """Take `req` out of the running set, back to the front of the queue, its pages freed."""
        self.running.remove(req)
        req.preemptions += 1
        self.counts["preemptions"] += 1
        if self.preempt == "swap":
            start = time.perf_counter()
            saved = jax.device_get(copy_out(self.layers, self.ring, req.seat, jnp.asarray(req.pages, jnp.int32),
                                            self.page_size))
            req.swapped = (len(req.pages), saved)
            self.swap_bytes += sum(int(a.nbytes) for part in saved for a in part if a is not None)
            self.swap_seconds += time.perf_counter() - start
            self.counts["swaps_out"] += 1
        else:
            req.computed = 0
        self._free(req)
        req.state = RequestState.WAITING
        self.waiting.insert(0, req)

    def _swap_in(self, req: Request) -> None:
        start = time.perf_counter()
        n_pages, saved = req.swapped
        req.pages = [self.pool.take() for _ in range(n_pages)]
        self.layers = copy_in(self.layers, self.ring, req.seat, jnp.asarray(req.pages, jnp.int32), saved,
                              self.page_size)
        jax.block_until_ready(self.layers)
        req.swapped = None
        self.swap_seconds += time.perf_counter() - start
        self.counts["swaps_in"] += 1

    def _admit(self, req: Request, budget: float) -> int | None:
        """Start `req` if a seat, pages and budget allow; returns the tokens it feeds now (None: not admitted)."""
        if not self.free_seats:
            return None
        if req.swapped is not None:  # back from host memory: its computed tokens come with it
            n = int(min(len(req.tokens) - req.computed, budget))
            if max(req.swapped[0], pages_for(req.computed + n, self.page_size)) > self.pool.num_free:
                return None
            req.seat = self.free_seats.pop(0)
            self._swap_in(req)
            self._grow(req, req.computed + n)
            return n
        hits = []
        if self.prefix_caching:  # whole pages of all but the last token: the last one must give logits
            for digest in self._digests(req, len(req.tokens) - 1):
                page = self.pool.lookup(digest)
                if page is None:
                    break
                hits.append(page)
        # ring layers: a hit must end at a boundary whose rings were kept
        self.ring_prefixes.trim(hits, lambda n: self._digests(req, n * self.page_size)[-1])
        start = len(hits) * self.page_size
        n = int(min(len(req.tokens) - start, budget))
        reclaimed = sum(self.pool.refs[b] == 0 for b in hits)  # free cached pages a hit takes off the free list
        if pages_for(start + n, self.page_size) - len(hits) > self.pool.num_free - reclaimed:
            return None
        for page in hits:
            self.pool.share(page)
        req.pages, req.registered, req.computed = list(hits), len(hits), start
        req.seat = self.free_seats.pop(0)
        if self.ring_prefixes and hits:  # the rings as they were when a request had computed through the hit
            self.layers = self.ring_prefixes.restore(self.layers, req.seat, self._digests(req, start)[-1])
        self._grow(req, start + n)
        req.hit_tokens = start
        self.counts["prompt_tokens"] += len(req.tokens)
        self.counts["hit_tokens"] += start
        self.counts["hit_pages"] += len(hits)
        return n

    # The iteration.
    def step(self) -> StepReport:
        """Schedule and run one iteration; returns what happened in it."""
        now = time.perf_counter()
        for req in self.requests.values():
            if req.state is RequestState.PENDING and req.arrival <= self.steps:
                req.state, req.arrived_at = RequestState.WAITING, now
                self.waiting.append(req)
        budget = float("inf") if self.chunk_tokens is None else self.chunk_tokens
        plan: list[tuple[Request, int, list[int]]] = []
        preempted, admitted, hits = [], [], {}
        for req in list(self.running):  # running requests first, oldest first
            if req not in self.running or budget <= 0:
                continue
            pending = len(req.tokens) - req.computed
            drafts = []
            if pending == 1 and self.speculate:
                room = req.max_new - len(req.generated) - 1  # drafts never run past max_new_tokens
                drafts = lookup_drafts(req.tokens, int(min(self.speculate, room, budget - 1)), self.ngram)
            n = int(min(pending, budget)) + len(drafts)
            while not self._grow(req, req.computed + n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim.rid)
                if victim is req:
                    break
            if req in self.running:
                plan.append((req, n, drafts))
                budget -= n
        static_busy = self.batching == "static" and bool(self.running)
        while self.waiting and budget > 0 and not preempted and not static_busy:
            req = self.waiting[0]
            n = self._admit(req, budget)
            if n is None:
                break
            self.waiting.pop(0)
            req.state = RequestState.RUNNING
            self.running.append(req)
            admitted.append(req.rid)
            hits[req.rid] = req.hit_tokens
            plan.append((req, n, []))
            budget -= n

        seconds, rows, emitted, calls = self._execute(plan)
        finished = []
        for req in list(self.running):
            self._register(req)
            if req.done:
                req.state = RequestState.FINISHED
                self.running.remove(req)
                self._free(req)
                finished.append(req.rid)
        self.pool.check([r.pages for r in self.running])
        self.ring_prefixes.forget_evicted(self.pool)  # rings of evicted pages are let go with them
        self.steps += 1
        held = collections.Counter(b for r in self.running for b in r.pages)
        return StepReport(
            step=self.steps - 1, rows=tuple(rows), emitted=emitted, admitted=tuple(admitted),
            finished=tuple(finished), preempted=tuple(preempted), hits=hits, budget=self.chunk_tokens,
            fed=sum(n for _, n, _ in plan), tables={r.rid: tuple(r.pages) for r in self.running},
            shared=frozenset(b for b, c in held.items() if c > 1), free=self.pool.num_free,
            cached_free=self.pool.num_cached_free, waiting=tuple(r.rid for r in self.waiting), seconds=seconds,
            calls=tuple(calls))

    def _execute(self, plan) -> tuple[float, list[Row], dict[int, list[int]], list[tuple[int, int]]]:
        """Run the plan as up to two ragged calls: short feeds (decodes, verifies) and prompt chunks."""
        short = [p for p in plan if p[1] <= 1 + self.speculate]
        long = [p for p in plan if p[1] > 1 + self.speculate]
        rows, emitted, seconds, calls = [], {}, 0.0, []
        for group, every in ((short, True), (long, False)):
            if not group:
                continue
            start = time.perf_counter()
            chosen, states, shape = self._call(group, every)
            calls.append(shape)
            seconds += time.perf_counter() - start
            for b, (req, n, drafts) in enumerate(group):
                rows.append(self._accept(req, n, drafts, chosen[b], None if states is None else states[b], emitted))
        return seconds, rows, emitted, calls

    def _call(self, group, every: bool) -> np.ndarray:
        n_max = max(n for _, n, _ in group)
        if every:  # decodes (one token) or verifies (1 + speculate)
            T = 1 if n_max == 1 and not (self.fixed_shapes and self.speculate) else 1 + self.speculate
        elif self.fixed_shapes:
            T = min(self.chunk_tokens or self.max_len, self.max_len)
        else:
            T = bucket_of(shape_buckets(self.max_len, 8), n_max)
        if self.fixed_shapes:
            B, M = self.max_seqs, self.max_pages
        else:
            B = power_of_two(len(group), self.max_seqs)
            M = power_of_two(max(len(r.pages) for r, _, _ in group), self.max_pages)
        feed = ragged_feed(group, B, T, M, every, self.cfg.vocab_size, self.max_seqs)
        sampling = any(req.rng is not None for req, _, _ in group)
        self.shapes.add((B, T, M, feed.at.shape[1], sampling))
        self.layers, chosen, states = forward_rows_jit(self.graphdef, self.params, self.layers, *feed,
                                                        sampling=sampling)
        chosen = np.asarray(jax.block_until_ready(chosen))[:len(group)]
        return chosen, (None if states is None else np.asarray(states)[:len(group)]), (B, T)

    def _accept(self, req: Request, n: int, drafts: list[int], greedy: np.ndarray, states, emitted) -> Row:
        """Advance `req` by what its feed computed; keep the agreed drafts and the model's next token.

        `greedy[j]` is the model's token after feed position j (a prompt chunk's call keeps only the last),
        greedy or drawn; a draft is kept when it is the token the model chose there, so a sampled request
        gets the tokens it would get without drafts. `states[j]` is its generator after that token.
        """
        start, real = req.computed, n - len(drafts)
        if real < len(req.tokens) - start:  # a prompt chunk short of the end: no token yet
            req.computed += n
            return Row(req.rid, "prefill", start, n)

        accepted, new = accept_drafts(drafts, lambda j: int(greedy[j] if len(greedy) > 1 else greedy[0]), real,
                                      req.max_new - len(req.generated), req.stop)
        kind = "verify" if drafts else ("decode" if real == 1 and start >= len(req.prompt) else "prefill")
        req.computed = start + real + min(accepted, len(new))  # accepted drafts' keys are valid, rejected past fill
        req.tokens += new
        if req.rng is not None and new:
            req.rng = states[len(new) - 1]
        req.token_times += [time.perf_counter()] * len(new)
        emitted[req.rid] = new
        self.counts["drafts"] += len(drafts)
        self.counts["accepted"] += accepted
        return Row(req.rid, kind, start, n, len(drafts), accepted)

    # Reports.
    def stats(self) -> dict[str, float]:
        """Counts over the whole run: prefix hits, pages saved, drafts accepted, preemptions, swaps.

        hit_rate is the tokens found in the prefix cache over the tokens looked up at every admission (a
        recomputed request is looked up again); pages_saved counts the pages those hits did not compute.
        """
        c = self.counts
        return {
            "steps": self.steps,
            "prompt_tokens": c["prompt_tokens"],
            "hit_tokens": c["hit_tokens"],
            "hit_rate": c["hit_tokens"] / c["prompt_tokens"] if c["prompt_tokens"] else 0.0,
            "pages_saved": c["hit_pages"],
            "drafts": c["drafts"],
            "accepted": c["accepted"],
            "acceptance_rate": c["accepted"] / c["drafts"] if c["drafts"] else 0.0,
            "preemptions": c["preemptions"],
            "swaps_out": c["swaps_out"],
            "swap_bytes": self.swap_bytes,
            "swap_seconds": self.swap_seconds,
            "evicted_pages": self.pool.evicted,
            "compiled_shapes": len(self.shapes),
        }

    def latencies(self) -> dict[int, tuple[float, float | None]]:
        """Per finished request: (time to first token, mean time per output token after it), in seconds."""
        return {rid: r.latency() for rid, r in self.requests.items()
                if r.state is RequestState.FINISHED and r.token_times}
