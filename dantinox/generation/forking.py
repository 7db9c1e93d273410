"""n samples of one prompt that store it once: prefill once, fork the pages,
copy a shared page on first write.

The paged pool and its copies are dantinox/cache/paged.py's; the decode loop is generate.py's, driven with a
pager that grows every sample's pages (`_ForkPager`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from flax import nnx

from dantinox.architectures.config import ModelConfig
from dantinox.cache.container import KVCache
from dantinox.cache.page_manager import PageManager, pages_for
from dantinox.cache.paged import copy_pages, init_pool, pool_bytes
from dantinox.checks import positive_int
from dantinox.generation.generate import advance, bucket_for, check_request, decode_program, prefill_jit


class SampleRun(NamedTuple):
    """What `sample_n` produced and what its pool held at the end (bytes measured from the pool's arrays)."""

    tokens: np.ndarray  # [n, T + max_new_tokens]
    caches: KVCache  # the paged cache after decoding: the pools, the n samples' page table and lengths
    manager: PageManager  # page tables, reference counts and fill after decoding
    copies: list[tuple[int, int]]  # copy-on-write copies (src, dst) made at the first decode write
    page_bytes: int  # bytes of one page across all layers (keys and values)
    used_bytes: int  # bytes of the pages held by the n samples
    unshared_bytes: int  # bytes the same n samples need when each stores its own prompt (pages, same size)


class _ForkPager:
    """The pager of generate's decode loop for n samples of one prefilled prompt (their pages shared)."""

    def __init__(self, cfg: ModelConfig, manager: PageManager, n: int, end: int):
        self.cfg, self.manager, self.seqs, self.end = cfg, manager, list(range(n)), end

    def grow(self, caches: KVCache, bucket: int) -> KVCache:
        for seq in self.seqs:
            caches = copy_pages(self.cfg, caches, self.manager.append(seq, max(0, min(bucket, self.end)
                                                                      - self.manager.lengths[seq])))
        table = self.manager.table_array(self.seqs, pages_for(bucket, self.manager.page_size))
        return caches._replace(page_table=jnp.asarray(table, jnp.int32))


def sample_n(model, prompt_ids: Any, n: int, max_new_tokens: int, page_size: int = 16,
             temperature: float = 1.0, top_k: int | None = None, seed: int = 0) -> SampleRun:
    """n continuations of one prompt [1, T] that store the prompt once: prefill once, fork,
    copy on first write."""
    cfg = model.cfg.with_cache(cache_layout="paged", page_size=positive_int("page_size", page_size))
    prompt, lengths, ends, _ = check_request(cfg, prompt_ids, max_new_tokens, temperature, top_k)
    n, ps = positive_int("n", n), cfg.page_size
    if prompt.shape[0] != 1:
        raise ValueError("prompt_ids: sample_n continues one prompt, expected shape [1, T], got "
                         f"{prompt.shape}")
    T, end = prompt.shape[1], int(ends[0])
    manager = PageManager(pages_for(T, ps) + n * pages_for(end, ps), ps)
    manager.add(0, T)
    graphdef, params = nnx.split(model)  # the model as it is: the paged layout comes with the cache
    table = manager.table_array([0], pages_for(bucket_for(cfg.max_context, T), ps))
    caches = init_pool(cfg, manager.num_pages, table)
    state = prefill_jit(graphdef, params, prompt, jnp.asarray(lengths, jnp.int32),
                        jnp.asarray(ends, jnp.int32), seed, caches)
    for seq in range(1, n):
        manager.fork(0, seq)
    copies = []
    # the first write into a shared partly filled page copies it; the last holder writes in place
    for seq in range(n):
        new = manager.append(seq, 1) if end > T else []
        copies += new
        state = state._replace(caches=copy_pages(cfg, state.caches, new))
    rows = jnp.zeros((n,), jnp.int32)
    state = state._replace(tokens=state.tokens[rows], logits=state.logits[rows], index=state.index[rows],
                           end=state.end[rows],
                           caches=state.caches._replace(lengths=state.caches.lengths[rows]))
    temp = jnp.float32(temperature) if temperature > 0 else None
    state = advance(cfg, decode_program(n, cfg=cfg, slots=end), graphdef, params, state, end, temp, top_k,
                    True, _ForkPager(cfg, manager, n, end))
    page_bytes = pool_bytes(cfg, 1, ps)
    return SampleRun(np.asarray(state.tokens[:, :end]), state.caches, manager, copies, page_bytes,
                     manager.num_used * page_bytes, n * pages_for(end, ps) * page_bytes)

