"""The host side of the paged KV cache: free list, reference counts, block tables and fill counts.

`BlockManager` decides which physical block holds which tokens of which sequence; dantinox/paged.py applies
its decisions to the device pools. Sequences that share a prefix point at the same blocks (`fork`); the
first write into a shared, partly filled block copies it first (copy-on-write: `append` returns the copies).
Asking for more blocks than are free raises PoolExhausted and changes nothing.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Sequence

import numpy as np

from dantinox.checks import positive_int


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed to hold `tokens` slots: a partly filled last block is a whole block."""
    return -(-tokens // block_size)


class PoolExhausted(ValueError):
    """The pool has fewer free blocks than a request needs (a scheduler preempts; a plain call fails)."""


class BlockManager:
    """Host bookkeeping of one block pool: free list, reference counts, block tables, filled slots per block.

    Blocks are handed out from the front of the free list and returned to its back. A block shared by
    several sequences (reference count > 1) is read-only: the first `append` into a shared, partly filled
    last block moves the writer onto a fresh copy.
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = positive_int("num_blocks", num_blocks)
        self.block_size = positive_int("block_size", block_size)
        self.free: collections.deque[int] = collections.deque(range(self.num_blocks))
        # plain lists, not arrays: a scheduler touches single entries every step, where numpy is slow
        self.refs = [0] * self.num_blocks  # sequences pointing at each block
        self.fill = [0] * self.num_blocks  # token slots written in each block
        self._held = 0  # blocks with refs > 0
        self._filled = 0  # sum of fill over held blocks
        self.tables: dict[Hashable, list[int]] = {}
        self.lengths: dict[Hashable, int] = {}

    # Queries.
    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        """Physical blocks held by at least one sequence."""
        return self._held

    @property
    def used_blocks(self) -> list[int]:
        return [b for b, r in enumerate(self.refs) if r]

    def filled_slots(self) -> int:
        """Token slots written in held blocks, a shared block counted once (what the pool physically stores)."""
        return self._filled

    def shared_blocks(self) -> set[int]:
        return {b for b, r in enumerate(self.refs) if r > 1}

    def _known(self, seq: Hashable) -> None:
        if seq not in self.tables:
            raise ValueError(f"seq: no sequence {seq!r} in the pool")

    def blocks_needed(self, seq: Hashable | None, n_tokens: int) -> int:
        """Free blocks that adding (seq None or new) or appending `n_tokens` tokens would take, copies included."""
        if seq is None or seq not in self.tables:
            return blocks_for(n_tokens, self.block_size)
        length, table = self.lengths[seq], self.tables[seq]
        cow = bool(table) and length % self.block_size and self.refs[table[-1]] > 1
        return blocks_for(length + n_tokens, self.block_size) - len(table) + int(cow)

    # Changes.
    def _check_free(self, seq: Hashable, n: int) -> None:
        if n > len(self.free):
            raise PoolExhausted(f"pool: sequence {seq!r} needs {n} more block(s) of {self.block_size} tokens, "
                                f"{len(self.free)} of {self.num_blocks} are free")

    def _take(self, seq: Hashable, n: int) -> list[int]:
        self._check_free(seq, n)
        taken = [self.free.popleft() for _ in range(n)]
        for block in taken:  # a free block holds nothing: its fill is already 0
            self.refs[block] = 1
        self._held += n
        return taken

    def add(self, seq: Hashable, n_tokens: int) -> list[int]:
        """A new sequence holding `n_tokens` (its prompt); returns its block table."""
        if seq in self.tables:
            raise ValueError(f"seq: sequence {seq!r} is already in the pool")
        positive_int("n_tokens", n_tokens, minimum=0)
        self.tables[seq], self.lengths[seq] = self._take(seq, blocks_for(n_tokens, self.block_size)), 0
        self._fill(seq, n_tokens)
        return list(self.tables[seq])

    def _fill(self, seq: Hashable, n_tokens: int) -> None:
        length, table, bs = self.lengths[seq], self.tables[seq], self.block_size
        new_length = length + n_tokens
        for m in range(length // bs, blocks_for(new_length, bs)):  # only the blocks the new tokens touch
            now = min(bs, new_length - m * bs)
            self._filled += now - self.fill[table[m]]
            self.fill[table[m]] = now
        self.lengths[seq] = new_length

    def fork(self, parent: Hashable, child: Hashable) -> list[int]:
        """A new sequence `child` sharing every block of `parent` (reference counts + 1); nothing is copied."""
        self._known(parent)
        if child in self.tables:
            raise ValueError(f"seq: sequence {child!r} is already in the pool")
        self.tables[child], self.lengths[child] = list(self.tables[parent]), self.lengths[parent]
        for block in self.tables[child]:
            self.refs[block] += 1
        return list(self.tables[child])

    def append(self, seq: Hashable, n_tokens: int = 1) -> list[tuple[int, int]]:
        """Make room for `n_tokens` more tokens of `seq`; returns the (src, dst) block copies to apply first.

        Raises PoolExhausted, changing nothing, when the free list is too short.
        """
        table, length = self.tables.get(seq), self.lengths.get(seq, 0)
        if n_tokens == 1 and table is not None:  # the decode step, a scheduler's hot path
            if length % self.block_size and self.refs[table[-1]] == 1:  # room in a private last block
                self.fill[table[-1]] += 1
                self._filled, self.lengths[seq] = self._filled + 1, length + 1
                return []
            if not length % self.block_size and self.free:  # last block full (or none): a fresh one
                block = self.free.popleft()
                self.refs[block], self.fill[block] = 1, 1
                self._held, self._filled, self.lengths[seq] = self._held + 1, self._filled + 1, length + 1
                table.append(block)
                return []
        self._known(seq)
        if type(n_tokens) is not int or n_tokens < 0:  # the hot path of a scheduler: check cheaply first
            positive_int("n_tokens", n_tokens, minimum=0)
        self._check_free(seq, self.blocks_needed(seq, n_tokens))  # all or nothing
        table, copies = self.tables[seq], []
        if self.lengths[seq] % self.block_size and self.refs[table[-1]] > 1:  # shared and partly filled: copy
            (fresh,) = self._take(seq, 1)
            old = table[-1]
            self.refs[old] -= 1  # still held by the others: stays counted
            self.fill[fresh] = self.fill[old]
            self._filled += self.fill[old]
            table[-1] = fresh
            copies.append((old, fresh))
        table += self._take(seq, blocks_for(self.lengths[seq] + n_tokens, self.block_size) - len(table))
        self._fill(seq, n_tokens)
        return copies

    def release(self, seq: Hashable) -> int:
        """Drop a sequence; blocks nobody else holds go back to the free list. Returns how many were freed."""
        self._known(seq)
        freed = 0
        for block in self.tables.pop(seq):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)
                self._filled -= self.fill[block]
                self.fill[block] = 0
                freed += 1
        self._held -= freed
        del self.lengths[seq]
        return freed

    def table_array(self, seqs: Sequence[Hashable], width: int) -> np.ndarray:
        """[len(seqs), width] int32 block tables; entries past a sequence's blocks point at block 0 (masked)."""
        out = np.zeros((len(seqs), width), np.int32)
        for row, seq in enumerate(seqs):
            self._known(seq)
            table = self.tables[seq]
            if len(table) > width:
                raise ValueError(f"width: sequence {seq!r} holds {len(table)} blocks, more than width={width}")
            out[row, :len(table)] = table
        return out
