"""Sliding-window layers: the ring-buffer cache of a local layer (another layout on dantinox/cache.py's protocol).

A local layer with window W attends to the current token and the W - 1 before it, so it keeps only the
keys and values of the last W positions: position p lives in slot p mod W (Mistral 7B's rolling buffer,
arXiv:2310.06825 §2). The buffer holds min(length, W) slots; while it has fewer than W slots, position p
is slot p, so growing it (dantinox.grow_cache) keeps every written token where it is. Which position a
slot holds is not stored: it follows from how many tokens were written (`slot_positions`), so the
buffer's bytes are exactly the keys and values, as the per-layer formula counts them.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dantinox.config import ModelConfig


class RingCache(NamedTuple):
    """Keys and values of the last min(length, W) positions of one local layer; W is the class's WINDOW."""

    k: jax.Array  # [B, K, S, H], S = min(length, W); keys after RoPE
    v: jax.Array  # [B, K, S, H]

    SEQ_AXIS = 2
    WINDOW = 0  # set by RingCache.of(W)

    @staticmethod
    @functools.cache
    def of(window: int) -> type[RingCache]:
        """The ring layout for window W (one class per W, so W is static and the arrays hold only K and V)."""
        return type(f"RingCache{window}", (RingCache,), {"WINDOW": window, "__slots__": ()})

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, length: int) -> RingCache:
        shape = (batch, cfg.n_kv_heads, min(length, cls.WINDOW), cfg.head_size)
        return cls(jnp.zeros(shape, cfg.cache_jnp_dtype), jnp.zeros(shape, cfg.cache_jnp_dtype))

    def write(self, k_BKTH: jax.Array, v_BKTH: jax.Array, index: jax.Array | int) -> RingCache:
        """Store positions index .. index + T - 1 at their slots p mod W; of a longer run only the last S survive."""
        S, T = self.k.shape[self.SEQ_AXIS], k_BKTH.shape[2]
        n = min(T, S)  # static: a prefill longer than the buffer keeps its last S tokens
        slots_n = (index + T - n + jnp.arange(n)) % self.WINDOW  # distinct, since n <= S <= W
        return type(self)(self.k.at[:, :, slots_n].set(k_BKTH[:, :, T - n:].astype(self.k.dtype)),
                          self.v.at[:, :, slots_n].set(v_BKTH[:, :, T - n:].astype(self.v.dtype)))

    def read(self) -> tuple[jax.Array, jax.Array]:
        return self.k, self.v

    def slot_positions(self, written: jax.Array | int) -> jax.Array:
        """Absolute position held by each slot after `written` tokens: the latest p < written with p = s mod W.

        Negative for a slot not written yet (attention masks it).
        """
        s_S = jnp.arange(self.k.shape[self.SEQ_AXIS])
        return s_S + self.WINDOW * jnp.floor_divide(written - 1 - s_S, self.WINDOW)


def ring_slots_held(window: int, written: int) -> list[int | None]:
    """Which position each slot of a full ring of `window` slots holds after `written` tokens (None: empty).

    The same rule as RingCache.slot_positions, in plain Python for the lab's ring-buffer view.
    """
    held = []
    for s in range(window):
        p = s + window * ((written - 1 - s) // window)
        held.append(p if p >= 0 else None)
    return held
