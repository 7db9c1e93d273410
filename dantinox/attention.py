"""Scaled dot-product attention over what a cache layout's View gives: one path for every layout.

`attend` scores grouped queries against K/V heads (never repeated), with int8 scales folded into the
contractions, attention sinks, and a shared pool read whole (a paged pool). One new token per sequence goes
to the kernel of dantinox/pool_kernel.py where it is built and where `uses_kernel` (a measured rule: a
shared pool, few query heads per KV head, int8 codes) says so. Otherwise, for one new token per sequence it
takes one of two arrangements of the same numbers that XLA:CPU runs faster (`_attend_one_token`);
`uses_one_token_arrangement` and `uses_reduction_arrangement` are the measured rules that choose, and
benchmarks/decode.py times every arrangement and the kernel against the others in each run.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dantinox import pool_kernel

NEG_INF = float(np.finfo(np.float32).min)  # large negative, not -inf: keeps fully-masked rows NaN-free


def attend(q_BTKGH: jax.Array, k_BKHS: jax.Array, v_BKSH: jax.Array, mask_BTS: jax.Array,
           scale: float | None = None, k_scale_BKS: jax.Array | None = None,
           v_scale_BKS: jax.Array | None = None, sink_q_BTKGH: jax.Array | None = None,
           sink_BS: jax.Array | None = None, with_weights: bool = False, keys_slot_last: bool = True) -> Any:
    """Scaled dot-product attention of grouped queries over K/V heads; K and V are never repeated.

    Keys come as the cache stores them, [B, K, H, S] (slot axis last); `keys_slot_last=False` takes
    [B, K, S, H] instead (MLA's absorbed path, whose keys are the cached latent rows). Keys and values of
    one row with B > 1 queries are one pool that every sequence reads (a paged pool read whole, its mask
    picking each sequence's slots). `mask_BTS` says
    which keys each query sees (a layout's View.mask). `scale` defaults to 1/sqrt(query width); V may be
    narrower than Q and K (MLA's absorbed path). Quantized keys and values come as codes with per-slot
    scales, folded into the contractions: scores = (q · codes) · k_scale, out = (p · v_scale) · codes.
    The slots marked in `sink_BS` (attention sinks) are scored with `sink_q_BTKGH`, the query rotated to its
    position within the cache. `with_weights` also returns the softmax weights [B, K, G, T, S] (eviction
    scores them).
    """
    scale = q_BTKGH.shape[-1] ** -0.5 if scale is None else scale
    B, T, K, G, _ = q_BTKGH.shape
    keys = "BKHS" if keys_slot_last else "BKSH"
    if (keys_slot_last and sink_BS is None and not with_weights and k_BKHS.shape[0] in (1, B)
            and uses_kernel(B, T, G, k_BKHS.shape[0], k_BKHS.dtype, k_scale_BKS is not None)):
        return pool_kernel.attend(q_BTKGH[:, 0], k_BKHS, v_BKSH, mask_BTS[:, 0], scale, k_scale_BKS,
                                  v_scale_BKS)[:, None]
    k, v_BKSH = k_BKHS.astype(jnp.float32), v_BKSH.astype(jnp.float32)
    if k.shape[0] == 1 < B and sink_BS is None and not with_weights:  # one row for all: a paged pool read whole
        return _attend_pool(q_BTKGH.astype(jnp.float32), k[0], v_BKSH[0], mask_BTS, scale,
                            None if k_scale_BKS is None else k_scale_BKS[0],
                            None if v_scale_BKS is None else v_scale_BKS[0], keys[1:])
    one_token = uses_one_token_arrangement(B, T, K, G) and (K > 1 or keys_slot_last)  # not MLA's latent rows
    by_reduction = uses_reduction_arrangement(B, T, G) and keys_slot_last
    if (one_token or by_reduction) and sink_BS is None and not with_weights:
        return _attend_one_token(q_BTKGH[:, 0].astype(jnp.float32), k, v_BKSH, mask_BTS[:, 0], scale,
                                 k_scale_BKS, v_scale_BKS, keys, by_reduction)[:, None]
    scores_BKGTS = jnp.einsum(f"BTKGH,{keys}->BKGTS", q_BTKGH.astype(jnp.float32), k) * scale
    if sink_BS is not None:
        sink_scores = jnp.einsum(f"BTKGH,{keys}->BKGTS", sink_q_BTKGH.astype(jnp.float32), k) * scale
        scores_BKGTS = jnp.where(sink_BS[:, None, None, None, :], sink_scores, scores_BKGTS)
    if k_scale_BKS is not None:
        scores_BKGTS = scores_BKGTS * k_scale_BKS[:, :, None, None, :]
    scores_BKGTS = jnp.where(mask_BTS[:, None, None], scores_BKGTS, NEG_INF)  # mask before the softmax
    probs = jax.nn.softmax(scores_BKGTS, axis=-1)
    weights = probs
    if v_scale_BKS is not None:
        probs = probs * v_scale_BKS[:, :, None, None, :]
    out = jnp.einsum("BKGTS,BKSH->BTKGH", probs, v_BKSH)
    return (out, weights) if with_weights else out


def _attend_pool(q_BTKGH: jax.Array, k: jax.Array, v_KSH: jax.Array, mask_BTS: jax.Array, scale: float,
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
    weights = jnp.exp(scores - scores.max(axis=-1, keepdims=True))  # the softmax, normalized after the product
    total_KR = weights.sum(axis=-1).reshape(K, B * T * G, 1)
    if v_scale_KS is not None:
        weights = weights * v_scale_KS[:, None, None, None, :]
    out_KRH = jnp.einsum("KRS,KSH->KRH", weights.reshape(K, B * T * G, S), v_KSH) / total_KR
    return out_KRH.reshape(K, B, T, G, -1).transpose(1, 2, 0, 3, 4)


def uses_kernel(B: int, T: int, G: int, rows: int, k_dtype: Any, quantized: bool) -> bool:
    """Whether `attend` hands one new token per sequence to dantinox/pool_kernel.py (measured rule).

    A pool all B > 1 sequences share (`rows` 1, a paged cache): always, for the storage the kernel takes;
    XLA's reads of it either copy each sequence's pages or score every other sequence's slots. A row per
    sequence (`rows` B): a bfloat16 cache always; float32 up to 3 query heads per KV head at batch 1 and 4
    above it; int8 codes up to 4. Measured against the best of XLA's arrangements below (benchmarks/decode.py's
    arrangement A/B, 384 slots, 2026-12-03, after the kernel read key rows in order), kernel / XLA, reference
    model (head size 32): MHA 0.63 at batch 1, 0.72 at 2, 0.82 at 8, 0.77 at 16; float32 K = 2 (G = 4) 0.69
    at batch 2, 0.94 at 8, 0.92 at 16; int8 K = 2 0.87 at batch 8. SmolLM2-135M (G = 3, head size 64,
    float32, 288 slots, benchmarks/decode_profile.py): attention 1.14 against 2.16 ms a step at batch 1 and
    7.8 against 11.6 at batch 8. Left to XLA: float32 G = 4 at batch 1 (1.17), float32 MQA (G = 8: 0.99 at
    batch 1, 1.01 at 8).
    bfloat16, after the kernel kept its sums in registers and widened each value once for a group of heads
    (2026-12-04, a 2-core AVX2 machine, 30 layers' calls in one program, interleaved): kernel / XLA at batch 8
    0.09 for MHA (reference), 0.56 for G = 4, 0.59 for MQA, 0.17 for SmolLM2 (G = 3, 288 slots); SmolLM2 in
    bfloat16 end to end (generate, 256 tokens) 173-194 against 144 tok/s at batch 8 and 55-59 against 52-54
    at batch 1.
    """
    if T != 1 or not pool_kernel.handles(k_dtype, quantized):
        return False
    if rows == 1 < B:
        return True
    if quantized:
        return G <= 4
    if jnp.dtype(k_dtype) == jnp.float32:
        return G <= (4 if B > 1 else 3)
    return True  # bfloat16


def uses_one_token_arrangement(B: int, T: int, K: int, G: int) -> bool:
    """Whether `attend` takes `_attend_one_token` for these shapes: a batch decoding with grouped queries
    (GQA, MQA; measured rule, below)."""
    return T == 1 and B > 1 and G > 1


def _attend_one_token(q_BKGH: jax.Array, k: jax.Array, v_BKSH: jax.Array, mask_BS: jax.Array, scale: float,
                      k_scale_BKS: jax.Array | None, v_scale_BKS: jax.Array | None, keys: str,
                      by_reduction: bool = False) -> jax.Array:
    """One new token per sequence: the G query heads of each KV head are the rows of one small matmul, or with
    `by_reduction` (keys slot-last) both products are multiply-and-sum reductions over the cache as stored.

    The same numbers as the general path, arranged so that XLA:CPU runs both products as library
    matmuls over [G, S] blocks. Measured with keys stored slot-last (`ab_step_ms` of benchmarks/decode.py,
    its "attention arrangement" A/B; reference model, 2026-12-02): at batch 8 this way takes half the
    step of the general one for GQA (K = 2: 4.2 against 8.6 ms at 384 slots) and 0.7 of it for MQA (2.9
    against 4.1 ms); it is equal for MHA (G = 1) and slower at batch 1, which keep the general path, as
    does MLA's absorbed path (one shared head over token-major latent rows, not re-measured this way).

    Reductions sum in another order. As matmuls at batch 1, XLA:CPU wants each cache operand with its
    contracted axis innermost (keys slot-major, values slot-last: the transpose of how they are stored) and
    copies every layer's whole key and value cache into that order every step; reductions read them where
    they lie (tests/test_model.py checks that the compiled loop has no such copy). Measured with the same
    A/B (2026-12-03): SmolLM2-135M (K = 3, G = 3), float32, 288 slots: the copies took 3.3 of 29.3 ms per
    step, and the step with reductions 26.8 ms; reference model at 384 slots, 1.63 against 1.75 ms (GQA,
    K = 2) and 1.54 against 1.62 ms (MQA). With one query head per KV head (MHA) the reductions measured
    2.6-4.6x slower (13.4 against 2.9 ms at 384 slots), and at batch 8 slower than the matmuls: those keep
    their paths, as does MLA's absorbed path.
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


def uses_reduction_arrangement(B: int, T: int, G: int) -> bool:
    """Whether `attend` takes `_attend_one_token` by reductions for these shapes: one sequence decoding one
    token with grouped queries (GQA, MQA; measured rule, in _attend_one_token)."""
    return T == 1 and B == 1 and G > 1
