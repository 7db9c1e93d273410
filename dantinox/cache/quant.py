"""Quantized KV cache: int8 or fp8 (e4m3) codes with one float32 scale per token and KV head.

Quantize on write (`LayerCache.encode` / `LatentCache.encode` in dantinox/cache/container.py); attention never
dequantizes the cache: it multiplies the scores by the key scales and the probabilities by the value scales
(scores = (q · codes_k) · scale_k, out = (p · scale_v) · codes_v), so storage is independent of addressing
and payload: int8 works on linear, ring, chunked and paged layers and on MLA latents.

Granularity: one scale per (token, KV head), shared by that head's H channels. A token's key and value are
computed once and written once, so a per-token scale is known at write time and no stored code is ever
revisited; per-channel key scales (KIVI, KVQuant) need a group of tokens first, so they keep a window of
recent tokens in full precision and requantize in blocks. Per head, because heads differ in magnitude and a
shared scale would spend the code range of the quiet heads on the loud ones. The price is one float32 scale
(4 bytes) per H = 32 codes, 12.5 % on top of the int8 codes, which `quant_cache_bytes` counts.

fp8: jax has float8_e4m3fn and XLA:CPU converts to and from it, so fp8 runs here; values are scaled so the
head's largest magnitude maps to 448 (e4m3's largest finite value) and clipped,
since a cast past 448 gives NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

CODE_MAX = {"int8": 127.0, "fp8_e4m3": 448.0}  # largest code magnitude of each format
SCALE_BYTES = 4  # one float32 scale per token and KV head


def quantize(x_BKTH: jax.Array, cache_dtype: str) -> tuple[jax.Array, jax.Array]:
    """Codes [B, K, T, H] and float32 scales [B, K, T]: x ≈ codes · scale, per token and head."""
    code_max = CODE_MAX[cache_dtype]
    x32 = x_BKTH.astype(jnp.float32)
    scale_BKT = jnp.max(jnp.abs(x32), axis=-1) / code_max
    safe = jnp.where(scale_BKT > 0, scale_BKT, 1.0)[..., None]  # an all-zero vector keeps scale 0 and codes 0
    scaled = jnp.clip(x32 / safe, -code_max, code_max)
    if cache_dtype == "int8":
        return jnp.round(scaled).astype(jnp.int8), scale_BKT
    return scaled.astype(jnp.float8_e4m3fn), scale_BKT


def dequantize(codes_BKSH: jax.Array, scale_BKS: jax.Array) -> jax.Array:
    """float32 values from codes and their per-token, per-head scales."""
    return codes_BKSH.astype(jnp.float32) * scale_BKS[..., None]
