"""DeepSeek-V3.2's sparse attention (DSA): an MLA cache with the lightning indexer's key beside each latent.

DeepSeek-V3.2 (tech report, https://arxiv.org/abs/2512.02556; config fields `index_n_heads`, `index_head_dim`,
`index_topk` in https://huggingface.co/deepseek-ai/DeepSeek-V3.2-Exp/blob/main/config.json) keeps MLA's cache
and adds, per layer and token, one key of the lightning indexer: a single head of I channels shared by the
indexer's query heads. Each query scores every cached token with the indexer,
I(t, s) = sum_j w(t, j) ReLU(q(t, j) · k(s)), and attends over its top-k tokens only. So a layer stores
C + R + I numbers per token but a decode step reads the S indexer keys and only k latents.

    ckv        [R, S, C + R]  the latent and the RoPE key, as LatentCache
    idx_k      [R, S, I]      the indexer's key of each token (after its RoPE)
    ckv_scale, idx_scale      [R, S] float32, for int8 / fp8 codes (one per latent, one per indexer key;
                              DeepSeek's own indexer cache keeps fp8 codes, a float32 scale per 128 channels)

The addressing is the layer's own (contiguous or paged): only the payload differs. Registered here under the
attention kind "indexed_latent" (registry.py: a latent model with `index_topk` set).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dantinox.architectures.config import CacheConfig, LayerSpec, ModelConfig
from dantinox.cache.layout import Payload
from dantinox.cache.quant import quantize
from dantinox.cache.registry import PAYLOAD, register


class _IndexedFields(NamedTuple):
    ckv: jax.Array  # [R, S, C + R]
    idx_k: jax.Array  # [R, S, I]
    ckv_scale: jax.Array | None = None  # [R, S] float32, for int8 / fp8 codes
    idx_scale: jax.Array | None = None  # [R, S] float32


class IndexedLatentCache(Payload, _IndexedFields):
    """MLA payload plus the indexer's key per token; every field has its slot axis at 1."""

    __slots__ = ()
    SEQ_AXES = (1, 1, 1, 1)

    @classmethod
    def zeros(cls, cfg: ModelConfig, rows: int, slots: int,
              layer: LayerSpec | None = None) -> IndexedLatentCache:
        dtype = cfg.cache_jnp_dtype

        def scales():
            return jnp.zeros((rows, slots), jnp.float32) if cfg.quantized_cache else None
        return cls(jnp.zeros((rows, slots, cfg.kv_latent_dim + cfg.rope_head_dim), dtype),
                   jnp.zeros((rows, slots, cfg.index_head_size), dtype), scales(), scales())

    @classmethod
    def encode(cls, cfg: CacheConfig, ckv_BTX: jax.Array, idx_BTI: jax.Array) -> IndexedLatentCache:
        if not cfg.quantized_cache:
            return cls(ckv_BTX.astype(cfg.cache_jnp_dtype), idx_BTI.astype(cfg.cache_jnp_dtype))
        (ckv, ckv_scale), (idx, idx_scale) = (quantize(a, cfg.cache_dtype) for a in (ckv_BTX, idx_BTI))
        return cls(ckv, idx, ckv_scale, idx_scale)

    def latents(self, dtype=jnp.float32) -> jax.Array:
        """[R, S, C + R] the latents as numbers (codes times their scales)."""
        ckv = self.ckv.astype(dtype)
        return ckv if self.ckv_scale is None else ckv * self.ckv_scale[..., None]

    def index_keys(self, dtype=jnp.float32) -> jax.Array:
        """[R, S, I] the indexer's keys as numbers."""
        k = self.idx_k.astype(dtype)
        return k if self.idx_scale is None else k * self.idx_scale[..., None]


register(PAYLOAD, "indexed_latent")(IndexedLatentCache)
