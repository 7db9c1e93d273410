"""The serving engine's allocator: one pool of KV-cache blocks, reference counts, and names of cached blocks.

No JAX here: the engine (dantinox/engine.py) owns the arrays; this keeps the bookkeeping of which block holds
what. The free list is in LRU order, so a freed block that still holds a cached full block is reused last
(vLLM's BlockAllocator and automatic prefix caching, docs `design/prefix_caching`; the simulator's
BlockManager in dantinox/paged.py counts blocks without contents).
"""

from __future__ import annotations

import collections
import hashlib

import numpy as np

from dantinox.checks import positive_int


class PoolError(RuntimeError):
    """The allocator's bookkeeping broke an invariant (a double free, a lost block): a bug, never user error."""


class BlockPool:
    """The allocator of one pool of blocks: free list in LRU order, reference counts, hashes of cached blocks.

    A block is free when no request holds it (reference count 0). A free block may still hold a cached full
    block (it keeps its hash): `share` takes it back out of the free list; `take` hands out the least recently
    freed block and forgets whatever it cached.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = positive_int("num_blocks", num_blocks)
        self.refs = [0] * self.num_blocks
        self.free: collections.OrderedDict[int, None] = collections.OrderedDict.fromkeys(range(self.num_blocks))
        self.hash_of: list[bytes | None] = [None] * self.num_blocks
        self.by_hash: dict[bytes, int] = {}
        self.evicted = 0  # cached blocks overwritten to make room

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_cached_free(self) -> int:
        """Free blocks that still hold a cached full block."""
        return sum(self.hash_of[b] is not None for b in self.free)

    def take(self) -> int:
        if not self.free:
            raise PoolError("pool: take() with no free block (the scheduler checks num_free first)")
        block, _ = self.free.popitem(last=False)
        if self.hash_of[block] is not None:  # its cached content is overwritten from now on
            del self.by_hash[self.hash_of[block]]
            self.hash_of[block] = None
            self.evicted += 1
        self.refs[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more holder of a cached block (a prefix hit); a free one leaves the free list."""
        if self.refs[block] == 0:
            del self.free[block]
        self.refs[block] += 1

    def release(self, block: int) -> None:
        if self.refs[block] <= 0:
            raise PoolError(f"pool: double free of block {block}")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free[block] = None  # most recently freed: evicted last

    def lookup(self, digest: bytes) -> int | None:
        return self.by_hash.get(digest)

    def register(self, block: int, digest: bytes) -> None:
        """Name a full block by its chained hash (a block computed twice keeps the first name)."""
        if self.hash_of[block] is None and digest not in self.by_hash:
            self.hash_of[block], self.by_hash[digest] = digest, block

    def check(self, tables: list[list[int]]) -> None:
        """Raise PoolError unless every reference is a table entry and every block is free xor held."""
        held = collections.Counter(b for table in tables for b in table)
        for block in range(self.num_blocks):
            if self.refs[block] != held[block]:
                raise PoolError(f"pool: block {block} has {self.refs[block]} reference(s), {held[block]} holder(s)")
            if (self.refs[block] == 0) != (block in self.free):
                raise PoolError(f"pool: block {block} free={block in self.free} with {self.refs[block]} reference(s)")
        named = {d: b for b, d in enumerate(self.hash_of) if d is not None}
        if named != self.by_hash:
            raise PoolError("pool: the hash map and the blocks' hashes disagree")


def block_digest(parent: bytes, tokens: list[int]) -> bytes:
    """The name of a full block: SHA-256 over its parent's name and its token ids."""
    return hashlib.sha256(parent + np.asarray(tokens, np.int64).tobytes()).digest()
