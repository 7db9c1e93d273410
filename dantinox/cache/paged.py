"""Paged KV cache: fixed-size pages in a shared pool, a page table per sequence (PagedAttention,
arXiv:2309.06180).

Device side, one addressing of dantinox/cache/container.py's layouts. Each paged layer holds a pool of
`num_pages` pages of `page_size` token slots as one row of num_pages · page_size slots ([1, K, H, P · ps]
keys, [1, K, P · ps, H] values, [1, P · ps, C + R] MLA latents; int8 codes and their scales alike); the
container holds one page table [B, M] for all of them: logical page m of sequence b lives in physical page
table[b, m]. A write scatters new tokens through the table. A batch's decode step over K/V heads in float32,
bfloat16 or int8 may be read by a backend's kernel (dantinox/backend/pool_kernel.py), each sequence's slots
where they lie (`reads_in_place`). Otherwise attention reads the whole pool with other sequences' slots
masked, or, where that would compute too many extra scores, each sequence's pages gathered into slot order
(`Paged.reads_pool`; the roofline counts a gather's copy). The config chooses it:
`ModelConfig(..., cache_layout="paged", page_size=16)`. Sliding-window and chunked layers of a paged config
keep their ring of W slots per sequence: a ring is already bounded, so paging it would save nothing.

Host side, `PageManager` (dantinox/cache/page_manager.py) owns the free list, reference counts, page tables
and fill counts; the copy-on-write copies its `append` returns are applied here by `copy_pages`. Asking for
more pages than are free raises PoolExhausted; nothing is ever silently overwritten.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from dantinox import ops
from dantinox.architectures.config import LayerSpec, ModelConfig
from dantinox.cache.container import KVCache, empty_cache
from dantinox.cache.layout import Contiguous
from dantinox.cache.page_manager import PageManager, PoolExhausted, pages_for  # noqa: F401  (re-exported)
from dantinox.cache.registry import ADDRESSING, layouts, register
from dantinox.checks import positive_int

# The largest `pool_read_excess` at which a paged layer reads its whole pool instead of gathering its pages:
# the extra scores of the whole-pool read against the gather's copy of every page it reads (measured:
# docs/benchmarks.md#speed-layer-rules, POOL_READ_MAX; benchmarks/cache_steps.py times both at 15 and 28).
POOL_READ_MAX = 16


@ops.takes_over("reads_in_place")  # a backend with a kernel that reads the pool as it lies says so
def reads_in_place(T: int, payload: type, k_dtype: Any, scale_layout: str | None) -> bool:
    """Whether attention reads a paged pool of `payload` (stored in `k_dtype`, scales laid out as
    `scale_layout`) where it lies, each sequence's own slots with neither a gather nor other sequences'
    scores. attend's einsum cannot: no."""
    return False


@dataclasses.dataclass(frozen=True)
class Paged(Contiguous):
    """Position p of sequence b in slot p mod ps of physical page table[b, p // ps].

    A layer's pool is one row of P pages (P · ps slots, page n holding slots n · ps .. n · ps + ps - 1), so
    it can be read two ways, both exact: every query attends over the whole pool, with the slots of
    other sequences' pages masked out (no copy; the score matrix is P / M times the sequences' own, for
    a table of M pages per sequence), or each sequence's pages are first gathered into slot order (a copy
    of B · M pages per step). `reads_pool` picks one from the shapes at trace time.
    """

    page_size: int
    query_heads: int = 1  # query heads per cached head (G; MLA's latent: all N heads read one row)
    pooled: ClassVar[bool] = True

    def locate(self, pos_BT, live_BT, after_B, S, table):
        page_BT = jnp.take_along_axis(table, jnp.clip(pos_BT // self.page_size, 0, table.shape[1] - 1),
                                      axis=1)
        slot_BT = page_BT * self.page_size + pos_BT % self.page_size
        return jnp.zeros_like(pos_BT), jnp.where(live_BT, slot_BT, -1)

    def pool_read_excess(self, T: int, pool_pages: int, table_pages: int) -> float:
        """Score entries the whole-pool read computes beyond a gathered read's, per gathered slot: each of
        the T · query_heads query rows of a sequence scores (P - M) · ps other slots per M · ps of its
        own."""
        return T * self.query_heads * (pool_pages - table_pages) / table_pages

    def reads_pool(self, T: int, pool_pages: int, table_pages: int) -> bool:
        """Whether attention reads the whole pool (True) or gathered pages: a gather copies every page it
        reads, the whole-pool read computes `pool_read_excess` more scores; see POOL_READ_MAX."""
        return self.pool_read_excess(T, pool_pages, table_pages) <= POOL_READ_MAX

    def reads_in_place(self, T: int, payload: type, k_dtype: Any, scale_layout: str | None) -> bool:
        """Whether attention reads each sequence's slots where they lie (`reads_in_place` below), so the pool
        is read whole whatever `reads_pool` says."""
        return reads_in_place(T, payload, k_dtype, scale_layout)

    def read(self, layer, table, lengths_B, T):
        ps, (B, M) = self.page_size, table.shape
        P = layer.slots // ps
        in_place = self.reads_in_place(T, type(layer), layer[0].dtype, layer.scale_layout)
        if not in_place and not self.reads_pool(T, P, M):
            return layer.gather(table, ps), self.positions(lengths_B, M * ps)
        # logical page of every physical page for each sequence (-1: not one of its written pages)
        m_BM = jnp.broadcast_to(jnp.arange(M, dtype=jnp.int32), (B, M))
        held_BM = m_BM * ps < lengths_B[:, None]
        page_BM = jnp.where(held_BM, table, P)
        owner_BP = jnp.full((B, P), -1, jnp.int32).at[jnp.arange(B)[:, None], page_BM].set(m_BM, mode="drop")
        slot_BPs = owner_BP[:, :, None] * ps + jnp.arange(ps, dtype=jnp.int32)
        pos_BS = slot_BPs.reshape(B, P * ps)  # < 0: not its
        return layer, jnp.where((pos_BS >= 0) & (pos_BS < lengths_B[:, None]), pos_BS, -1)


def _paged_view(a: jax.Array, axis: int, page_size: int) -> jax.Array:
    """A one-row pool field [1, ..., P · ps, ...] as [..., P, ps, ...] (its page axis at axis - 1)."""
    a = a[0]
    return a.reshape(a.shape[:axis - 1] + (a.shape[axis - 1] // page_size, page_size) + a.shape[axis:])


def take_pages(layer: Any, pages: jax.Array, page_size: int) -> Any:
    """The pages `pages` [n] of a paged layer's pool, each field as [..., n, ps, ...]."""
    return layer.map_slots(lambda a, axis: jnp.take(_paged_view(a, axis, page_size), pages, axis=axis - 1))


def put_pages(layer: Any, pages: jax.Array, parts: Any, page_size: int) -> Any:
    """The pool with pages `pages` [n] replaced by `parts` (from take_pages)."""
    def put(a: jax.Array, part: Any, axis: int) -> jax.Array:
        if a is None:
            return None
        view = _paged_view(a, axis, page_size)
        at = (slice(None),) * (axis - 1) + (pages,)
        return view.at[at].set(jnp.asarray(part, a.dtype)).reshape(a.shape)
    return type(layer)(*(put(a, p, ax) for a, p, ax in zip(layer, parts, layer.SEQ_AXES, strict=True)))


def init_pool(cfg: ModelConfig, num_pages: int, table_BM: Any) -> KVCache:
    """An empty paged cache: per paged layer a pool of `num_pages` pages, all read through `table_BM`."""
    num_pages = positive_int("num_pages", num_pages)
    if cfg.cache_layout != "paged":
        raise ValueError("cfg: init_pool builds a paged cache; this config has "
                         f"cache_layout={cfg.cache_layout!r}")
    table = np.asarray(table_BM)
    return empty_cache(cfg, table.shape[0], table.shape[1] * cfg.page_size, table, num_pages)


def pool_bytes(cfg: ModelConfig, num_pages: int, page_size: int) -> int:
    """Bytes of the key/value (or latent) pools of every layer, measured from their shapes;
    page table excluded."""
    paged = cfg.replace(cache_layout="paged", page_size=page_size, sliding_windows=None,
                        attention_chunks=None)
    shapes = jax.eval_shape(lambda: init_pool(paged, num_pages, np.zeros((1, 1), np.int32)))
    return shapes.nbytes


@partial(jax.jit, static_argnums=(0,))
def _copy(page_sizes: tuple, caches: KVCache, src: jax.Array, dst: jax.Array) -> KVCache:
    layers = tuple(layer if ps is None else put_pages(layer, dst, take_pages(layer, src, ps), ps)
                   for layer, ps in zip(caches.layers, page_sizes, strict=True))
    return caches._replace(layers=layers)


def copy_pages(cfg: ModelConfig, caches: KVCache, copies: Sequence[tuple[int, int]]) -> KVCache:
    """Apply copy-on-write copies (src, dst) from PageManager.append to every paged layer's pool."""
    if not copies:
        return caches
    src, dst = (jnp.asarray(c, jnp.int32) for c in zip(*copies, strict=True))
    return _copy(page_sizes(cfg), caches, src, dst)


def page_sizes(cfg: ModelConfig) -> tuple[int | None, ...]:
    """Each layer's page size, None for a layer that is not paged (a ring)."""
    return tuple(lay.addressing.page_size if lay.addressing.pooled else None for lay in layouts(cfg))


@register(ADDRESSING, "paged")
def _paged(cfg: ModelConfig, layer: LayerSpec) -> Paged:
    """A full layer of a paged cache (sliding and chunked layers keep their ring: it is already bounded)."""
    return Paged(cfg.page_size, cfg.n_heads if cfg.attention == "latent" else cfg.n_heads // layer.kv_heads)
