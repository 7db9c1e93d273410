"""KIVI-style low-bit KV cache: a storage layout of dantinox/cache/container.py (Liu et al. 2024,
arXiv:2402.02750).

Keys are quantized per channel and values per token (the paper's finding: a few key channels carry large
outliers, so a scale per channel isolates them; values have no fixed outlier channels and are read as a
per-token mixture, so a scale per token keeps each token's error to itself). Both are asymmetric: b-bit
codes c in [0, 2^b - 1] with x ≈ c · scale + zero, scales and zeros stored in float16.

    keys    one (scale, zero) per channel for each group of G consecutive tokens
    values  one (scale, zero) per token for each group of G consecutive channels
    window  the R most recent tokens' keys and values also kept in full precision (R >= G)

A key group can only be quantized once its G tokens exist, so keys are quantized group by group as groups
complete; until then they are read from the full-precision window, which is why R >= G. Values are
quantized as they are written. A slot is read from the window while it is among the R most recent, and
from the codes after that, so what attention sees does not depend on how the tokens were written (one
prompt or one token at a time). A prompt attends to itself in full precision, as KIVI's prefill does.

Codes are packed 8 // b to a byte along the head channels. Every array is counted: codes, scales,
zeros and the window (`kivi_cache_bytes`). Attention reads the dequantized keys and values: with
per-channel key scales the scores are not one scaled contraction per slot, as they are for int8.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from dantinox.architectures.config import LayerSpec, ModelConfig
from dantinox.cache.layout import Contiguous, LayerCache, Layout, View
from dantinox.cache.registry import MODES, register

SCALE_DTYPE = jnp.float16  # scales and zero points, as KIVI stores them


def kivi_cache_bytes(cfg: ModelConfig, batch: int, tokens: int) -> int:
    """Bytes of a KIVI cache of `tokens` slots: codes + key and value scales and zeros + full-precision
    window."""
    K, H, G, bits = cfg.n_kv_heads, cfg.head_size, cfg.kivi_group, cfg.kivi_bits
    scale = jnp.dtype(SCALE_DTYPE).itemsize
    codes = 2 * tokens * K * H * bits // 8
    key_params = 2 * -(-tokens // G) * K * H * scale  # scale and zero per channel per token group
    value_params = 2 * tokens * K * (H // G) * scale  # scale and zero per token per channel group
    window = 2 * min(tokens, cfg.kivi_residual) * K * H * jnp.dtype(cfg.jnp_dtype).itemsize
    return batch * cfg.n_layers * (codes + key_params + value_params + window)


def pack(codes: jax.Array, bits: int) -> jax.Array:
    """uint8 codes [..., H] (each < 2^bits) packed 8 // bits to a byte: [..., H · bits / 8]."""
    per = 8 // bits
    c = codes.astype(jnp.uint8).reshape(codes.shape[:-1] + (codes.shape[-1] // per, per))
    shifts = (jnp.arange(per, dtype=jnp.uint8) * bits).astype(jnp.uint8)
    return jnp.sum(c << shifts, axis=-1, dtype=jnp.uint8)  # disjoint bit fields: the sum is an OR


def unpack(packed: jax.Array, bits: int) -> jax.Array:
    """The inverse of `pack`: float32 codes [..., H]."""
    per = 8 // bits
    shifts = (jnp.arange(per, dtype=jnp.uint8) * bits).astype(jnp.uint8)
    c = (packed[..., None] >> shifts) & jnp.uint8(2**bits - 1)
    return c.reshape(packed.shape[:-1] + (packed.shape[-1] * per,)).astype(jnp.float32)


def scale_zero(lo: jax.Array, hi: jax.Array, bits: int) -> tuple[jax.Array, jax.Array]:
    """Asymmetric (scale, zero) in float16 for values in [lo, hi]."""
    return ((hi - lo) / (2**bits - 1)).astype(SCALE_DTYPE), lo.astype(SCALE_DTYPE)


def encode(x: jax.Array, scale: jax.Array, zero: jax.Array, bits: int) -> jax.Array:
    """Codes of x with the stored (float16) scale and zero, so dequantizing reverses exactly this rounding."""
    s, z = scale.astype(jnp.float32), zero.astype(jnp.float32)
    c = jnp.round((x.astype(jnp.float32) - z) / jnp.where(s > 0, s, 1.0))
    return jnp.clip(c, 0, 2**bits - 1)


def quantize_values(v_BKTH: jax.Array, G: int, bits: int):
    """Per token, per group of G channels: packed codes [B, K, T, H·b/8], scales and zeros [B, K, T, H/G]."""
    grouped = v_BKTH.astype(jnp.float32).reshape(v_BKTH.shape[:-1] + (-1, G))
    scale, zero = scale_zero(grouped.min(-1), grouped.max(-1), bits)
    codes = encode(grouped, scale[..., None], zero[..., None], bits).reshape(v_BKTH.shape)
    return pack(codes, bits), scale, zero


def _ring_positions(lengths_B: jax.Array, R: int) -> jax.Array:
    """[B, R] position held by each slot of the window ring (position p in slot p mod R; -1: empty)."""
    s = jnp.arange(R)[None, :]
    p = s + R * jnp.floor_divide(lengths_B[:, None] - 1 - s, R)
    return jnp.where(p >= 0, p, -1)


def _scatter(a: jax.Array, slots_BN: jax.Array, new_BKNX: jax.Array) -> jax.Array:
    """Write new [B, K, N, ...] at slot axis 2 of a [B, K, S, ...]; slot -1 is not written."""
    rows = jnp.broadcast_to(jnp.arange(a.shape[0])[:, None], slots_BN.shape)
    idx = (rows, slice(None), jnp.where(slots_BN < 0, a.shape[2], slots_BN))
    return a.at[idx].set(jnp.moveaxis(new_BKNX, 2, 1).astype(a.dtype), mode="drop")


class KiviCache(NamedTuple):
    """A KIVI layer: packed codes with their scales and zeros, and the full-precision window of the last R."""

    k_codes: jax.Array  # [B, K, S, H·b/8] uint8
    k_scale: jax.Array  # [B, K, ceil(S / G), H] float16, per channel per token group
    k_zero: jax.Array  # [B, K, ceil(S / G), H] float16
    v_codes: jax.Array  # [B, K, S, H·b/8] uint8
    v_scale: jax.Array  # [B, K, S, H / G] float16, per token per channel group
    v_zero: jax.Array  # [B, K, S, H / G] float16
    k_window: jax.Array  # [B, K, min(S, R), H] keys of the latest tokens, full precision (after RoPE)
    v_window: jax.Array  # [B, K, min(S, R), H]

    SEQ_AXES = (2,) * 8  # every field: [B, K, slots or groups, ...]

    @property
    def slots(self) -> int:
        return self.k_codes.shape[2]

    @classmethod
    def zeros(cls, cfg: ModelConfig, rows: int, slots: int, layer: Any = None) -> KiviCache:
        K, H, G, b = cfg.n_kv_heads, cfg.head_size, cfg.kivi_group, cfg.kivi_bits
        R, groups = min(slots, cfg.kivi_residual), -(-slots // G)
        codes, key_params = (rows, K, slots, H * b // 8), (rows, K, groups, H)
        value_params, window = (rows, K, slots, H // G), (rows, K, R, H)
        return cls(jnp.zeros(codes, jnp.uint8), jnp.zeros(key_params, SCALE_DTYPE),
                   jnp.zeros(key_params, SCALE_DTYPE), jnp.zeros(codes, jnp.uint8),
                   jnp.zeros(value_params, SCALE_DTYPE), jnp.zeros(value_params, SCALE_DTYPE),
                   jnp.zeros(window, cfg.jnp_dtype), jnp.zeros(window, cfg.jnp_dtype))

    def fit_slots(self, cfg: ModelConfig, n: int, fit) -> KiviCache:
        """The same layer with `n` slots (`fit(array, axis, count)` cuts or pads one axis)."""
        G, R = cfg.kivi_group, min(n, cfg.kivi_residual)
        counts = (n, -(-n // G), -(-n // G), n, n, n, R, R)
        return KiviCache(*(fit(a, 2, c) for a, c in zip(self, counts, strict=True)))

    def read(self, cfg: ModelConfig, lengths_B: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Keys and values [B, K, S, H] float32 as attention sees them after `lengths` tokens."""
        G, b = cfg.kivi_group, cfg.kivi_bits
        S, R = self.slots, self.k_window.shape[2]
        k_scale, k_zero = (jnp.repeat(a.astype(jnp.float32), G, axis=2)[:, :, :S]
                           for a in (self.k_scale, self.k_zero))
        k = unpack(self.k_codes, b) * k_scale + k_zero
        v_codes = unpack(self.v_codes, b).reshape(self.v_codes.shape[:3] + (-1, G))
        v_scale, v_zero = (a.astype(jnp.float32)[..., None] for a in (self.v_scale, self.v_zero))
        v = v_codes * v_scale + v_zero
        v = v.reshape(k.shape)
        s_S = jnp.arange(S)
        recent_BS = s_S[None, :] >= lengths_B[:, None] - R  # the window's slots; the rest come from the codes
        k_win, v_win = (jnp.take(a.astype(jnp.float32), s_S % R, axis=2)
                        for a in (self.k_window, self.v_window))
        pick = recent_BS[:, None, :, None]
        return jnp.where(pick, k_win, k), jnp.where(pick, v_win, v)

    @classmethod
    def encode(cls, cfg: ModelConfig, k_BKTH: jax.Array, v_BKTH: jax.Array) -> LayerCache:
        """New keys and values in float32 as LayerCache holds them: KIVI quantizes inside its layout's write,
        because a key group spans several writes."""
        return LayerCache(k_BKTH.astype(jnp.float32).swapaxes(2, 3), v_BKTH.astype(jnp.float32))

    def write(self, cfg: ModelConfig, k_BKTH: jax.Array, v_BKTH: jax.Array, pos_BT: jax.Array,
              live_BT: jax.Array, before_B: jax.Array, after_B: jax.Array) -> KiviCache:
        """The layer with T new tokens written: values quantized now,
        key groups quantized as they complete."""
        G, b = cfg.kivi_group, cfg.kivi_bits
        R = self.k_window.shape[2]
        T = pos_BT.shape[1]
        new_pos_BT = jnp.where(live_BT, pos_BT, -1)
        v_codes, v_scale, v_zero = quantize_values(v_BKTH, G, b)
        out = self._replace(v_codes=_scatter(self.v_codes, new_pos_BT, v_codes),
                            v_scale=_scatter(self.v_scale, new_pos_BT, v_scale),
                            v_zero=_scatter(self.v_zero, new_pos_BT, v_zero))
        # Key groups that complete in this call: their members are in the old window or among the new tokens.
        cand_pos_BN = jnp.concatenate([_ring_positions(before_B, R), new_pos_BT], axis=1)
        cand_k = jnp.concatenate([self.k_window.astype(jnp.float32), k_BKTH.astype(jnp.float32)], axis=2)
        n_groups = (R + T) // G + 2
        first_B = jnp.maximum(before_B - R, 0) // G  # the oldest group a candidate can belong to
        group_BN = cand_pos_BN // G - first_B[:, None]
        group_BN = jnp.where((cand_pos_BN >= 0) & (group_BN >= 0) & (group_BN < n_groups), group_BN, n_groups)

        def group_range(k_KNH, g_N):
            k_NKH = k_KNH.transpose(1, 0, 2)
            lo = jax.ops.segment_min(k_NKH, g_N, n_groups + 1)[:n_groups]
            hi = jax.ops.segment_max(k_NKH, g_N, n_groups + 1)[:n_groups]
            return lo.transpose(1, 0, 2), hi.transpose(1, 0, 2)  # [K, n_groups, H]

        lo, hi = jax.vmap(group_range)(cand_k, group_BN)
        k_scale, k_zero = scale_zero(lo, hi, b)
        absolute_BJ = first_B[:, None] + jnp.arange(n_groups)[None, :]
        end_BJ = (absolute_BJ + 1) * G
        completes_BJ = (end_BJ > before_B[:, None]) & (end_BJ <= after_B[:, None])
        out = out._replace(k_scale=_scatter(self.k_scale, jnp.where(completes_BJ, absolute_BJ, -1), k_scale),
                           k_zero=_scatter(self.k_zero, jnp.where(completes_BJ, absolute_BJ, -1), k_zero))
        safe_BN = jnp.minimum(group_BN, n_groups - 1)
        take = lambda a: jnp.take_along_axis(a, safe_BN[:, None, :, None], axis=2)  # noqa: E731
        codes = encode(cand_k, take(k_scale), take(k_zero), b)
        member_done_BN = jnp.take_along_axis(completes_BJ, safe_BN, axis=1) & (group_BN < n_groups)
        out = out._replace(k_codes=_scatter(self.k_codes, jnp.where(member_done_BN, cand_pos_BN, -1),
                                            pack(codes, b)))
        # of a long prompt only the last R reach the window
        keep_BT = live_BT & (pos_BT >= after_B[:, None] - R)
        window_slot = jnp.where(keep_BT, pos_BT % R, -1)
        return out._replace(k_window=_scatter(self.k_window, window_slot, k_BKTH),
                            v_window=_scatter(self.v_window, window_slot, v_BKTH))


@dataclasses.dataclass(frozen=True)
class KiviLayout(Layout):
    """Contiguous addressing with KIVI storage (KiviCache above): the write depends on what the layer holds
    (key groups complete over several writes), so the layout writes and reads through the payload."""

    cfg: ModelConfig | None = None

    def update(self, layer: KiviCache, new: LayerCache, pos_BT: jax.Array, live_BT: jax.Array,
               lengths_B: jax.Array, after_B: jax.Array, table: jax.Array | None) -> tuple[Any, View]:
        cfg, addr = self.cfg, self.addressing
        written = layer.write(cfg, new.k.swapaxes(2, 3), new.v, pos_BT, live_BT, lengths_B, after_B)
        # a prompt attends to its own tokens in full precision, as KIVI's prefill does
        if pos_BT.shape[1] > 1:
            k, v = layer.read(cfg, lengths_B)
            k_pos = jnp.concatenate([addr.positions(lengths_B, layer.slots), jnp.where(live_BT, pos_BT, -1)],
                                    axis=1)
            return written, View(LayerCache(k.swapaxes(2, 3), v).concat(new), k_pos, addr)
        k, v = written.read(cfg, after_B)
        return written, View(LayerCache(k.swapaxes(2, 3), v), addr.positions(after_B, layer.slots), addr)


@register(MODES, "kivi")
def _kivi(cfg: ModelConfig, layer: LayerSpec) -> KiviLayout:
    return KiviLayout(Contiguous(), KiviCache, layer, cfg.cache, cfg=cfg)
