"""The page allocator: one pool of KV-cache pages, its free list, reference counts and names of cached pages.

The one allocator of every paged pool here, apart from the space managers that map sequences to pages
(vLLM's BlockAllocator beside its block manager): `PageManager` (dantinox/cache/page_manager.py: tables and
fill counts, copy-on-write, for paged decoding and the serving simulator) and the engine's `KVManager`
(dantinox/engine/kv_manager.py: tables per request, a prefix cache by page name). No JAX here: they own the
arrays; this keeps the bookkeeping of which page is free and how many hold it. The free list is in LRU order,
so a freed page that still holds a cached full page is reused last (vLLM's automatic prefix caching, docs
`design/prefix_caching`).
"""

from __future__ import annotations

import collections
import hashlib

import numpy as np

from dantinox.checks import positive_int


class PoolError(RuntimeError):
    """The allocator's bookkeeping broke an invariant (a double free, a lost page): a bug,
    never user error."""


class PoolExhausted(ValueError):
    """The pool has fewer free pages than a request needs (a scheduler preempts; a plain call fails)."""


def pages_for(tokens: int, page_size: int) -> int:
    """Pages needed to hold `tokens` slots: a partly filled last page is a whole page."""
    return -(-tokens // page_size)


class PagePool:
    """The allocator of one pool of pages: free list in LRU order, reference counts, hashes of cached pages.

    A page is free when nothing holds it (reference count 0). `take` hands out the least recently freed page
    (held once) and forgets whatever it cached; `share` adds a holder; `release` drops one, and a page nobody
    holds goes to the back of the free list. A free page may still hold a cached full page (it keeps its
    hash): `share` takes it back out of the free list.
    """

    def __init__(self, num_pages: int):
        self.num_pages = positive_int("num_pages", num_pages)
        self.refs = [0] * self.num_pages
        pages = range(self.num_pages)
        self.free: collections.OrderedDict[int, None] = collections.OrderedDict.fromkeys(pages)
        self.hash_of: list[bytes | None] = [None] * self.num_pages
        self.by_hash: dict[bytes, int] = {}
        self.evicted = 0  # cached pages overwritten to make room

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_cached_free(self) -> int:
        """Free pages that still hold a cached full page."""
        return sum(self.hash_of[b] is not None for b in self.free)

    def take(self) -> int:
        if not self.free:
            raise PoolError("pool: take() with no free page (the scheduler checks num_free first)")
        page, _ = self.free.popitem(last=False)
        if self.hash_of[page] is not None:  # its cached content is overwritten from now on
            del self.by_hash[self.hash_of[page]]
            self.hash_of[page] = None
            self.evicted += 1
        self.refs[page] = 1
        return page

    def share(self, page: int) -> None:
        """One more holder of a page (a fork, a prefix hit); a free cached one leaves the free list."""
        if self.refs[page] == 0:
            del self.free[page]
        self.refs[page] += 1

    def release(self, page: int) -> None:
        if self.refs[page] <= 0:
            raise PoolError(f"pool: double free of page {page}")
        self.refs[page] -= 1
        if self.refs[page] == 0:
            self.free[page] = None  # most recently freed: evicted last

    def lookup(self, digest: bytes) -> int | None:
        return self.by_hash.get(digest)

    def register(self, page: int, digest: bytes) -> None:
        """Name a full page by its chained hash (a page computed twice keeps the first name)."""
        if self.hash_of[page] is None and digest not in self.by_hash:
            self.hash_of[page], self.by_hash[digest] = digest, page

    def check(self, tables: list[list[int]]) -> None:
        """Raise PoolError unless every reference is a table entry and every page is free xor held."""
        held = collections.Counter(b for table in tables for b in table)
        for page in range(self.num_pages):
            if self.refs[page] != held[page]:
                raise PoolError(f"pool: page {page} has {self.refs[page]} reference(s), "
                                f"{held[page]} holder(s)")
            if (self.refs[page] == 0) != (page in self.free):
                raise PoolError(f"pool: page {page} free={page in self.free} with {self.refs[page]} "
                                "reference(s)")
        named = {d: b for b, d in enumerate(self.hash_of) if d is not None}
        if named != self.by_hash:
            raise PoolError("pool: the hash map and the pages' hashes disagree")


def page_digest(parent: bytes, tokens: list[int]) -> bytes:
    """The name of a full page: SHA-256 over its parent's name and its token ids."""
    return hashlib.sha256(parent + np.asarray(tokens, np.int64).tobytes()).digest()
