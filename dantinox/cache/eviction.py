"""Score-based eviction: H2O's heavy hitters under a fixed budget (Zhang et al. 2023, arXiv:2306.14048).

Every layer keeps at most N = `cache_budget` slots. A call attends over the kept slots and its new tokens
side by side, adds the attention weights each candidate received (summed over heads and the call's
queries) to that candidate's running score, and then keeps N of them: the tokens among the latest N // 2
positions, and the others with the largest scores (the heavy hitters); ties go to the older token. For one
new token that is H2O's step: the non-recent token with the least accumulated attention gives up its slot.
A prompt longer than the budget is compressed the same way after attending to itself in full.

After evictions a slot's position no longer follows from the fill, so it is stored beside the slot, with
the score: each slot costs 2·K·H elements plus a float32 score and an int32 position, all counted by
`kv_cache_bytes`. One kept set per layer, shared by its KV heads (scores summed over all heads), where the
paper chooses per head: a set shared by the heads is what a page table shared by the heads could express.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from dantinox.architectures.config import LayerSpec, ModelConfig
from dantinox.cache.layout import Contiguous, LayerCache, Layout, View
from dantinox.cache.registry import MODES, register

BOOKKEEPING_BYTES = 4 + 4  # per slot: the float32 score and the int32 position


class BudgetFields(NamedTuple):
    k: jax.Array  # [B, K, H, S] keys after RoPE, slot axis last as in LayerCache, S = min(length, N) slots
    v: jax.Array  # [B, K, S, H]
    score: jax.Array  # [B, S] float32, attention each kept token has received so far
    pos: jax.Array  # [B, S] int32, the position each slot holds (-1: empty)


class BudgetCache(BudgetFields):
    """An eviction layer: keys and values of the kept tokens, with their scores and positions."""

    __slots__ = ()
    SEQ_AXES = (3, 2, 1, 1)  # k, v, score, pos

    @property
    def slots(self) -> int:
        return self.k.shape[3]

    @classmethod
    def zeros(cls, cfg: ModelConfig, rows: int, slots: int, layer: Any = None) -> BudgetCache:
        K, H, dtype = cfg.n_kv_heads, cfg.head_size, cfg.cache_jnp_dtype
        return cls(jnp.zeros((rows, K, H, slots), dtype), jnp.zeros((rows, K, slots, H), dtype),
                   jnp.zeros((rows, slots), jnp.float32), jnp.full((rows, slots), -1, jnp.int32))

    encode = staticmethod(LayerCache.encode)  # new tokens arrive as LayerCache; `keep` decides what stays

    def fit_slots(self, cfg: ModelConfig, n: int, fit) -> BudgetCache:
        """The same layer with `n` slots; new slots are empty (position -1)."""
        return BudgetCache(fit(self.k, 3, n), fit(self.v, 2, n), fit(self.score, 1, n),
                           fit(self.pos + 1, 1, n) - 1)


@dataclasses.dataclass(frozen=True)
class Budget(Contiguous):
    """At most `size` slots; which position a slot holds is stored, not computed."""

    size: int  # N
    bounded: ClassVar[bool] = True

    def slots(self, length: int) -> int:
        return min(length, self.size)


@dataclasses.dataclass(frozen=True)
class EvictionLayout(Layout):
    """Budget addressing with H2O's choice: the write waits for the attention weights (`keep`)."""

    cfg: ModelConfig | None = None
    scored: ClassVar[bool] = True

    def update(self, layer: BudgetCache, new: LayerCache, pos_BT: jax.Array, live_BT: jax.Array,
               lengths_B: jax.Array, after_B: jax.Array, table: jax.Array | None) -> tuple[Any, View]:
        """The layer unchanged and the view attention reads: the kept slots beside the new tokens."""
        k_pos = jnp.concatenate([layer.pos, jnp.where(live_BT, pos_BT, -1)], axis=1)
        new_kv = LayerCache(new.k.astype(layer.k.dtype), new.v.astype(layer.v.dtype))
        kv = LayerCache(layer.k, layer.v).concat(new_kv)
        return layer, View(kv, k_pos, self.addressing)

    def keep(self, layer: BudgetCache, view: View, weights_BS: jax.Array, after_B: jax.Array) -> BudgetCache:
        """The layer after this call: the recent tokens and the heavy hitters among the view's candidates."""
        S = layer.slots
        pos_BC = view.k_pos_BS
        valid = pos_BC >= 0
        score_BC = jnp.where(valid, jnp.concatenate([layer.score, jnp.zeros_like(weights_BS[:, S:])], 1)
                             + weights_BS, 0.0)
        recent = valid & (pos_BC >= after_B[:, None] - self.cfg.recent_budget)
        big = jnp.float32(3e38)  # recent tokens first, then by score; empty candidates last
        priority = jnp.where(recent, big, jnp.where(valid, score_BC, -big))
        _, picked_BS = jax.lax.top_k(priority, S)  # equal priorities: the lower index (the older token) wins
        picked_BS = jnp.sort(picked_BS, axis=1)  # kept tokens stay in the order they were written
        take = lambda a: jnp.take_along_axis(a, picked_BS, axis=1)  # noqa: E731
        keys = jnp.take_along_axis(view.payload.k, picked_BS[:, None, None, :], axis=3)
        values = jnp.take_along_axis(view.payload.v, picked_BS[:, None, :, None], axis=2)
        return BudgetCache(keys, values, take(score_BC), take(pos_BC))


@register(MODES, "eviction")
def _eviction(cfg: ModelConfig, layer: LayerSpec) -> EvictionLayout:
    return EvictionLayout(Budget(cfg.cache_budget), BudgetCache, layer, cfg.cache, cfg=cfg)


def budget_cache_bytes(cfg: ModelConfig, batch: int, tokens: int) -> int:
    """Bytes of an eviction cache holding `tokens` positions: min(T, N) slots of K/V heads
    plus bookkeeping."""
    per_slot = 2 * cfg.n_kv_heads * cfg.head_size * cfg.cache_itemsize + BOOKKEEPING_BYTES
    return batch * cfg.n_layers * min(tokens, cfg.cache_budget) * per_slot
