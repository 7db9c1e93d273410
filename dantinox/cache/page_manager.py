"""The host side of the paged KV cache for paged decoding and the serving simulator:
page tables and fill counts.

`PageManager` is a space manager: it decides which physical page holds which tokens of which sequence, and
takes and hands back pages through the allocator every pool uses (`PagePool`, dantinox/cache/page_pool.py:
free list, reference counts); dantinox/cache/paged.py applies its decisions to the device pools. Sequences
that share a prefix point at the same pages (`fork`: each page shared once more); the first write into a
shared, partly filled page copies it first (copy-on-write: `append` returns the copies). Asking for more pages
than are free raises PoolExhausted and changes nothing. The serving engine's space manager is
dantinox/engine/kv_manager.py (page tables per request, a prefix cache by page name, no fill counts) over the
same allocator.

One vocabulary for both levels: the allocator takes a page off the free list (`take`), shares one (`share`:
one more holder) and releases one (`release`: one holder fewer, free at none); a space manager adds a
sequence, forks it, appends tokens to it and releases it (each of its pages released once).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

# re-exported: paged.py, tests
from dantinox.cache.page_pool import PagePool, PoolExhausted, pages_for  # noqa: F401
from dantinox.checks import positive_int


class PageManager:
    """Page tables and filled slots per page of sequences in one pool, over its allocator (`PagePool`).

    Pages are handed out from the front of the allocator's free list and returned to its back. A page shared
    by several sequences (reference count > 1) is read-only: the first `append` into a shared, partly filled
    last page moves the writer onto a fresh copy.
    """

    def __init__(self, num_pages: int, page_size: int):
        self.pool = PagePool(num_pages)  # the allocator: its free list and reference counts
        self.page_size = positive_int("page_size", page_size)
        self.num_pages = self.pool.num_pages
        # plain lists, not arrays: a scheduler touches single entries every step, where numpy is slow
        self.refs = self.pool.refs  # sequences pointing at each page: the allocator's own counts
        self.fill = [0] * self.num_pages  # token slots written in each page
        self._held = 0  # pages with refs > 0
        self._filled = 0  # sum of fill over held pages
        self.tables: dict[Hashable, list[int]] = {}
        self.lengths: dict[Hashable, int] = {}

    # Queries.
    @property
    def num_free(self) -> int:
        return self.pool.num_free

    @property
    def num_used(self) -> int:
        """Physical pages held by at least one sequence."""
        return self._held

    @property
    def used_pages(self) -> list[int]:
        return [b for b, r in enumerate(self.refs) if r]

    def filled_slots(self) -> int:
        """Token slots written in held pages, a shared page counted once (what the pool physically stores)."""
        return self._filled

    def shared_pages(self) -> set[int]:
        return {b for b, r in enumerate(self.refs) if r > 1}

    def _known(self, seq: Hashable) -> None:
        if seq not in self.tables:
            raise ValueError(f"seq: no sequence {seq!r} in the pool")

    def pages_needed(self, seq: Hashable | None, n_tokens: int) -> int:
        """Free pages that adding (seq None or new) or appending `n_tokens` tokens would take,
        copies included."""
        if seq is None or seq not in self.tables:
            return pages_for(n_tokens, self.page_size)
        length, table = self.lengths[seq], self.tables[seq]
        cow = bool(table) and length % self.page_size and self.refs[table[-1]] > 1
        return pages_for(length + n_tokens, self.page_size) - len(table) + int(cow)

    # Changes.
    def _check_free(self, seq: Hashable, n: int) -> None:
        if n > self.pool.num_free:
            raise PoolExhausted(f"pool: sequence {seq!r} needs {n} more page(s) of {self.page_size} tokens, "
                                f"{self.pool.num_free} of {self.num_pages} are free")

    def _take(self, seq: Hashable, n: int) -> list[int]:
        self._check_free(seq, n)
        taken = [self.pool.take() for _ in range(n)]  # a free page holds nothing: its fill is already 0
        self._held += n
        return taken

    def add(self, seq: Hashable, n_tokens: int) -> list[int]:
        """A new sequence holding `n_tokens` (its prompt); returns its page table."""
        if seq in self.tables:
            raise ValueError(f"seq: sequence {seq!r} is already in the pool")
        positive_int("n_tokens", n_tokens, minimum=0)
        self.tables[seq], self.lengths[seq] = self._take(seq, pages_for(n_tokens, self.page_size)), 0
        self._fill(seq, n_tokens)
        return list(self.tables[seq])

    def _fill(self, seq: Hashable, n_tokens: int) -> None:
        length, table, ps = self.lengths[seq], self.tables[seq], self.page_size
        new_length = length + n_tokens
        for m in range(length // ps, pages_for(new_length, ps)):  # only the pages the new tokens touch
            now = min(ps, new_length - m * ps)
            self._filled += now - self.fill[table[m]]
            self.fill[table[m]] = now
        self.lengths[seq] = new_length

    def fork(self, parent: Hashable, child: Hashable) -> list[int]:
        """A new sequence `child` sharing every page of `parent` (reference counts + 1); nothing is copied."""
        self._known(parent)
        if child in self.tables:
            raise ValueError(f"seq: sequence {child!r} is already in the pool")
        self.tables[child], self.lengths[child] = list(self.tables[parent]), self.lengths[parent]
        for page in self.tables[child]:
            self.pool.share(page)
        return list(self.tables[child])

    def append(self, seq: Hashable, n_tokens: int = 1) -> list[tuple[int, int]]:
        """Make room for `n_tokens` more tokens of `seq`; returns the (src, dst) page copies to apply first.

        Raises PoolExhausted, changing nothing, when the free list is too short.
        """
        table, length = self.tables.get(seq), self.lengths.get(seq, 0)
        if n_tokens == 1 and table is not None:  # the decode step, a scheduler's hot path
            if length % self.page_size and self.refs[table[-1]] == 1:  # room in a private last page
                self.fill[table[-1]] += 1
                self._filled, self.lengths[seq] = self._filled + 1, length + 1
                return []
            if not length % self.page_size and self.pool.free:  # last page full (or none): a fresh one
                page = self.pool.take()
                self.fill[page] = 1
                self._held, self._filled, self.lengths[seq] = self._held + 1, self._filled + 1, length + 1
                table.append(page)
                return []
        self._known(seq)
        if type(n_tokens) is not int or n_tokens < 0:  # the hot path of a scheduler: check cheaply first
            positive_int("n_tokens", n_tokens, minimum=0)
        self._check_free(seq, self.pages_needed(seq, n_tokens))  # all or nothing
        table, copies = self.tables[seq], []
        if self.lengths[seq] % self.page_size and self.refs[table[-1]] > 1:  # shared and partly filled: copy
            (fresh,) = self._take(seq, 1)
            old = table[-1]
            self.pool.release(old)  # still held by the others: stays counted
            self.fill[fresh] = self.fill[old]
            self._filled += self.fill[old]
            table[-1] = fresh
            copies.append((old, fresh))
        table += self._take(seq, pages_for(self.lengths[seq] + n_tokens, self.page_size) - len(table))
        self._fill(seq, n_tokens)
        return copies

    def release(self, seq: Hashable) -> int:
        """Drop a sequence; pages nobody else holds go back to the free list. Returns how many were freed."""
        self._known(seq)
        freed = 0
        for page in self.tables.pop(seq):
            self.pool.release(page)
            if self.refs[page] == 0:
                self._filled -= self.fill[page]
                self.fill[page] = 0
                freed += 1
        self._held -= freed
        del self.lengths[seq]
        return freed

    def table_array(self, seqs: Sequence[Hashable], width: int) -> np.ndarray:
        """[len(seqs), width] int32 page tables; entries past a sequence's pages point at page 0 (masked)."""
        out = np.zeros((len(seqs), width), np.int32)
        for row, seq in enumerate(seqs):
            self._known(seq)
            table = self.tables[seq]
            if len(table) > width:
                raise ValueError(f"width: sequence {seq!r} holds {len(table)} pages, more than width={width}")
            out[row, :len(table)] = table
        return out
