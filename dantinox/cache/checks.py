"""Checks on a cache a caller passes in: that it is a KVCache for this config, and that a write fits its fill.

Both run before any computation (dantinox.Transformer.__call__), so bad input gets one line, not a clamp.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from dantinox.architectures.config import ModelConfig
from dantinox.cache.container import KVCache, cache_length
from dantinox.cache.registry import layouts


def check_cache(cfg: ModelConfig, cache: Any, batch: int) -> None:
    """Raise ValueError unless `cache` is a KVCache for `cfg` that holds `batch` sequences."""
    if not isinstance(cache, KVCache):
        raise ValueError("kv_caches: expected a dantinox.KVCache from dantinox.init_cache, got "
                         f"{type(cache).__name__}")
    if len(cache.layers) != cfg.n_layers:
        raise ValueError(f"kv_caches: expected {cfg.n_layers} layers, got {len(cache.layers)}")
    if cache.lengths.shape != (batch,):
        raise ValueError(f"kv_caches: cache holds batch {cache.lengths.shape[0]} but ids have batch {batch}")
    if (cache.page_table is None) != (cfg.cache_layout != "paged"):
        raise ValueError(f"kv_caches: a page table goes with cache_layout='paged', the config has "
                         f"cache_layout={cfg.cache_layout!r}")
    for i, (got, lay) in enumerate(zip(cache.layers, layouts(cfg), strict=True)):
        if type(got) is not lay.payload:
            raise ValueError(f"kv_caches[{i}]: expected {lay.payload.__name__} for "
                             f"attention={cfg.attention!r}, got {type(got).__name__}")
        rows = got[0].shape[0] if lay.addressing.pooled else batch  # a pool's rows are pages
        want = jax.eval_shape(lambda lay=lay, got=got, rows=rows: lay.zeros(cfg, rows, got.slots))
        for name, g, w in zip(got._fields, got, want, strict=True):
            if (g is None) != (w is None):
                raise ValueError(f"kv_caches[{i}].{name}: expected {'no array' if w is None else 'an array'} "
                                 f"(cache_dtype={cfg.cache_dtype!r}), got {'none' if g is None else 'one'}")
            if g is None:
                continue
            if g.shape != w.shape:
                raise ValueError(f"kv_caches[{i}].{name}: expected shape {w.shape}, got {g.shape}")
            if g.dtype != w.dtype:
                raise ValueError(f"kv_caches[{i}].{name}: expected dtype {w.dtype} (cache_dtype="
                                 f"{cfg.cache_dtype!r}), got {g.dtype}")


def check_write(cfg: ModelConfig, cache: KVCache, cache_index: int | None, n_tokens: int) -> None:
    """Refuse a write the cache's fill does not allow: at a position other than `lengths`, or past its room.

    (XLA would silently clamp or drop an out-of-range write.)
    """
    lengths = np.asarray(cache.lengths)
    if cache_index is not None:
        if cache_index < 0:
            raise ValueError(f"cache_index: must be >= 0, got {cache_index}")
        if np.any(lengths != cache_index):
            held = int(lengths[0]) if np.all(lengths == lengths[0]) else lengths.tolist()
            raise ValueError(f"cache_index: the cache holds {held} token(s), so the next write goes at "
                             f"{held}; got {cache_index} (leave it out: the cache knows its fill)")
    room = cache_length(cfg, cache)
    need = int(lengths.max()) + n_tokens
    if need > room:
        raise ValueError(f"cache_index: writing {n_tokens} token(s) at position {int(lengths.max())} needs "
                         f"{need} slots, but the cache holds {room} (max_context={cfg.max_context})")
