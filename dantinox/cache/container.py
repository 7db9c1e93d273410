"""The KV cache as a value: a container that owns its fill, with one layout per layer.

`KVCache` is a pytree passed into the model and returned updated; nothing is stored on the model. It holds

    layers       one payload value per layer (the arrays: keys and values, or MLA latents, with scales)
    lengths      [B] int32, tokens each sequence holds, shared by every layer
    page_table  [B, M] int32 for a paged cache (logical page m of sequence b is physical page
                 table[b, m] of every layer's pool), held once; None for a contiguous cache
    config       the CacheConfig it was made with (static): the model reads its layers' layouts from it,
                 so one model decodes with a contiguous, paged, ring, quantized or engine cache

`model.forward` writes at `lengths` and advances it, and attention masks with it, so no caller passes a
length beside the cache and nothing re-reads it from the data. Each layer's layout (layout.py) comes from
the registry (registry.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dantinox.architectures.config import CacheConfig, ModelConfig
from dantinox.cache.page_manager import pages_for
from dantinox.cache.registry import layouts
from dantinox.checks import positive_int


class KVCache(NamedTuple):
    """The whole cache: per-layer payloads, the fill of each sequence, and (paged) the page table."""

    layers: tuple  # one payload per layer
    lengths: jax.Array  # [B] int32, tokens held by each sequence
    page_table: jax.Array | None = None  # [B, M] int32, paged layers only
    config: CacheConfig | None = None  # what it was made with (static); None: the model's own cfg.cache

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of the stored keys and values (or latents) and their scales: what the cache formulas count.

        The bookkeeping (`lengths`, the page table) is B + B·M int32s and is not part of the formulas.
        """
        return tree_nbytes(self.layers)


def init_cache(cfg: ModelConfig, batch_size: int, length: int | None = None) -> KVCache:
    """Pre-allocate an empty cache for `batch_size` sequences of up to `length` tokens (default max_context).

    Arrays are in `cfg.cache_dtype`. A paged config gets a private pool: sequence b owns
    pages b·M .. b·M + M - 1.
    """
    batch_size = positive_int("batch_size", batch_size)
    length = cfg.max_context if length is None else positive_int("length", length)
    if length > cfg.max_context:
        raise ValueError(f"length: a cache holds at most max_context={cfg.max_context} tokens, got {length}")
    if cfg.cache_layout != "paged":
        return empty_cache(cfg, batch_size, length)
    M = pages_for(length, cfg.page_size)
    return empty_cache(cfg, batch_size, length,
                       np.arange(batch_size * M, dtype=np.int32).reshape(batch_size, M),
                       batch_size * M)


def empty_cache(cfg: ModelConfig, batch: int, length: int, table: Any = None, num_pages: int | None = None):
    """An empty KVCache: contiguous layers of `length` slots (rings: min(length, W)); paged layers get pools
    of `num_pages` pages (default: every page `table` names) read through `table`."""
    layers = []
    for layout in layouts(cfg):
        addr = layout.addressing
        if addr.pooled:
            n = int(np.max(np.asarray(table))) + 1 if num_pages is None else num_pages
            layers.append(layout.zeros(cfg, 1, n * addr.page_size))  # one row of n pages
        else:
            layers.append(layout.zeros(cfg, batch, addr.slots(length)))
    table = None if table is None else jnp.asarray(table, jnp.int32)
    return KVCache(tuple(layers), jnp.zeros((batch,), jnp.int32), table, cfg.cache)


def cache_shapes(cfg: ModelConfig, batch_size: int, length: int | None = None) -> KVCache:
    """The same pytree as `init_cache`, as ShapeDtypeStructs: sizes without allocating a byte."""
    return jax.eval_shape(lambda: init_cache(cfg, batch_size, length))


def tree_nbytes(tree) -> int:
    """Bytes held by every array (or ShapeDtypeStruct) leaf of a pytree, measured from shapes and dtypes.

    A KVCache inside counts its stored layers (`KVCache.nbytes`): its lengths and page table are bookkeeping.
    """
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, KVCache))
    return int(sum(x.nbytes if isinstance(x, KVCache) else int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
                   for x in leaves))


def filled_slots(cache: KVCache) -> np.ndarray:
    """[B] tokens each sequence of the cache holds: its `lengths`, read from the container (not the data)."""
    return np.asarray(cache.lengths)


def cache_length(cfg: ModelConfig, cache: KVCache) -> int:
    """S: how many positions the cache has room for (its key bucket): the slots of its linear layers and of
    rings not yet at their full size (a full ring takes any), or table width x page."""
    if cache.page_table is not None:
        return cache.page_table.shape[1] * cfg.page_size
    growing = [layer.slots for layer, lay in zip(cache.layers, layouts(cfg), strict=True)
               if not lay.addressing.bounded or layer.slots < lay.addressing.slots(cfg.max_context)]
    return min(growing) if growing else cfg.max_context


def resize_layers(layers: tuple, cfg: ModelConfig, length: int, at_end: bool = False) -> tuple:
    """The same per-layer arrays with `length` slots, cut or zero-padded at the end
    (at_end=False) or the start.

    A ring layer gets min(length, W) slots, as init_cache gives it.
    """
    def fit(a: jax.Array, axis: int, n: int) -> jax.Array:
        old = a.shape[axis]
        if n <= old:
            return jax.lax.slice_in_dim(a, old - n if at_end else 0, old if at_end else n, axis=axis)
        widths = [(0, 0)] * a.ndim
        widths[axis] = (n - old, 0) if at_end else (0, n - old)
        return jnp.pad(a, widths)

    def fit_layer(layer: Any, n: int) -> Any:
        return layer.fit_slots(cfg, n, fit)  # KIVI's fields hold different slot counts: its payload says how

    return tuple(fit_layer(layer, lay.addressing.slots(length))
                 for layer, lay in zip(layers, layouts(cfg), strict=True))


def grow_cache(cache: KVCache, cfg: ModelConfig, length: int) -> KVCache:
    """The same cache with room for `length` positions per contiguous layer: written slots kept,
    new ones zero."""
    return cache._replace(layers=resize_layers(cache.layers, cfg, length))


def keep_slots(layers: tuple, live_S: jax.Array) -> tuple:
    """Zero every slot whose entry of the bool mask `live_S` [S] is False."""
    def mask(a: jax.Array, axis: int) -> jax.Array:
        return jnp.where(live_S.reshape((-1,) + (1,) * (a.ndim - axis - 1)), a, jnp.zeros((), a.dtype))

    return tuple(layer.map_slots(mask) for layer in layers)


def add_caches(a: tuple, b: tuple) -> tuple:
    """Slot-wise sum of two sets of layers of one length: joins halves whose unused slots are zero."""
    return jax.tree_util.tree_map(jnp.add, a, b)
