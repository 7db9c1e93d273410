"""dantinox/engine/ring_prefixes.py: which boundaries keep a seat's rings, how a hit is trimmed, what eviction drops.

The engine tests run it through whole requests; these pin the bookkeeping itself, including a case those do
not reach: pages named long after their boundary (a request swapped back in names all its pages again), whose
rings are gone, so a later hit must stop before them."""

from dantinox.cache.page_pool import PagePool
from dantinox.engine.ring_prefixes import RingPrefixes

PAGE = 4
LAYERS = (None,)  # one paged layer: the bookkeeping needs no arrays (a paged layer's part of a copy is None)


def names(n):
    return [bytes([m]) for m in range(n)]


def test_off_without_ring_layers_or_prefix_caching():
    off = RingPrefixes((False,), 0, PAGE)
    assert not off
    off.keep(LAYERS, 0, 8, list(enumerate(names(2))))
    assert off.rows_at == {} and off.trim([10, 11], lambda n: names(2)[n - 1]) == [10, 11]


def test_only_boundaries_the_ring_still_covers_are_kept_and_a_hit_ends_at_the_last_one():
    prefixes = RingPrefixes((False,), 6, PAGE)  # the ring reaches 6 slots past its window
    d = names(4)
    # a request at 16 computed tokens names pages 0-3 (boundaries 4, 8, 12, 16): 16 - 8 > 6, so only 12 and 16
    prefixes.keep(LAYERS, 0, 16, list(enumerate(d)))
    assert set(prefixes.rows_at) == {d[2], d[3]}
    assert prefixes.trim([10, 11, 12, 13], lambda n: d[n - 1]) == [10, 11, 12, 13]  # ends at 16: kept
    assert prefixes.trim([10, 11], lambda n: d[n - 1]) == []  # ends at 8, and 4 has no rings either
    # the same boundary seen again later (a second request) keeps the first copy
    first = prefixes.rows_at[d[2]]
    prefixes.keep(LAYERS, 1, 12, [(2, d[2])])
    assert prefixes.rows_at[d[2]] is first


def test_rings_of_pages_the_pool_no_longer_names_are_let_go():
    pool = PagePool(2)
    prefixes = RingPrefixes((False,), 8, PAGE)
    a, b = pool.take(), pool.take()
    pool.register(a, b"a")
    pool.register(b, b"b")
    prefixes.keep(LAYERS, 0, 8, [(0, b"a"), (1, b"b")])
    pool.release(a)
    pool.release(b)
    prefixes.forget_evicted(pool)
    assert set(prefixes.rows_at) == {b"a", b"b"}  # freed but still cached: kept
    pool.take()  # overwrites the least recently freed, a
    prefixes.forget_evicted(pool)
    assert set(prefixes.rows_at) == {b"b"}
