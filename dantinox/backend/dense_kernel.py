"""A kernel of its own for a decode step's weight products: a few rows times bfloat16 weights, in one pass.

A decode step multiplies one row per sequence by every weight matrix, so its time is the time to read the
weights. Stored in bfloat16 they are half the bytes of float32, but XLA:CPU converts each matrix to a float32
temporary before its dot (it reads 2 bytes, writes 4 and reads 4 per weight), so a model stored in bfloat16
decoded no faster than in float32 (docs/benchmarks.md, SmolLM2-135M). dantinox/kernels/dense.cc widens each
weight in registers as it is read (exact: a bfloat16 is the high half of a float32) and multiplies and sums in
float32: the float32 model's arithmetic on the stored weights, summed in another order.

`matmul(x, w)` is x · w for flax's [in, out] kernels, `matmul(x, w, transposed=True)` x · wᵀ for the tied
output head ([vocabulary, d_model]). The CPU backend (cpu.py) uses them where `takes` says so: bfloat16
weights, at most `MAX_ROWS` rows (decode steps and short prompts, 8 rows at a time; longer prompts and
training batches keep XLA's dots). Derivatives go through XLA (a custom JVP), so a gradient through a short
batch is still right. Built by dantinox/backend/native.py and loaded when dantinox is imported (`load`); where
it cannot be built, `why_not()` says why in one line and the products stay XLA's. `DANTINOX_DENSE_KERNEL=0`
turns it off.

`rows(table, ids)` is the embedding lookup of a bfloat16 table, widened to float32 row by row: XLA:CPU gathers
from a bfloat16 table by widening all of it first, and in a decode loop it lifted that widening out of the
loop, so every call of the loop wrote a float32 copy of the whole table before its first step (cpu.py,
`take_rows`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

import dantinox.backend.native as native

ENV = "DANTINOX_DENSE_KERNEL"
SOURCE = "dense.cc"
# Rows the kernel takes, in tiles of 8 (W read once per tile): a forward pass's time against XLA's dots, which
# widen every bfloat16 weight first; past 128 rows the kernel no longer wins
# (docs/benchmarks.md#speed-layer-rules, MAX_ROWS).
MAX_ROWS = 128
_TARGETS = {"dantinox_dense_bf16": "DenseBf16", "dantinox_dense_bf16_t": "DenseBf16T",
            "dantinox_rows_bf16": "RowsBf16"}
KERNEL = native.Kernel(__name__, SOURCE, _TARGETS, ENV, "weight products go through XLA")
load, available, why_not = KERNEL.load, KERNEL.available, KERNEL.why_not


def takes(x: jax.Array, w: jax.Array) -> bool:
    """Whether `matmul` takes x [..., D] (float32 or bfloat16) times the 2-D bfloat16 `w`:
    at most MAX_ROWS rows."""
    rows = math.prod(x.shape[:-1])
    return (w.dtype == jnp.bfloat16 and w.ndim == 2 and x.dtype in (jnp.float32, jnp.bfloat16)
            and 1 <= rows <= MAX_ROWS and available())


def matmul(x: jax.Array, w: jax.Array, transposed: bool = False) -> jax.Array:
    """x [..., D] · w (w [D, N]; or wᵀ for w [N, D] with `transposed`) in float32: [..., N] float32."""
    D = w.shape[1] if transposed else w.shape[0]
    if x.shape[-1] != D or not takes(x, w):
        raise ValueError(f"dense_kernel.matmul: expected x [..., {D}] of at most {MAX_ROWS} rows (float32 or "
                         f"bfloat16) and bfloat16 w; got x {x.shape} {x.dtype}, w {w.shape} {w.dtype}")
    y = _product(x.reshape(-1, D).astype(jnp.float32), w, transposed)
    return y.reshape(*x.shape[:-1], y.shape[-1])


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _product(x_MD: jax.Array, w: jax.Array, transposed: bool) -> jax.Array:
    N = w.shape[0] if transposed else w.shape[1]
    target = "dantinox_dense_bf16_t" if transposed else "dantinox_dense_bf16"
    out = jax.ShapeDtypeStruct((x_MD.shape[0], N), jnp.float32)
    return jax.ffi.ffi_call(target, out, vmap_method="sequential")(x_MD, w)


@_product.defjvp
def _product_jvp(transposed, primals, tangents):
    (x, w), (dx, dw) = primals, tangents

    def times(a, b):  # through XLA: this is what gets transposed for a gradient
        b = b.astype(jnp.float32)
        return a @ (b.T if transposed else b)

    return _product(x, w, transposed), times(dx, w) + times(x, dw)


def rows(table: jax.Array, ids: jax.Array) -> jax.Array:
    """table [V, D] (bfloat16) at int32 `ids` [...]: [..., D] float32, jnp.take's values
    (NaN outside [-V, V))."""
    if (table.dtype != jnp.bfloat16 or table.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer)
            or not available()):
        raise ValueError("dense_kernel.rows: expected a bfloat16 table [V, D] and integer ids with the "
                         f"kernel available; got table {table.shape} {table.dtype}, ids {ids.dtype}")
    out = _rows(table, ids.reshape(-1).astype(jnp.int32))
    return out.reshape(*ids.shape, table.shape[1])


@jax.custom_jvp
def _rows(table: jax.Array, ids_n: jax.Array) -> jax.Array:
    out = jax.ShapeDtypeStruct((ids_n.shape[0], table.shape[1]), jnp.float32)
    return jax.ffi.ffi_call("dantinox_rows_bf16", out, vmap_method="sequential")(ids_n, table)


@_rows.defjvp
def _rows_jvp(primals, tangents):
    (table, ids_n), (d_table, _) = primals, tangents
    return _rows(table, ids_n), jnp.take(d_table, ids_n, axis=0).astype(jnp.float32)
