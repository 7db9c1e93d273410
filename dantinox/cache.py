"""The KV cache as a value: typed per-layer containers, allocation, and the checks that guard writes.

A cache is a tuple with one entry per layer, passed into the model and returned updated; nothing
is stored on the model. Keys are cached after RoPE, so a cached key never needs re-rotating.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dantinox.config import ModelConfig


class LayerCache(NamedTuple):
    """One layer of the static autoregressive cache (MHA, GQA, MQA)."""

    k: jax.Array  # [B, K, S, H], keys after RoPE
    v: jax.Array  # [B, K, S, H]


class LatentCache(NamedTuple):
    """One layer of the MLA cache: the compressed KV latent and the decoupled RoPE key, side by side."""

    ckv: jax.Array  # [B, S, C + R]


KVCache = tuple  # tuple[LayerCache, ...] or tuple[LatentCache, ...], one entry per layer


def init_cache(cfg: ModelConfig, batch_size: int, length: int | None = None) -> KVCache:
    """Pre-allocate a zeroed static cache for `batch_size` sequences of up to `length` tokens.

    `length` defaults to `cfg.max_context`. Arrays are in `cfg.cache_dtype`.
    """
    batch_size = _check_count("batch_size", batch_size)
    length = cfg.max_context if length is None else _check_count("length", length)
    if length > cfg.max_context:
        raise ValueError(f"length: a cache holds at most max_context={cfg.max_context} tokens, got {length}")
    dt = cfg.cache_jnp_dtype
    if cfg.attention == "mla":
        shape = (batch_size, length, cfg.kv_latent_dim + cfg.rope_head_dim)
        return tuple(LatentCache(jnp.zeros(shape, dt)) for _ in range(cfg.n_layers))
    shape = (batch_size, cfg.kv_heads, length, cfg.head_size)
    return tuple(LayerCache(jnp.zeros(shape, dt), jnp.zeros(shape, dt)) for _ in range(cfg.n_layers))


def cache_shapes(cfg: ModelConfig, batch_size: int, length: int | None = None) -> KVCache:
    """The same pytree as `init_cache`, as ShapeDtypeStructs: sizes without allocating a byte."""
    return jax.eval_shape(lambda: init_cache(cfg, batch_size, length))


def grow_cache(cache: KVCache, length: int) -> KVCache:
    """The same cache with `length` slots per layer: written slots kept, the new ones zero."""
    def pad(x: jax.Array, axis: int) -> jax.Array:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, length - x.shape[axis])
        return jnp.pad(x, widths)

    return tuple(LatentCache(pad(layer.ckv, 1)) if isinstance(layer, LatentCache)
                 else LayerCache(pad(layer.k, 2), pad(layer.v, 2)) for layer in cache)


def tree_nbytes(tree) -> int:
    """Bytes held by every array (or ShapeDtypeStruct) leaf of a pytree, measured from shapes and dtypes."""
    return int(sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def cache_length(cache: KVCache) -> int:
    """S: how many token slots each layer of the cache has."""
    first = cache[0]
    return first.ckv.shape[1] if isinstance(first, LatentCache) else first.k.shape[2]


def check_cache(cfg: ModelConfig, cache: KVCache, batch: int) -> None:
    """Raise ValueError unless `cache` is a cache for `cfg` that holds `batch` sequences."""
    if not isinstance(cache, tuple | list) or len(cache) != cfg.n_layers:
        raise ValueError(f"kv_caches: expected a tuple of {cfg.n_layers} per-layer caches from "
                         f"dantinox.init_cache, got {type(cache).__name__}")
    expected = cache_shapes(cfg, batch, cache_length(cache))
    for layer, (got, want) in enumerate(zip(cache, expected, strict=True)):
        if type(got) is not type(want):
            raise ValueError(f"kv_caches[{layer}]: expected {type(want).__name__} for attention="
                             f"{cfg.attention!r}, got {type(got).__name__}")
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
    if cache_index + n_tokens > length:
        raise ValueError(f"cache_index: writing {n_tokens} token(s) at position {cache_index} needs "
                         f"{cache_index + n_tokens} slots, but the cache holds {length} (max_context)")


def _check_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)
