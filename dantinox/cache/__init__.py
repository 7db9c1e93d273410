"""The KV cache and its layouts: the container (container.py), one layer's layout and payloads (layout.py),
the registry that picks a layer's layout (registry.py), and one module per layout or storage: ring.py,
paged.py with its host-side allocator (page_manager.py, page_pool.py), quant.py, kivi.py, eviction.py,
shared.py (a layer that reads another's cache), state.py (recurrent layers' constant states), indexer.py
(DeepSeek-V3.2's indexer keys beside MLA's latents).

Importing the package registers every layout module's entries; `dantinox.cache.X` names what the rest of
dantinox and its users read.
"""

from dantinox.cache import eviction, indexer, kivi, paged, ring, shared, state  # noqa: F401  (each registers its layouts)
from dantinox.cache.container import (
    KVCache,
    add_caches,
    cache_length,
    cache_shapes,
    empty_cache,
    filled_slots,
    grow_cache,
    init_cache,
    keep_slots,
    resize_layers,
    tree_nbytes,
)
from dantinox.cache.indexer import IndexedLatentCache
from dantinox.cache.layout import Contiguous, LatentCache, LayerCache, Layout, View, writes_as_slice
from dantinox.cache.registry import layer_layout, layouts

__all__ = [
    "Contiguous", "IndexedLatentCache", "KVCache", "LatentCache", "LayerCache", "Layout", "View",
    "add_caches", "cache_length", "cache_shapes", "empty_cache", "filled_slots", "grow_cache", "init_cache",
    "keep_slots", "layer_layout", "layouts", "resize_layers", "tree_nbytes", "writes_as_slice",
]
