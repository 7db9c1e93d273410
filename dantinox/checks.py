"""Argument checks shared by every dantinox entry point: one message shape, `name: expected X, got Y`.

`positive_int` needs numpy alone, so the host-side bookkeeping that uses it (the page allocators, the engine's
scheduler) imports no JAX; the checks of model inputs import JAX where they run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import jax


def positive_int(name: str, value: Any, minimum: int = 1) -> int:
    """`value` as a Python int if it is an integer (Python or numpy, not bool) >= `minimum`,
    else ValueError."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name}: expected {what}, got {value!r}")
    return int(value)


def check_ids(vocab_size: int, ids: Any, name: str = "ids") -> jax.Array:
    """Validate token ids: an integer array [batch, tokens] with values in [0, vocab_size)."""
    import jax
    import jax.numpy as jnp

    arr = ids if isinstance(ids, jax.core.Tracer) else np.asarray(ids)
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected an integer array of shape [batch, tokens], got shape {arr.shape}")
    if not jnp.issubdtype(arr.dtype, jnp.integer):
        raise ValueError(f"{name}: expected integer token ids, got dtype {arr.dtype}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"{name}: expected at least one sequence of at least one token, got shape "
                         f"{arr.shape}")
    if not isinstance(arr, jax.core.Tracer):
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name}: token ids must lie in [0, {vocab_size}), got values in [{lo}, {hi}]")
    if isinstance(arr, jax.core.Tracer):
        return arr.astype(jnp.int32)
    # a host copy first: the transfer and the computations after it are dispatched asynchronously, and must
    # not see ids the caller changes after the call returns
    return jnp.asarray(np.array(arr, np.int32, copy=True))


def concrete_index(cache_index: Any) -> int:
    """The cache index as a Python int; a traced index cannot be bounds-checked, so it is refused."""
    import jax

    if isinstance(cache_index, jax.core.Tracer):
        raise ValueError("cache_index: must be a concrete integer so the write can be bounds-checked; "
                         "inside jax.jit use dantinox.generate or dantinox.stream, "
                         "which check bounds up front")
    arr = np.asarray(cache_index)
    if arr.ndim != 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"cache_index: expected an integer, got {cache_index!r}")
    return int(arr)
