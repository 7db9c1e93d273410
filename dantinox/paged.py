"""Paged KV cache: fixed-size blocks in a shared pool, a block table per sequence (PagedAttention, arXiv:2309.06180).

Device side, two layouts on dantinox/cache.py's protocol. Each layer holds a pool of `num_blocks` blocks
of `block_size` token slots, `[num_blocks, K, block_size, H]` for keys and values (PagedCache: MHA, GQA,
MQA) or `[num_blocks, block_size, C + R]` for MLA latents (PagedLatentCache), plus the block table
`[B, M]`: logical block m of sequence b lives in physical block table[b, m]. `write` scatters new tokens
through the table, `read` gathers each sequence's blocks back into slot order, so attention is unchanged.

Host side, `BlockManager` (dantinox/blocks.py) owns the free list, reference counts, block tables and fill
counts; the copy-on-write copies its `append` returns are applied here by `copy_blocks`. Asking for more
blocks than are free raises PoolExhausted; nothing is ever silently overwritten.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dantinox.blocks import BlockManager, PoolExhausted, blocks_for  # noqa: F401  (the allocator; re-exported)
from dantinox.cache import tree_nbytes
from dantinox.checks import check_ids, positive_int
from dantinox.config import ModelConfig


def _slots_of(index: jax.Array | int, T: int, table_BM: jax.Array, block_size: int):
    """Physical block and offset of positions index .. index + T - 1 of every sequence: ([B, T], [T])."""
    pos_T = index + jnp.arange(T)
    return table_BM[:, pos_T // block_size], pos_T % block_size


class PagedCache(NamedTuple):
    """Per-head keys and values of one layer in a block pool, read through the block table."""

    k: jax.Array  # [num_blocks, K, block_size, H], keys after RoPE
    v: jax.Array  # [num_blocks, K, block_size, H]
    block_table: jax.Array  # [B, M] int32, physical block of each logical block

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, length: int, block_size: int = 16) -> PagedCache:
        """A private pool for `batch` sequences of `length` slots; sequence b owns blocks b·M .. b·M + M - 1."""
        M = blocks_for(length, block_size)
        shape = (batch * M, cfg.n_kv_heads, block_size, cfg.head_size)
        table = jnp.arange(batch * M, dtype=jnp.int32).reshape(batch, M)
        return cls(jnp.zeros(shape, cfg.cache_jnp_dtype), jnp.zeros(shape, cfg.cache_jnp_dtype), table)

    def write(self, k_BKTH: jax.Array, v_BKTH: jax.Array, index: jax.Array | int) -> PagedCache:
        blk_BT, off_T = _slots_of(index, k_BKTH.shape[2], self.block_table, self.k.shape[2])
        # the two index arrays sit apart, so the indexed shape is [B, T, K, H]
        k = self.k.at[blk_BT, :, off_T].set(k_BKTH.transpose(0, 2, 1, 3).astype(self.k.dtype))
        v = self.v.at[blk_BT, :, off_T].set(v_BKTH.transpose(0, 2, 1, 3).astype(self.v.dtype))
        return PagedCache(k, v, self.block_table)

    def read(self) -> tuple[jax.Array, jax.Array]:
        """[B, K, M·block_size, H] keys and values in slot order; attention masks slots past the filled length."""
        def gather(pool):
            B, M = self.block_table.shape
            blocks = pool[self.block_table]  # [B, M, K, bs, H]
            return blocks.transpose(0, 2, 1, 3, 4).reshape(B, pool.shape[1], M * pool.shape[2], pool.shape[3])
        return gather(self.k), gather(self.v)

    def pools(self) -> tuple[jax.Array, ...]:
        return self.k, self.v


class PagedLatentCache(NamedTuple):
    """MLA latents (c_KV and the RoPE key) of one layer in a block pool, read through the block table."""

    ckv: jax.Array  # [num_blocks, block_size, C + R]
    block_table: jax.Array  # [B, M] int32

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, length: int, block_size: int = 16) -> PagedLatentCache:
        M = blocks_for(length, block_size)
        shape = (batch * M, block_size, cfg.kv_latent_dim + cfg.rope_head_dim)
        return cls(jnp.zeros(shape, cfg.cache_jnp_dtype), jnp.arange(batch * M, dtype=jnp.int32).reshape(batch, M))

    def write(self, ckv_BTX: jax.Array, index: jax.Array | int) -> PagedLatentCache:
        blk_BT, off_T = _slots_of(index, ckv_BTX.shape[1], self.block_table, self.ckv.shape[1])
        return PagedLatentCache(self.ckv.at[blk_BT, off_T].set(ckv_BTX.astype(self.ckv.dtype)), self.block_table)

    def read(self) -> tuple[jax.Array]:
        B, M = self.block_table.shape
        return (self.ckv[self.block_table].reshape(B, M * self.ckv.shape[1], self.ckv.shape[2]),)

    def pools(self) -> tuple[jax.Array, ...]:
        return (self.ckv,)


def paged_layout(cfg: ModelConfig) -> type:
    """The paged layout of a config, or a one-line error for layers that cannot be paged here."""
    if cfg.sliding_window is not None or cfg.quantized_cache:
        raise ValueError(f"cache_layout: 'paged' stores float keys and values of global layers; this config has "
                         f"sliding_window={cfg.sliding_window!r}, cache_dtype={cfg.cache_dtype!r}")
    return PagedLatentCache if cfg.attention == "mla" else PagedCache


def init_pool(cfg: ModelConfig, num_blocks: int, block_size: int, table_BM: Any) -> tuple:
    """A zeroed paged cache: per layer a pool of `num_blocks` blocks, every layer reading through `table_BM`."""
    num_blocks, block_size = positive_int("num_blocks", num_blocks), positive_int("block_size", block_size)
    layout = paged_layout(cfg)
    # num_blocks sequences of one block each is exactly a pool; one per layer, as decoding donates them
    return with_table(tuple(layout.zeros(cfg, num_blocks, block_size, block_size) for _ in range(cfg.n_layers)),
                      table_BM)


def pool_bytes(cfg: ModelConfig, num_blocks: int, block_size: int) -> int:
    """Bytes of the key/value (or latent) pools of every layer, measured from their shapes; block tables excluded."""
    shapes = jax.eval_shape(lambda: init_pool(cfg, num_blocks, block_size, np.zeros((1, 1), np.int32)))
    return tree_nbytes([layer.pools() for layer in shapes])


def with_table(caches: tuple, table_BM: Any) -> tuple:
    """The same pools, read and written through another block table (one copy per layer: decoding donates them)."""
    return tuple(layer._replace(block_table=jnp.array(table_BM, jnp.int32)) for layer in caches)


@jax.jit
def _copy(caches: tuple, src: jax.Array, dst: jax.Array) -> tuple:
    return tuple(type(layer)(*(p.at[dst].set(p[src]) for p in layer.pools()), layer.block_table) for layer in caches)


def copy_blocks(caches: tuple, copies: Sequence[tuple[int, int]]) -> tuple:
    """Apply copy-on-write copies (src, dst) from BlockManager.append to every layer's pools."""
    if not copies:
        return caches
    src, dst = (jnp.asarray(c, jnp.int32) for c in zip(*copies, strict=True))
    return _copy(caches, src, dst)


def _prefill(graphdef, params, prompt_BT: jax.Array, caches: tuple, end, seed):
    from dantinox.generate import DecodeState

    model = nnx.merge(graphdef, params)
    B, T = prompt_BT.shape
    tokens = jnp.zeros((B, model.cfg.max_context), jnp.int32).at[:, :T].set(prompt_BT)
    logits_BTV, caches = model.forward(prompt_BT, caches, 0)
    return DecodeState(tokens, caches, jnp.int32(T), jnp.asarray(end, jnp.int32), logits_BTV[:, -1],
                       jax.random.key(seed))


_prefill_jit = jax.jit(_prefill, static_argnums=(0,), donate_argnums=(3,))


def _decode_windows(model, graphdef, params, state, manager: BlockManager, seqs: list, end: int, temp, top_k):
    """Decode to `end` one key window at a time, taking each window's blocks from the pool just before it."""
    from dantinox.generate import decode_program, window_for

    index, bs = int(state.index), manager.block_size
    decode = decode_program(len(seqs), donate=True)
    while index < end:
        window = window_for(model.cfg.max_context, index + 1)  # the step at index i writes slot i
        for seq in seqs:
            copies = manager.append(seq, min(window, end) - manager.lengths[seq])
            state = state._replace(caches=copy_blocks(state.caches, copies))
        table = manager.table_array(seqs, blocks_for(window, bs))
        state = state._replace(caches=with_table(state.caches, table))
        state = decode(graphdef, params, state, temp, end, top_k=top_k, use_cache=True, window=window)
        index = min(end, window)
    return state


def paged_generate(model, prompt_ids: Any, end: int, temperature: float = 0.0, top_k: int | None = None,
                   seed: int = 0, block_size: int = 16) -> jax.Array:
    """What `dantinox.generate(..., cache_layout="paged")` runs (arguments already checked there).

    Each of the B sequences gets blocks from one pool sized for B · ceil(end / block_size) blocks, taken
    as its key window grows; decoding runs the same compiled step as the contiguous cache.
    """
    bs = positive_int("block_size", block_size)
    cfg = model.cfg
    prompt = check_ids(cfg.vocab_size, prompt_ids, "prompt_ids")
    B, T = prompt.shape
    manager = BlockManager(B * blocks_for(end, bs), bs)
    seqs = list(range(B))
    for seq in seqs:
        manager.add(seq, T)
    graphdef, params = nnx.split(model)
    caches = init_pool(cfg, manager.num_blocks, bs, manager.table_array(seqs, blocks_for(T, bs)))
    state = _prefill_jit(graphdef, params, prompt, caches, end, seed)
    temp = jnp.float32(temperature) if temperature > 0 else None
    return _decode_windows(model, graphdef, params, state, manager, seqs, end, temp, top_k).tokens[:, :end]


class SampleRun(NamedTuple):
    """What `sample_n` produced and what its pool held at the end (bytes measured from the pool's arrays)."""

    tokens: np.ndarray  # [n, T + max_new_tokens]
    caches: tuple  # the paged cache after decoding: per layer the pools and the n samples' block table
    manager: BlockManager  # block tables, reference counts and fill after decoding
    copies: list[tuple[int, int]]  # copy-on-write copies (src, dst) made at the first decode write
    block_bytes: int  # bytes of one block across all layers (keys and values)
    used_bytes: int  # bytes of the blocks held by the n samples
    unshared_bytes: int  # bytes the same n samples need when each stores its own prompt (blocks, same size)


def sample_n(model, prompt_ids: Any, n: int, max_new_tokens: int, block_size: int = 16, temperature: float = 1.0,
             top_k: int | None = None, seed: int = 0) -> SampleRun:
    """n continuations of one prompt [1, T] that store the prompt once: prefill once, fork, copy on first write."""
    from dantinox.generate import _check_request

    prompt, end = _check_request(model.cfg, prompt_ids, max_new_tokens, temperature, top_k)
    n, bs = positive_int("n", n), positive_int("block_size", block_size)
    if prompt.shape[0] != 1:
        raise ValueError(f"prompt_ids: sample_n continues one prompt, expected shape [1, T], got {prompt.shape}")
    T, cfg = prompt.shape[1], model.cfg
    manager = BlockManager(blocks_for(T, bs) + n * blocks_for(end, bs), bs)
    manager.add(0, T)
    graphdef, params = nnx.split(model)
    caches = init_pool(cfg, manager.num_blocks, bs, manager.table_array([0], blocks_for(T, bs)))
    state = _prefill_jit(graphdef, params, prompt, caches, end, seed)
    for seq in range(1, n):
        manager.fork(0, seq)
    copies = []
    for seq in range(n):  # the first write into a shared partly filled block copies it; the last holder writes in place
        new = manager.append(seq, 1) if end > T else []
        copies += new
        state = state._replace(caches=copy_blocks(state.caches, new))
    rows = jnp.zeros((n,), jnp.int32)
    state = state._replace(tokens=state.tokens[rows], logits=state.logits[rows])
    temp = jnp.float32(temperature) if temperature > 0 else None
    state = _decode_windows(model, graphdef, params, state, manager, list(range(n)), end, temp, top_k)
    block_bytes = pool_bytes(cfg, 1, bs)
    return SampleRun(np.asarray(state.tokens[:, :end]), state.caches, manager, copies, block_bytes,
                     manager.num_used * block_bytes, n * blocks_for(end, bs) * block_bytes)
