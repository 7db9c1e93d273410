"""One layer's cache layout: addressing x storage x payload, and the View attention reads.

A layer's layout is three independent choices, fixed per layer by its LayerSpec and the cache's CacheConfig
(dantinox/cache/registry.py picks them; the model holds none, so one model decodes with any cache its
architecture allows):
  addressing  where position p lives: `Contiguous` (slot p, here), `Ring` of W slots (p mod W), `SinkRing`,
              `Chunked` (a ring of one chunk, Llama 4; all in ring.py), `Paged` (through the page table,
              paged.py), `Budget` (H2O, eviction.py)
  storage     the dtype of the stored values: a float dtype, or int8 / fp8 codes with a float32 scale per
              token and head (quant.py; `SCALE_LAYOUT` declares how scales lie); KIVI (kivi.py)
  payload     `LayerCache` (K/V heads) or `LatentCache` (MLA's latent and RoPE key), here; the indexed latent
              (indexer.py), the shared layer's nothing (shared.py) and the recurrent states (state.py)
Attention asks its layout for a `View` (the arrays to attend over, each slot's position, and the layout's
visibility rule) and has one code path for all of them. Keys are cached after RoPE.

What a layout can do is declared on it, never probed: an addressing's `pooled` (its layers are one pool of
pages read through the page table), `bounded` (it holds at most a fixed number of slots whatever the
length) and `keeps_sinks`, a layout's `scored` (H2O: the write needs attention's weights), a payload's
`SEQ_AXES`, `SCALE_LAYOUT` and `fit_slots`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from dantinox import ops
from dantinox.architectures.config import CacheConfig, LayerSpec, ModelConfig
from dantinox.cache.quant import quantize


@ops.takes_over("store")  # the speed layer may write some dtypes its own way (in place)
def _scatter(a: jax.Array, axis: int, rows_BT: jax.Array, slots_BT: jax.Array,
             new_BT: jax.Array) -> jax.Array:
    """Store token-major `new_BT` [B, T, ...] at (row, slot) of `a` [R, ..., S, ...]; slot -1 is dropped."""
    if writes_as_slice(*rows_BT.shape):  # one token of one row: a slice update, not a scatter
        row, slot = rows_BT[0, 0], slots_BT[0, 0]
        start = (row,) + (0,) * (axis - 1) + (jnp.maximum(slot, 0),) + (0,) * (a.ndim - axis - 1)
        update = jnp.moveaxis(new_BT, 1, axis).astype(a.dtype)
        old = jax.lax.dynamic_slice(a, start, update.shape)
        kept = jnp.where(slot >= 0, update, old)  # -1: leave the slot
        return jax.lax.dynamic_update_slice(a, kept, start)  # in bounds: locate's slots are < S, rows < R
    idx = (rows_BT,) + (slice(None),) * (axis - 1) + (jnp.where(slots_BT < 0, a.shape[axis], slots_BT),)
    return a.at[idx].set(new_BT.astype(a.dtype), mode="drop")  # out of range: a masked token, not written


def writes_as_slice(B: int, T: int) -> bool:
    """Whether a write of T tokens into B rows is one slice update (B = T = 1: a batch-1 decode step) rather
    than a scatter; benchmarks/cache_steps.py times both."""
    return B == 1 and T == 1


class Payload:
    """What the payload types share: field i has its slot axis at SEQ_AXES[i]."""

    __slots__ = ()
    SEQ_AXES: tuple[int, ...] = ()
    SCALE_LAYOUT = "per_token"  # a quantized payload's scales: one per token (and head), quant.quantize's

    @property
    def scale_layout(self) -> str | None:
        """How this payload's scales are laid out (SCALE_LAYOUT), what a kernel must know to read them; None:
        float storage, no scales (the last field)."""
        return None if not self.SEQ_AXES or self[-1] is None else self.SCALE_LAYOUT

    @property
    def slots(self) -> int:
        """Token slots per row; 0 for a payload with no slot axis (a shared layer's, a recurrent state)."""
        return self[0].shape[self.SEQ_AXES[0]] if self.SEQ_AXES else 0

    def fit_slots(self, cfg, n: int, fit) -> Any:
        """The same payload with `n` slots, every field cut or padded by `fit(array, axis, n)` (KIVI's
        payload, whose fields hold different slot counts, says otherwise)."""
        return self.map_slots(lambda a, axis: fit(a, axis, n))

    def map_slots(self, fn) -> Any:
        """Apply `fn(array, axis)` to every field that is set (axis: that field's slot axis)."""
        return type(self)(*(None if a is None else fn(a, ax)
                            for a, ax in zip(self, self.SEQ_AXES, strict=True)))

    def store(self, new: Any, rows_BT: jax.Array, slots_BT: jax.Array) -> Any:
        """The same arrays with the tokens of `new` (this type, T slots, from `encode`) at (row, slot)."""
        return type(self)(*(None if a is None else _scatter(a, ax, rows_BT, slots_BT, jnp.moveaxis(n, ax, 1))
                            for a, n, ax in zip(self, new, self.SEQ_AXES, strict=True)))

    def concat(self, new: Any) -> Any:
        """These slots followed by the T slots of `new`."""
        return type(self)(*(None if a is None else jnp.concatenate([a, n], axis=ax)
                            for a, n, ax in zip(self, new, self.SEQ_AXES, strict=True)))

    def gather(self, table_BM: jax.Array, page_size: int) -> Any:
        """A one-row pool of pages ([1, ..., P · ps, ...]) read through a page table:
        [B, ..., M · ps, ...]."""
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


class LayerCache(Payload, _HeadsFields):
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
        return cls(jnp.zeros((rows, K, H, slots), dtype), jnp.zeros((rows, K, slots, H), dtype),
                   scales(), scales())

    @classmethod
    def encode(cls, cfg: CacheConfig, k_BKTH: jax.Array, v_BKTH: jax.Array) -> LayerCache:
        """New keys and values as the cache stores them (rounded to its dtype, or quantized)."""
        if not cfg.quantized_cache:
            return cls(k_BKTH.astype(cfg.cache_jnp_dtype).swapaxes(2, 3), v_BKTH.astype(cfg.cache_jnp_dtype))
        (k, ks), (v, vs) = quantize(k_BKTH, cfg.cache_dtype), quantize(v_BKTH, cfg.cache_dtype)
        return cls(k.swapaxes(2, 3), v, ks, vs)


class LatentCache(Payload, _LatentFields):
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
    """Position p lives in slot p of its sequence's row:
    a cache of `length` slots holds positions < length."""

    pooled: ClassVar[bool] = False  # True: the layer is one row of pages shared by all sequences (Paged)
    bounded: ClassVar[bool] = False  # True: at most `slots(max_context)` slots whatever the length (rings)
    keeps_sinks: ClassVar[bool] = False  # True: the first `sinks` positions stay (SinkRing: `sink_shift`)

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
        """What attention reads after a write that left `lengths_B` tokens:
        the arrays and each slot's position."""
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
    scored: ClassVar[bool] = False  # True: what stays after a write depends on attention's weights (`keep`)

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
