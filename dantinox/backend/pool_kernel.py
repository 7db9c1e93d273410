"""A kernel of its own for one decode step: each sequence's cached slots read where they lie.

XLA:CPU can read a paged pool in two ways, and both cost: gathering each sequence's pages copies them every
step, and scoring every query against the whole pool computes the other sequences' scores only to mask them
(dantinox/cache/paged.py weighs the two). dantinox/kernels/pool_attend.cc, an XLA FFI custom call, walks the
pool in blocks of 16 slots, skips the blocks a sequence's mask leaves empty and keeps a running softmax over
the rest, for float32 or bfloat16 keys and values and for int8 codes with their scales folded in.

It is C++ built by dantinox/backend/native.py (the machine's compiler; by the set-up, or when dantinox is
first imported) and registered with XLA for the CPU when dantinox is imported (`load`).
The CPU backend (dantinox/backend/cpu.py) hands it
dantinox.architectures.attention.attend's one new token per sequence over
a shared pool (paged) or, where its measured rule `uses_kernel` says so, over a cache row per sequence. Where
it cannot be built or the backend is not the CPU, `available()` is False, `why_not()` says why in one line,
and attention keeps XLA's reads. `DANTINOX_POOL_KERNEL=0` turns it off (benchmarks/cache_steps.py times both).

The same library writes new tokens into caches of bfloat16, float16 or fp8 in place (`store`, used by
dantinox/cache/container.py): XLA:CPU updates such an array by widening all of it to float32 and narrowing it
back, so each decode step rewrote every layer's whole cache: a bfloat16 cache, half the bytes, decoded slower
than a float32 one (docs/benchmarks.md#speed-layer-rules, store).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

import dantinox.backend.native as native

ENV = "DANTINOX_POOL_KERNEL"
CACHE_ENV = native.CACHE_ENV
SOURCE = "pool_attend.cc"
_TARGETS = {"float32": ("dantinox_pool_attend_float", "PoolAttendFloat"),
            "bfloat16": ("dantinox_pool_attend_bf16", "PoolAttendBf16"),
            "int8": ("dantinox_pool_attend_int8", "PoolAttendInt8")}
_STORE = ("dantinox_cache_store", "CacheStore")  # tokens into a cache in place (`store`)


KERNEL = native.Kernel(__name__, SOURCE, dict([*_TARGETS.values(), _STORE]), ENV,
                       "paged decode reads through XLA")
build, load, available, why_not = KERNEL.build, KERNEL.load, KERNEL.available, KERNEL.why_not


# The one scale layout the kernel reads: [R, K, S] float32, one scale per token and KV head (quant.quantize's,
# the payload's declared `scale_layout`). Int8 codes whose scales are laid out any other way never reach it.
SCALE_LAYOUT = "per_token"


def handles(k_dtype, scale_layout: str | None) -> bool:
    """Whether the kernel takes a pool stored in `k_dtype` with scales laid out as `scale_layout`: float32 or
    bfloat16 without scales, or int8 codes with SCALE_LAYOUT scales."""
    name = jnp.dtype(k_dtype).name
    expected = SCALE_LAYOUT if name == "int8" else None
    return name in _TARGETS and scale_layout == expected and available()


def attend(q_BKGH: jax.Array, k_RKHS: jax.Array, v_RKSH: jax.Array, mask_BS: jax.Array, scale: float,
           k_scale_RKS: jax.Array | None = None, v_scale_RKS: jax.Array | None = None) -> jax.Array:
    """One query token per sequence over cached keys and values: [B, K, G, H] float32 out, zeros for a row
    that sees no slot. Keys [R, K, H, S] and values [R, K, S, H] are float32 or bfloat16, or int8 codes with
    scales [R, K, S]; R = 1 is one pool every sequence reads (its mask picks its slots), R = B a row each."""
    R, B = k_RKHS.shape[0], q_BKGH.shape[0]
    if R not in (1, B):
        raise ValueError(f"k_RKHS: expected 1 or {B} rows (the batch), got {R}")
    out = jax.ShapeDtypeStruct(q_BKGH.shape, jnp.float32)
    args = [q_BKGH.astype(jnp.float32), k_RKHS, v_RKSH]
    target = _TARGETS[jnp.dtype(k_RKHS.dtype).name][0]
    if k_scale_RKS is not None:
        args += [k_scale_RKS.astype(jnp.float32), v_scale_RKS.astype(jnp.float32)]
    return jax.ffi.ffi_call(target, out)(*args, mask_BS.astype(bool), scale=np.float32(scale))


# Cache dtypes whose in-place update XLA:CPU turns into a rewrite of the whole array (widened to float32 and
# narrowed back); `store` writes their tokens in place instead. float32 and int8 updates are XLA's, in place.
NARROW_FLOATS = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


def stores(dtype) -> bool:
    """Whether `store` writes caches of `dtype` (one XLA:CPU would rewrite whole at every update)."""
    return jnp.dtype(dtype).name in NARROW_FLOATS and available()


def store(a: jax.Array, axis: int, rows_BT: jax.Array, slots_BT: jax.Array, new_BT: jax.Array) -> jax.Array:
    """`a` [R, ..., S (at `axis`), ...] with token-major `new_BT` [B, T, ...] at (row, slot), written in
    place; a token whose slot or row is outside `a` (slot -1: masked) is dropped."""
    outer, inner = math.prod(a.shape[1:axis]), math.prod(a.shape[axis + 1:])
    n = math.prod(rows_BT.shape)
    tokens = new_BT.astype(a.dtype).reshape(n, outer, inner)
    rows, slots = rows_BT.reshape(n).astype(jnp.int32), slots_BT.reshape(n).astype(jnp.int32)
    return jax.ffi.ffi_call(_STORE[0], jax.ShapeDtypeStruct(a.shape, a.dtype), input_output_aliases={0: 0},
                            vmap_method="sequential")(a, tokens, rows, slots, axis=np.int64(axis))
