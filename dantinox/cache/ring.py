"""Sliding-window and chunked layers: ring-buffer addressing (one layout axis of dantinox/cache/container.py).

A local layer with window W attends to the current token and the W - 1 before it, so it keeps only the
keys and values of the last W positions: position p lives in slot p mod W (Mistral 7B's rolling buffer,
arXiv:2310.06825 §2). The buffer holds min(length, W) slots; while it has fewer than W slots, position p
is slot p, so growing it keeps every written token where it is. Which position a slot holds is not
stored: it follows from the cache's `lengths` (`positions`), so the buffer's bytes are exactly the
stored values, as the per-layer formula counts them. Storage (float or int8 codes) and payload (K/V heads
or MLA latents) are the other axes: a ring of int8 codes is a Ring with a quantized config.

A chunked layer (Llama 4's `attention_chunk_size` C; dantinox's `attention_chunks`) attends only within its
own chunk of C positions, [C·floor(p / C), p]: the same ring of C slots, with the chunk as its visibility
rule.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from dantinox.architectures.config import LayerSpec, ModelConfig
from dantinox.cache.layout import Contiguous
from dantinox.cache.registry import ADDRESSING, register


@dataclasses.dataclass(frozen=True)
class Ring(Contiguous):
    """Position p in slot p mod S of a ring of S = min(length, W) slots;
    keys more than W - 1 back are masked."""

    size: int  # W slots (the sliding window); for Chunked, the chunk size C
    bounded: ClassVar[bool] = True

    def slots(self, length: int) -> int:
        return min(length, self.size)

    def visible(self, q_pos, k_pos) -> jax.Array:
        return q_pos - k_pos < self.size  # the band: the current token and the W - 1 before it

    def locate(self, pos_BT, live_BT, after_B, S, table):
        """Slot p mod S; of a run longer than the ring only the last S real tokens are written
        (distinct slots)."""
        rows = jnp.broadcast_to(jnp.arange(pos_BT.shape[0])[:, None], pos_BT.shape)
        keep = live_BT & (pos_BT >= after_B[:, None] - S)
        return rows, jnp.where(keep, pos_BT % S, -1)

    def positions(self, lengths_B: jax.Array, S: int) -> jax.Array:
        """Position held by each slot after `lengths` tokens: the latest p < length with p = s mod S
        (-1: empty)."""
        s_S = jnp.arange(S)[None, :]
        p = s_S + S * jnp.floor_divide(lengths_B[:, None] - 1 - s_S, S)
        return jnp.where(p >= 0, p, -1)

    def reads_before_write(self, T: int) -> bool:
        # a prompt's early queries need keys its later tokens evict; one token writes, then attends
        return T > 1


@dataclasses.dataclass(frozen=True)
class SinkRing(Ring):
    """StreamingLLM (Xiao et al. 2023, arXiv:2309.17453):
    the first `sinks` positions kept forever beside a ring.

    Slots 0 .. S-1 hold positions 0 .. S-1; the other slots are a ring for positions >= S. A query at
    position p sees the sinks and its window (the current token and the W - 1 before it). Positions are
    assigned within the cache, as the paper does: the kept tokens are numbered consecutively, so the
    window keeps its text distances and a sink at k is seen from p - shift, shift = max(0, p - W + 1 - S)
    (`sink_shift`); attention rotates the query once more for the sink slots.
    """

    sinks: int = 0  # S
    keeps_sinks: ClassVar[bool] = True

    def slots(self, length: int) -> int:
        return min(length, self.size + self.sinks)

    def visible(self, q_pos, k_pos) -> jax.Array:
        return (k_pos < self.sinks) | (q_pos - k_pos < self.size)

    def sink_shift(self, q_pos) -> jax.Array:
        """How far the cache moves query p towards the sinks:
        the tokens evicted between them and its window."""
        return jnp.maximum(q_pos - self.size + 1 - self.sinks, 0)

    def _ring(self, S: int) -> int:
        return max(S - self.sinks, 1)

    def locate(self, pos_BT, live_BT, after_B, S, table):
        rows = jnp.broadcast_to(jnp.arange(pos_BT.shape[0])[:, None], pos_BT.shape)
        n = self._ring(S)
        sink = pos_BT < self.sinks
        keep = live_BT & (sink | (pos_BT >= after_B[:, None] - n))
        return rows, jnp.where(keep, jnp.where(sink, pos_BT, self.sinks + (pos_BT - self.sinks) % n), -1)

    def positions(self, lengths_B: jax.Array, S: int) -> jax.Array:
        s_S = jnp.arange(S)[None, :]
        n = self._ring(S)
        r = s_S - self.sinks
        ring = self.sinks + r + n * jnp.floor_divide(lengths_B[:, None] - 1 - self.sinks - r, n)
        p = jnp.where(s_S < self.sinks, s_S, jnp.where(ring >= self.sinks, ring, -1))
        return jnp.where((p >= 0) & (p < lengths_B[:, None]), p, -1)


@dataclasses.dataclass(frozen=True)
class Chunked(Ring):
    """Llama 4's chunked attention: a ring of one chunk of C positions, a query sees only its own chunk."""

    def visible(self, q_pos, k_pos) -> jax.Array:
        return q_pos // self.size == k_pos // self.size


@register(ADDRESSING, "sliding")
def _sliding(cfg: ModelConfig, layer: LayerSpec) -> Ring:
    return SinkRing(layer.window, cfg.attention_sinks) if cfg.attention_sinks else Ring(layer.window)


@register(ADDRESSING, "chunked")
def _chunked(cfg: ModelConfig, layer: LayerSpec) -> Chunked:
    return Chunked(layer.window)


def ring_slots_held(window: int, written: int) -> list[int | None]:
    """Which position each slot of a full ring of `window` slots holds after `written` tokens (None: empty).

    The same rule as Ring.positions, in plain Python for the lab's ring-buffer view.
    """
    held = []
    for s in range(window):
        p = s + window * ((written - 1 - s) // window)
        held.append(p if p >= 0 else None)
    return held
