"""The KV cache as a value: one protocol, one small type per layout, allocation and the write checks.

A cache is a tuple with one entry per layer, passed into the model and returned updated; nothing is
stored on the model. Every layout is a NamedTuple of arrays (so a pytree) that implements:

    zeros(cfg, batch, length) -> layout   allocate `length` empty (all-zero) slots
    write(*new, index) -> layout          the same layout with T new tokens stored at slots [index, index + T)
    read() -> tuple of arrays             what attention consumes, in compute-ready form
    SEQ_AXIS                              the slot axis of every field (for growing and counting slots)

Attention calls only `write` and `read`; Block, Transformer and the decoders never look inside. Adding a
layout (paged blocks, a ring buffer, int8 with scales) means adding one such type and naming it in
`layout_for`. Keys are cached after RoPE, so a cached key never needs re-rotating.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dantinox.checks import positive_int
from dantinox.config import ModelConfig
from dantinox.quant import QuantCache
from dantinox.ring import RingCache


class LayerCache(NamedTuple):
    """Static per-head layout (MHA, GQA, MQA): keys and values of K heads."""

    k: jax.Array  # [B, K, S, H], keys after RoPE
    v: jax.Array  # [B, K, S, H]

    SEQ_AXIS = 2

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, length: int) -> LayerCache:
        shape = (batch, cfg.n_kv_heads, length, cfg.head_size)
        return cls(jnp.zeros(shape, cfg.cache_jnp_dtype), jnp.zeros(shape, cfg.cache_jnp_dtype))

    def write(self, k_BKTH: jax.Array, v_BKTH: jax.Array, index: jax.Array | int) -> LayerCache:
        at = (0, 0, index, 0)
        return LayerCache(jax.lax.dynamic_update_slice(self.k, k_BKTH.astype(self.k.dtype), at),
                          jax.lax.dynamic_update_slice(self.v, v_BKTH.astype(self.v.dtype), at))

    def read(self) -> tuple[jax.Array, jax.Array]:
        return self.k, self.v


class LatentCache(NamedTuple):
    """MLA layout: the compressed KV latent and the decoupled RoPE key of each token, side by side."""

    ckv: jax.Array  # [B, S, C + R]

    SEQ_AXIS = 1

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, length: int) -> LatentCache:
        return cls(jnp.zeros((batch, length, cfg.kv_latent_dim + cfg.rope_head_dim), cfg.cache_jnp_dtype))

    def write(self, ckv_BTX: jax.Array, index: jax.Array | int) -> LatentCache:
        return LatentCache(jax.lax.dynamic_update_slice(self.ckv, ckv_BTX.astype(self.ckv.dtype), (0, index, 0)))

    def read(self) -> tuple[jax.Array]:
        return (self.ckv,)


KVCache = tuple  # one layout value per layer, e.g. tuple[LayerCache, ...]


def layout_for(cfg: ModelConfig, layer: int = 0) -> type:
    """The cache layout that layer `layer` of a config writes: latent, ring buffer (local layer), quantized or float."""
    if cfg.attention == "mla":
        return LatentCache
    if cfg.layer_windows[layer] is not None:
        return RingCache.of(cfg.layer_windows[layer])
    return QuantCache if cfg.quantized_cache else LayerCache


def init_cache(cfg: ModelConfig, batch_size: int, length: int | None = None) -> KVCache:
    """Pre-allocate a zeroed static cache for `batch_size` sequences of up to `length` tokens.

    `length` defaults to `cfg.max_context`. Arrays are in `cfg.cache_dtype`.
    """
    batch_size = positive_int("batch_size", batch_size)
    length = cfg.max_context if length is None else positive_int("length", length)
    if length > cfg.max_context:
        raise ValueError(f"length: a cache holds at most max_context={cfg.max_context} tokens, got {length}")
    return tuple(layout_for(cfg, i).zeros(cfg, batch_size, length) for i in range(cfg.n_layers))


def cache_shapes(cfg: ModelConfig, batch_size: int, length: int | None = None) -> KVCache:
    """The same pytree as `init_cache`, as ShapeDtypeStructs: sizes without allocating a byte."""
    return jax.eval_shape(lambda: init_cache(cfg, batch_size, length))


def _map_slots(layer: Any, fn) -> Any:
    """Apply `fn(array, axis)` to every field of a layer along its slot axis."""
    return type(layer)(*(fn(a, layer.SEQ_AXIS) for a in layer))


def resize_cache(cache: KVCache, length: int, at_end: bool = False) -> KVCache:
    """The same cache with `length` slots per layer, cut or zero-padded at the end (at_end=False) or the start.

    A ring-buffer layer gets min(length, W) slots, as init_cache gives it.
    """
    def fit(a: jax.Array, axis: int, length: int) -> jax.Array:
        old = a.shape[axis]
        if length <= old:
            return jax.lax.slice_in_dim(a, old - length if at_end else 0, old if at_end else length, axis=axis)
        widths = [(0, 0)] * a.ndim
        widths[axis] = (length - old, 0) if at_end else (0, length - old)
        return jnp.pad(a, widths)

    def fit_layer(layer: Any) -> Any:
        n = min(length, getattr(layer, "WINDOW", length))  # a ring buffer keeps at most W slots
        return _map_slots(layer, lambda a, axis: fit(a, axis, n))

    return tuple(fit_layer(layer) for layer in cache)


def grow_cache(cache: KVCache, length: int) -> KVCache:
    """The same cache with `length` >= current slots per layer: written slots kept, the new ones zero."""
    return resize_cache(cache, length)


def keep_slots(cache: KVCache, live_S: jax.Array) -> KVCache:
    """Zero every slot whose entry of the bool mask `live_S` [S] is False."""
    def mask(a: jax.Array, axis: int) -> jax.Array:
        return jnp.where(live_S.reshape((-1,) + (1,) * (a.ndim - axis - 1)), a, jnp.zeros((), a.dtype))

    return tuple(_map_slots(layer, mask) for layer in cache)


def add_caches(a: KVCache, b: KVCache) -> KVCache:
    """Slot-wise sum of two caches of one length: joins halves whose unused slots are zero."""
    return jax.tree_util.tree_map(jnp.add, a, b)


def tree_nbytes(tree) -> int:
    """Bytes held by every array (or ShapeDtypeStruct) leaf of a pytree, measured from shapes and dtypes."""
    return int(sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def _slots(layer: Any) -> int:
    return layer[0].shape[layer.SEQ_AXIS]


def _wraps(layer: Any) -> bool:
    """A ring buffer with all W slots: it takes any position, overwriting the one W back."""
    return _slots(layer) == getattr(layer, "WINDOW", None)


def cache_length(cache: KVCache) -> int:
    """S: how many token positions the cache holds: the slots of its layers (full ring buffers, which wrap, aside)."""
    growing = [_slots(layer) for layer in cache if not _wraps(layer)]
    return min(growing) if growing else _slots(cache[0])


def filled_slots(cache: KVCache) -> int:
    """How many slots of the cache hold a token, read from the arrays: one past the last written slot.

    Caches fill left to right from zeroed slots, so this is the index of the last slot of layer 0,
    sequence 0 whose stored values are not all zero, plus one (0 for an empty or zero-slot cache).
    """
    if not cache:
        return 0
    first = cache[0]
    axis = first.SEQ_AXIS
    written_S = np.zeros(first[0].shape[axis], bool)
    for a in first:
        rows = np.moveaxis(np.asarray(a[0]), axis - 1, 0)  # sequence 0, slots first
        written_S |= rows.reshape(rows.shape[0], -1).any(axis=1)
    return int(np.flatnonzero(written_S)[-1] + 1) if written_S.any() else 0


def check_cache(cfg: ModelConfig, cache: KVCache, batch: int) -> None:
    """Raise ValueError unless `cache` is a cache for `cfg` that holds `batch` sequences."""
    if not isinstance(cache, tuple | list) or len(cache) != cfg.n_layers:
        raise ValueError(f"kv_caches: expected a tuple of {cfg.n_layers} per-layer caches from "
                         f"dantinox.init_cache, got {type(cache).__name__}")
    for layer, got in enumerate(cache):
        layout = layout_for(cfg, layer)
        if type(got) is not layout:
            raise ValueError(f"kv_caches[{layer}]: expected {layout.__name__} for attention={cfg.attention!r}, "
                             f"got {type(got).__name__}")
    expected = cache_shapes(cfg, batch, cache_length(cache))
    for layer, (got, want) in enumerate(zip(cache, expected, strict=True)):
        for name, g, w in zip(want._fields, got, want, strict=True):
            if g.shape[0] != w.shape[0]:
                raise ValueError(f"kv_caches[{layer}].{name}: cache holds batch {g.shape[0]} but ids have "
                                 f"batch {batch}")
            if g.shape != w.shape:
                raise ValueError(f"kv_caches[{layer}].{name}: expected shape {w.shape}, got {g.shape}")
            if g.dtype != w.dtype:
                raise ValueError(f"kv_caches[{layer}].{name}: expected dtype {w.dtype} (cache_dtype="
                                 f"{cfg.cache_dtype!r}), got {g.dtype}")


def check_write(cache: KVCache, cache_index: int, n_tokens: int) -> None:
    """Refuse a write of `n_tokens` at `cache_index` that would not fit (XLA would silently clamp it)."""
    length = cache_length(cache)
    if cache_index < 0:
        raise ValueError(f"cache_index: must be >= 0, got {cache_index}")
    if cache_index + n_tokens > length and not all(_wraps(layer) for layer in cache):
        raise ValueError(f"cache_index: writing {n_tokens} token(s) at position {cache_index} needs "
                         f"{cache_index + n_tokens} slots, but the cache holds {length} (max_context)")
