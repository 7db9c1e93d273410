"""The dantinox transformer, top-down: RMSNorm, RoPE, attend, Attention, LatentAttention, MLP, Block, Transformer.

Shapes are named with the alphabet in dantinox/config.py. The KV cache is a value passed in and
returned (see dantinox/cache.py): attention writes its new keys into the cache it is given and reads
every slot of it, masking the slots past `kv_len`. How long that cache is (key windows while decoding,
a prefix and suffix in diffusion) is the caller's business. No module keeps state between calls.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dantinox.cache import KVCache, LatentCache, LayerCache, check_cache, check_write, init_cache
from dantinox.checks import check_ids, concrete_index
from dantinox.config import ModelConfig

NEG_INF = float(np.finfo(np.float32).min)  # large negative, not -inf: keeps fully-masked rows NaN-free


def _dense(d_in: int, d_out: int, cfg: ModelConfig, rngs: nnx.Rngs, scale: float = 1.0) -> nnx.Linear:
    init = nnx.initializers.normal(stddev=scale * d_in**-0.5)
    return nnx.Linear(d_in, d_out, use_bias=False, dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_dtype,
                      kernel_init=init, rngs=rngs)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype: Any):
        self.scale = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    @jax.named_scope("norm")
    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)  # normalise in f32 whatever the activation dtype
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (x32 * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def apply_rope(x: jax.Array, positions_T: jax.Array, base: float) -> jax.Array:
    """Rotate channel pairs (i, i + H/2) of x [B, T, ..., H] by angles position · base^(-2i/H)."""
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions_T.astype(jnp.float32)[:, None] * freqs  # [T, H/2]
    angles = angles.reshape((1, x.shape[1]) + (1,) * (x.ndim - 3) + (half,))
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def attend(q_BTKGH: jax.Array, k_BKSH: jax.Array, v_BKSH: jax.Array, q_pos_T: jax.Array,
           kv_len: jax.Array | int, causal: bool, scale: float | None = None, window: int | None = None,
           k_pos_S: jax.Array | None = None) -> jax.Array:
    """Scaled dot-product attention of grouped queries over K/V heads; K and V are never repeated.

    Key slots at or past `kv_len` are masked. `scale` defaults to 1/sqrt(query width); V may be
    narrower than Q and K (MLA's absorbed path). A local layer passes its `window` W (keys more than
    W - 1 positions back are masked) and, for a ring buffer, the position of each key `k_pos_S`
    (negative: an empty slot); by default slot s holds position s.
    """
    scale = q_BTKGH.shape[-1] ** -0.5 if scale is None else scale
    B, T, K, G, _ = q_BTKGH.shape
    k_pos_S = jnp.arange(k_BKSH.shape[2]) if k_pos_S is None else k_pos_S
    mask_TS = ((k_pos_S >= 0) & (k_pos_S < kv_len))[None, :]  # slots past the filled length hold no token
    if causal:
        mask_TS = mask_TS & (k_pos_S[None, :] <= q_pos_T[:, None])
    if window is not None:  # the band: the current token and the W - 1 before it
        mask_TS = mask_TS & (q_pos_T[:, None] - k_pos_S[None, :] < window)
    k_BKSH, v_BKSH = k_BKSH.astype(jnp.float32), v_BKSH.astype(jnp.float32)
    if uses_one_token_arrangement(B, T, K, G):
        return _attend_one_token(q_BTKGH[:, 0].astype(jnp.float32), k_BKSH, v_BKSH, mask_TS[0], scale)[:, None]
    scores_BKGTS = jnp.einsum("BTKGH,BKSH->BKGTS", q_BTKGH.astype(jnp.float32), k_BKSH) * scale
    scores_BKGTS = jnp.where(mask_TS, scores_BKGTS, NEG_INF)  # mask before the softmax
    probs = jax.nn.softmax(scores_BKGTS, axis=-1)
    return jnp.einsum("BKGTS,BKSH->BTKGH", probs, v_BKSH)


def uses_one_token_arrangement(B: int, T: int, K: int, G: int) -> bool:
    """Whether `attend` takes `_attend_one_token` for these shapes: a batch decoding GQA (measured rule, below)."""
    return T == 1 and B > 1 and K > 1 and G > 1


def _attend_one_token(q_BKGH: jax.Array, k_BKSH: jax.Array, v_BKSH: jax.Array, mask_S: jax.Array,
                      scale: float) -> jax.Array:
    """One new token per sequence: the G query heads of each KV head are the rows of one small matmul.

    The same numbers as the general path, arranged so that XLA:CPU runs both products as library
    matmuls over [G, S] blocks; the general arrangement copies the probabilities into a transposed
    layout per layer. Measured (`benchmarks/decode.py`, "attention arrangement" rows), this way is faster
    for GQA (K > 1 and G > 1) at batch 2 and more, and slower at batch 1, for MHA (G = 1) and for one
    shared KV head (MQA, MLA's absorbed path), which all keep the general path.
    """
    scores_BKGS = jnp.einsum("BKGH,BKSH->BKGS", q_BKGH, k_BKSH) * scale
    probs_BKGS = jax.nn.softmax(jnp.where(mask_S, scores_BKGS, NEG_INF), axis=-1)
    return jnp.einsum("BKSH,BKGS->BKHG", v_BKSH, probs_BKGS).transpose(0, 1, 3, 2)  # [B, K, G, H]


class Attention(nnx.Module):
    """Multi-head attention with K KV heads: MHA (K = N), GQA (1 < K < N) and MQA (K = 1) in one einsum.

    With a `window` W the layer is local (sliding-window attention) and caches into a ring buffer.
    """

    def __init__(self, cfg: ModelConfig, window: int | None = None, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.window = window
        n, k, h = cfg.n_heads, cfg.n_kv_heads, cfg.head_size
        self.wqkv = _dense(cfg.d_model, (n + 2 * k) * h, cfg, rngs)  # one matmul for Q, K and V
        self.wo = _dense(n * h, cfg.d_model, cfg, rngs, scale=(2 * cfg.n_layers) ** -0.5)

    def __call__(self, x_BTD: jax.Array, pos_T: jax.Array, cache: LayerCache | None = None,
                 kv_len: jax.Array | int | None = None) -> tuple[jax.Array, LayerCache | None]:
        """Attend from T new tokens at positions pos_T; with a cache, write them at slot pos_T[0] first."""
        cfg = self.cfg
        B, T, _ = x_BTD.shape
        K, G, H = cfg.n_kv_heads, cfg.groups, cfg.head_size
        with jax.named_scope("qkv"):  # named scopes label the ops in profiles (benchmarks/decode_profile.py)
            q, k, v = jnp.split(self.wqkv(x_BTD), [K * G * H, (K * G + K) * H], axis=-1)
            q_BTKGH = apply_rope(q.reshape(B, T, K, G, H), pos_T, cfg.rope_base)
            k_BKTH = apply_rope(k.reshape(B, T, K, H), pos_T, cfg.rope_base).transpose(0, 2, 1, 3)
            v_BKTH = v.reshape(B, T, K, H).transpose(0, 2, 1, 3)
        if cache is None:
            with jax.named_scope("attend"):
                out_BTKGH = attend(q_BTKGH, k_BKTH, v_BKTH, pos_T, T, cfg.causal, window=self.window)
        elif self.window is None:
            with jax.named_scope("cache_write"):
                cache = cache.write(k_BKTH, v_BKTH, pos_T[0])
            with jax.named_scope("attend"):
                out_BTKGH = attend(q_BTKGH, *cache.read(), pos_T, kv_len, cfg.causal)
        else:  # ring buffer: attend over what it held before this write plus the T new keys, then write
            with jax.named_scope("attend"):
                k_old, v_old = cache.read()
                keep = k_old.dtype  # round the new keys as the cache stores them
                k_BKSH = jnp.concatenate([k_old, k_BKTH.astype(keep)], axis=2)
                v_BKSH = jnp.concatenate([v_old, v_BKTH.astype(keep)], axis=2)
                k_pos_S = jnp.concatenate([cache.slot_positions(pos_T[0]), pos_T])
                out_BTKGH = attend(q_BTKGH, k_BKSH, v_BKSH, pos_T, kv_len, cfg.causal, window=self.window,
                                   k_pos_S=k_pos_S)
            with jax.named_scope("cache_write"):
                cache = cache.write(k_BKTH, v_BKTH, pos_T[0])
        with jax.named_scope("out_proj"):
            return self.wo(out_BTKGH.reshape(B, T, K * G * H).astype(x_BTD.dtype)), cache


class LatentAttention(nnx.Module):
    """Multi-head latent attention (MLA, DeepSeek-V2 §2.1, arXiv:2405.04434): the cache is a latent plus a RoPE key.

    Each token is compressed into one latent c_KV [C] that every head's key and value are up-projected
    from, plus one RoPE key k_R [R] shared by all heads; the cache holds concat(c_KV, rope(k_R)), C + R
    numbers per token per layer. Two decode paths give the same numbers: materialized up-projects the
    cached latents to per-head K and V; absorbed folds W_UK into the query and W_UV into the output, so
    attention runs over the cached rows themselves. Absorption works because RoPE lives only in the R
    channels; the teaching switch `mla_rope_on_latent` also rotates W_UK·c_KV, which only the
    materialized path can apply, so the two then disagree.
    """

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
                 kv_len: jax.Array | int | None = None) -> tuple[jax.Array, LatentCache | None]:
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
        if cache is None:
            ckv_BSX, kv_len = ckv_BTX, T
        else:
            cache = cache.write(ckv_BTX, pos_T[0])
            (ckv_BSX,) = cache.read()
        read = self._read_absorbed if cfg.mla_decode == "absorbed" else self._read_materialized
        out_BTNH = read(q_nope_BTNH, q_rope_BTNR, ckv_BSX, pos_T, kv_len)
        return self.wo(out_BTNH.reshape(B, T, N * H).astype(x_BTD.dtype)), cache

    @property
    def scale(self) -> float:
        """Softmax scale 1/sqrt(H + R): a score sums a head-size dot product and a RoPE-width one."""
        return (self.cfg.head_size + self.cfg.rope_head_dim) ** -0.5

    def _read_materialized(self, q_nope_BTNH, q_rope_BTNR, ckv_BSX, q_pos_T, kv_len):
        """Up-project the cached latents into per-head K and V, then attend (K = N heads)."""
        C, N = self.cfg.kv_latent_dim, self.cfg.n_heads
        B, S, _ = ckv_BSX.shape
        ckv_BSX = ckv_BSX.astype(jnp.float32)
        c_BSC, k_rope_BSR = ckv_BSX[..., :C], ckv_BSX[..., C:]
        k_nope_BSNH = jnp.einsum("BSC,CNH->BSNH", c_BSC, self.w_uk[...].astype(jnp.float32))
        if self.cfg.mla_rope_on_latent:  # rotate each compressed key by its own position (slot s holds s)
            k_nope_BSNH = apply_rope(k_nope_BSNH, jnp.arange(S), self.cfg.rope_base)
        v_BNSH = jnp.einsum("BSC,CNH->BNSH", c_BSC, self.w_uv[...].astype(jnp.float32))
        k_rope_BNSR = jnp.broadcast_to(k_rope_BSR[:, None], (B, N, S, k_rope_BSR.shape[-1]))
        k_BNSX = jnp.concatenate([k_nope_BSNH.transpose(0, 2, 1, 3), k_rope_BNSR], axis=-1)
        q_BTN1X = jnp.concatenate([q_nope_BTNH, q_rope_BTNR], axis=-1)[:, :, :, None]  # K = N, G = 1
        out_BTN1H = attend(q_BTN1X, k_BNSX, v_BNSH, q_pos_T, kv_len, self.cfg.causal, self.scale)
        return out_BTN1H[:, :, :, 0]

    def _read_absorbed(self, q_nope_BTNH, q_rope_BTNR, ckv_BSX, q_pos_T, kv_len):
        """Attend over the cached rows directly: one shared "KV head" of width C + R."""
        C = self.cfg.kv_latent_dim
        ckv_B1SX = ckv_BSX[:, None]
        q_lat_BTNC = jnp.einsum("BTNH,CNH->BTNC", q_nope_BTNH.astype(jnp.float32),
                                self.w_uk[...].astype(jnp.float32))  # W_UK folded into the query
        q_BT1NX = jnp.concatenate([q_lat_BTNC, q_rope_BTNR.astype(jnp.float32)], axis=-1)[:, :, None]
        out_BT1NC = attend(q_BT1NX, ckv_B1SX, ckv_B1SX[..., :C], q_pos_T, kv_len, self.cfg.causal, self.scale)
        # W_UV applied after attention, to T query rows only: values are never formed for the S cached tokens.
        return jnp.einsum("BTNC,CNH->BTNH", out_BT1NC[:, :, 0], self.w_uv[...].astype(jnp.float32))


class MLP(nnx.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.gate_up = _dense(cfg.d_model, 2 * cfg.mlp_width, cfg, rngs)  # one matmul for both
        self.down = _dense(cfg.mlp_width, cfg.d_model, cfg, rngs, scale=(2 * cfg.n_layers) ** -0.5)

    @jax.named_scope("mlp")
    def __call__(self, x: jax.Array) -> jax.Array:
        gate, up = jnp.split(self.gate_up(x), 2, axis=-1)
        return self.down(jax.nn.silu(gate) * up)


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, window: int | None = None, *, rngs: nnx.Rngs):
        self.norm1 = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.jnp_dtype)
        self.attn = (LatentAttention(cfg, rngs=rngs) if cfg.attention == "mla"
                     else Attention(cfg, window, rngs=rngs))
        self.norm2 = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.jnp_dtype)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, pos_T, cache=None, kv_len=None):
        h, cache = self.attn(self.norm1(x), pos_T, cache, kv_len)
        x = x + h
        x = x + self.mlp(self.norm2(x))
        return x, cache


class Transformer(nnx.Module):
    """Token ids in, next-token logits out; optionally reads and writes a KV cache.

    Call it as `logits, kv_caches, aux = model(ids, use_cache=True, kv_caches=cache, cache_index=i)`.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_dtype,
                               embedding_init=nnx.initializers.normal(stddev=1.0), rngs=rngs)
        self.blocks = nnx.List([Block(cfg, window, rngs=rngs) for window in cfg.layer_windows])
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.jnp_dtype)
        self.head = None if cfg.tie_embeddings else _dense(cfg.d_model, cfg.vocab_size, cfg, rngs)

    def __call__(self, ids: Any, *, use_cache: bool = False, kv_caches: KVCache | None = None,
                 cache_index: int = 0) -> tuple[jax.Array, KVCache | None, dict[str, Any]]:
        """Checked entry point: every shape, dtype and bound is verified before any computation."""
        ids = check_ids(self.cfg.vocab_size, ids)
        B, T = ids.shape
        if not use_cache:
            if kv_caches is not None:
                raise ValueError("kv_caches: given, but use_cache=False; pass use_cache=True to use it")
            if T > self.cfg.max_context:
                raise ValueError(f"ids: {T} tokens exceed max_context={self.cfg.max_context}")
            logits, _ = self.forward(ids)
            return logits, None, {}
        if kv_caches is None:
            kv_caches = init_cache(self.cfg, B)
        check_cache(self.cfg, kv_caches, B)
        cache_index = concrete_index(cache_index)
        check_write(kv_caches, cache_index, T)
        logits, kv_caches = self.forward(ids, kv_caches, cache_index)
        return logits, kv_caches, {"cache_index": cache_index + T}

    def forward(self, ids_BT: jax.Array, kv_caches: KVCache | None = None, cache_index: jax.Array | int = 0,
                kv_len: jax.Array | int | None = None) -> tuple[jax.Array, KVCache | None]:
        """Unchecked forward used inside compiled code; callers guarantee the bounds.

        The T tokens sit at positions cache_index, ..., cache_index + T - 1 and are written at those
        slots of `kv_caches`; attention reads slots [0, kv_len), by default cache_index + T (causal
        decoding). A bidirectional caller that has filled the slots after the span passes kv_len itself.
        """
        T = ids_BT.shape[1]
        pos_T = cache_index + jnp.arange(T, dtype=jnp.int32)
        kv_len = cache_index + T if kv_len is None else kv_len
        with jax.named_scope("embed"):
            x = self.embed(ids_BT)
        new_caches = []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, pos_T, None if kv_caches is None else kv_caches[i], kv_len)
            new_caches.append(layer_cache)
        return self.logits(self.norm(x)), (None if kv_caches is None else tuple(new_caches))

    @jax.named_scope("logits")
    def logits(self, x_BTD: jax.Array) -> jax.Array:
        x32 = x_BTD.astype(jnp.float32)  # logits in f32 for a stable softmax
        if self.head is None:
            scale = self.cfg.d_model**-0.5 if self.cfg.scale_tied_logits else 1.0
            return x32 @ self.embed.embedding[...].astype(jnp.float32).T * scale
        return self.head(x_BTD).astype(jnp.float32)
