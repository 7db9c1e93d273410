"""Configs as earlier dantinox versions wrote them (runs/*/config.json of older runs),
read into today's fields.

`ModelConfig.from_dict` passes every dict through `upgrade` before it checks the field names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dantinox.architectures.windows import local_layers


def upgrade(data: dict[str, Any], defaults: Any, variants: tuple[str, ...], cache_fields: tuple[str, ...],
            heads_fields: Callable[..., dict]) -> dict[str, Any]:
    """Fields as earlier dantinox versions wrote them, in today's form: mlp_width None (3 * d_model),
    attention as a variant label (mha/gqa/mqa/mla) beside kv_heads, one window or chunk size placed by a
    window_pattern ("local" or "n:1"), block_size for what is now page_size (the paged cache's tokens per
    page), and the cache's fields flat beside the architecture's, as every config written before CacheConfig
    has them: they move under "cache". `ModelConfig.from_dict` passes its class (`defaults`: the default
    widths), its variant labels, the cache's field names and its `heads_fields`,
    so this module needs nothing from config.py."""
    data = dict(data)
    if "block_size" in data:
        if "page_size" in data or "page_size" in (data.get("cache") or {}):
            raise ValueError("config: block_size is the old name of page_size; give one of them, not both")
        data["page_size"] = data.pop("block_size")
    flat = {name: data.pop(name) for name in cache_fields if name in data}
    cache = dict(data.get("cache") or {})
    unknown = sorted(set(cache) - set(cache_fields))
    if unknown:
        raise ValueError(f"config: unknown field(s) {', '.join('cache.' + name for name in unknown)}")
    if set(flat) & set(cache):
        raise ValueError(f"config: {sorted(set(flat) & set(cache))[0]} is given both flat and under cache; "
                         f"give it once")
    if flat or cache:
        data["cache"] = {**cache, **flat}
    if "mlp_width" in data and data["mlp_width"] is None:
        data["mlp_width"] = 3 * data.get("d_model", defaults.d_model)
    if data.get("attention") in variants:
        n = data.get("n_heads", defaults.n_heads)
        variant, k = data["attention"], data.get("kv_heads")
        data.update(heads_fields(variant, n, k))
        if variant in ("mha", "mla") and k not in (None, n):
            raise ValueError(f"kv_heads: attention={variant!r} has {n} KV heads (n_heads), got {k}")
    pattern = data.pop("window_pattern", "local")
    n_layers = data.get("n_layers", defaults.n_layers)
    for old, new in (("sliding_window", "sliding_windows"), ("attention_chunk_size", "attention_chunks")):
        if old not in data:
            continue
        size = data.pop(old)
        if size is None:
            continue
        head, _, tail = str(pattern).partition(":")
        if pattern != "local" and not (head.isdigit() and int(head) >= 1 and tail == "1"):
            raise ValueError(f"window_pattern: expected 'local' or 'n:1' with n >= 1 (e.g. '1:1', '5:1'), "
                             f"got {pattern!r}")
        data[new] = local_layers(n_layers, size, None if pattern == "local" else int(head))
    return data
