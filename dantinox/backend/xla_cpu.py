"""XLA:CPU's side of the speed layer: faster arrangements of attention's numbers, and compiler options.

`attend_pool` and `attend_one_token` compute what dantinox.architectures.attention.attend's einsum computes,
arranged so that
XLA:CPU runs them faster for one new token per sequence; dantinox/backend/cpu.py says when (its measured
rules). `compiler_options` are the XLA options a decode program is compiled with (dantinox.generate asks).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import dantinox.backend.pool_kernel as pool_kernel
from dantinox.architectures.attention import NEG_INF
from dantinox.architectures.config import ModelConfig
from dantinox.cache import LayerCache


def attend_pool(q_BTKGH: jax.Array, k: jax.Array, v_KSH: jax.Array, mask_BTS: jax.Array, scale: float,
                 k_scale_KS: jax.Array | None, v_scale_KS: jax.Array | None, keys: str) -> jax.Array:
    """Every query of the batch over one shared row of S slots: per KV head, the B · T · G query rows are
    the rows of one matmul against the pool, so each slot is read once per step for all sequences."""
    B, T, K, G, H = q_BTKGH.shape
    S = mask_BTS.shape[-1]
    q_KRH = q_BTKGH.transpose(2, 0, 1, 3, 4).reshape(K, B * T * G, H)
    scores = (jnp.einsum(f"KRH,{keys}->KRS", q_KRH, k) * scale).reshape(K, B, T, G, S)
    if k_scale_KS is not None:
        scores = scores * k_scale_KS[:, None, None, None, :]
    scores = jnp.where(mask_BTS[None, :, :, None, :], scores, NEG_INF)
    weights = jnp.exp(scores - scores.max(axis=-1, keepdims=True))  # softmax, normalized after the product
    total_KR = weights.sum(axis=-1).reshape(K, B * T * G, 1)
    if v_scale_KS is not None:
        weights = weights * v_scale_KS[:, None, None, None, :]
    out_KRH = jnp.einsum("KRS,KSH->KRH", weights.reshape(K, B * T * G, S), v_KSH) / total_KR
    return out_KRH.reshape(K, B, T, G, -1).transpose(1, 2, 0, 3, 4)


def attend_one_token(q_BKGH: jax.Array, k: jax.Array, v_BKSH: jax.Array, mask_BS: jax.Array, scale: float,
                      k_scale_BKS: jax.Array | None, v_scale_BKS: jax.Array | None, keys: str,
                      by_reduction: bool = False) -> jax.Array:
    """One new token per sequence: the G query heads of each KV head are the rows of one small matmul, or with
    `by_reduction` (keys slot-last) both products are multiply-and-sum reductions over the cache as stored.

    The same numbers as the general path, arranged so that XLA:CPU runs both products as library
    matmuls over [G, S] blocks: at batch 8 with grouped queries (GQA, MQA) the step's attention time falls;
    for MHA (G = 1) and at batch 1 it does not, and they keep the general path, as does MLA's absorbed path.

    Reductions sum in another order. As matmuls at batch 1, XLA:CPU wants each cache operand with its
    contracted axis innermost (keys slot-major, values slot-last: the transpose of how they are stored) and
    copies every layer's whole key and value cache into that order every step; reductions read them where
    they lie (tests/test_model.py checks that the compiled loop has no such copy), and trade that copy against
    slower sums for MHA. Measured: docs/benchmarks.md#speed-layer-rules, attend_one_token.
    """
    if by_reduction:  # [B, K, G, H, 1] x [B, K, 1, H, S], summed over H
        scores_BKGS = (q_BKGH[..., None] * k[:, :, None]).sum(axis=3) * scale
    else:
        scores_BKGS = jnp.einsum(f"BKGH,{keys}->BKGS", q_BKGH, k) * scale
    if k_scale_BKS is not None:
        scores_BKGS = scores_BKGS * k_scale_BKS[:, :, None, :]
    probs_BKGS = jax.nn.softmax(jnp.where(mask_BS[:, None, None], scores_BKGS, NEG_INF), axis=-1)
    if v_scale_BKS is not None:
        probs_BKGS = probs_BKGS * v_scale_BKS[:, :, None, :]
    if by_reduction:  # [B, K, G, S, 1] x [B, K, 1, S, H], summed over S
        return (probs_BKGS[..., None] * v_BKSH[:, :, None]).sum(axis=3)
    return jnp.einsum("BKGS,BKSH->BKGH", probs_BKGS, v_BKSH)


# XLA:CPU runs a batch-1 step's matrix-vector products faster when it may use 512-bit vectors; from
# batch 2 up the matmuls go to a library kernel and the option measured neutral to slower
# (benchmarks/decode.py times both sides in every run). Other backends get no options.
VECTOR_512 = {"xla_cpu_prefer_vector_width": "512"}
# A paged pool read whole (dantinox/cache/paged.py) multiplies B query rows by P · ps slots per KV head.
# XLA:CPU hands such float32 products to YNNPACK by default, slower than XLA's own (Eigen) dot for the weights
# by the values. The option is per program, so it also moves the weight matmuls to Eigen, slower for a larger
# model. Paged decode programs take it only where a layer's values outweigh its weights
# (benchmarks/cache_steps.py times the paged step against the contiguous one with the options generate uses);
# where the pool kernel reads the pool, that product is not XLA's and the option is not taken
# (docs/benchmarks.md#speed-layer-rules, EIGEN_DOTS).
EIGEN_DOTS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"}


def _values_outweigh_weights(cfg: ModelConfig, batch: int, slots: int) -> bool:
    """Whether a paged layer's values for `batch` sequences of `slots` outnumber its matmul weights."""
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_size, cfg.mlp_width
    return batch * slots * K * H > D * (N + 2 * K) * H + N * H * D + 3 * D * F


def compiler_options(batch: int, cfg: ModelConfig | None = None,
                     slots: int | None = None) -> dict[str, str] | None:
    """The XLA options dantinox compiles a decode program for `batch` sequences of `cfg` with, decoding up to
    `slots` tokens (default max_context); None: the defaults. Without a config: a contiguous cache's."""
    if jax.default_backend() != "cpu":
        return None
    options = dict(VECTOR_512) if batch == 1 else {}
    if (batch > 1 and cfg is not None and cfg.cache_layout == "paged" and cfg.attention == "heads"
            and cfg.jnp_dtype == jnp.float32
            and _values_outweigh_weights(cfg, batch, slots or cfg.max_context)
            and not pool_kernel.handles(cfg.cache_jnp_dtype,
                                        LayerCache.SCALE_LAYOUT if cfg.quantized_cache else None)):
        options |= EIGEN_DOTS
    return options or None
