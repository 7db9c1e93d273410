"""A request's part of the engine's layers: its seat's row of each sliding-window (ring) layer, its pages of
each paged layer. `copy_out` takes that part out and `copy_in` puts it back: a swap to host memory and back,
and a ring prefix kept for later requests (dantinox/engine/kv_manager.py, ring_prefixes.py); the runner reads
and writes the seats' rows in its compiled iteration (`seat_rows`, `put_seat_rows`)."""

from __future__ import annotations

import jax

from dantinox.cache.paged import put_pages, take_pages


def seat_rows(layer, seat):
    """A seated layer's rows at `seat` (one seat, or [B] of them): a ring's slots or a recurrent state."""
    return type(layer)(*(None if a is None else a[seat] for a in layer))


def put_seat_rows(layer, rows, seat):
    """The layer with `rows` (as seat_rows gives them) written back at `seat`."""
    return type(layer)(*(None if a is None else a.at[seat].set(p) for a, p in zip(layer, rows, strict=True)))


def copy_out(layers: tuple, ring: tuple[bool, ...], seat: int, pages: jax.Array | None,
             page_size: int) -> tuple:
    """A request's part of each layer: its seat's row of a ring layer, its `pages` of a paged one (None for
    paged layers when `pages` is None)."""
    return tuple(seat_rows(layer, seat) if r
                 else None if pages is None else take_pages(layer, pages, page_size)
                 for layer, r in zip(layers, ring, strict=True))


def copy_in(layers: tuple, ring: tuple[bool, ...], seat: int, pages: jax.Array | None, saved: tuple,
            page_size: int) -> tuple:
    """`layers` with `saved` (as `copy_out` gave it, on the host or the device) written back at the seat's row
    and at `pages`; a None part leaves its layer as it is."""
    def put(layer, part, r):
        return put_seat_rows(layer, part, seat) if r else put_pages(layer, pages, part, page_size)
    return tuple(layer if part is None else put(layer, part, r)
                 for layer, part, r in zip(layers, saved, ring, strict=True))
