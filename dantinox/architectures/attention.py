"""Scaled dot-product attention over what a cache layout's View gives: one path for every layout.

`attend` scores grouped queries against K/V heads (never repeated) in one einsum, with int8 scales folded into
the contractions, attention sinks (tokens a ring keeps, StreamingLLM), learned sink logits (gpt-oss: one more
term in each query head's softmax denominator, nothing cached), and a shared pool read whole (a paged pool:
one row of keys broadcast over the batch). A backend may compute the same numbers its own way
(dantinox/ops.py, `takes_over`); the CPU one (dantinox/backend) hands one new token per sequence to a native
kernel or to an arrangement XLA:CPU runs faster.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dantinox import ops

NEG_INF = float(np.finfo(np.float32).min)  # large negative, not -inf: keeps fully-masked rows NaN-free


@ops.takes_over("attend")  # the speed layer may answer first; it declines sinks of either kind and weights
def attend(q_BTKGH: jax.Array, k_BKHS: jax.Array, v_BKSH: jax.Array, mask_BTS: jax.Array,
           scale: float | None = None, k_scale_BKS: jax.Array | None = None,
           v_scale_BKS: jax.Array | None = None, sink_q_BTKGH: jax.Array | None = None,
           sink_BS: jax.Array | None = None, with_weights: bool = False, keys_slot_last: bool = True,
           scale_layout: str | None = None, sink_logits_KG: jax.Array | None = None) -> Any:
    """Scaled dot-product attention of grouped queries over K/V heads; K and V are never repeated.

    Keys come as the cache stores them, [B, K, H, S] (slot axis last); `keys_slot_last=False` takes
    [B, K, S, H] instead (MLA's absorbed path, whose keys are the cached latent rows). Keys and values of
    one row with B > 1 queries are one pool that every sequence reads (a paged pool read whole, its mask
    picking each sequence's slots). `mask_BTS` says
    which keys each query sees (a layout's View.mask). `scale` defaults to 1/sqrt(query width); V may be
    narrower than Q and K (MLA's absorbed path). Quantized keys and values come as codes with per-slot
    scales, folded into the contractions: scores = (q · codes) · k_scale, out = (p · v_scale) · codes;
    `scale_layout` is the storage's name for that layout (the payload's `scale_layout`, "per_token"), which a
    backend's kernel must know before it reads the scales.
    The slots marked in `sink_BS` (attention sinks) are scored with `sink_q_BTKGH`, the query rotated to its
    position within the cache. `sink_logits_KG` are learned sink logits, one per query head (gpt-oss: the
    model card, arXiv:2508.10925, and its reference `sdpa` in
    https://github.com/openai/gpt-oss/blob/main/gpt_oss/torch/model.py, which appends the logit to each row of
    scaled, masked scores and drops its column after the softmax; transformers' gpt_oss
    `eager_attention_forward` does the same): each row's weights are
    exp(s_j) / (exp(sink) + sum_i exp(s_i)), so they sum to less than 1 and the sink reads no value. A sink
    of -inf is plain attention, exactly. `with_weights` also returns the softmax weights [B, K, G, T, S]
    (eviction scores them).
    """
    scale = q_BTKGH.shape[-1] ** -0.5 if scale is None else scale
    keys = "BKHS" if keys_slot_last else "BKSH"
    q, k, v_BKSH = q_BTKGH.astype(jnp.float32), k_BKHS.astype(jnp.float32), v_BKSH.astype(jnp.float32)
    scores_BKGTS = jnp.einsum(f"BTKGH,{keys}->BKGTS", q, k) * scale  # one row of keys: broadcast over B
    if sink_BS is not None:
        sink_scores = jnp.einsum(f"BTKGH,{keys}->BKGTS", sink_q_BTKGH.astype(jnp.float32), k) * scale
        scores_BKGTS = jnp.where(sink_BS[:, None, None, None, :], sink_scores, scores_BKGTS)
    if k_scale_BKS is not None:
        scores_BKGTS = scores_BKGTS * k_scale_BKS[:, :, None, None, :]
    scores_BKGTS = jnp.where(mask_BTS[:, None, None], scores_BKGTS, NEG_INF)  # mask before the softmax
    if sink_logits_KG is None:
        probs = jax.nn.softmax(scores_BKGTS, axis=-1)
    else:  # the sink joins the max and the denominator; its own term is dropped (it has no value)
        sink_BKGT1 = jnp.broadcast_to(sink_logits_KG.astype(jnp.float32)[None, :, :, None, None],
                                      scores_BKGTS.shape[:-1] + (1,))
        top = jnp.maximum(jnp.max(scores_BKGTS, axis=-1, keepdims=True), sink_BKGT1)
        unnormalized = jnp.exp(scores_BKGTS - top)
        probs = unnormalized / (jnp.sum(unnormalized, axis=-1, keepdims=True) + jnp.exp(sink_BKGT1 - top))
    weights = probs
    if v_scale_BKS is not None:
        probs = probs * v_scale_BKS[:, :, None, None, :]
    out = jnp.einsum("BKGTS,BKSH->BTKGH", probs, v_BKSH)
    return (out, weights) if with_weights else out
