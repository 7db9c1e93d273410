"""Multi-head latent attention (MLA, DeepSeek-V2 §2.1, https://arxiv.org/abs/2405.04434).

Each token is compressed into one latent c_KV [C] that every head's key and value are up-projected
from, plus one RoPE key k_R [R] shared by all heads. The cache holds only concat(c_KV, rope(k_R)),
C + R numbers per token per layer: no factor 2 and no per-head K or V.

Two ways to decode from that cache give the same numbers:
  materialized: up-project the cached latents to per-head K_nope and V, then attend as usual;
  absorbed:     fold W_UK into the query (a query in latent space) and W_UV into the output, so
                attention runs over the cached rows themselves and K, V never exist.
Absorption works because RoPE lives only in the separate R channels. The teaching switch
`mla_rope_on_latent` rotates the compressed keys W_UK·c_KV as well; the materialized path applies
that rotation, the absorbed path cannot (the key's rotation would sit between W_UK and c_KV), so
the two disagree.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from dantinox.cache import LatentCache
from dantinox.config import ModelConfig
from dantinox.model import RMSNorm, _dense, apply_rope, attend, on_window


class LatentAttention(nnx.Module):
    """Attention whose cache is a per-token latent [C] plus a shared RoPE key [R]."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        D, N, H, C, R = cfg.d_model, cfg.n_heads, cfg.head_size, cfg.kv_latent_dim, cfg.rope_head_dim
        if cfg.q_latent_dim is None:  # queries straight from x
            self.q_down, self.q_norm = None, None
            self.q_up = _dense(D, N * (H + R), cfg, rngs)
        else:  # queries through their own low-rank latent (saves activations, not cache)
            self.q_down = _dense(D, cfg.q_latent_dim, cfg, rngs)
            self.q_norm = RMSNorm(cfg.q_latent_dim, cfg.norm_eps, cfg.jnp_dtype)
            self.q_up = _dense(cfg.q_latent_dim, N * (H + R), cfg, rngs)
        self.kv_down = _dense(D, C, cfg, rngs)
        self.kv_norm = RMSNorm(C, cfg.norm_eps, cfg.jnp_dtype)
        self.k_rope = _dense(D, R, cfg, rngs)
        init = nnx.initializers.normal(stddev=C**-0.5)
        self.w_uk = nnx.Param(init(rngs.params(), (C, N, H), cfg.jnp_dtype))  # latent -> per-head key
        self.w_uv = nnx.Param(init(rngs.params(), (C, N, H), cfg.jnp_dtype))  # latent -> per-head value
        self.wo = _dense(N * H, D, cfg, rngs, scale=(2 * cfg.n_layers) ** -0.5)

    def __call__(self, x_BTD: jax.Array, pos_T: jax.Array, cache: LatentCache | None = None,
                 cache_index: jax.Array | int = 0, window: int | None = None) -> tuple[jax.Array, LatentCache | None]:
        cfg = self.cfg
        B, T, _ = x_BTD.shape
        N, H = cfg.n_heads, cfg.head_size
        q_in = x_BTD if self.q_down is None else self.q_norm(self.q_down(x_BTD))
        q_BTNX = self.q_up(q_in).reshape(B, T, N, H + cfg.rope_head_dim)
        q_nope_BTNH = q_BTNX[..., :H]
        q_rope_BTNR = apply_rope(q_BTNX[..., H:], pos_T, cfg.rope_base)
        if cfg.mla_rope_on_latent:  # the query side of rotating the compressed keys
            q_nope_BTNH = apply_rope(q_nope_BTNH, pos_T, cfg.rope_base)
        ckv_BTX = jnp.concatenate([self.kv_norm(self.kv_down(x_BTD)),
                                   apply_rope(self.k_rope(x_BTD), pos_T, cfg.rope_base)], axis=-1)
        read = self._read_absorbed if cfg.mla_decode == "absorbed" else self._read_materialized
        if cache is None:
            out_BTNH = read(T, q_nope_BTNH, q_rope_BTNR, ckv_BTX, pos_T, T)
        else:
            cache = LatentCache(jax.lax.dynamic_update_slice(cache.ckv, ckv_BTX.astype(cache.ckv.dtype),
                                                             (0, cache_index, 0)))
            out_BTNH = on_window(read, cache.ckv.shape[1], cache_index + T,
                                 q_nope_BTNH, q_rope_BTNR, cache.ckv, pos_T, cache_index + T, window=window)
        return self.wo(out_BTNH.reshape(B, T, N * H).astype(x_BTD.dtype)), cache

    @property
    def scale(self) -> float:
        """Softmax scale 1/sqrt(H + R): a score sums a head-size dot product and a RoPE-width one."""
        return (self.cfg.head_size + self.cfg.rope_head_dim) ** -0.5

    def _read_materialized(self, size: int, q_nope_BTNH, q_rope_BTNR, ckv_BSX, q_pos_T, kv_len):
        """Up-project the first `size` cached latents into per-head K and V, then attend (K = N heads)."""
        C, N = self.cfg.kv_latent_dim, self.cfg.n_heads
        ckv_BSX = jax.lax.slice_in_dim(ckv_BSX, 0, size, axis=1).astype(jnp.float32)
        c_BSC, k_rope_BSR = ckv_BSX[..., :C], ckv_BSX[..., C:]
        k_nope_BSNH = jnp.einsum("BSC,CNH->BSNH", c_BSC, self.w_uk[...].astype(jnp.float32))
        if self.cfg.mla_rope_on_latent:  # rotate each compressed key by its own position (slot s holds s)
            k_nope_BSNH = apply_rope(k_nope_BSNH, jnp.arange(size), self.cfg.rope_base)
        k_nope_BNSH = k_nope_BSNH.transpose(0, 2, 1, 3)
        v_BNSH = jnp.einsum("BSC,CNH->BNSH", c_BSC, self.w_uv[...].astype(jnp.float32))
        k_rope_BNSR = jnp.broadcast_to(k_rope_BSR[:, None], (k_rope_BSR.shape[0], N, size, k_rope_BSR.shape[-1]))
        k_BNSX = jnp.concatenate([k_nope_BNSH, k_rope_BNSR], axis=-1)
        q_BTN1X = jnp.concatenate([q_nope_BTNH, q_rope_BTNR], axis=-1)[:, :, :, None]  # K = N, G = 1
        out_BTN1H = attend(q_BTN1X, k_BNSX, v_BNSH, q_pos_T, kv_len, self.cfg.causal, self.scale)
        return out_BTN1H[:, :, :, 0]

    def _read_absorbed(self, size: int, q_nope_BTNH, q_rope_BTNR, ckv_BSX, q_pos_T, kv_len):
        """Attend over the first `size` cached rows directly: one shared "KV head" of width C + R."""
        C = self.cfg.kv_latent_dim
        ckv_B1SX = jax.lax.slice_in_dim(ckv_BSX, 0, size, axis=1)[:, None]
        q_lat_BTNC = jnp.einsum("BTNH,CNH->BTNC", q_nope_BTNH.astype(jnp.float32),
                                self.w_uk[...].astype(jnp.float32))  # W_UK folded into the query
        q_BT1NX = jnp.concatenate([q_lat_BTNC, q_rope_BTNR.astype(jnp.float32)], axis=-1)[:, :, None]
        out_BT1NC = attend(q_BT1NX, ckv_B1SX, ckv_B1SX[..., :C], q_pos_T, kv_len, self.cfg.causal, self.scale)
        # W_UV applied after attention, to T query rows only: values are never formed for the S cached tokens.
        return jnp.einsum("BTNC,CNH->BTNH", out_BT1NC[:, :, 0], self.w_uv[...].astype(jnp.float32))
