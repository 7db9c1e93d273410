"""Pure readings of a cache: the content formula (derived) beside the arrays `init_cache` makes (measured).

    import content, dantinox
    from widgets.readings import read_kv_cache, read_mla_cache
    cfg = dantinox.ModelConfig.preset("reference", cache_dtype="bfloat16")
    r = read_kv_cache(content.load_entry("kv-cache"), cfg, batch=1, tokens=512)
    r.formula_bytes, r.measured_bytes, r.source, r.residual      # 6 MiB, 6 MiB, "arrays", 0

No widget is involved: the labs render these readings, and notebooks and benchmarks call them directly.
Content symbols (H_kv, d_h, ...) come from a config through `dantinox.accounting.memory.formula_params`, the one map
between the two alphabets (`CONTENT_SYMBOLS`).
Bytes are measured by `dantinox.accounting.memory.measure_cache` (real arrays under the budget, else `jax.eval_shape`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import content
import dantinox
from dantinox.accounting.memory import CacheMeasurement, formula_params, measure_cache

# Bytes; a larger cache is sized from shapes instead of allocated. Allocating is dominated by the OS
# zeroing fresh pages (benchmarks/lab_latency.py): 256 MiB keeps a slider move under 300 ms on 2 CPU cores.
DEFAULT_BUDGET = 256 * 2**20

KV_SIZE = "KV cache size"  # science item titles, in content/entries/kv-cache.yaml
KV_PER_TOKEN = "KV cache per token"
MLA_SIZE = "MLA latent cache size"  # in content/entries/multi-head-latent-attention.yaml
MLA_EQUIVALENT_HEADS = "Equivalent GQA KV heads"
MLA_FRACTION = "MLA cache relative to MHA"


def evaluate(entry: Any, title: str, params: dict[str, float]) -> float:
    """The entry's science item `title` at `params` (names the item does not use are left out)."""
    item = entry.science_item(title)
    return content.evaluate(entry, title, **{k: v for k, v in params.items() if k in item.variables})


def evaluate_bytes(entry: Any, title: str, params: dict[str, float]) -> int:
    """A science item that counts bytes: refused with the entry and item named if it is not a whole number."""
    value = evaluate(entry, title, params)
    if value != int(value):
        raise ValueError(f"{entry.id}.science[{title!r}]: expected a whole number of bytes, got {value}")
    return int(value)


def variant_label(cfg: dantinox.ModelConfig) -> str:
    """`MHA (K=8)`, `GQA (K=2)`, `MQA (K=1)` or `MLA (C=64, R=16)`."""
    if cfg.attention == "latent":
        return f"MLA (C={cfg.kv_latent_dim}, R={cfg.rope_head_dim})"
    return f"{cfg.variant.upper()} (K={cfg.n_kv_heads})"


def peer_configs(cfg: dantinox.ModelConfig, gqa_kv_heads: int | None = None) -> list[dantinox.ModelConfig]:
    """MHA, GQA and MQA of the same model, in that order.

    GQA uses `gqa_kv_heads`, else cfg's K if cfg is GQA, else the first proper divisor of N (no GQA if none).
    """
    heads = dict(attention="heads", kv_latent_dim=None, rope_head_dim=None, q_latent_dim=None)
    n = cfg.n_heads
    proper = [k for k in range(2, n) if n % k == 0]
    if gqa_kv_heads is not None and gqa_kv_heads not in proper:
        raise ValueError(f"gqa_kv_heads: expected a divisor of n_heads={n} between 1 and {n} exclusive, "
                         f"got {gqa_kv_heads!r}")
    k = gqa_kv_heads or (cfg.n_kv_heads if cfg.variant == "gqa" else proper[0] if proper else None)
    out = [cfg.replace(kv_heads=None, **heads)]
    if k is not None:
        out.append(cfg.replace(kv_heads=k, **heads))
    return [*out, cfg.replace(kv_heads=1, **heads)]


@functools.lru_cache(maxsize=64)
def weight_bytes(cfg: dantinox.ModelConfig) -> int:
    """Parameter bytes of a config (traced once per config: it builds the model under eval_shape)."""
    return dantinox.param_bytes(cfg)


@dataclasses.dataclass(frozen=True)
class CacheSize:
    """One cache sized two ways: a content formula (derived) and the arrays of `init_cache` (measured)."""

    cfg: dantinox.ModelConfig
    batch: int  # B
    tokens: int  # T
    formula: str  # the science item evaluated
    formula_params: dict[str, float]  # its variables, as substituted
    formula_bytes: int  # derived
    measured_bytes: int  # measured: tree_nbytes of the cache (of its shapes above the budget)
    source: str  # "arrays" (allocated, measured, freed) | "shapes" (jax.eval_shape, nothing allocated)
    layer_shapes: dict[str, tuple[int, ...]]  # measured: layer 0's arrays by field, from eval_shape

    @property
    def residual(self) -> int:
        return self.measured_bytes - self.formula_bytes

    @property
    def label(self) -> str:
        return variant_label(self.cfg)


def size_cache(entry: Any, title: str, cfg: dantinox.ModelConfig, batch: int, tokens: int,
               budget: int = DEFAULT_BUDGET, **extra: float) -> CacheSize:
    """Evaluate the entry's byte formula `title` for a config and measure the cache it describes."""
    params = formula_params(cfg, batch, tokens, **extra)
    derived = evaluate_bytes(entry, title, params)
    m: CacheMeasurement = measure_cache(cfg, batch, tokens, budget)
    used = {k: v for k, v in params.items() if k in entry.science_item(title).variables}
    return CacheSize(cfg=cfg, batch=batch, tokens=tokens, formula=title, formula_params=used,
                     formula_bytes=derived, measured_bytes=m.nbytes, source=m.source, layer_shapes=m.layer_shapes)


@dataclasses.dataclass(frozen=True)
class CacheReading(CacheSize):
    """The KV-cache lab's numbers: the cache, its growth per token, and the batch that fits on a device."""

    device: dantinox.DevicePreset
    per_token_bytes: int  # derived: ΔM, one more token of one sequence (the per-token science item)
    weight_bytes: int  # measured from the parameter shapes
    max_batch: int  # derived: sequences of `tokens` tokens that fit on `device` next to the weights


def read_kv_cache(entry: Any, cfg: dantinox.ModelConfig, batch: int, tokens: int, *, device: str = "H100 80GB",
                  budget: int = DEFAULT_BUDGET) -> CacheReading:
    """Everything the cache lab shows for one setting, from the kv-cache entry's formulas and real arrays."""
    if device not in dantinox.DEVICE_PRESETS:
        raise ValueError(f"device: expected one of {', '.join(dantinox.DEVICE_PRESETS)}, got {device!r}")
    preset = dantinox.DEVICE_PRESETS[device]
    size = size_cache(entry, KV_SIZE, cfg, batch, tokens, budget)
    weights = weight_bytes(cfg)
    return CacheReading(
        **{f.name: getattr(size, f.name) for f in dataclasses.fields(CacheSize)}, device=preset,
        per_token_bytes=evaluate_bytes(entry, KV_PER_TOKEN, formula_params(cfg, 1, 1)), weight_bytes=weights,
        max_batch=dantinox.max_batch_size(cfg, preset.memory_bytes, tokens, weight_bytes=weights))


@dataclasses.dataclass(frozen=True)
class MlaReading(CacheSize):
    """The MLA lab's numbers: the latent cache, its MHA/GQA/MQA peers, and the equivalent KV heads."""

    equivalent_kv_heads: float  # derived: (C + R) / (2 H)
    measured_kv_heads: float  # measured: MLA bytes / (MHA bytes per KV head)
    mha_fraction: float  # derived: (C + R) / (2 N H)
    peers: tuple[CacheSize, ...]  # MHA, GQA, MQA of the same model, sized with the kv-cache formula


def read_mla_cache(entry: Any, kv_entry: Any, cfg: dantinox.ModelConfig, batch: int, tokens: int, *,
                   gqa_kv_heads: int | None = None, budget: int = DEFAULT_BUDGET) -> MlaReading:
    """Everything the MLA lab shows for one MLA config, from the MLA and kv-cache entries and real arrays."""
    if cfg.attention != "latent":
        raise ValueError(f"cfg: expected attention='latent' (MLA), got {cfg.variant!r}")
    size = size_cache(entry, MLA_SIZE, cfg, batch, tokens, budget)
    peers = tuple(size_cache(kv_entry, KV_SIZE, c, batch, tokens, budget)
                  for c in peer_configs(cfg, gqa_kv_heads))
    params = formula_params(cfg, batch, tokens)
    return MlaReading(
        **{f.name: getattr(size, f.name) for f in dataclasses.fields(CacheSize)},
        equivalent_kv_heads=evaluate(entry, MLA_EQUIVALENT_HEADS, params),
        measured_kv_heads=size.measured_bytes / (peers[0].measured_bytes / cfg.n_heads),
        mha_fraction=evaluate(entry, MLA_FRACTION, params), peers=peers)


def cache_formula_bytes(kv_entry: Any, mla_entry: Any | None, cfg: dantinox.ModelConfig, batch: int,
                        tokens: int) -> int:
    """The derived bytes of any variant's cache: the MLA entry's formula for MLA, else the kv-cache formula."""
    if cfg.attention == "latent":
        if mla_entry is None:
            raise ValueError("mla_entry: an MLA config needs the multi-head-latent-attention entry's formula")
        return evaluate_bytes(mla_entry, MLA_SIZE, formula_params(cfg, batch, tokens))
    return evaluate_bytes(kv_entry, KV_SIZE, formula_params(cfg, batch, tokens))
