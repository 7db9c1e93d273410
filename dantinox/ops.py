"""Where a speed layer may step in: the few operations a backend can compute its own way, and nothing else.

The reference modules (model.py, attention.py, cache.py, paged.py, generate.py) mark each such operation with
`@takes_over("name")` on its plain JAX function and import no backend. A backend is an object whose method of
that name receives the call's arguments by name and returns its own result, or None to leave the call to the
plain function. `Reference` declines everything; dantinox/backend installs its own backend once, when dantinox
is imported (`install`), unless DANTINOX_BACKEND=reference.

    attend          attention without sinks (kept tokens or learned logits) or returned weights
                    (dantinox/architectures/attention.py)
    store           new tokens into a cache array (dantinox/cache/container.py)
    reads_in_place  whether attend reads a paged pool where it lies, so no page is gathered
                    (dantinox/cache/paged.py)
    dot_general     a dense layer's product, and promote_dtype, its operands' dtypes
                    (dantinox/architectures/model.py)
    take_rows       the embedding lookup (dantinox/architectures/model.py)
    compiler_options  XLA options for a decode program (dantinox/generation/generate.py)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


class Reference:
    """The pure-JAX backend: every operation is its plain function's."""

    name = "reference"

    def __getattr__(self, operation: str) -> Callable[..., None]:
        return lambda **arguments: None  # declined: the plain function computes it


_backend: Any = Reference()


def install(backend: Any) -> None:
    """Route the marked operations to `backend` (its methods by name; None from one: the plain function)."""
    global _backend
    _backend = backend


def current() -> Any:
    """The installed backend."""
    return _backend


def takes_over(operation: str) -> Callable[[Callable], Callable]:
    """Mark `fn` as an operation the installed backend may compute: its method `operation`, called with fn's
    arguments by name (defaults filled in), answers first, and fn runs where it returns None."""
    def mark(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            taken = getattr(_backend, operation)(**bound.arguments)
            return fn(*args, **kwargs) if taken is None else taken
        return call
    return mark


@takes_over("promote_dtype")
def promote_dtype(args: tuple, *, dtype=None, inexact: bool = True) -> tuple:
    """nnx.Linear's promotion of its operands to one dtype (`dtype`, else their common one)."""
    return nnx.nn.dtypes.promote_dtype(args, dtype=dtype, inexact=inexact)


@takes_over("dot_general")
def dot_general(x: jax.Array, w: jax.Array, dims, precision=None, preferred_element_type=None,
                out_sharding=None) -> jax.Array:
    """nnx.Linear's product: jax.lax.dot_general."""
    return jax.lax.dot_general(x, w, dims, precision, preferred_element_type=preferred_element_type,
                               out_sharding=out_sharding)


@takes_over("take_rows")
def take_rows(table_VD: jax.Array, ids: jax.Array) -> jax.Array:
    """nnx.Embed's lookup: the rows of `table_VD` at `ids` (NaN rows for ids outside the table)."""
    return jnp.take(table_VD, ids, axis=0)
