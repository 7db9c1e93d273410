"""The CPU backend: which calls go to a native kernel or to an arrangement XLA:CPU runs faster, and the hooks
of dantinox/ops.py that send them there.

The rules (`uses_kernel`, `uses_one_token_arrangement`, `uses_reduction_arrangement`) are measured: each names
the shapes it applies to and the quantity it trades; benchmarks/decode.py times every choice against the
others. A kernel takes a cache only in a storage it declares it reads (pool_kernel.handles: dtype and scale
layout).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import dantinox.backend.dense_kernel as dense_kernel
import dantinox.backend.pool_kernel as pool_kernel
import dantinox.backend.xla_cpu as xla_cpu
from dantinox import ops
from dantinox.cache import LayerCache


class CPU(ops.Reference):
    """The native backend: kernels where they are built and the rules take them, XLA:CPU's arrangements and
    options elsewhere; each hook returns None where the reference's own computation is as fast."""

    name = "native"

    def attend(self, q_BTKGH, k_BKHS, v_BKSH, mask_BTS, scale, k_scale_BKS, v_scale_BKS, sink_q_BTKGH,
               sink_BS, with_weights, keys_slot_last, scale_layout, sink_logits_KG) -> jax.Array | None:
        # The one dispatch rule for sinks: kept sink tokens, learned sink logits (gpt-oss) and returned
        # weights go to the reference einsum path; neither the kernel nor the arrangements below compute them.
        if sink_BS is not None or sink_logits_KG is not None or with_weights:
            return None
        scale = q_BTKGH.shape[-1] ** -0.5 if scale is None else scale
        B, T, K, G, _ = q_BTKGH.shape
        rows = k_BKHS.shape[0]
        if keys_slot_last and rows in (1, B) and uses_kernel(B, T, G, rows, k_BKHS.dtype, scale_layout):
            return pool_kernel.attend(q_BTKGH[:, 0], k_BKHS, v_BKSH, mask_BTS[:, 0], scale, k_scale_BKS,
                                      v_scale_BKS)[:, None]
        keys = "BKHS" if keys_slot_last else "BKSH"
        k, v_BKSH = k_BKHS.astype(jnp.float32), v_BKSH.astype(jnp.float32)
        if rows == 1 < B:  # one row for all: a paged pool read whole
            return xla_cpu.attend_pool(q_BTKGH.astype(jnp.float32), k[0], v_BKSH[0], mask_BTS, scale,
                                       None if k_scale_BKS is None else k_scale_BKS[0],
                                       None if v_scale_BKS is None else v_scale_BKS[0], keys[1:])
        one_token = (uses_one_token_arrangement(B, T, K, G)
                     and (K > 1 or keys_slot_last))  # not MLA's latent rows
        by_reduction = uses_reduction_arrangement(B, T, G) and keys_slot_last
        if one_token or by_reduction:
            return xla_cpu.attend_one_token(q_BTKGH[:, 0].astype(jnp.float32), k, v_BKSH, mask_BTS[:, 0],
                                            scale, k_scale_BKS, v_scale_BKS, keys, by_reduction)[:, None]
        return None

    def reads_in_place(self, T, payload, k_dtype, scale_layout) -> bool:
        """A paged pool of K/V heads that the kernel reads: each sequence's slots where they lie
        (no gather)."""
        return T == 1 and payload is LayerCache and pool_kernel.handles(k_dtype, scale_layout)

    def store(self, a, axis, rows_BT, slots_BT, new_BT) -> jax.Array | None:
        """Narrow floats in place: XLA:CPU updates them by widening the whole array and narrowing it back."""
        return pool_kernel.store(a, axis, rows_BT, slots_BT, new_BT) if pool_kernel.stores(a.dtype) else None

    def promote_dtype(self, args, dtype, inexact):
        """nnx.Linear's promotion, except that a bfloat16 weight is handed to `dot_general` as stored."""
        promoted = nnx.nn.dtypes.promote_dtype(args, dtype=dtype, inexact=inexact)
        if args[1].dtype == jnp.bfloat16 and promoted[0].dtype == jnp.float32:
            return (promoted[0], args[1], *promoted[2:])
        return promoted

    def dot_general(self, x, w, dims, precision, preferred_element_type, out_sharding) -> jax.Array:
        """Every dense layer's product (nnx.Linear's `dot_general`); the tied logits go through it too.

        bfloat16 weights times a few rows (a decode step, a short prompt) go to
        dantinox/backend/dense_kernel.py, which reads each weight once and widens it in registers, with
        float32 sums, where XLA:CPU converts each matrix to a float32 temporary first: the step's time spent
        on weight products (docs/benchmarks.md#speed-layer-rules, dot_general).

        Otherwise XLA's: bfloat16 weights with float32 activations are widened first (what nnx.Linear's
        promotion did before it handed them over); bfloat16 operands over more than one row accumulate in
        float32. The inputs are the same bf16 numbers either way, and the result comes back as
        `preferred_element_type` (default bf16); asked this way, XLA:CPU takes its bf16 dot instead of
        converting the weight to a float32 temporary first (decode tok/s of a bfloat16 model at batch 8:
        dot_general, same place).
        """
        (x_axes, w_axes), batch_axes = dims
        if (x_axes == (x.ndim - 1,) and w_axes in ((0,), (1,)) and batch_axes == ((), ())
                and out_sharding is None
                and dense_kernel.takes(x, w)):  # w [in, out] (a layer) or [out, in] (the tied head)
            out = dense_kernel.matmul(x, w, transposed=w_axes == (1,))
            return out.astype(preferred_element_type or x.dtype)
        if x.dtype != w.dtype and x.dtype == jnp.float32:
            w = w.astype(x.dtype)
        if not x.dtype == w.dtype == jnp.bfloat16:
            return jax.lax.dot_general(x, w, dims, precision, preferred_element_type=preferred_element_type,
                                       out_sharding=out_sharding)
        asked = jnp.float32 if int(np.prod(x.shape[:-1])) > 1 else None
        return jax.lax.dot_general(x, w, dims, precision, preferred_element_type=asked,
                                   out_sharding=out_sharding).astype(preferred_element_type or jnp.bfloat16)

    def take_rows(self, table_VD, ids) -> jax.Array | None:
        """A bfloat16 table through the kernel's `rows`, widened row by row: XLA:CPU gathers bfloat16 by
        widening the whole table to float32, and in a decode loop that widening was lifted out of the loop, so
        every call of the loop wrote a float32 copy of the table first (SmolLM2-135M: 113 MB, about 30 ms per
        call)."""
        if table_VD.dtype == jnp.bfloat16 and dense_kernel.available():
            return dense_kernel.rows(table_VD, ids)
        return None

    def compiler_options(self, batch, cfg, slots) -> dict[str, str] | None:
        return xla_cpu.compiler_options(batch, cfg, slots)


def uses_kernel(B: int, T: int, G: int, rows: int, k_dtype: Any, scale_layout: str | None) -> bool:
    """Whether `attend` hands one new token per sequence to dantinox/backend/pool_kernel.py (measured rule).

    A pool all B > 1 sequences share (`rows` 1, a paged cache): always, for the storage the kernel takes;
    XLA's reads of it either copy each sequence's pages or score every other sequence's slots. A row per
    sequence (`rows` B): a bfloat16 cache always; float32 up to 3 query heads per KV head at batch 1 and 4
    above it; int8 codes up to 4. Each threshold is where the kernel's attention time per step stopped beating
    the best of XLA's arrangements (benchmarks/decode.py's arrangement A/B;
    docs/benchmarks.md#speed-layer-rules, uses_kernel).
    """
    if T != 1 or not pool_kernel.handles(k_dtype, scale_layout):
        return False
    if rows == 1 < B:
        return True
    if scale_layout is not None:  # int8 codes
        return G <= 4
    if jnp.dtype(k_dtype) == jnp.float32:
        return G <= (4 if B > 1 else 3)
    return True  # bfloat16


def uses_one_token_arrangement(B: int, T: int, K: int, G: int) -> bool:
    """Whether `attend` takes `attend_one_token` for these shapes: a batch decoding with grouped queries
    (GQA, MQA; measured rule, below)."""
    return T == 1 and B > 1 and G > 1


def uses_reduction_arrangement(B: int, T: int, G: int) -> bool:
    """Whether `attend` takes `attend_one_token` by reductions for these shapes: one sequence decoding one
    token with grouped queries (GQA, MQA; measured rule, in xla_cpu.attend_one_token)."""
    return T == 1 and B == 1 and G > 1
