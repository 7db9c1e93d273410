"""Which layout each layer gets: the rules every layout module registers, looked up by name.

Three tables, one per axis of a layout (layout.py):
  ADDRESSING  layer kind ("full", "sliding", "chunked") or, for full layers, the cache's `cache_layout`
              ("contiguous", "paged") -> build(cfg, layer) -> an addressing
  PAYLOAD     a layer kind ("shared", "state", "conv", "mamba") or the model's attention kind ("latent";
              "indexed_latent" for a latent model with DeepSeek-V3.2's indexer) -> a payload type; any other
              layer stores K/V heads
  MODES       a whole-cache storage mode that brings its own layout (KIVI, H2O eviction): name -> build(cfg,
              layer) -> a Layout; `mode_of(cfg)` names the one a cache config asks for
A layout module registers its own entries when the package `dantinox.cache` is imported, so adding a layout
or a storage touches its module, its line in dantinox/cache/__init__.py and its tests (docs/EXTENDING.md).
Nothing here imports a layout module, and no layout module imports another's: no import circle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dantinox.architectures.config import LayerSpec, ModelConfig
from dantinox.cache.layout import Contiguous, LatentCache, LayerCache, Layout

ADDRESSING: dict[str, Callable[[ModelConfig, LayerSpec], Any]] = {
    "contiguous": lambda cfg, layer: Contiguous()}
PAYLOAD: dict[str, type] = {"latent": LatentCache}
MODES: dict[str, Callable[[ModelConfig, LayerSpec], Layout]] = {}


def register(table: dict, name: str):
    """Decorator: `@register(ADDRESSING, "sliding")` puts the decorated builder in `table` under `name`."""
    def put(entry):
        if name in table:
            raise ValueError(f"{name!r} is registered twice in one layout table")
        table[name] = entry
        return entry
    return put


def mode_of(cfg: ModelConfig) -> str | None:
    """The whole-cache storage mode `cfg.cache` asks for: "kivi", "eviction" or None (per-layer layouts)."""
    if cfg.kivi_bits is not None:
        return "kivi"
    return "eviction" if cfg.eviction is not None else None


def addressing_key(cfg: ModelConfig, layer: LayerSpec) -> str:
    """The ADDRESSING entry of one layer: its kind, or for a full layer the cache's contiguous / paged."""
    return cfg.cache_layout if layer.kind == "full" else layer.kind


def layer_layout(cfg: ModelConfig, layer: LayerSpec) -> Layout:
    """The layout of one layer, given its filled-in spec (one of cfg.layers), under cfg.cache."""
    mode = mode_of(cfg)
    if mode is not None:  # the config refuses per-layer K, H and windows with KIVI and eviction
        return MODES[mode](cfg, layer)
    key = addressing_key(cfg, layer)
    if key not in ADDRESSING:
        raise ValueError(f"layers: no cache layout is registered for {key!r} (registered: "
                         f"{', '.join(sorted(ADDRESSING))})")
    indexed = cfg.attention == "latent" and cfg.index_topk is not None  # MLA with the lightning indexer
    payload = (PAYLOAD.get(layer.kind)
               or PAYLOAD.get("indexed_latent" if indexed else cfg.attention, LayerCache))
    return Layout(ADDRESSING[key](cfg, layer), payload, layer, cfg.cache)


def layouts(cfg: ModelConfig) -> tuple[Layout, ...]:
    """The layout of every layer of a config (its layer specs under its cache config)."""
    return tuple(layer_layout(cfg, layer) for layer in cfg.layers)
