"""Memory accounting: the KV-cache formula, weight bytes, batch capacity and the generated tables."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import jax
import numpy as np
from flax import nnx

from dantinox.architectures.config import RECURRENT_KINDS, ModelConfig
from dantinox.cache import cache_shapes, init_cache, tree_nbytes
from dantinox.cache.eviction import budget_cache_bytes
from dantinox.cache.kivi import kivi_cache_bytes
from dantinox.cache.quant import SCALE_BYTES
from dantinox.cache.state import state_bytes
from dantinox.checks import positive_int


@dataclass(frozen=True)
class DevicePreset:
    """An accelerator (or this machine) for the batch calculator."""

    name: str
    memory_bytes: int
    source: str


def _host_ram() -> int:
    """Physical memory in bytes: POSIX sysconf, or Windows' GlobalMemoryStatusEx
    (Windows has no os.sysconf)."""
    if hasattr(os, "sysconf"):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    import ctypes

    sizes = ("ullTotalPhys", "ullAvailPhys", "ullTotalPageFile", "ullAvailPageFile", "ullTotalVirtual",
             "ullAvailVirtual", "ullAvailExtendedVirtual")

    class MemoryStatus(ctypes.Structure):  # MEMORYSTATUSEX, as sysinfoapi.h declares it
        _fields_ = [("dwLength", ctypes.c_uint32), ("dwMemoryLoad", ctypes.c_uint32),
                    *((name, ctypes.c_uint64) for name in sizes)]

    status = MemoryStatus(dwLength=ctypes.sizeof(MemoryStatus))
    if not ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):
        raise OSError("GlobalMemoryStatusEx failed: cannot read this machine's physical memory")
    return int(status.ullTotalPhys)


# Capacities are what the device reports (nvidia-smi memory.total, in MiB), not the rated "80GB" or "141GB".
# content/devices.yaml holds the same devices for concept entries;
# tests/test_content_devices.py keeps them equal.
DEVICE_PRESETS: dict[str, DevicePreset] = {
    p.name: p
    for p in (
        DevicePreset("A100 40GB", 40_960 * 2**20, "nvidia-smi memory.total of an A100-SXM4-40GB, 40,960 MiB "
                     "(public nvidia-smi logs; rated 40 GB)"),
        DevicePreset("A100 80GB", 81_920 * 2**20, "nvidia-smi memory.total of an A100-SXM4-80GB, 81,920 MiB "
                     "(public nvidia-smi logs; rated 80 GB)"),
        DevicePreset("H100 80GB", 81_559 * 2**20,
                     "nvidia-smi memory.total of an H100 80GB HBM3, 81,559 MiB, as "
                     "printed in https://docs.nvidia.com/datacenter/tesla/mig-user-guide/"),
        DevicePreset("H200 141GB", 143_771 * 2**20, "nvidia-smi memory.total of an H200, 143,771 MiB "
                     "(public nvidia-smi logs; rated 141 GB)"),
        DevicePreset("this machine (RAM)", _host_ram(), "the operating system's physical memory size"),
    )
}


@dataclass(frozen=True)
class WeightFormat:
    """How a checkpoint stores one parameter, for the device fit of a model known by its parameter count."""

    bits: float  # per parameter, shared block scales included
    about: str  # what the bits are, and where the format is defined


# A published checkpoint's format is named in dantinox/data/real_models.json (weights_format,
# with its source).
WEIGHT_FORMATS: dict[str, WeightFormat] = {
    "fp32": WeightFormat(32, "32-bit floats, 4 bytes a parameter"),
    "bf16": WeightFormat(16, "bfloat16, 2 bytes a parameter"),
    "fp8": WeightFormat(8, "8-bit floats (e4m3), 1 byte a parameter; per-block scales left out"),
    "mxfp4": WeightFormat(4.25, "4-bit floats in blocks of 32 that share one 8-bit scale, 4 + 8/32 bits a "
                                "parameter (OCP Microscaling formats, https://arxiv.org/abs/2310.10537)"),
}


def kv_cache_bytes(cfg: ModelConfig, batch_size: int = 1, tokens: int | None = None) -> int:
    """The formula, summed over layers: each layer holds B · slots · (elements per token · bytes + scales).

    slots = T, or min(T, W + S) for a sliding-window layer's ring buffer and its S attention sinks (min(T, C)
    for a chunked one, 0 for a shared layer, which reads another layer's cache; a 'state' layer holds its
    constant recurrent state, `state_bytes`); a KIVI cache (cache_dtype kivi4 / kivi2) is counted by
    `kivi_cache_bytes`, an eviction cache (cache_budget N) by `budget_cache_bytes` (min(T, N) slots, each
    with a score and a position); elements per token = 2 · K · H, or C + R for MLA; a quantized cache adds
    one float32 scale per token, KV head and K/V (one per token for MLA's latent).
    `tokens` defaults to `cfg.max_context`, the size `init_cache` allocates.
    """
    tokens = cfg.max_context if tokens is None else tokens
    for name, value in (("batch_size", batch_size), ("tokens", tokens)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise ValueError(f"{name}: expected a non-negative integer, got {value!r}")
    if cfg.kivi_bits is not None:
        return kivi_cache_bytes(cfg, int(batch_size), int(tokens))
    if cfg.eviction is not None:
        return budget_cache_bytes(cfg, int(batch_size), int(tokens))
    return sum(layer_cache_bytes(cfg, int(batch_size), int(tokens)))


def layer_cache_bytes(cfg: ModelConfig, batch_size: int, tokens: int) -> list[int]:
    """Each layer's term of `kv_cache_bytes` (a per-layer layout: not KIVI, not eviction)."""
    per_layer = []
    for layer in cfg.layers:  # each layer with its own K, H and ring
        if layer.kind in ("shared", "mlp"):  # reads another layer's cache, or none: stores none
            per_layer.append(0)
            continue
        if layer.kind in RECURRENT_KINDS:  # a recurrent state: the same bytes at any number of tokens
            per_layer.append(batch_size * state_bytes(cfg, layer))
            continue
        if cfg.attention == "latent":  # one scale per latent, and one per indexer key (DeepSeek-V3.2)
            elements, scales = cfg.kv_elements_per_token_per_layer, 1 + (cfg.index_topk is not None)
        else:  # one scale per K/V head
            elements, scales = 2 * layer.kv_heads * layer.head_size, 2 * layer.kv_heads
        per_slot = elements * cfg.cache_itemsize + (scales * SCALE_BYTES if cfg.quantized_cache else 0)
        ring = None if layer.kind == "full" else layer.window + (cfg.attention_sinks
                                                                 if layer.kind == "sliding" else 0)
        per_layer.append(batch_size * (tokens if ring is None else min(tokens, ring)) * per_slot)
    return per_layer


def kv_read_bytes(cfg: ModelConfig, batch_size: int = 1, tokens: int | None = None) -> int:
    """Bytes of cache one decode step's attention reads at `tokens` tokens: `kv_cache_bytes`, plus, for every
    shared layer, its source layer's bytes again (stored once, read by each layer that attends over it); with
    DeepSeek-V3.2's indexer, every indexer key but only the top-k latents (`indexed_read_bytes`)."""
    tokens = cfg.max_context if tokens is None else tokens
    if cfg.index_topk is not None:  # DeepSeek-V3.2: every indexer key, and only the top k latents
        return cfg.n_layers * int(batch_size) * indexed_read_bytes(cfg, int(tokens))
    if not cfg.shared_layers:
        return kv_cache_bytes(cfg, batch_size, tokens)
    per_layer = layer_cache_bytes(cfg, int(batch_size), int(tokens))
    return sum(per_layer[s.source] if s.kind == "shared" else b
               for s, b in zip(cfg.layers, per_layer, strict=True))


def indexed_read_bytes(cfg: ModelConfig, tokens: int) -> int:
    """Bytes one decode step of one sequence reads from one layer with DeepSeek-V3.2's indexer, `tokens` held:
    the indexer scores all T stored keys (I elements each), the attention reads min(k, T) latents (C + R);
    a quantized cache adds each one's float32 scale. The layer stores T of both (`layer_cache_bytes`)."""
    scale = SCALE_BYTES if cfg.quantized_cache else 0
    latent = (cfg.kv_latent_dim + cfg.rope_head_dim) * cfg.cache_itemsize + scale
    key = cfg.index_head_size * cfg.cache_itemsize + scale
    return tokens * key + min(cfg.index_topk, tokens) * latent


# Content symbol -> (code letter, ModelConfig property): the one place the content's alphabet meets the
# code's. B (sequences) and T (tokens held: the cache's filled slots S) are arguments, not config fields.
CONTENT_SYMBOLS = {
    "L": ("L", "n_layers"),
    "N": ("N", "n_heads"),
    "H_kv": ("K", "n_kv_heads"),
    "d_h": ("H", "head_size"),
    "C": ("C", "kv_latent_dim"),
    "R": ("R", "rope_head_dim"),
    "bytes": ("bytes", "cache_itemsize"),
}


def formula_params(cfg: ModelConfig, batch: int | None = None, tokens: int | None = None,
                   **extra: float) -> dict[str, float]:
    """A config's values under the content's symbols (L, N, H_kv, d_h, bytes; C, R for MLA),
    plus B, T, extra."""
    params = {symbol: getattr(cfg, field) for symbol, (_, field) in CONTENT_SYMBOLS.items()}
    params = {k: v for k, v in params.items() if v is not None}
    if batch is not None:
        params["B"] = batch
    if tokens is not None:
        params["T"] = tokens
    return {**params, **extra}


@dataclass(frozen=True)
class CacheMeasurement:
    """The bytes of a cache `init_cache` would allocate, and how they were obtained."""

    nbytes: int  # tree_nbytes of the arrays, or of their ShapeDtypeStructs
    source: str  # "arrays": allocated, measured, freed | "shapes": jax.eval_shape, nothing allocated
    # layer 0's arrays by field name, e.g. {"k": (B, K, H, S), "v": ...}
    layer_shapes: dict[str, tuple[int, ...]]


@functools.lru_cache(maxsize=512)
def _cache_shapes(cfg: ModelConfig, batch: int, tokens: int):
    """cache_shapes, remembered: tracing init_cache is most of a small measurement,
    and its shapes never change."""
    return cache_shapes(cfg, batch, tokens)


def measure_cache(cfg: ModelConfig, batch: int, tokens: int, budget: int) -> CacheMeasurement:
    """Bytes of `init_cache(cfg, batch, tokens)`: the real arrays if they fit in `budget`,
    else its eval_shape.

    Allocated arrays are measured with `tree_nbytes` and freed before returning; `budget=0` never allocates.
    """
    budget = positive_int("budget", budget, minimum=0)
    batch, tokens = positive_int("batch", batch), positive_int("tokens", tokens)
    # checked here: raised inside eval_shape, JAX would append its traceback note
    if tokens > cfg.max_context:
        raise ValueError(f"tokens: a cache holds at most max_context={cfg.max_context} tokens, got {tokens}")
    shapes = _cache_shapes(cfg, batch, tokens)
    first = shapes.layers[0]
    layer_shapes = {name: tuple(a.shape) for name, a in zip(type(first)._fields, first, strict=True)
                    if a is not None}
    if shapes.nbytes > budget:
        return CacheMeasurement(shapes.nbytes, "shapes", layer_shapes)
    cache = jax.block_until_ready(init_cache(cfg, batch, tokens))
    measured = cache.nbytes
    del cache  # the only reference: the buffers are freed now, not at the caller's next call
    return CacheMeasurement(measured, "arrays", layer_shapes)


def param_bytes(cfg_or_model: ModelConfig | nnx.Module) -> int:
    """Bytes of the model's parameters, measured from the parameter arrays (shapes only for a config)."""
    if isinstance(cfg_or_model, ModelConfig):
        from dantinox.architectures.model import Transformer

        cfg = cfg_or_model
        state = jax.eval_shape(lambda: nnx.state(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param))
    else:
        state = nnx.state(cfg_or_model, nnx.Param)
    return tree_nbytes(state)


def max_batch_size(cfg: ModelConfig, memory_bytes: int, tokens: int | None = None,
                   weight_bytes: int | None = None) -> int:
    """How many sequences of `tokens` tokens fit: (memory - weights) // KV bytes per sequence.

    Weights default to the bytes of the model's parameter arrays. Returns 0 when even one does not fit.
    """
    if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes <= 0:
        raise ValueError(f"memory_bytes: expected a positive integer, got {memory_bytes!r}")
    weights = param_bytes(cfg) if weight_bytes is None else weight_bytes
    per_sequence = kv_cache_bytes(cfg, 1, tokens)
    if per_sequence == 0:
        raise ValueError("tokens: must be at least 1 to size a batch")
    return max(0, (memory_bytes - weights) // per_sequence)


def format_bytes(n: float) -> str:
    """Binary units, as the formula's powers of two read best: 6 MiB, 1.5 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            text = f"{n:,.0f}" if unit == "B" else f"{n:,.3f}".rstrip("0").rstrip(".")
            return f"{text} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


TABLE_VARIANTS = (("MHA", dict(kv_heads=None)), ("GQA ×4", dict(kv_heads=2)),
                  ("GQA ×8 (= MQA)", dict(kv_heads=1)))
TABLE_TOKENS = (512, 1024, 4096)


def reference_tables() -> str:
    """The README's reference tables (KV-cache size and max batch), generated from the formula."""
    base = ModelConfig.preset("reference", cache_dtype="bfloat16", dtype="bfloat16", max_context=4096)
    lines = ["KV cache per sequence, reference model (12 layers, 8 query heads, head size 32, bf16 cache):",
             "",
             "| variant | KV heads | " + " | ".join(f"{t} tokens" for t in TABLE_TOKENS) + " |",
             "|---|---|" + "---|" * len(TABLE_TOKENS)]
    configs = [(label, base.replace(**kw)) for label, kw in TABLE_VARIANTS]
    for label, cfg in configs:
        cells = [format_bytes(kv_cache_bytes(cfg, 1, t)) for t in TABLE_TOKENS]
        lines.append(f"| {label} | {cfg.n_kv_heads} | " + " | ".join(cells) + " |")
    devices = [d for d in DEVICE_PRESETS.values() if not d.name.startswith("this machine")]
    weights = param_bytes(base)
    f32 = param_bytes(base.replace(dtype="float32"))
    lines += ["", f"Largest batch at 512 tokens (weights {format_bytes(weights)} in {base.dtype}, measured "
              "from the parameter arrays, subtracted first; the labs run this model in float32, "
              f"{format_bytes(f32)} of weights):", "",
              "| variant | " + " | ".join(d.name for d in devices) + " |",
              "|---|" + "---|" * len(devices)]
    for label, cfg in configs:
        cells = [f"{max_batch_size(cfg, d.memory_bytes, 512, weights):,}" for d in devices]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    mha, tokens = configs[0][1], TABLE_TOKENS[0]
    measured = cache_shapes(mha, 1, tokens).nbytes
    factors = (mha.n_layers, 2, tokens, mha.n_kv_heads, mha.head_size, mha.cache_itemsize)
    terms = " · ".join(str(v) for v in factors)
    lines += ["", f"A widely copied hand-made version of the first table gives {COPIED_MHA_512_MIB} MB for "
              f"MHA at {tokens} tokens. The formula ({terms} bytes) and the shapes of the allocated arrays "
              f"both give {format_bytes(measured)}, {measured / (COPIED_MHA_512_MIB * 2**20):g} times more "
              "(reading its MB as MiB), and that table's max-batch column is off by a similar factor. The "
              "numbers above are the correct ones."]
    return "\n".join(lines)


COPIED_MHA_512_MIB = 0.375  # the erroneous figure in circulation, kept only to say how far off it is
