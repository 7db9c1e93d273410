"""The prefix cache of a serving engine's sliding-window (ring) layers: copies of a seat's rings,
by page name.

A paged layer's prefix is shared by sharing pages; a ring layer's cannot be, since a ring is overwritten as
its request moves on. The keys a ring holds at page boundary P (positions [P - W, P)) depend only on the
tokens before P, so a copy of a seat's rings taken when its request had computed through P (and the ring,
`reach` slots longer than its window, still covered P: dantinox/engine/kv_manager.py) is exactly the rings a
request with the same first P tokens would build. `RingPrefixes` keeps one such copy per named page while the
pool keeps the page, trims a hit to the longest cached boundary that has one, and writes it into a new
request's seat. Recomputing the ring layers at a hit instead would save little: their keys at [P - W, P) need
the hidden states below them there, which need each ring layer below within its window, one more window back
per ring layer, so most of the prompt on a deep model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dantinox.cache.page_pool import PagePool
from dantinox.engine.copies import copy_in, copy_out


class RingPrefixes:
    """Ring rows by page name (the pool's digest of the prefix through that page)."""

    def __init__(self, ring: tuple[bool, ...], reach: int, page_size: int):
        self.ring, self.reach, self.page_size = ring, reach, page_size
        self.rows_at: dict[bytes, tuple] = {}  # page name -> ring rows of a request that had computed past it
        self._evicted = 0  # the pool's eviction count when rows of evicted pages were last let go

    def __bool__(self) -> bool:
        """Whether there is anything to keep: ring layers, with prefix caching on."""
        return self.reach > 0

    def keep(self, layers: tuple, seat: int, computed: int, named: Sequence[tuple[int, bytes]]) -> None:
        """After an iteration, the seat's rings for each newly named page (its index, its digest) whose
        boundary they still cover; one copy serves every boundary the iteration crossed."""
        rows = None
        for m, digest in named:
            if self and digest not in self.rows_at and computed - (m + 1) * self.page_size <= self.reach:
                if rows is None:
                    rows = copy_out(layers, self.ring, seat, None, self.page_size)
                self.rows_at[digest] = rows

    def trim(self, hits: list, last_digest: Callable[[int], bytes]) -> list:
        """`hits` (cached pages of a prompt's prefix) cut back to end at a boundary whose rings were kept;
        `last_digest(n)` names the n-th page's prefix."""
        while self and hits and last_digest(len(hits)) not in self.rows_at:
            hits.pop()
        return hits

    def restore(self, layers: tuple, seat: int, digest: bytes) -> tuple:
        """`layers` with the rings kept for `digest` written into the seat's row."""
        return copy_in(layers, self.ring, seat, None, self.rows_at[digest], self.page_size)

    def forget_evicted(self, pool: PagePool) -> None:
        """Let go of the rings of pages the pool no longer names."""
        if len(self.rows_at) > len(pool.by_hash) or pool.evicted != self._evicted:
            self._evicted = pool.evicted
            self.rows_at = {d: rows for d, rows in self.rows_at.items() if d in pool.by_hash}
