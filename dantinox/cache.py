"""The KV cache as a value: a container that owns its fill, and one layout per layer.

`KVCache` is a pytree passed into the model and returned updated; nothing is stored on the model. It holds

    layers       one payload value per layer (the arrays: keys and values, or MLA latents, with scales)
    lengths      [B] int32, tokens each sequence holds, shared by every layer
    page_table  [B, M] int32 for a paged cache (logical page m of sequence b is physical page
                 table[b, m] of every layer's pool), held once; None for a contiguous cache
    config       the CacheConfig it was made with (static): the model reads its layers' layouts from it,
                 so one model decodes with a contiguous, paged, ring, quantized or engine cache

`model.forward` writes at `lengths` and advances it, and attention masks with it, so no caller passes a
length beside the cache and nothing re-reads it from the data.

A layer's layout is three independent choices, fixed per layer by its LayerSpec and the cache's CacheConfig
(`layouts`; the model holds none, so one model decodes with any cache its architecture allows):
  addressing  where position p lives: `Contiguous` (slot p), `Ring` of W slots (p mod W, dantinox/ring.py),
              `Chunked` (a ring of one chunk, Llama 4), `Paged` (through the page table, dantinox/paged.py)
  storage     the dtype of the stored values: a float dtype, or int8 / fp8 codes with a float32 scale per
              token and head (dantinox/quant.py); scales are folded into attention's contractions
  payload     `LayerCache` (K/V heads) or `LatentCache` (MLA's latent and RoPE key)
Attention asks its layout for a `View` (the arrays to attend over, each slot's position, and the layout's
visibility rule) and has one code path for all of them. Keys are cached after RoPE.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dantinox import ops
from dantinox.checks import positive_int
from dantinox.config import CacheConfig, LayerSpec, ModelConfig
from dantinox.quant import quantize


@ops.takes_over("store")  # the speed layer may write some dtypes its own way (in place)
def _scatter(a: jax.Array, axis: int, rows_BT: jax.Array, slots_BT: jax.Array, new_BT: jax.Array) -> jax.Array:
    """Store token-major `new_BT` [B, T, ...] at (row, slot) of `a` [R, ..., S, ...]; slot -1 is dropped."""
    if writes_as_slice(*rows_BT.shape):  # one token of one row: a slice update, not a scatter
        row, slot = rows_BT[0, 0], slots_BT[0, 0]
        start = (row,) + (0,) * (axis - 1) + (jnp.maximum(slot, 0),) + (0,) * (a.ndim - axis - 1)
        update = jnp.moveaxis(new_BT, 1, axis).astype(a.dtype)
        kept = jnp.where(slot >= 0, update, jax.lax.dynamic_slice(a, start, update.shape))  # -1: leave the slot
        return jax.lax.dynamic_update_slice(a, kept, start)  # in bounds: locate's slots are < S, rows < R
    idx = (rows_BT,) + (slice(None),) * (axis - 1) + (jnp.where(slots_BT < 0, a.shape[axis], slots_BT),)
    return a.at[idx].set(new_BT.astype(a.dtype), mode="drop")  # out of range: a masked token, not written


def writes_as_slice(B: int, T: int) -> bool:
    """Whether a write of T tokens into B rows is one slice update (B = T = 1: a batch-1 decode step) rather
    than a scatter; benchmarks/cache_steps.py times both."""
    return B == 1 and T == 1


class _Payload:
    """What the payload types share: field i has its slot axis at SEQ_AXES[i]."""

    __slots__ = ()
    SEQ_AXES: tuple[int, ...] = ()
    SCALE_LAYOUT = "per_token"  # a quantized payload's scales: one per token (and head), quant.quantize's

    @property
    def scale_layout(self) -> str | None:
        """How this payload's scales are laid out (SCALE_LAYOUT), what a kernel must know to read them; None:
        float storage, no scales (the last field)."""
        return None if self[-1] is None else self.SCALE_LAYOUT

    @property
    def slots(self) -> int:
        return self[0].shape[self.SEQ_AXES[0]]

    def map_slots(self, fn) -> Any:
        """Apply `fn(array, axis)` to every field that is set (axis: that field's slot axis)."""
        return type(self)(*(None if a is None else fn(a, ax) for a, ax in zip(self, self.SEQ_AXES, strict=True)))

    def store(self, new: Any, rows_BT: jax.Array, slots_BT: jax.Array) -> Any:
        """The same arrays with the tokens of `new` (this type, T slots, from `encode`) at (row, slot)."""
        return type(self)(*(None if a is None else _scatter(a, ax, rows_BT, slots_BT, jnp.moveaxis(n, ax, 1))
                            for a, n, ax in zip(self, new, self.SEQ_AXES, strict=True)))

    def concat(self, new: Any) -> Any:
        """These slots followed by the T slots of `new`."""
        return type(self)(*(None if a is None else jnp.concatenate([a, n], axis=ax)
                            for a, n, ax in zip(self, new, self.SEQ_AXES, strict=True)))

    def gather(self, table_BM: jax.Array, page_size: int) -> Any:
        """A one-row pool of pages ([1, ..., P · ps, ...]) read through a page table: [B, ..., M · ps, ...]."""
        B, M = table_BM.shape

        def one(pool: jax.Array, axis: int) -> jax.Array:
            a = pool[0]
            ax = axis - 1
            pages = a.reshape(a.shape[:ax] + (a.shape[ax] // page_size, page_size) + a.shape[ax + 1:])
            rows = jnp.moveaxis(jnp.take(pages, table_BM, axis=ax), ax, 0)  # [B, ..., M, ps, ...]
            return rows.reshape(rows.shape[:axis] + (M * page_size,) + rows.shape[axis + 2:])
        return self.map_slots(one)

class _HeadsFields(NamedTuple):
    k: jax.Array  # [R, K, H, S], keys after RoPE, slot axis last (R: sequences, or 1: a paged pool)
    v: jax.Array  # [R, K, S, H]
    k_scale: jax.Array | None = None  # [R, K, S] float32, for int8 / fp8 codes
    v_scale: jax.Array | None = None  # [R, K, S] float32


class _LatentFields(NamedTuple):
    ckv: jax.Array  # [R, S, C + R]
    ckv_scale: jax.Array | None = None  # [R, S] float32, for int8 / fp8 codes


class LayerCache(_Payload, _HeadsFields):
    """K/V-heads payload (MHA, GQA, MQA): keys and values of K heads; scales only for a quantized cache.

    Keys are stored [R, K, H, S] (slot axis last) and values [R, K, S, H], so that both decode products,
    q·K over H and p·V over S, are plain [rows, inner] x [inner, columns] matmuls that XLA:CPU runs without
    repacking a cache operand (benchmarks/decode.py and benchmarks/cache_steps.py measure the step).
    """

    __slots__ = ()
    SEQ_AXES = (3, 2, 2, 2)  # k, v, k_scale, v_scale

    @classmethod
    def zeros(cls, cfg: ModelConfig, rows: int, slots: int, layer: LayerSpec | None = None) -> LayerCache:
        """An empty layer of `slots` slots with the K and H of `layer` (default: the model-wide ones)."""
        K, H = (cfg.n_kv_heads, cfg.head_size) if layer is None else (layer.kv_heads, layer.head_size)

        def scales():  # a buffer each: decoding donates them
            return jnp.zeros((rows, K, slots), jnp.float32) if cfg.quantized_cache else None
        dtype = cfg.cache_jnp_dtype
        return cls(jnp.zeros((rows, K, H, slots), dtype), jnp.zeros((rows, K, slots, H), dtype), scales(), scales())

    @classmethod
    def encode(cls, cfg: CacheConfig, k_BKTH: jax.Array, v_BKTH: jax.Array) -> LayerCache:
        """New keys and values as the cache stores them (rounded to its dtype, or quantized)."""
        if not cfg.quantized_cache:
            return cls(k_BKTH.astype(cfg.cache_jnp_dtype).swapaxes(2, 3), v_BKTH.astype(cfg.cache_jnp_dtype))
        (k, ks), (v, vs) = quantize(k_BKTH, cfg.cache_dtype), quantize(v_BKTH, cfg.cache_dtype)
        return cls(k.swapaxes(2, 3), v, ks, vs)


class LatentCache(_Payload, _LatentFields):
    """MLA payload: the compressed KV latent and the decoupled RoPE key of each token, side by side."""

    __slots__ = ()
    SEQ_AXES = (1, 1)  # ckv, ckv_scale

    @classmethod
    def zeros(cls, cfg: ModelConfig, rows: int, slots: int, layer: LayerSpec | None = None) -> LatentCache:
        width = cfg.kv_latent_dim + cfg.rope_head_dim
        scales = jnp.zeros((rows, slots), jnp.float32) if cfg.quantized_cache else None
        return cls(jnp.zeros((rows, slots, width), cfg.cache_jnp_dtype), scales)

    @classmethod
    def encode(cls, cfg: CacheConfig, ckv_BTX: jax.Array) -> LatentCache:
        if not cfg.quantized_cache:
            return cls(ckv_BTX.astype(cfg.cache_jnp_dtype))
        return cls(*quantize(ckv_BTX, cfg.cache_dtype))


class View(NamedTuple):
    """What attention reads from one layer: the arrays, the position each slot holds, the layout's rule."""

    payload: Any  # LayerCache or LatentCache, [B, ..., S, ...]
    k_pos_BS: jax.Array  # position of the token in each slot; -1: empty
    addressing: Any  # static: its `visible(q_pos_BT, k_pos_BS)` is the layout's own mask (window, chunk)

    def mask(self, q_pos_BT: jax.Array, causal: bool) -> jax.Array:
        """[B, T, S] which keys each query may attend to."""
        k_pos = self.k_pos_BS[:, None, :]
        mask = (k_pos >= 0) & self.addressing.visible(q_pos_BT[:, :, None], k_pos)
        return mask & (k_pos <= q_pos_BT[:, :, None]) if causal else mask


@dataclasses.dataclass(frozen=True)
class Contiguous:
    """Position p lives in slot p of its sequence's row: a cache of `length` slots holds positions < length."""

    def slots(self, length: int) -> int:
        return length

    def visible(self, q_pos, k_pos) -> jax.Array:
        return jnp.ones((), bool)

    def locate(self, pos_BT, live_BT, after_B, S, table):
        """(rows, slots) [B, T] where the new tokens go; slot -1 for a token not to write."""
        rows = jnp.broadcast_to(jnp.arange(pos_BT.shape[0])[:, None], pos_BT.shape)
        return rows, jnp.where(live_BT, pos_BT, -1)

    def positions(self, lengths_B: jax.Array, S: int) -> jax.Array:
        s_S = jnp.arange(S)
        return jnp.where(s_S[None, :] < lengths_B[:, None], s_S[None, :], -1)

    def read(self, layer, table, lengths_B: jax.Array, T: int) -> tuple[Any, jax.Array]:
        """What attention reads after a write that left `lengths_B` tokens: the arrays and each slot's position."""
        return layer, self.positions(lengths_B, layer.slots)

    def reads_before_write(self, T: int) -> bool:
        """Whether attention must see the old slots and the new tokens side by side (a write would evict)."""
        return False


@dataclasses.dataclass(frozen=True)
class Layout:
    """One layer's layout: addressing x storage x payload type, for one layer's spec."""

    addressing: Any
    payload: type
    layer: LayerSpec | None = None  # its K and H size the payload; None: the model-wide ones
    storage: CacheConfig | None = None  # the cache dtype new tokens are stored in (rounded or quantized)

    def encode(self, *new: jax.Array) -> Any:
        """New tokens (keys and values, or MLA latents) as this layer's payload stores them."""
        return self.payload.encode(self.storage, *new)

    def zeros(self, cfg: ModelConfig, rows: int, slots: int) -> Any:
        """An empty payload of `slots` slots in `rows` rows for this layer."""
        return self.payload.zeros(cfg, rows, slots, self.layer)

    def update(self, layer: Any, new: Any, pos_BT: jax.Array, live_BT: jax.Array, lengths_B: jax.Array,
               after_B: jax.Array, table: jax.Array | None) -> tuple[Any, View]:
        """Write the new tokens (payload from `encode`) and return the layer and the view attention reads.

        `lengths_B` and `after_B` are the fill before and after the write; `live_BT` marks the tokens to
        write (a ragged batch's padding and finished rows are not).
        """
        addr = self.addressing
        S = layer.slots
        rows, slots = addr.locate(pos_BT, live_BT, after_B, S, table)
        written = layer.store(new, rows, slots)
        if addr.reads_before_write(pos_BT.shape[1]):  # old slots beside the new tokens, then the write
            k_pos = jnp.concatenate([addr.positions(lengths_B, S), jnp.where(live_BT, pos_BT, -1)], axis=1)
            return written, View(layer.concat(new), k_pos, addr)
        return written, View(*addr.read(written, table, after_B, pos_BT.shape[1]), addr)


def layouts(cfg: ModelConfig) -> tuple[Layout, ...]:
    """The layout of every layer of a config (its layer specs under its cache config)."""
    return tuple(layer_layout(cfg, layer) for layer in cfg.layers)


def layer_layout(cfg: ModelConfig, layer: LayerSpec) -> Layout:
    """The layout of one layer, given its filled-in spec (one of cfg.layers), under cfg.cache."""
    from dantinox.kivi import KiviCache, KiviLayout
    from dantinox.paged import Paged
    from dantinox.ring import Chunked, Ring, SinkRing

    if cfg.kivi_bits is not None:  # the config refuses per-layer K, H and windows with KIVI and eviction
        return KiviLayout(Contiguous(), KiviCache, layer, cfg.cache, cfg=cfg)
    if cfg.eviction is not None:
        from dantinox.eviction import Budget, BudgetCache, EvictionLayout

        return EvictionLayout(Budget(cfg.cache_budget), BudgetCache, layer, cfg.cache, cfg=cfg)
    if layer.kind == "sliding" and cfg.attention_sinks:
        addr = SinkRing(layer.window, cfg.attention_sinks)
    elif layer.kind == "sliding":
        addr = Ring(layer.window)
    elif layer.kind == "chunked":
        addr = Chunked(layer.window)
    elif cfg.cache_layout == "paged":
        addr = Paged(cfg.page_size, cfg.n_heads if cfg.attention == "latent" else cfg.n_heads // layer.kv_heads)
    else:
        addr = Contiguous()
    return Layout(addr, LatentCache if cfg.attention == "latent" else LayerCache, layer, cfg.cache)


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

    Arrays are in `cfg.cache_dtype`. A paged config gets a private pool: sequence b owns pages b·M .. b·M + M - 1.
    """
    batch_size = positive_int("batch_size", batch_size)
    length = cfg.max_context if length is None else positive_int("length", length)
    if length > cfg.max_context:
        raise ValueError(f"length: a cache holds at most max_context={cfg.max_context} tokens, got {length}")
    if cfg.cache_layout != "paged":
        return empty_cache(cfg, batch_size, length)
    from dantinox.page_manager import pages_for

    M = pages_for(length, cfg.page_size)
    return empty_cache(cfg, batch_size, length, np.arange(batch_size * M, dtype=np.int32).reshape(batch_size, M),
                       batch_size * M)


def empty_cache(cfg: ModelConfig, batch: int, length: int, table: Any = None, num_pages: int | None = None):
    """An empty KVCache: contiguous layers of `length` slots (rings: min(length, W)); paged layers get pools
    of `num_pages` pages (default: every page `table` names) read through `table`."""
    layers = []
    for layout in layouts(cfg):
        addr = layout.addressing
        if hasattr(addr, "page_size"):
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
               if type(lay.addressing) is Contiguous or layer.slots < lay.addressing.slots(cfg.max_context)]
    return min(growing) if growing else cfg.max_context


def resize_layers(layers: tuple, cfg: ModelConfig, length: int, at_end: bool = False) -> tuple:
    """The same per-layer arrays with `length` slots, cut or zero-padded at the end (at_end=False) or the start.

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
        if hasattr(layer, "fit_slots"):  # fields with different slot counts (KIVI's groups and window)
            return layer.fit_slots(cfg, n, fit)
        return layer.map_slots(lambda a, axis: fit(a, axis, n))

    return tuple(fit_layer(layer, lay.addressing.slots(length))
                 for layer, lay in zip(layers, layouts(cfg), strict=True))


def grow_cache(cache: KVCache, cfg: ModelConfig, length: int) -> KVCache:
    """The same cache with room for `length` positions per contiguous layer: written slots kept, new ones zero."""
    return cache._replace(layers=resize_layers(cache.layers, cfg, length))


def keep_slots(layers: tuple, live_S: jax.Array) -> tuple:
    """Zero every slot whose entry of the bool mask `live_S` [S] is False."""
    def mask(a: jax.Array, axis: int) -> jax.Array:
        return jnp.where(live_S.reshape((-1,) + (1,) * (a.ndim - axis - 1)), a, jnp.zeros((), a.dtype))

    return tuple(layer.map_slots(mask) for layer in layers)


def add_caches(a: tuple, b: tuple) -> tuple:
    """Slot-wise sum of two sets of layers of one length: joins halves whose unused slots are zero."""
    return jax.tree_util.tree_map(jnp.add, a, b)
