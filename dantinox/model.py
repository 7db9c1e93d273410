"""The dantinox transformer, top-down: RMSNorm → RoPE → Attention → MLP → Block → Transformer.

Shapes are named with the alphabet in dantinox/config.py. The KV cache is a value passed in and
returned (see dantinox/cache.py); no module keeps state between calls.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dantinox.cache import KVCache, LayerCache, check_cache, check_write, init_cache
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


def kv_windows(length: int) -> tuple[int, ...]:
    """Static key-window sizes for a cache of `length` slots: 128, 192, 256, 384, 512, 768, ..., length.

    Attention reads the smallest window that covers the filled part, so a step's cost follows the
    filled length (within 1.5x) instead of the allocated length.
    """
    sizes, size = [], 128
    while size < length:
        sizes += [s for s in (size, size * 3 // 2) if s < length]
        size *= 2
    return (*sizes, length)


def window_for(length: int, kv_len: int) -> int:
    """The smallest window of `kv_windows(length)` that holds `kv_len` slots."""
    return next(w for w in kv_windows(length) if w >= kv_len)


def attend(q_BTKGH: jax.Array, k_BKSH: jax.Array, v_BKSH: jax.Array, q_pos_T: jax.Array,
           kv_len: jax.Array | int, causal: bool, scale: float | None = None) -> jax.Array:
    """Scaled dot-product attention of grouped queries over K/V heads; K and V are never repeated.

    `scale` defaults to 1/sqrt(query width); V may be narrower than Q and K (MLA's absorbed path).
    """
    scale = q_BTKGH.shape[-1] ** -0.5 if scale is None else scale
    scores_BKGTS = jnp.einsum("BTKGH,BKSH->BKGTS", q_BTKGH.astype(jnp.float32),
                              k_BKSH.astype(jnp.float32)) * scale
    k_pos_S = jnp.arange(k_BKSH.shape[2])
    mask_TS = (k_pos_S < kv_len)[None, :]  # slots past the filled length hold no token
    if causal:
        mask_TS = mask_TS & (k_pos_S[None, :] <= q_pos_T[:, None])
    scores_BKGTS = jnp.where(mask_TS, scores_BKGTS, NEG_INF)  # mask before the softmax
    probs = jax.nn.softmax(scores_BKGTS, axis=-1)
    return jnp.einsum("BKGTS,BKSH->BTKGH", probs, v_BKSH.astype(jnp.float32))


def on_window(fn: Any, length: int, kv_len: jax.Array | int, *operands: Any, window: int | None = None) -> Any:
    """`fn(size, *operands)`: `size` is how many of the cache's `length` slots attention reads.

    Decode loops fix `window` statically (the cache is then exactly that long); an eager call with a
    concrete kv_len reads the smallest window of `kv_windows(length)` that covers it; a traced kv_len
    without a window reads every slot (the mask hides the unfilled ones).
    """
    if window is None:
        window = window_for(length, kv_len) if isinstance(kv_len, int) else length
    return fn(window, *operands)


def attend_window(q_BTKGH: jax.Array, k_BKSH: jax.Array, v_BKSH: jax.Array, q_pos_T: jax.Array,
                  kv_len: jax.Array | int, causal: bool, seq_axis: int = 2, scale: float | None = None,
                  window: int | None = None) -> jax.Array:
    """`attend` over only the first w slots of a static cache, w a window >= kv_len (see `on_window`)."""
    def over(size, q, k, v, qp, n):
        take = lambda a: jax.lax.slice_in_dim(a, 0, size, axis=seq_axis)  # noqa: E731
        return attend(q, take(k), take(v), qp, n, causal, scale)

    return on_window(over, k_BKSH.shape[seq_axis], kv_len, q_BTKGH, k_BKSH, v_BKSH, q_pos_T, kv_len, window=window)


class Attention(nnx.Module):
    """Multi-head attention with K KV heads: MHA (K = N), GQA (1 < K < N) and MQA (K = 1) in one einsum."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        n, k, h = cfg.n_heads, cfg.kv_heads, cfg.head_size
        self.wqkv = _dense(cfg.d_model, (n + 2 * k) * h, cfg, rngs)  # one matmul for Q, K and V
        self.wo = _dense(n * h, cfg.d_model, cfg, rngs, scale=(2 * cfg.n_layers) ** -0.5)

    def __call__(self, x_BTD: jax.Array, pos_T: jax.Array, cache: LayerCache | None = None,
                 cache_index: jax.Array | int = 0, window: int | None = None) -> tuple[jax.Array, LayerCache | None]:
        cfg = self.cfg
        B, T, _ = x_BTD.shape
        q_BTKGH, k_BKTH, v_BKTH = self.project(x_BTD, pos_T)
        if cache is None:
            out_BTKGH = attend(q_BTKGH, k_BKTH, v_BKTH, pos_T, T, cfg.causal)
        else:
            at = (0, 0, cache_index, 0)
            cache = LayerCache(jax.lax.dynamic_update_slice(cache.k, k_BKTH.astype(cache.k.dtype), at),
                               jax.lax.dynamic_update_slice(cache.v, v_BKTH.astype(cache.v.dtype), at))
            out_BTKGH = attend_window(q_BTKGH, cache.k, cache.v, pos_T, cache_index + T, cfg.causal, window=window)
        return self.output(out_BTKGH, x_BTD.dtype), cache

    def project(self, x_BTD: jax.Array, pos_T: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Queries [B, T, K, G, H] and keys, values [B, K, T, H], with RoPE at positions pos_T."""
        cfg = self.cfg
        B, T, _ = x_BTD.shape
        K, G, H = cfg.kv_heads, cfg.groups, cfg.head_size
        q, k, v = jnp.split(self.wqkv(x_BTD), [K * G * H, (K * G + K) * H], axis=-1)
        q_BTKGH = apply_rope(q.reshape(B, T, K, G, H), pos_T, cfg.rope_base)
        k_BKTH = apply_rope(k.reshape(B, T, K, H), pos_T, cfg.rope_base).transpose(0, 2, 1, 3)
        v_BKTH = v.reshape(B, T, K, H).transpose(0, 2, 1, 3)
        return q_BTKGH, k_BKTH, v_BKTH

    def output(self, out_BTKGH: jax.Array, dtype: Any) -> jax.Array:
        """Merge the heads and project back to the model width."""
        B, T = out_BTKGH.shape[:2]
        return self.wo(out_BTKGH.reshape(B, T, -1).astype(dtype))


class MLP(nnx.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.gate_up = _dense(cfg.d_model, 2 * cfg.mlp_hidden, cfg, rngs)  # one matmul for both
        self.down = _dense(cfg.mlp_hidden, cfg.d_model, cfg, rngs, scale=(2 * cfg.n_layers) ** -0.5)

    def __call__(self, x: jax.Array) -> jax.Array:
        gate, up = jnp.split(self.gate_up(x), 2, axis=-1)
        return self.down(jax.nn.silu(gate) * up)


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.norm1 = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.jnp_dtype)
        if cfg.attention == "mla":
            from dantinox.mla import LatentAttention  # MLA lives in its own file

            self.attn = LatentAttention(cfg, rngs=rngs)
        else:
            self.attn = Attention(cfg, rngs=rngs)
        self.norm2 = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.jnp_dtype)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, pos_T, cache=None, cache_index=0, window=None):
        h, cache = self.attn(self.norm1(x), pos_T, cache, cache_index, window)
        x = x + h
        x = x + self.mlp(self.norm2(x))
        return x, cache


class Transformer(nnx.Module):
    """Token ids in, next-token logits out; optionally reads and writes a static KV cache.

    Call it as `logits, kv_caches, aux = model(ids, use_cache=True, kv_caches=cache, cache_index=i)`.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_dtype,
                               embedding_init=nnx.initializers.normal(stddev=1.0), rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.jnp_dtype)
        self.head = None if cfg.tie_embeddings else _dense(cfg.d_model, cfg.vocab_size, cfg, rngs)

    def __call__(self, ids: Any, *, use_cache: bool = False, kv_caches: KVCache | None = None,
                 cache_index: int = 0) -> tuple[jax.Array, KVCache | None, dict[str, Any]]:
        """Checked entry point: every shape, dtype and bound is verified before any computation."""
        ids = check_ids(self.cfg, ids)
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
                window: int | None = None) -> tuple[jax.Array, KVCache | None]:
        """Unchecked forward used inside compiled loops; callers guarantee the bounds.

        `window` fixes how many cache slots attention reads (it must cover cache_index + T); decode
        loops pass it so the program has no branches. Without it the window follows the index.
        """
        T = ids_BT.shape[1]
        pos_T = cache_index + jnp.arange(T, dtype=jnp.int32)
        x = self.embed(ids_BT)
        new_caches = []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, pos_T, None if kv_caches is None else kv_caches[i], cache_index, window)
            new_caches.append(layer_cache)
        return self.logits(self.norm(x)), (None if kv_caches is None else tuple(new_caches))

    def logits(self, x_BTD: jax.Array) -> jax.Array:
        x32 = x_BTD.astype(jnp.float32)  # logits in f32 for a stable softmax
        if self.head is None:
            return x32 @ self.embed.embedding[...].astype(jnp.float32).T * self.cfg.d_model**-0.5
        return self.head(x_BTD).astype(jnp.float32)


def check_ids(cfg: ModelConfig, ids: Any, name: str = "ids") -> jax.Array:
    """Validate token ids: an integer array [batch, tokens] with values in [0, vocab_size)."""
    if isinstance(ids, jax.core.Tracer):
        arr = ids
    else:
        arr = np.asarray(ids)
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected an integer array of shape [batch, tokens], got shape {arr.shape}")
    if not jnp.issubdtype(arr.dtype, jnp.integer):
        raise ValueError(f"{name}: expected integer token ids, got dtype {arr.dtype}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"{name}: expected at least one sequence of at least one token, got shape {arr.shape}")
    if not isinstance(arr, jax.core.Tracer):
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= cfg.vocab_size:
            raise ValueError(f"{name}: token ids must lie in [0, {cfg.vocab_size}), got values in [{lo}, {hi}]")
    return jnp.asarray(arr, jnp.int32)


def concrete_index(cache_index: Any) -> int:
    """The cache index as a Python int; a traced index cannot be bounds-checked, so it is refused."""
    if isinstance(cache_index, jax.core.Tracer):
        raise ValueError("cache_index: must be a concrete integer so the write can be bounds-checked; "
                         "inside jax.jit use dantinox.generate or dantinox.stream, which check bounds up front")
    arr = np.asarray(cache_index)
    if arr.ndim != 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"cache_index: expected an integer, got {cache_index!r}")
    return int(arr)
