"""The dantinox transformer, top-down: RMSNorm, RoPE, Attention, LatentAttention (with DeepSeek-V3.2's
LightningIndexer), the recurrent mixers GatedDeltaNet, ShortConv and Mamba2 (one causal_conv), MLP, Block,
Transformer.

Attention's arithmetic is dantinox/architectures/attention.py's `attend`. Shapes are named with the alphabet
in dantinox/architectures/config.py. The KV cache is a value passed in and returned (see
dantinox/cache/container.py): it knows how many tokens each sequence holds, and every layer writes its new
keys through its layout and attends over
the View the layout gives back. How long the cache is (key buckets while decoding, a prefix and suffix in
diffusion) is the caller's business. No module keeps state between calls.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dantinox import ops
from dantinox.architectures.attention import NEG_INF, attend
from dantinox.architectures.config import LayerSpec, ModelConfig
from dantinox.cache import (
    IndexedLatentCache,
    KVCache,
    LatentCache,
    LayerCache,
    Layout,
    View,
    init_cache,
    layer_layout,
    layouts,
)
from dantinox.cache.checks import check_cache, check_write
from dantinox.checks import check_ids, concrete_index


def _dense(d_in: int, d_out: int, cfg: ModelConfig, rngs: nnx.Rngs, scale: float = 1.0) -> nnx.Linear:
    init = nnx.initializers.normal(stddev=scale * d_in**-0.5)
    return nnx.Linear(d_in, d_out, use_bias=False, dtype=cfg.jnp_dtype, param_dtype=cfg.param_jnp_dtype,
                      kernel_init=init, dot_general=ops.dot_general, promote_dtype=ops.promote_dtype,
                      rngs=rngs)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype: Any):
        self.scale = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    @jax.named_scope("norm")
    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)  # normalise in f32 whatever the activation dtype
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (x32 * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def apply_rope(x: jax.Array, positions_BT: jax.Array, base: float) -> jax.Array:
    """Rotate channel pairs (i, i + H/2) of x [B, T, ..., H] by angles position · base^(-2i/H)."""
    half = x.shape[-1] // 2
    return rotate_pairs(x, positions_BT, base ** (-jnp.arange(half, dtype=jnp.float32) / half))


def rotate_pairs(x: jax.Array, positions_BT: jax.Array, freqs: Any) -> jax.Array:
    """Rotate channel pairs (i, i + W/2) of x [B, T, ..., W] by angles position · freqs[..., i] (freqs
    broadcasts against x's [..., W/2]: one row per head where heads keep different pairs)."""
    positions_BT = jnp.broadcast_to(positions_BT, x.shape[:2])
    angles = positions_BT.astype(jnp.float32).reshape(x.shape[:2] + (1,) * (x.ndim - 2)) * freqs
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class Fill(NamedTuple):
    """How a forward call fills the cache: the same for every layer (the container's lengths, read once)."""

    live_BT: jax.Array  # which new tokens are real (a ragged batch pads)
    before_B: jax.Array  # lengths before the call
    after_B: jax.Array  # lengths after it
    page_table: jax.Array | None


def _view(layout: Layout, cache: Any, new: Any, pos_BT: jax.Array, fill: Fill | None) -> tuple[Any, View]:
    """The layer after its write and what attention reads; without a cache, the new tokens alone."""
    if cache is None:
        return None, View(new, pos_BT, layout.addressing)
    return layout.update(cache, new, pos_BT, fill.live_BT, fill.before_B, fill.after_B, fill.page_table)


class Attention(nnx.Module):
    """Multi-head attention with K KV heads: MHA (K = N), GQA (1 < K < N) and MQA (K = 1) in one einsum.

    The layer's spec gives its K, H and RoPE base. The layout the cache gives it (linear, ring, chunked or
    paged addressing; float or quantized storage; default: under the model's own cache config) decides what
    the cache holds and which keys a query may see; attention reads its View and has one path for all.
    A layer with `learned_sinks` (gpt-oss) holds one sink logit per query head, a parameter that joins its
    softmax's denominator and caches nothing.
    """

    def __init__(self, cfg: ModelConfig, layer: LayerSpec, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.layer = layer
        n, k, h = cfg.n_heads, layer.kv_heads, layer.head_size
        # reads the keys and values of layer `layer.source`: queries only
        self.shared = layer.kind == "shared"
        qkv_heads = n + (0 if self.shared else 2 * k)
        self.wqkv = _dense(cfg.d_model, qkv_heads * h, cfg, rngs)  # one matmul for Q, K, V
        self.wo = _dense(n * h, cfg.d_model, cfg, rngs, scale=(2 * cfg.n_layers) ** -0.5)
        if cfg.qk_norm:  # one scale of H per layer, shared by its heads
            self.q_norm = RMSNorm(h, cfg.norm_eps, cfg.param_jnp_dtype)
            self.k_norm = RMSNorm(h, cfg.norm_eps, cfg.param_jnp_dtype)
        else:
            self.q_norm = self.k_norm = None
        # gpt-oss's learned sinks: a logit per query head (in the queries' order, K groups of G), random here
        self.sinks = (nnx.Param(nnx.initializers.normal(stddev=1.0)(rngs.params(), (n,), cfg.param_jnp_dtype))
                      if layer.learned_sinks else None)

    def __call__(self, x_BTD: jax.Array, pos_BT: jax.Array, cache: LayerCache | None = None,
                 fill: Fill | None = None, layout: Layout | None = None,
                 source_view: View | None = None) -> tuple[jax.Array, LayerCache | None, View]:
        """Attend from T new tokens at positions pos_BT; with a cache, through its layout's write and view.

        A shared layer writes nothing and reads `source_view`, the view its source layer's write produced.
        Returns the output, the layer's cache after the write and the view attention read.
        """
        cfg, base = self.cfg, self.layer.rope_base
        layout = layer_layout(cfg, self.layer) if layout is None else layout
        B, T, _ = x_BTD.shape
        K, H = self.layer.kv_heads, self.layer.head_size
        G = cfg.n_heads // K
        with jax.named_scope("qkv"):  # named scopes label the ops in profiles (benchmarks/decode_profile.py)
            qkv = self.wqkv(x_BTD)
            q = qkv[..., :K * G * H].reshape(B, T, K, G, H)
            if self.q_norm is not None:  # QK-norm: each head normalized before RoPE
                q = self.q_norm(q)
            q_BTKGH = apply_rope(q, pos_BT, base)
            if not self.shared:
                k, v = jnp.split(qkv[..., K * G * H:], 2, axis=-1)
                k = k.reshape(B, T, K, H)
                k = k if self.k_norm is None else self.k_norm(k)
                k_BKTH = apply_rope(k, pos_BT, base).transpose(0, 2, 1, 3)
                v_BKTH = v.reshape(B, T, K, H).transpose(0, 2, 1, 3)
        with jax.named_scope("cache_write"):
            if self.shared:  # nothing to store: the source layer's view, as its own write left it
                view = source_view
            elif cache is None:
                cache, view = _view(layout, None, LayerCache(k_BKTH.swapaxes(2, 3), v_BKTH), pos_BT, fill)
            else:
                # each payload type stores new tokens its own way (rounded to the cache dtype, or quantized)
                cache, view = _view(layout, cache, layout.encode(k_BKTH, v_BKTH), pos_BT, fill)
        sink_q = sinks = None
        if view.addressing.keeps_sinks:  # attention sinks: the query's position in the cache
            addr = view.addressing
            sink_q = apply_rope(q, pos_BT - addr.sink_shift(pos_BT), base)
            sinks = (view.k_pos_BS >= 0) & (view.k_pos_BS < addr.sinks)
        with jax.named_scope("attend"):
            kv = view.payload
            scored = cache is not None and layout.scored  # eviction: the write needs the weights
            logits_KG = None if self.sinks is None else self.sinks[...].reshape(K, G)
            out_BTKGH = attend(q_BTKGH, kv.k, kv.v, view.mask(pos_BT, cfg.causal), None, kv.k_scale,
                               kv.v_scale, sink_q, sinks, with_weights=scored, scale_layout=kv.scale_layout,
                               sink_logits_KG=logits_KG)
        if scored:
            with jax.named_scope("cache_write"):
                out_BTKGH, weights_BKGTS = out_BTKGH
                weights_BS = jnp.einsum("BKGTS,BT->BS", weights_BKGTS, fill.live_BT.astype(jnp.float32))
                cache = layout.keep(cache, view, weights_BS, fill.after_B)
        with jax.named_scope("out_proj"):
            return self.wo(out_BTKGH.reshape(B, T, K * G * H).astype(x_BTD.dtype)), cache, view


class LatentAttention(nnx.Module):
    """Multi-head latent attention (MLA, DeepSeek-V2 §2.1, arXiv:2405.04434):
    the cache is a latent plus a RoPE key.

    Each token is compressed into one latent c_KV [C] that every head's key and value are up-projected
    from, plus one RoPE key k_R [R] shared by all heads; the cache holds concat(c_KV, rope(k_R)), C + R
    numbers per token per layer. Two decode paths give the same numbers: materialized up-projects the
    cached latents to per-head K and V; absorbed folds W_UK into the query and W_UV into the output, so
    attention runs over the cached rows themselves (and a quantized latent's scales fold into it).
    Absorption works because RoPE lives only in the R channels; the teaching switch `mla_rope_on_latent`
    also rotates W_UK·c_KV, which only the materialized path can apply, so the two then disagree.

    A model converted from K/V heads (dantinox/architectures/convert.py, MHA2MLA) differs in three fields:
    `mla_rope_heads` RoPE key heads of R / rope heads channels each, read by their group of query heads;
    per layer, the frequency pairs each keeps (`LayerSpec.rope_pairs`); a nope width of its own
    (`mla_nope_dim`, so a score keeps the original head's width); and no norm on the latent.
    """

    def __init__(self, cfg: ModelConfig, layer: LayerSpec, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.layer = layer  # its RoPE base and kept pairs; the config refuses per-layer K and H for a latent
        D, N, H, C, R = cfg.d_model, cfg.n_heads, cfg.head_size, cfg.kv_latent_dim, cfg.rope_head_dim
        X = cfg.qk_nope_dim + R // cfg.mla_rope_heads  # one query head: its nope and RoPE channels
        if cfg.q_latent_dim is None:  # queries straight from x
            self.q_down, self.q_norm = None, None
            self.q_up = _dense(D, N * X, cfg, rngs)
        else:  # queries through their own low-rank latent (saves activations, not cache)
            self.q_down = _dense(D, cfg.q_latent_dim, cfg, rngs)
            self.q_norm = RMSNorm(cfg.q_latent_dim, cfg.norm_eps, cfg.param_jnp_dtype)
            self.q_up = _dense(cfg.q_latent_dim, N * X, cfg, rngs)
        self.kv_down = _dense(D, C, cfg, rngs)
        self.kv_norm = RMSNorm(C, cfg.norm_eps, cfg.param_jnp_dtype) if cfg.mla_latent_norm else None
        self.k_rope = _dense(D, R, cfg, rngs)
        init = nnx.initializers.normal(stddev=C**-0.5)
        dtype = cfg.param_jnp_dtype
        self.w_uk = nnx.Param(init(rngs.params(), (C, N, cfg.qk_nope_dim), dtype))  # latent -> keys
        self.w_uv = nnx.Param(init(rngs.params(), (C, N, H), dtype))  # latent -> per-head value
        self.wo = _dense(N * H, D, cfg, rngs, scale=(2 * cfg.n_layers) ** -0.5)
        self.indexer = (None if cfg.index_topk is None
                        else LightningIndexer(cfg, cfg.q_latent_dim or D, rngs=rngs))

    def rope_freqs(self) -> np.ndarray:
        """[rope heads, pairs] the angle per position of each RoPE key head's channel pairs: its own pairs
        0, 1, .. at base^(-2i/width) (DeepSeek-V2), or the kept pairs i of the full head (`rope_pairs`)."""
        cfg, base = self.cfg, self.layer.rope_base
        per_head = cfg.rope_head_dim // cfg.mla_rope_heads
        if self.layer.rope_pairs is None:
            pairs, width = [range(per_head // 2)] * cfg.mla_rope_heads, per_head
        else:
            pairs, width = self.layer.rope_pairs, cfg.qk_nope_dim + per_head
        return np.asarray([[base ** (-2 * i / width) for i in head] for head in pairs], np.float32)

    def __call__(self, x_BTD: jax.Array, pos_BT: jax.Array, cache: LatentCache | None = None,
                 fill: Fill | None = None, layout: Layout | None = None,
                 source_view: View | None = None) -> tuple[jax.Array, LatentCache | None, View]:
        cfg = self.cfg
        layout = layer_layout(cfg, self.layer) if layout is None else layout
        B, T, _ = x_BTD.shape
        N, H, Hn, Kr = cfg.n_heads, cfg.head_size, cfg.qk_nope_dim, cfg.mla_rope_heads
        freqs_KP = self.rope_freqs()
        with jax.named_scope("qkv"):  # the scopes Attention uses: they sort the ops of a profile
            q_in = x_BTD if self.q_down is None else self.q_norm(self.q_down(x_BTD))
            q_BTNX = self.q_up(q_in).reshape(B, T, N, Hn + cfg.rope_head_dim // Kr)
            q_nope_BTNH = q_BTNX[..., :Hn]
            freqs_NP = np.repeat(freqs_KP, N // Kr, axis=0)  # a group's
            q_rope_BTNR = rotate_pairs(q_BTNX[..., Hn:], pos_BT, freqs_NP)
            if cfg.mla_rope_on_latent:  # the query side of rotating the compressed keys
                q_nope_BTNH = apply_rope(q_nope_BTNH, pos_BT, self.layer.rope_base)
            c_BTC = self.kv_down(x_BTD)
            c_BTC = c_BTC if self.kv_norm is None else self.kv_norm(c_BTC)
            k_rope_BTKR = rotate_pairs(self.k_rope(x_BTD).reshape(B, T, Kr, -1), pos_BT, freqs_KP)
            ckv_BTX = jnp.concatenate([c_BTC, k_rope_BTKR.reshape(B, T, -1)], axis=-1)
        read = self._read_absorbed if cfg.mla_decode == "absorbed" else self._read_materialized
        if self.indexer is None:
            with jax.named_scope("cache_write"):
                new = LatentCache(ckv_BTX) if cache is None else layout.encode(ckv_BTX)
                cache, view = _view(layout, cache, new, pos_BT, fill)
            with jax.named_scope("attend"):
                out_BTNH = read(q_nope_BTNH, q_rope_BTNR, view, view.mask(pos_BT, cfg.causal))
            with jax.named_scope("out_proj"):
                return self.wo(out_BTNH.reshape(B, T, N * H).astype(x_BTD.dtype)), cache, view
        # DeepSeek-V3.2's sparse attention: store the indexer's key too, then read only each query's top k
        with jax.named_scope("cache_write"):
            idx_BTI = self.indexer.key(x_BTD, pos_BT, self.layer.rope_base)
            new = IndexedLatentCache(ckv_BTX, idx_BTI) if cache is None else layout.encode(ckv_BTX, idx_BTI)
            cache, view = _view(layout, cache, new, pos_BT, fill)
        with jax.named_scope("attend"):
            chosen = self.indexer.select(q_in, x_BTD, pos_BT, self.layer.rope_base, view, cfg.causal)
            rows = lambda a: a.reshape((B * T, 1) + a.shape[2:])  # noqa: E731  each query a row of its own
            out_RNH = read(rows(q_nope_BTNH), rows(q_rope_BTNR), chosen, chosen.k_pos_BS[:, None, :] >= 0)
        with jax.named_scope("out_proj"):
            return self.wo(out_RNH.reshape(B, T, N * H).astype(x_BTD.dtype)), cache, chosen

    @property
    def scale(self) -> float:
        """Softmax scale 1/sqrt(nope + RoPE width of a query head): a score sums both dot products."""
        return (self.cfg.qk_nope_dim + self.cfg.rope_head_dim // self.cfg.mla_rope_heads) ** -0.5

    def _read_materialized(self, q_nope_BTNH, q_rope_BTNR, view: View, mask_BTS):
        """Up-project the cached latents into per-head K and V, then attend (K = N heads)."""
        C, N, Kr = self.cfg.kv_latent_dim, self.cfg.n_heads, self.cfg.mla_rope_heads
        ckv_BSX = view.payload.ckv.astype(jnp.float32)
        if view.payload.ckv_scale is not None:  # up-projecting needs the values themselves
            ckv_BSX = ckv_BSX * view.payload.ckv_scale[..., None]
        if self.cfg.mla_rope_on_latent:  # rotated per sequence's positions: a shared pool becomes B rows
            ckv_BSX = jnp.broadcast_to(ckv_BSX, view.k_pos_BS.shape + ckv_BSX.shape[2:])
        B, S, _ = ckv_BSX.shape
        c_BSC, k_rope_BSKR = ckv_BSX[..., :C], ckv_BSX[..., C:].reshape(B, S, Kr, -1)
        k_nope_BSNH = jnp.einsum("BSC,CNH->BSNH", c_BSC, self.w_uk[...].astype(jnp.float32))
        if self.cfg.mla_rope_on_latent:  # rotate each compressed key by the position its slot holds
            k_nope_BSNH = apply_rope(k_nope_BSNH, jnp.maximum(view.k_pos_BS, 0), self.layer.rope_base)
        v_BNSH = jnp.einsum("BSC,CNH->BNSH", c_BSC, self.w_uv[...].astype(jnp.float32))
        k_rope_BSNR = jnp.repeat(k_rope_BSKR, N // Kr, axis=2)  # each query head reads its group's RoPE key
        k_BNSX = jnp.concatenate([k_nope_BSNH, k_rope_BSNR], axis=-1).transpose(0, 2, 1, 3)
        q_BTN1X = jnp.concatenate([q_nope_BTNH, q_rope_BTNR], axis=-1)[:, :, :, None]  # K = N, G = 1
        out_BTN1H = attend(q_BTN1X, k_BNSX, v_BNSH, mask_BTS, self.scale, keys_slot_last=False)
        return out_BTN1H[:, :, :, 0]

    def _read_absorbed(self, q_nope_BTNH, q_rope_BTNR, view: View, mask_BTS):
        """Attend over the cached rows directly: one shared "KV head" of width C + R."""
        C, N, Kr = self.cfg.kv_latent_dim, self.cfg.n_heads, self.cfg.mla_rope_heads
        ckv_B1SX = view.payload.ckv[:, None]
        scale_B1S = None if view.payload.ckv_scale is None else view.payload.ckv_scale[:, None]
        with jax.named_scope("qkv"):  # a weight matmul per query, as the query projection is
            q_lat_BTNC = jnp.einsum("BTNH,CNH->BTNC", q_nope_BTNH.astype(jnp.float32),
                                    self.w_uk[...].astype(jnp.float32))  # W_UK folded into the query
        q_rope_BTNR = q_rope_BTNR.astype(jnp.float32)
        if Kr > 1:  # a query head's RoPE part faces its group's R / Kr cached channels, zeros the others'
            group_NK = np.repeat(np.eye(Kr, dtype=np.float32), N // Kr, axis=0)
            q_rope_BTNKP = jnp.einsum("BTNP,NK->BTNKP", q_rope_BTNR, group_NK)
            q_rope_BTNR = q_rope_BTNKP.reshape(q_rope_BTNR.shape[:3] + (-1,))
        q_BT1NX = jnp.concatenate([q_lat_BTNC, q_rope_BTNR], axis=-1)[:, :, None]
        out_BT1NC = attend(q_BT1NX, ckv_B1SX, ckv_B1SX[..., :C], mask_BTS, self.scale, scale_B1S, scale_B1S,
                           keys_slot_last=False)
        # W_UV applied after attention, to T query rows only: values are never formed for the S cached tokens.
        with jax.named_scope("out_proj"):
            return jnp.einsum("BTNC,CNH->BTNH", out_BT1NC[:, :, 0], self.w_uv[...].astype(jnp.float32))


class LightningIndexer(nnx.Module):
    """DeepSeek-V3.2's lightning indexer (DSA, arXiv:2512.02556 §2.1): which k cached tokens a query reads.

    Each token stores one key k_s of I channels (the cache's `idx_k`, beside its latent); a query token t has
    `index_heads` query heads q_tj of I channels and a weight w_tj per head, and scores every visible cached
    token with I(t, s) = sum_j w_tj ReLU(q_tj · k_s). The top `index_topk` scores pick the latents the main
    attention reads. Queries come from the query latent (x without one), keys from x through a norm; both
    rotate their first R channels by RoPE (R = rope_head_dim), as in DeepSeek's inference code
    (https://github.com/deepseek-ai/DeepSeek-V3.2-Exp, inference/model.py, which normalises the key with a
    LayerNorm where this uses the model's RMSNorm, and keeps the indexer's cache in fp8).
    """

    def __init__(self, cfg: ModelConfig, q_width: int, *, rngs: nnx.Rngs):
        self.cfg = cfg
        J, I = cfg.index_heads, cfg.index_head_size
        self.q_up = _dense(q_width, J * I, cfg, rngs)
        self.k_proj = _dense(cfg.d_model, I, cfg, rngs)
        self.k_norm = RMSNorm(I, cfg.norm_eps, cfg.param_jnp_dtype)
        self.weights = _dense(cfg.d_model, J, cfg, rngs)

    def _rope(self, x: jax.Array, pos_BT: jax.Array, base: float) -> jax.Array:
        R = self.cfg.rope_head_dim  # the first R channels turn with the position, the rest do not
        return jnp.concatenate([apply_rope(x[..., :R], pos_BT, base), x[..., R:]], axis=-1)

    def key(self, x_BTD: jax.Array, pos_BT: jax.Array, base: float) -> jax.Array:
        """[B, T, I] the key each new token stores."""
        return self._rope(self.k_norm(self.k_proj(x_BTD)), pos_BT, base)

    def scores(self, q_in: jax.Array, x_BTD: jax.Array, pos_BT: jax.Array, base: float,
               keys_BSI: jax.Array) -> jax.Array:
        """[B, T, S] I(t, s) of the T new queries against S stored keys."""
        B, T, _ = x_BTD.shape
        J, I = self.cfg.index_heads, self.cfg.index_head_size
        q_BTJI = self._rope(self.q_up(q_in).reshape(B, T, J, I), pos_BT, base).astype(jnp.float32)
        w_BTJ = self.weights(x_BTD).astype(jnp.float32) * (J * I) ** -0.5  # the heads' weights, scaled once
        dots_BTJS = jax.nn.relu(jnp.einsum("BTJI,BSI->BTJS", q_BTJI, keys_BSI.astype(jnp.float32)))
        return jnp.einsum("BTJS,BTJ->BTS", dots_BTJS, w_BTJ)

    def select(self, q_in: jax.Array, x_BTD: jax.Array, pos_BT: jax.Array, base: float, view: View,
               causal: bool) -> View:
        """The View the main attention reads: for each query token (a row of its own, B · T rows) the latents
        of its top-k visible tokens by I(t, s), k = min(index_topk, S); a selected slot it may not see is
        -1."""
        B, T, _ = x_BTD.shape
        payload = view.payload
        S = payload.slots
        rows_B = jnp.arange(B) if payload.ckv.shape[0] == B else jnp.zeros((B,), jnp.int32)  # a pool: one row
        visible_BTS = view.mask(pos_BT, causal)
        scores_BTS = self.scores(q_in, x_BTD, pos_BT, base, payload.index_keys()[rows_B])
        _, top_BTk = jax.lax.top_k(jnp.where(visible_BTS, scores_BTS, NEG_INF), min(self.cfg.index_topk, S))
        at = (rows_B[:, None, None], top_BTk)  # gather only the k chosen slots of each query
        k_pos_BTS = jnp.where(visible_BTS, jnp.broadcast_to(view.k_pos_BS[:, None], visible_BTS.shape), -1)
        k_pos_Rk = jnp.take_along_axis(k_pos_BTS, top_BTk, axis=-1).reshape(B * T, -1)
        scale = None if payload.ckv_scale is None else payload.ckv_scale[at].reshape(B * T, -1)
        chosen = LatentCache(payload.ckv[at].reshape((B * T, -1, payload.ckv.shape[-1])), scale)
        return View(chosen, k_pos_Rk, view.addressing)


def causal_conv(window_BCW: jax.Array | None, new_BTC: jax.Array, kernel_CW: jax.Array, live_BT: jax.Array,
                dtype: Any) -> tuple[jax.Array, jax.Array]:
    """A short causal depthwise convolution over the T new inputs after the W the window holds (zeros before
    the first token): each output channel c sums kernel[c, j] times its input W - 1 - j steps back, j < W.

    Returns the float32 outputs [B, T, C] and the window [B, C, W] the next call needs: the last W live inputs
    of each row (live tokens come first in a row, so a ragged row's padding never enters it).
    """
    B, T, C = new_BTC.shape
    W = kernel_CW.shape[-1]
    window = jnp.zeros((B, C, W), dtype) if window_BCW is None else window_BCW
    inputs = jnp.concatenate([window.swapaxes(1, 2), new_BTC.astype(window.dtype)], axis=1)  # [B, W + T, C]
    kernel = kernel_CW.astype(jnp.float32)
    out_BTC = sum(inputs[:, 1 + j:1 + j + T].astype(jnp.float32) * kernel[:, j] for j in range(W))
    n_B = jnp.sum(live_BT, axis=1)
    last = jax.vmap(lambda seq, n: jax.lax.dynamic_slice_in_dim(seq, n, W, axis=0))(inputs, n_B)
    return out_BTC, last.swapaxes(1, 2)


def _delta_rule_step(S_BVHH: jax.Array, t: tuple) -> tuple[jax.Array, jax.Array]:
    """One token of the gated delta rule: decay the state, correct what it returns for k towards v, read q."""
    q_t, k_t, v_t, g_t, b_t = t  # g_t [B, V, 1] (a gate per head) or [B, V, H] (per key channel)
    S_BVHH = S_BVHH * jnp.exp(g_t)[..., None]  # row i of S (key channel i) decays by its gate
    delta = (v_t - jnp.einsum("BVkd,BVk->BVd", S_BVHH, k_t)) * b_t[..., None]
    S_BVHH = S_BVHH + k_t[..., :, None] * delta[..., None, :]
    return S_BVHH, jnp.einsum("BVkd,BVk->BVd", S_BVHH, q_t)


class GatedDeltaNet(nnx.Module):
    """Linear attention with a recurrent state (a 'state' layer): Gated DeltaNet, arXiv:2412.06464.

    Per value head a matrix S (keys' H channels x values' H channels) replaces the cached keys and values.
    Each token first decays it by its gate, then writes its value at its key with the delta rule
    (S += k ⊗ β (v - Sᵀk): the value S already returns for k is corrected, not added twice), and its
    query reads S. Queries, keys and values first go through a short causal depthwise convolution (the last
    `conv` inputs, kept in the cache) and a SiLU; queries and keys are L2-normalised; the output is
    normalised per head and gated by SiLU(z) (the arrangement of Qwen3-Next's linear layers in
    transformers' `Qwen3NextGatedDeltaNet`, here with one projection for q, k, v and z). K key heads serve
    V = G · K value heads. No RoPE: order comes from the recurrence. The cache is dantinox/cache/state.py's
    StateCache, constant in the number of tokens.

    With `decay="channel"` the layer is Kimi Delta Attention (Kimi Linear, arXiv:2510.26692): the same state
    and delta rule, S_t = (I - β_t k_t k_tᵀ) Diag(α_t) S_{t-1} + β_t k_t v_tᵀ, whose decay α_t has one entry
    per key channel instead of one per head (Gated DeltaNet's α_t I); each entry is exp(-A_h · softplus(a +
    dt_bias)) with a bias per channel, as transformers' `KimiLinearDeltaAttention` computes it (its output
    gate is the same SiLU(z) after a per-head norm). So it is an option of this kind, not a kind of its own.
    """

    def __init__(self, cfg: ModelConfig, layer: LayerSpec, *, rngs: nnx.Rngs):
        self.cfg, self.layer = cfg, layer
        K, V, H, W = layer.kv_heads, layer.value_heads, layer.head_size, layer.conv
        self.in_proj = _dense(cfg.d_model, (2 * K + 2 * V) * H, cfg, rngs)  # q, k, v and the output gate z
        # the decay's width: 1 per value head (Gated DeltaNet), H per key channel (Kimi Delta Attention)
        self.gate_width = H if layer.decay == "channel" else 1
        # per value head: its write strength β, then its decay input(s)
        self.gates = _dense(cfg.d_model, V + V * self.gate_width, cfg, rngs)
        self.conv = nnx.Param(nnx.initializers.normal(stddev=W**-0.5)(rngs.params(), ((2 * K + V) * H, W),
                                                                        cfg.param_jnp_dtype))
        self.dt_bias = nnx.Param(jnp.ones((V, self.gate_width), jnp.float32))
        rates = jax.random.uniform(rngs.params(), (V,), jnp.float32, 1.0, 16.0)  # decay rates A of each head
        self.a_log = nnx.Param(jnp.log(rates))
        self.norm = RMSNorm(H, cfg.norm_eps, cfg.param_jnp_dtype)
        self.out = _dense(V * H, cfg.d_model, cfg, rngs, scale=(2 * cfg.n_layers) ** -0.5)

    def __call__(self, x_BTD: jax.Array, pos_BT: jax.Array, cache: Any = None, fill: Fill | None = None,
                 layout: Layout | None = None,
                 source_view: View | None = None) -> tuple[jax.Array, Any, None]:
        """The T new tokens through the state; with a cache, from its state and into it (tokens not live in
        `fill` leave it as it was). Returns the output, the new state and no view (nothing to share)."""
        layer = self.layer
        B, T, _ = x_BTD.shape
        K, V, H = layer.kv_heads, layer.value_heads, layer.head_size
        with jax.named_scope("qkv"):
            qkvz = self.in_proj(x_BTD)
            qkv, z_BTVH = qkvz[..., :(2 * K + V) * H], qkvz[..., (2 * K + V) * H:].reshape(B, T, V, H)
            gates = self.gates(x_BTD).astype(jnp.float32)
            b_BTV, a_BTVg = gates[..., :V], gates[..., V:].reshape(B, T, V, self.gate_width)
            live_BT = jnp.ones((B, T), bool) if fill is None else fill.live_BT
            mixed, window = causal_conv(None if cache is None else cache.window, qkv, self.conv[...], live_BT,
                                        self.cfg.jnp_dtype)
            mixed = jax.nn.silu(mixed)
            q, k, v = jnp.split(mixed, [K * H, 2 * K * H], axis=-1)
            unit = lambda t: t * jax.lax.rsqrt(jnp.sum(t * t, -1, keepdims=True) + 1e-6)  # noqa: E731
            G = V // K  # key head i serves value heads i·G .. i·G + G - 1
            q = jnp.repeat(unit(q.reshape(B, T, K, H)), G, axis=2) * H**-0.5
            k = jnp.repeat(unit(k.reshape(B, T, K, H)), G, axis=2)
            v = v.reshape(B, T, V, H)
            beta = jnp.where(live_BT[..., None], jax.nn.sigmoid(b_BTV), 0.0)  # a padding token writes nothing
            rate = jnp.exp(self.a_log[...])[:, None] * jax.nn.softplus(a_BTVg + self.dt_bias[...])
            decay = jnp.where(live_BT[..., None, None], -rate, 0.0)  # the gate's log: exp(0) keeps the state

        with jax.named_scope("attend"):
            S0 = jnp.zeros((B, V, H, H), jnp.float32) if cache is None else cache.s
            steps = tuple(jnp.swapaxes(t, 0, 1) for t in (q, k, v, decay, beta))  # time first
            S, o_TBVH = jax.lax.scan(_delta_rule_step, S0, steps)
            o_BTVH = self.norm(jnp.swapaxes(o_TBVH, 0, 1)) * jax.nn.silu(z_BTVH.astype(jnp.float32))
        if cache is not None:
            cache = type(cache)(S, window)
        with jax.named_scope("out_proj"):
            return self.out(o_BTVH.reshape(B, T, V * H).astype(x_BTD.dtype)), cache, None


class ShortConv(nnx.Module):
    """LFM2's gated short convolution (a 'conv' layer; LFM2 technical report, arXiv:2511.23404, and
    transformers' `Lfm2ShortConv`): three projections B, C and x of the input to the layer's channels
    (LFM2: D); B·x through a causal depthwise convolution of `conv` taps; the result gated by C and projected
    back to D. No attention and no position: its cache is the convolution's last inputs
    (dantinox/cache/state.py's ConvCache), constant in the number of tokens.
    """

    def __init__(self, cfg: ModelConfig, layer: LayerSpec, *, rngs: nnx.Rngs):
        self.cfg, self.layer = cfg, layer
        C, W = layer.channels, layer.conv
        self.in_proj = _dense(cfg.d_model, 3 * C, cfg, rngs)  # B, C, x
        init = nnx.initializers.normal(stddev=W**-0.5)
        self.conv = nnx.Param(init(rngs.params(), (C, W), cfg.param_jnp_dtype))
        self.out = _dense(C, cfg.d_model, cfg, rngs, scale=(2 * cfg.n_layers) ** -0.5)

    def __call__(self, x_BTD: jax.Array, pos_BT: jax.Array, cache: Any = None, fill: Fill | None = None,
                 layout: Layout | None = None,
                 source_view: View | None = None) -> tuple[jax.Array, Any, None]:
        """The T new tokens through the convolution, after the inputs the cache's window holds."""
        B, T, _ = x_BTD.shape
        b, c, h = jnp.split(self.in_proj(x_BTD), 3, axis=-1)  # [B, T, channels] each
        live_BT = jnp.ones((B, T), bool) if fill is None else fill.live_BT
        mixed, window = causal_conv(None if cache is None else cache.window, b * h, self.conv[...], live_BT,
                                    self.cfg.jnp_dtype)
        y = c.astype(jnp.float32) * mixed
        return self.out(y.astype(x_BTD.dtype)), None if cache is None else type(cache)(window), None


def _ssm_step(h_BNPS: jax.Array, t: tuple) -> tuple[jax.Array, jax.Array]:
    """One token of Mamba-2's scan: decay each head's state by exp(Δ·A), add Δ · x ⊗ B, read it with C."""
    x_BNP, b_BNS, c_BNS, dt_BN, decay_BN = t
    write_BNPS = (dt_BN[..., None] * x_BNP)[..., None] * b_BNS[:, :, None]
    h_BNPS = h_BNPS * jnp.exp(decay_BN)[..., None, None] + write_BNPS
    return h_BNPS, jnp.einsum("BNPS,BNS->BNP", h_BNPS, c_BNS)


class Mamba2(nnx.Module):
    """A Mamba-2 mixer (a 'mamba' layer; Dao and Gu, arXiv:2405.21060; the M layers of Nemotron-H and
    Granite 4.0-H), run as the plain sequential scan of its recurrence.

    One projection gives z (the gate), the inputs x of `value_heads` heads of P = head_size channels, B and C
    (N = ssm_state channels per group of heads) and Δ per head; x, B and C go through a short causal
    convolution and SiLU. Per head, with A < 0 a learned scalar: h ← exp(Δ·A) h + Δ · x ⊗ B, y = h·C + D·x.
    The output is RMS-normalised per group after the SiLU(z) gate, then projected back to D. The cache is
    dantinox/cache/state.py's MambaCache: the heads' P x N states and the convolution's window.
    """

    def __init__(self, cfg: ModelConfig, layer: LayerSpec, *, rngs: nnx.Rngs):
        self.cfg, self.layer = cfg, layer
        Nh, P, S, G, W = layer.value_heads, layer.head_size, layer.ssm_state, layer.ssm_groups, layer.conv
        conv_dim = Nh * P + 2 * G * S
        self.in_proj = _dense(cfg.d_model, Nh * P + conv_dim + Nh, cfg, rngs)  # z, then x B C, then Δ
        self.conv = nnx.Param(nnx.initializers.normal(stddev=W**-0.5)(rngs.params(), (conv_dim, W),
                                                                        cfg.param_jnp_dtype))
        self.dt_bias = nnx.Param(jnp.zeros((Nh,), jnp.float32))
        rates = jax.random.uniform(rngs.params(), (Nh,), jnp.float32, 1.0, 16.0)  # A = -rate per head
        self.a_log = nnx.Param(jnp.log(rates))
        self.skip = nnx.Param(jnp.ones((Nh,), jnp.float32))  # D: the input's direct path
        self.norm = RMSNorm(Nh * P // G, cfg.norm_eps, cfg.param_jnp_dtype)
        self.out = _dense(Nh * P, cfg.d_model, cfg, rngs, scale=(2 * cfg.n_layers) ** -0.5)

    def __call__(self, x_BTD: jax.Array, pos_BT: jax.Array, cache: Any = None, fill: Fill | None = None,
                 layout: Layout | None = None,
                 source_view: View | None = None) -> tuple[jax.Array, Any, None]:
        """The T new tokens through the scan, from the cache's state and into it (tokens not live in `fill`
        leave it as it was: their Δ is 0)."""
        layer = self.layer
        B, T, _ = x_BTD.shape
        Nh, P, S, G = layer.value_heads, layer.head_size, layer.ssm_state, layer.ssm_groups
        proj = self.in_proj(x_BTD)
        z_BTE, xbc, dt_BTN = jnp.split(proj, [Nh * P, proj.shape[-1] - Nh], axis=-1)
        live_BT = jnp.ones((B, T), bool) if fill is None else fill.live_BT
        mixed, window = causal_conv(None if cache is None else cache.window, xbc, self.conv[...], live_BT,
                                    self.cfg.jnp_dtype)
        mixed = jax.nn.silu(mixed)
        x, b, c = jnp.split(mixed, [Nh * P, Nh * P + G * S], axis=-1)
        x_BTNP = x.reshape(B, T, Nh, P)
        # each head reads its group's B and C
        b_BTNS, c_BTNS = (jnp.repeat(t.reshape(B, T, G, S), Nh // G, axis=2) for t in (b, c))
        rate = jax.nn.softplus(dt_BTN.astype(jnp.float32) + self.dt_bias[...])
        dt = jnp.where(live_BT[..., None], rate, 0.0)
        decay = -jnp.exp(self.a_log[...]) * dt  # log of exp(Δ·A): 0 for a padding token, keeps the state
        h0 = jnp.zeros((B, Nh, P, S), jnp.float32) if cache is None else cache.ssm
        steps = tuple(jnp.swapaxes(t, 0, 1) for t in (x_BTNP, b_BTNS, c_BTNS, dt, decay))  # time first
        h, y_TBNP = jax.lax.scan(_ssm_step, h0, steps)
        y_BTNP = jnp.swapaxes(y_TBNP, 0, 1) + self.skip[...][:, None] * x_BTNP
        gated = y_BTNP.reshape(B, T, Nh * P) * jax.nn.silu(z_BTE.astype(jnp.float32))
        y = self.norm(gated.reshape(B, T, G, Nh * P // G)).reshape(B, T, Nh * P)
        return self.out(y.astype(x_BTD.dtype)), None if cache is None else type(cache)(h, window), None


class MLP(nnx.Module):
    """Gated feed-forward: down(act(gate(x)) * up(x)), act silu (SwiGLU) or tanh-approximated gelu (GeGLU)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.gelu = cfg.mlp == "geglu"
        self.gate_up = _dense(cfg.d_model, 2 * cfg.mlp_width, cfg, rngs)  # one matmul for both
        self.down = _dense(cfg.mlp_width, cfg.d_model, cfg, rngs, scale=(2 * cfg.n_layers) ** -0.5)

    @jax.named_scope("mlp")
    def __call__(self, x: jax.Array) -> jax.Array:
        gate, up = jnp.split(self.gate_up(x), 2, axis=-1)
        act = jax.nn.gelu(gate, approximate=True) if self.gelu else jax.nn.silu(gate)
        return self.down(act * up)


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, layer: LayerSpec, *, rngs: nnx.Rngs):
        mixers = {"state": GatedDeltaNet, "conv": ShortConv, "mamba": Mamba2}  # the recurrent kinds
        if layer.kind == "mlp":  # an MLP-only block (Nemotron-H): no token mixer
            self.norm1, self.attn = None, None
        else:
            self.norm1 = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.param_jnp_dtype)
            self.attn = (mixers[layer.kind](cfg, layer, rngs=rngs) if layer.kind in mixers
                         else LatentAttention(cfg, layer, rngs=rngs) if cfg.attention == "latent"
                         else Attention(cfg, layer, rngs=rngs))
        self.norm2 = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.param_jnp_dtype)
        self.mlp = MLP(cfg, rngs=rngs)
        if cfg.post_norms:  # each branch's output normalized before the residual add (Gemma 2 and 3)
            self.attn_out_norm = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.param_jnp_dtype)
            self.mlp_out_norm = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.param_jnp_dtype)
        else:
            self.attn_out_norm = self.mlp_out_norm = None

    def __call__(self, x, pos_BT, cache=None, fill=None, layout=None, source_view=None):
        view = None
        if self.attn is not None:  # an MLP-only block mixes no tokens: its cache (nothing) passes through
            h, cache, view = self.attn(self.norm1(x), pos_BT, cache, fill, layout, source_view)
            x = x + (h if self.attn_out_norm is None else self.attn_out_norm(h))
        h = self.mlp(self.norm2(x))
        x = x + (h if self.mlp_out_norm is None else self.mlp_out_norm(h))
        return x, cache, view


@functools.partial(jax.jit, static_argnums=0)
def _compiled_forward(graphdef: nnx.GraphDef, state: nnx.State, ids_BT: jax.Array, kv_caches: KVCache | None):
    """The checked entry point's forward as one compiled program per model and shape, not op by op.

    Called eagerly, the forward would dispatch (and, the first time, compile) each of its hundreds of
    operations on its own: measured on the four-layer test model, 4.7 s for the first one-token step and 25 ms
    for each after it. Inside another trace (a training step, a gradient) this is one more nested jit.
    """
    return nnx.merge(graphdef, state).forward(ids_BT, kv_caches)


class Transformer(nnx.Module):
    """Token ids in, next-token logits out; optionally reads and writes a KV cache.

    Call it as `logits, kv_caches, aux = model(ids, use_cache=True, kv_caches=cache)`: the tokens go after
    what the cache holds (`cache.lengths`).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.jnp_dtype,
                               param_dtype=cfg.param_jnp_dtype,
                               embedding_init=nnx.initializers.normal(stddev=1.0), rngs=rngs)
        self.blocks = nnx.List([Block(cfg, layer, rngs=rngs) for layer in cfg.layers])
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.param_jnp_dtype)
        self.head = None if cfg.tie_embeddings else _dense(cfg.d_model, cfg.vocab_size, cfg, rngs)

    def __call__(self, ids: Any, *, use_cache: bool = False, kv_caches: KVCache | None = None,
                 cache_index: int | None = None) -> tuple[jax.Array, KVCache | None, dict[str, Any]]:
        """Checked entry point: every shape, dtype and bound is verified before any computation.

        `cache_index`, if given, must be where the cache's fill says the tokens go (a gap is refused).
        """
        ids = check_ids(self.cfg.vocab_size, ids)
        B, T = ids.shape
        if not use_cache:
            if kv_caches is not None:
                raise ValueError("kv_caches: given, but use_cache=False; pass use_cache=True to use it")
            if T > self.cfg.max_context:
                raise ValueError(f"ids: {T} tokens exceed max_context={self.cfg.max_context}")
            logits, _ = _compiled_forward(*nnx.split(self), ids, None)
            return logits, None, {}
        if kv_caches is None:
            kv_caches = init_cache(self.cfg, B)
        cfg = (self.config_for(kv_caches) if isinstance(kv_caches, KVCache)
               else self.cfg)  # else: refused below
        check_cache(cfg, kv_caches, B)
        check_write(cfg, kv_caches, None if cache_index is None else concrete_index(cache_index), T)
        logits, kv_caches = _compiled_forward(*nnx.split(self), ids, kv_caches)
        lengths = np.asarray(kv_caches.lengths)
        return logits, kv_caches, {"cache_index": int(lengths.max()), "lengths": lengths}

    def config_for(self, kv_caches: KVCache | None) -> ModelConfig:
        """This model's config with the cache config `kv_caches` was made with (its own without one)."""
        config = None if kv_caches is None else kv_caches.config
        return self.cfg if config is None else self.cfg.with_cache(config)

    def forward(self, ids_BT: jax.Array, kv_caches: KVCache | None = None, live_BT: jax.Array | None = None,
                positions_BT: jax.Array | None = None, logits_at_BP: jax.Array | None = None,
                with_views: bool = False) -> tuple[jax.Array, KVCache | None]:
        """Unchecked forward used inside compiled code; callers guarantee the bounds.

        With a cache, the T tokens of row b sit at positions lengths[b] .. lengths[b] + T - 1; those marked
        in `live_BT` (default: all) are written and counted into `lengths`, the rest (a ragged batch's
        padding) are neither. A bidirectional caller that rewrites slots it already holds passes
        `positions_BT` itself (diffusion); the fill then becomes max(lengths, last position + 1).
        `logits_at_BP` picks which P of the T positions get logits (a serving engine needs one per prompt
        chunk). Each layer writes and reads through the layout the cache's config gives it (the model holds
        none). `with_views` also returns each layer's View, what its attention read (for DeepSeek-V3.2's
        indexed layers, the latents its top-k selection gathered; None for a recurrent or MLP-only block).
        """
        B, T = ids_BT.shape
        fill = None
        if kv_caches is None:
            pos_BT = positions_BT
            if positions_BT is None:
                pos_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        else:
            before = kv_caches.lengths
            live_BT = jnp.ones((B, T), bool) if live_BT is None else live_BT
            if positions_BT is None:
                pos_BT = before[:, None] + jnp.arange(T, dtype=jnp.int32)
                after = before + jnp.sum(live_BT, axis=1, dtype=jnp.int32)
            else:
                pos_BT = positions_BT
                after = jnp.maximum(before, jnp.max(jnp.where(live_BT, pos_BT + 1, 0), axis=1))
            fill = Fill(live_BT, before, after, kv_caches.page_table)
        with jax.named_scope("embed"):
            x = ops.take_rows(self.embed.embedding[...], ids_BT)  # nnx.Embed's lookup
            x = x.astype(self.cfg.jnp_dtype)
            if self.cfg.scale_embeddings:  # sqrt(D) rounded to the compute dtype first, as Gemma's reference
                x = x * jnp.asarray(self.cfg.d_model**0.5, self.cfg.jnp_dtype)
        new_layers, views = [], []
        block_layouts = zip(self.blocks, layouts(self.config_for(kv_caches)), strict=True)
        for i, (block, layout) in enumerate(block_layouts):
            source = views[layout.layer.source] if layout.layer.kind == "shared" else None  # KV sharing
            x, layer_cache, view = block(x, pos_BT, None if kv_caches is None else kv_caches.layers[i], fill,
                                         layout, source)
            new_layers.append(layer_cache)
            views.append(view)
        if kv_caches is not None:
            kv_caches = kv_caches._replace(layers=tuple(new_layers), lengths=fill.after_B)
        x = self.norm(x)
        if logits_at_BP is not None:  # the vocabulary projection only where a next token is wanted
            x = jnp.take_along_axis(x, logits_at_BP[:, :, None], axis=1)
        logits = self.logits(x)
        return (logits, kv_caches, tuple(views)) if with_views else (logits, kv_caches)

    @jax.named_scope("logits")
    def logits(self, x_BTD: jax.Array) -> jax.Array:
        if self.head is None:  # tied: x times the embedding table, as a dense layer's product
            scale = self.cfg.d_model**-0.5 if self.cfg.scale_tied_logits else 1.0
            x, embedding = ops.promote_dtype((x_BTD, self.embed.embedding[...]))
            dims = (((x.ndim - 1,), (1,)), ((), ()))
            logits = ops.dot_general(x, embedding, dims, preferred_element_type=jnp.float32)  # f32 logits
            return logits * scale
        return self.head(x_BTD).astype(jnp.float32)
