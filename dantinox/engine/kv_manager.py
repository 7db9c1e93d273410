"""The engine's KV manager: the cache's arrays and who holds which part of them.

It owns the engine's layers (one pool of `num_pages` pages per paged layer, one ring per seat per
sliding-window layer) and the bookkeeping over them: the page allocator (`PagePool`: free list in LRU order,
reference counts, names of cached full pages), each request's page table and seat, the prefix cache (a full
page is named by a hash chained over its parent's name and its tokens, vLLM's automatic prefix caching, docs
`design/prefix_caching`; ring layers keep copies of their rings by page name,
dantinox/engine/ring_prefixes.py) and swapping (a preempted request's pages and ring rows copied to host
memory and back, vLLM, arXiv:2309.06180 §4.5). The scheduler asks it for room (`allocate`, `admit`) and hands
pages back (`release`, `preempt`); the runner reads and writes `layers`.
"""

from __future__ import annotations

import collections
import time

import jax
import jax.numpy as jnp
import numpy as np

from dantinox.architectures.config import ModelConfig
from dantinox.cache import empty_cache, layouts
from dantinox.cache.page_pool import PagePool, page_digest, pages_for
from dantinox.engine.copies import copy_in, copy_out
from dantinox.engine.records import Request
from dantinox.engine.ring_prefixes import RingPrefixes


class KVManager:
    """The engine's layers, its page pool, the seats of its ring layers, the prefix cache and swapping.

    With prefix caching a seat's ring holds `reach` slots beyond its window (chunk_tokens, the most tokens one
    iteration feeds a request; max_len when whole prompts are fed): after an iteration every page boundary P a
    request crossed still has positions [P - W, P) in its ring, so a copy of the ring then is the ring a
    request that stops at P would have had. `swap`: a preempted request's cache goes to host memory and comes
    back (otherwise it is recomputed from its tokens).
    """

    def __init__(self, cfg: ModelConfig, num_pages: int, page_size: int, max_seqs: int, max_len: int,
                 prefix_caching: bool, chunk_tokens: int | None, swap: bool):
        self.page_size, self.prefix_caching, self.swap = page_size, prefix_caching, swap
        self.pool = PagePool(num_pages)
        self.ring = tuple(not lay.addressing.pooled for lay in layouts(cfg))
        table = np.zeros((1, 1), np.int32)  # ring layers: one row per seat, plus a scratch row for padding
        layers = empty_cache(cfg, max_seqs + 1, cfg.max_context, table, num_pages).layers
        self.reach = (chunk_tokens or max_len) if prefix_caching and any(self.ring) else 0
        self.layers = tuple(
            lay.zeros(cfg, max_seqs + 1, min(lay.addressing.slots(max_len) + self.reach, max_len))
            if r and self.reach and lay.addressing.slots(max_len) + self.reach > layer.slots else layer
            for layer, lay, r in zip(layers, layouts(cfg), self.ring, strict=True))
        self.ring_prefixes = RingPrefixes(self.ring, self.reach, page_size)
        self.free_seats = list(range(max_seqs))
        self.counts = collections.Counter()  # prompt_tokens, hit_tokens, hit_pages, swaps_out, swaps_in
        self.swap_seconds = 0.0
        self.swap_bytes = 0

    def _digests(self, req: Request, upto: int) -> list[bytes]:
        """Names of the full pages among the first `upto` tokens (chained, cached on the request)."""
        ps = self.page_size
        while len(req.digests) < upto // ps:
            m = len(req.digests)
            req.digests.append(page_digest(req.digests[-1] if m else b"", req.tokens[m * ps:(m + 1) * ps]))
        return req.digests[:upto // ps]

    # Room for tokens.
    def allocate(self, req: Request, upto: int) -> bool:
        """Give `req` pages for its first `upto` tokens; False (nothing taken) if the pool is short."""
        need = pages_for(upto, self.page_size) - len(req.pages)
        if need > self.pool.num_free:
            return False
        req.pages += [self.pool.take() for _ in range(max(0, need))]
        return True

    def cached(self, req: Request) -> tuple[int, list[int]]:
        """(tokens `req` need not compute when admitted now, the cached pages of its prompt that hold them).

        A swapped-out request brings its computed tokens back from host memory. Otherwise: the whole cached
        pages of all but its last token (that one must be computed: its logits give the next token), cut back
        to a boundary whose rings were kept.
        """
        if req.swapped is not None:
            return req.computed, []
        hits = []
        if self.prefix_caching:
            for digest in self._digests(req, len(req.tokens) - 1):
                page = self.pool.lookup(digest)
                if page is None:
                    break
                hits.append(page)
        self.ring_prefixes.trim(hits, lambda n: self._digests(req, n * self.page_size)[-1])
        return len(hits) * self.page_size, hits

    def admit(self, req: Request, cached: tuple[int, list[int]], n: int) -> bool:
        """Give `req` a seat and pages for its `cached` tokens (as `cached(req)` found them) and `n` more;
        False (nothing taken) if the pool is short. The caller checks that a seat is free."""
        start, hits = cached
        if req.swapped is not None:  # back from host memory: its computed tokens come with it
            if max(req.swapped[0], pages_for(start + n, self.page_size)) > self.pool.num_free:
                return False
            req.seat = self.free_seats.pop(0)
            self._swap_in(req)
            self.allocate(req, start + n)
            return True
        # free cached pages a hit takes off the free list
        reclaimed = sum(self.pool.refs[b] == 0 for b in hits)
        if pages_for(start + n, self.page_size) - len(hits) > self.pool.num_free - reclaimed:
            return False
        for page in hits:
            self.pool.share(page)
        req.pages, req.registered, req.computed = list(hits), len(hits), start
        req.seat = self.free_seats.pop(0)
        if self.ring_prefixes and hits:  # the rings as they were when a request had computed through the hit
            self.layers = self.ring_prefixes.restore(self.layers, req.seat, self._digests(req, start)[-1])
        self.allocate(req, start + n)
        req.hit_tokens = start
        self.counts["prompt_tokens"] += len(req.tokens)
        self.counts["hit_tokens"] += start
        self.counts["hit_pages"] += len(hits)
        return True

    # Pages back.
    def register(self, req: Request) -> None:
        """Name the request's newly completed pages, so later requests with the same prefix can share them."""
        if not self.prefix_caching:
            return
        full = req.computed // self.page_size
        named = list(enumerate(self._digests(req, full * self.page_size)[req.registered:], req.registered))
        for m, digest in named:
            self.pool.register(req.pages[m], digest)
        self.ring_prefixes.keep(self.layers, req.seat, req.computed, named)
        req.registered = max(req.registered, full)

    def release(self, req: Request) -> None:
        """Hand the request's pages back to the pool
        (cached ones stay findable until reused) and free its seat."""
        for page in reversed(req.pages):  # a prefix's first pages are freed last, so evicted last
            self.pool.release(page)
        req.pages, req.registered = [], 0
        if req.seat is not None:
            self.free_seats.append(req.seat)
            req.seat = None

    def preempt(self, req: Request) -> None:
        """Release a running request's pages: swapped out to host memory first, or dropped
        (it is recomputed)."""
        if self.swap:
            start = time.perf_counter()
            saved = jax.device_get(copy_out(self.layers, self.ring, req.seat,
                                            jnp.asarray(req.pages, jnp.int32), self.page_size))
            req.swapped = (len(req.pages), saved)
            self.swap_bytes += sum(int(a.nbytes) for part in saved for a in part if a is not None)
            self.swap_seconds += time.perf_counter() - start
            self.counts["swaps_out"] += 1
        else:
            req.computed = 0
        self.release(req)

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

    def end_step(self, running: list[Request]) -> None:
        """After an iteration: check the pool against the running tables (PoolError on a lost or doubly freed
        page) and let go of the rings of pages it has evicted."""
        self.pool.check([r.pages for r in running])
        self.ring_prefixes.forget_evicted(self.pool)
