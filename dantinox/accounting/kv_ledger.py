"""The KV cache of a real model, layer by layer: `kv_ledger(model, tokens, batch, cache_dtype, device)`.

    ledger = dantinox.kv_ledger("gemma-3-27b", tokens=32_768, batch=4, device="H100 80GB")
    ledger.total_bytes, ledger.per_token_bytes, ledger.rows[0], ledger.naive_error_pct, ledger.fit

Each row is one layer: its kind (catalogue.KINDS), the slots it holds at T tokens, the elements one slot
stores and its bytes for B sequences. A K/V layer stores 2·K·H elements per slot, an MLA layer C + R (one
latent, no K/V pair; DeepSeek-V3.2 adds its indexer's key of I), a shared layer nothing new, a
linear-attention, Mamba-2 or short-convolution layer a constant state (with its formula). States are sized as
transformers allocates them: recurrent matrices in float32, convolution inputs in the activation dtype. A
quantized cache (int8 / fp8) adds dantinox's float32 scale per token and KV head (one per latent).

Measured: the rows dantinox can build (full, sliding, chunked, latent) are built on dantinox's own cache
container, with the same layouts the model uses (Contiguous, Ring, Chunked addressing;
LayerCache or LatentCache payload), and their bytes are read from the shapes `jax.eval_shape` gives;
`measured_bytes` must equal the formula's to the byte. `with_working_model` measures instead the cache a
working model of the whole architecture (every layer, real cache geometry, narrow widths:
dantinox/accounting/working_model.py) prefilled and decoded with, read from its arrays (`dantinox kv NAME
--measure`).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from typing import Any

import jax
import numpy as np

from dantinox.accounting.memory import DEVICE_PRESETS, WEIGHT_FORMATS
from dantinox.accounting.working_model import MEMORY_GUARD, measure_working_model
from dantinox.architectures.catalogue import Architecture, LayerGeometry, load_architecture
from dantinox.architectures.config import DTYPES, QUANT_CACHE_DTYPES, LayerSpec, ModelConfig
from dantinox.cache import KVCache, layouts, tree_nbytes
from dantinox.cache.quant import SCALE_BYTES
from dantinox.checks import positive_int

CACHE_DTYPES = (*DTYPES, *QUANT_CACHE_DTYPES)
STATE_KINDS = ("linear", "conv", "mamba")  # a constant recurrent state per sequence (dantinox builds each)
DEFAULT_WEIGHTS_FORMAT = "bf16"  # assumed where the catalogue names no published checkpoint format


@dataclasses.dataclass(frozen=True)
class LedgerRow:
    layer: int
    kind: str
    slots: int  # token slots held per sequence at T (0 for shared and linear layers)
    elements_per_slot: int  # 2·K·H, or C + R; 0 for shared and linear layers
    bytes: int  # for all B sequences
    measured_bytes: int | None  # from dantinox's cache shapes; None where dantinox builds no such layer
    formula: str  # how `bytes` follows from the config
    derived: bool = False  # True for a row dantinox cannot build: formula only
    kv_heads: int | None = None  # K of a K/V layer
    head_size: int | None = None  # H of a K/V layer
    # what one decode step at T reads, where it differs from `bytes`: DeepSeek-V3.2's T indexer keys and only
    # min(k, T) latents; a shared layer its source's bytes
    read_bytes: int | None = None
    # the same, read from the arrays a working model's decode step read (with_working_model; DSA layers)
    measured_read_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class DeviceFit:
    device: str
    capacity_bytes: int  # what the device reports (DEVICE_PRESETS)
    weight_bytes: int | None  # None: unknown (a config.json names no weight count)
    weights_source: str
    # largest T at the ledger's batch (None when the weights are unknown or do not fit)
    max_context: int | None
    max_batch: int | None  # largest B at the ledger's T
    weights_format: str | None = None  # the format the weights were sized in (None: bytes given or read)


@dataclasses.dataclass(frozen=True)
class Ledger:
    model: str
    source: str
    tokens: int
    batch: int
    cache_dtype: str
    max_context: int  # the model's max_position_embeddings
    rows: tuple[LedgerRow, ...]
    total_bytes: int
    measured_bytes: int  # sum of the measured rows plus the derived ones
    per_token_bytes: int  # bytes one more token adds to one sequence at T
    naive_bytes: int  # 2·L·K·(D/N)·T·B·s: every layer full, head size D/N, no latent, no scales
    naive_formula: str
    gap_terms: tuple[str, ...]  # the ledger terms that explain naive − total
    notes: tuple[str, ...]
    fit: DeviceFit | None
    # what `measured_bytes` were read from: "cache shapes" (one-layer caches under jax.eval_shape), or a
    # working model's decode ("working model arrays", or "working model shapes" over the memory guard;
    # with_working_model)
    measured_from: str = "cache shapes"

    @property
    def read_total_bytes(self) -> int:
        """Bytes one decode step at T reads from the cache, all layers (`read_bytes` where a row says)."""
        return sum(r.bytes if r.read_bytes is None else r.read_bytes for r in self.rows)

    @property
    def measured_read_total_bytes(self) -> int:
        """What a working model's decode step read, all layers (`measured_read_bytes` where a row has it, else
        its measured bytes)."""
        return sum(r.measured_bytes if r.measured_read_bytes is None else r.measured_read_bytes
                   for r in self.rows)

    @property
    def naive_error_pct(self) -> float:
        if not self.total_bytes:
            return float("inf")
        return 100.0 * (self.naive_bytes - self.total_bytes) / self.total_bytes

    @property
    def from_working_model(self) -> bool:
        return self.measured_from.startswith("working model")

    def to_json(self) -> dict[str, Any]:
        """The schema of `dantinox kv --json`; with a working model's measurement (`--measure`), each layer's
        `measured_bytes`, the `measured_total_bytes` and what they were `measured_from`."""
        out = {"model": self.model, "tokens": self.tokens, "batch": self.batch,
               "cache_dtype": self.cache_dtype,
               "total_bytes": self.total_bytes, "per_token_bytes": self.per_token_bytes,
               "layers": [{"layer": r.layer, "kind": r.kind, "slots": r.slots, "bytes": r.bytes}
                          for r in self.rows]}
        sparse = self.reads_less_than_stored
        if sparse:
            out["read_total_bytes"] = self.read_total_bytes
            for row, r in zip(out["layers"], self.rows, strict=True):
                row["read_bytes"] = r.bytes if r.read_bytes is None else r.read_bytes
        if self.from_working_model:
            reads = {"measured_read_total_bytes": self.measured_read_total_bytes} if sparse else {}
            out = {**{k: v for k, v in out.items() if k != "layers"},
                   "measured_total_bytes": self.measured_bytes,
                   "measured_from": self.measured_from, **reads,
                   "layers": [{**row, "measured_bytes": r.measured_bytes,
                               **({"measured_read_bytes": r.measured_bytes if r.measured_read_bytes is None
                                   else r.measured_read_bytes} if sparse else {})}
                              for row, r in zip(out["layers"], self.rows, strict=True)]}
        return out

    @property
    def reads_less_than_stored(self) -> bool:
        """Whether a decode step reads other than the cache stores (DeepSeek-V3.2's indexed latents)."""
        return any(r.kind == "latent" and r.read_bytes is not None for r in self.rows)


def _itemsize(cache_dtype: str) -> int:
    return int(np.dtype((QUANT_CACHE_DTYPES | DTYPES)[cache_dtype]).itemsize)


def _state_itemsize(cache_dtype: str) -> int:
    """A recurrent state is kept in floats: the cache's float dtype, bf16 when the K/V cache is quantized."""
    return 2 if cache_dtype in QUANT_CACHE_DTYPES else _itemsize(cache_dtype)


def slots_held(layer: LayerGeometry, tokens: int) -> int:
    """Token slots a layer holds per sequence after `tokens` tokens."""
    if layer.kind in ("full", "latent"):
        return tokens
    if layer.kind in ("sliding", "chunked"):
        return min(tokens, layer.window)
    return 0


def slot_bytes(layer: LayerGeometry, cache_dtype: str) -> int:
    """Bytes one slot of one sequence takes: codes plus (quantized) float32 scales."""
    s, quant = _itemsize(cache_dtype), cache_dtype in QUANT_CACHE_DTYPES
    if layer.kind == "latent":  # and DeepSeek-V3.2's indexer key, each with its scale when quantized
        index = 0 if layer.indexer is None else layer.indexer * s + (SCALE_BYTES if quant else 0)
        return (layer.latent + layer.rope) * s + (SCALE_BYTES if quant else 0) + index
    if layer.kind in ("full", "sliding", "chunked"):
        return 2 * layer.kv_heads * layer.head_size * s + (2 * layer.kv_heads * SCALE_BYTES if quant else 0)
    return 0


def _elements(layer: LayerGeometry) -> int:
    if layer.kind == "latent":
        return layer.latent + layer.rope + (layer.indexer or 0)
    if layer.kind in ("full", "sliding", "chunked"):
        return 2 * layer.kv_heads * layer.head_size
    return 0


def indexed_read_bytes(layer: LayerGeometry, tokens: int, cache_dtype: str) -> int:
    """Bytes one decode step of one sequence reads from a latent layer with DeepSeek-V3.2's indexer at T
    tokens: the indexer scores all T keys, the attention reads the top min(k, T) latents (each with its
    scale)."""
    s, scale = _itemsize(cache_dtype), SCALE_BYTES if cache_dtype in QUANT_CACHE_DTYPES else 0
    latent = (layer.latent + layer.rope) * s + scale
    return tokens * (layer.indexer * s + scale) + min(layer.index_topk, tokens) * latent


def state_bytes(layer: LayerGeometry, cache_dtype: str) -> int:
    """One sequence's constant state in a linear, conv or Mamba-2 layer (0 for any other kind), as
    transformers' caches hold it: a linear layer (Gated DeltaNet) keeps its recurrent matrices in float32 and
    its convolution inputs in the activation dtype; a conv layer (LFM2) its convolution's inputs; a Mamba-2
    layer its heads' P x N states in float32 and its convolution's inputs. The activation dtype is the cache's
    float dtype (bf16 beside a quantized cache)."""
    act = _state_itemsize(cache_dtype)
    if layer.kind == "linear":
        conv_dim = 2 * layer.kv_heads * layer.head_size + layer.value_heads * layer.value_size
        return layer.value_heads * layer.head_size * layer.value_size * 4 + conv_dim * layer.conv * act
    if layer.kind == "conv":
        return layer.channels * layer.conv * act
    if layer.kind == "mamba":
        return layer.value_heads * layer.value_size * layer.state_size * 4 + layer.channels * layer.conv * act
    return 0


def sequence_bytes(arch: Architecture, tokens: int, cache_dtype: str) -> int:
    """The formula for one sequence at `tokens` tokens, summed over layers (constant states included)."""
    return sum(slots_held(layer, tokens) * slot_bytes(layer, cache_dtype) + state_bytes(layer, cache_dtype)
               for layer in arch.layers)


def state_crossover_tokens(arch: Architecture, cache_dtype: str = "bfloat16") -> int | None:
    """The smallest T at which a sequence's growing cache (its attention layers' slots) takes at least as many
    bytes as its constant states (linear-attention and Mamba-2 layers): derived. None without both, or when
    the attention layers are all windows too small to get there."""
    state = sum(state_bytes(layer, cache_dtype) for layer in arch.layers)
    if not state or not any(slot_bytes(layer, cache_dtype) for layer in arch.layers):
        return None

    def growing(tokens: int) -> int:
        return sum(slots_held(layer, tokens) * slot_bytes(layer, cache_dtype) for layer in arch.layers)

    hi = arch.max_context
    if growing(hi) < state:
        return None
    lo = 1
    while lo < hi:  # growing() is non-decreasing in T
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if growing(mid) < state else (lo, mid)
    return lo


def _row(layer: LayerGeometry, tokens: int, batch: int, cache_dtype: str) -> LedgerRow:
    s = _itemsize(cache_dtype)
    slots = slots_held(layer, tokens)
    scale = f" + scales {SCALE_BYTES} B" if cache_dtype in QUANT_CACHE_DTYPES else ""
    if layer.kind in STATE_KINDS:  # dantinox builds each ('state', 'conv', 'mamba' layers)
        size = _state_itemsize(cache_dtype)
        return LedgerRow(layer.index, layer.kind, 0, 0, batch * state_bytes(layer, cache_dtype), None,
                         f"constant state: {layer.state_formula} × {size} B, × B; it does not grow with T",
                         layer.kind == "linear" and layer.value_size != layer.head_size)  # equal heads built
    if layer.kind == "mlp":
        return LedgerRow(layer.index, "mlp", 0, 0, 0, 0, "an MLP or MoE block, no token mixer: no cache")
    if layer.kind == "shared":
        return LedgerRow(layer.index, "shared", 0, 0, 0, 0,
                         f"reads layer {layer.shares}'s cache: 0 new bytes")
    per_slot = slot_bytes(layer, cache_dtype)
    if layer.kind == "latent" and layer.indexer is not None:
        what = (f"(C + R + I) = ({layer.latent} + {layer.rope} + {layer.indexer}) elements × {s} B"
                f"{scale.replace('scales', '2 scales of')}; a step reads T indexer keys and min(T, k = "
                f"{layer.index_topk:,}) latents")
        return LedgerRow(layer.index, layer.kind, slots, _elements(layer), batch * slots * per_slot, None,
                         f"B · T · {what}", read_bytes=batch * indexed_read_bytes(layer, tokens, cache_dtype))
    if layer.kind == "latent":
        what = f"(C + R) = ({layer.latent} + {layer.rope}) elements × {s} B{scale}"
    else:
        scales = f" + 2·K·{SCALE_BYTES} B scales" if scale else ""
        what = f"2·K·H = 2·{layer.kv_heads}·{layer.head_size} elements × {s} B{scales}"
    held = {"full": "T", "latent": "T", "sliding": f"min(T, W={layer.window})",
            "chunked": f"min(T, chunk={layer.window})"}[layer.kind]
    return LedgerRow(layer.index, layer.kind, slots, _elements(layer), batch * slots * per_slot, None,
                     f"B · {held} · {what}", kv_heads=layer.kv_heads, head_size=layer.head_size)


def _layer_config(layer: LayerGeometry, tokens: int, cache_dtype: str) -> ModelConfig:
    """A one-layer dantinox config with this layer's cache geometry
    (its attention shapes are all that matter)."""
    window = dict(sliding_windows=(layer.window,)) if layer.kind == "sliding" else (
        dict(attention_chunks=(layer.window,)) if layer.kind == "chunked" else {})
    if layer.kind == "latent":  # with DeepSeek-V3.2's indexer where it has one (its heads cache nothing)
        index = {} if layer.indexer is None else dict(index_heads=1, index_head_size=layer.indexer,
                                                      index_topk=layer.index_topk)
        return ModelConfig(n_layers=1, attention="latent", kv_latent_dim=layer.latent,
                           rope_head_dim=layer.rope, max_context=tokens, cache_dtype=cache_dtype, **index)
    if layer.kind in ("conv", "mamba"):  # LFM2's convolution, a Mamba-2 mixer: inputs in the activation dtype
        spec = (LayerSpec("conv", conv=layer.conv, channels=layer.channels) if layer.kind == "conv" else
                LayerSpec("mamba", value_heads=layer.value_heads, head_size=layer.value_size, conv=layer.conv,
                          ssm_state=layer.state_size, ssm_groups=layer.ssm_groups))
        return ModelConfig(n_layers=1, max_context=tokens, cache_dtype=cache_dtype, layer_specs=(spec,),
                           dtype=cache_dtype if cache_dtype in DTYPES else "bfloat16")
    if layer.kind == "linear":  # a Gated DeltaNet 'state' layer, its convolution inputs as activations
        spec = LayerSpec("state", kv_heads=layer.kv_heads, head_size=layer.head_size,
                         value_heads=layer.value_heads, conv=layer.conv)
        return ModelConfig(n_layers=1, n_heads=layer.kv_heads, kv_heads=layer.kv_heads,
                           head_size=layer.head_size,
                           max_context=tokens, cache_dtype=cache_dtype, layer_specs=(spec,),
                           dtype=cache_dtype if cache_dtype in DTYPES else "bfloat16")
    return ModelConfig(n_layers=1, attention="heads", n_heads=layer.kv_heads, kv_heads=layer.kv_heads,
                       head_size=layer.head_size, max_context=tokens, cache_dtype=cache_dtype, **window)


@functools.lru_cache(maxsize=256)
def _measured(layers: tuple[LayerGeometry, ...], tokens: int, batch: int,
              cache_dtype: str) -> tuple[int, ...]:
    """Per layer, the bytes of the cache dantinox's container allocates for it, from `jax.eval_shape`."""
    built = [layer for layer in layers
             if layer.kind in ("full", "sliding", "chunked", "latent", "conv", "mamba")
             or layer.kind == "linear" and layer.value_size == layer.head_size]

    def cache() -> KVCache:
        payloads = []
        for layer in built:
            cfg = _layer_config(layer, tokens, cache_dtype)
            layout = layouts(cfg)[0]  # the layout the model would use: Contiguous, Ring or Chunked x payload
            payloads.append(layout.zeros(cfg, batch, layout.addressing.slots(tokens)))
        return KVCache(tuple(payloads), jax.numpy.zeros((batch,), jax.numpy.int32))

    shapes = jax.eval_shape(cache)
    by_index = {layer.index: tree_nbytes(p) for layer, p in zip(built, shapes.layers, strict=True)}
    return tuple(by_index.get(layer.index, 0 if layer.kind in ("shared", "mlp") else -1) for layer in layers)


def _naive(arch: Architecture, tokens: int, batch: int, cache_dtype: str) -> tuple[int, str]:
    L, K, s = len(arch.layers), arch.config_kv_heads, _itemsize(cache_dtype)
    H = arch.d_model // arch.n_heads
    return (2 * L * K * H * tokens * batch * s,
            f"2·L·K·(D/N)·T·B·s = "
            f"2·{L}·{K}·({arch.d_model}/{arch.n_heads})·{tokens:,}·{batch}·{s}")


def _gap_terms(arch: Architecture, tokens: int, cache_dtype: str) -> tuple[str, ...]:
    L, terms = len(arch.layers), []
    for kind, what in (("sliding", "sliding-window"), ("chunked", "chunked-local")):
        n = arch.count(kind)
        if n:
            w = next(layer.window for layer in arch.layers if layer.kind == kind)
            terms.append(f"{n} of {L} layers are {what} ({'W' if kind == 'sliding' else 'chunk'} = {w:,}): "
                         f"they hold min(T, {w:,}) = {min(tokens, w):,} slots, not T = {tokens:,}")
    heads = [layer for layer in arch.layers if layer.kind in ("full", "sliding", "chunked")]
    if heads and heads[0].head_size != arch.d_model // arch.n_heads:
        terms.append(f"head size H = head_dim = {heads[0].head_size}, not hidden_size / num_attention_heads "
                     f"= {arch.d_model}/{arch.n_heads} = {arch.d_model // arch.n_heads}")
    shapes = {(layer.kv_heads, layer.head_size) for layer in heads}
    if len(shapes) > 1:  # Gemma 4: global layers with their own K and H
        for k, h in sorted(shapes - {(heads[0].kv_heads, heads[0].head_size)}):
            n = sum((layer.kv_heads, layer.head_size) == (k, h) for layer in heads)
            terms.append(f"{n} layers have K = {k} and H = {h} of their own, not num_key_value_heads = "
                         f"{arch.config_kv_heads} and H = {heads[0].head_size}")
    if arch.count("latent"):
        layer = next(layer for layer in arch.layers if layer.kind == "latent")
        terms.append(f"MLA: each layer caches one latent of C + R = {layer.latent} + {layer.rope} = "
                     f"{layer.latent + layer.rope} elements per token, not 2·K·(D/N) = "
                     f"2·{arch.config_kv_heads}·{arch.d_model // arch.n_heads} = "
                     f"{2 * arch.config_kv_heads * (arch.d_model // arch.n_heads):,}")
    if arch.count("conv"):
        terms.append(f"{arch.count('conv')} of {L} layers are short convolutions: a constant state per "
                     "sequence, no K/V that grows with T")
    if arch.count("linear"):
        terms.append(f"{arch.count('linear')} of {L} layers are linear attention (delta rule): a constant "
                     "state per sequence, no K/V that grows with T")
    if any(layer.indexer for layer in arch.layers):
        layer = next(layer for layer in arch.layers if layer.indexer)
        terms.append(f"DeepSeek-V3.2's indexer: each layer also stores a key of I = {layer.indexer} elements "
                     "per token, and a decode step reads every indexer key but only "
                     f"k = {layer.index_topk:,} latents")
    if arch.count("mamba"):
        terms.append(f"{arch.count('mamba')} of {L} layers are Mamba-2: a constant state per sequence, "
                     "no K/V that grows with T")
    if arch.count("mlp"):
        terms.append(f"{arch.count('mlp')} of {L} layers are MLP or MoE blocks with no attention: "
                     "no cache at all")
    if arch.count("shared"):
        terms.append(f"{arch.count('shared')} of {L} layers reuse an earlier layer's cache: 0 new bytes")
    if cache_dtype in QUANT_CACHE_DTYPES:
        terms.append(f"{cache_dtype}: float32 scales ({SCALE_BYTES} B per token and KV head, per K and V; "
                     "one per latent) come on top of the 1-byte codes")
    return tuple(terms)


def weights_format_used(arch: Architecture, weights_format: str | None = None) -> tuple[str, str]:
    """(format, why): the one asked for, else the published checkpoint's, else bf16 (assumed)."""
    if weights_format is not None:
        if weights_format not in WEIGHT_FORMATS:
            raise ValueError(f"weights_format: expected one of {', '.join(WEIGHT_FORMATS)}, got "
                             f"{weights_format!r}")
        return weights_format, ("the published checkpoint's format" if weights_format == arch.weights_format
                                else "as chosen")
    if arch.weights_format is not None:
        return arch.weights_format, "the published checkpoint's format"
    return DEFAULT_WEIGHTS_FORMAT, "assumed: no published format in the catalogue"


def _fit(arch: Architecture, tokens: int, batch: int, cache_dtype: str, device: str,
         weight_bytes: int | None, weights_format: str | None = None) -> DeviceFit:
    if device not in DEVICE_PRESETS:
        raise ValueError(f"device: expected one of {', '.join(DEVICE_PRESETS)}, got {device!r}")
    capacity = DEVICE_PRESETS[device].memory_bytes
    used = None
    if weight_bytes is not None:
        if weights_format is not None:
            raise ValueError("weights_format: give the weights' bytes or their format, not both")
        weights, where = positive_int("weight_bytes", weight_bytes, minimum=0), "given"
    elif arch.weight_bytes is not None:
        if weights_format is not None:
            raise ValueError(f"weights_format: {arch.name} is a GGUF file whose tensors give the weights' "
                             "bytes; pass weight_bytes to size them otherwise")
        weights, where = arch.weight_bytes, "the GGUF file's tensor bytes"
    elif arch.parameters is not None:
        used, why = weights_format_used(arch, weights_format)
        bits = WEIGHT_FORMATS[used].bits
        weights = math.ceil(arch.parameters * bits / 8)
        where = f"{arch.parameters:,} parameters × {bits:g} bits ({used}, {why})"
    else:
        return DeviceFit(device, capacity, None,
                         "unknown: the config names no weight count (pass weight_bytes)",
                         None, None)
    free = capacity - weights
    if free <= 0:
        return DeviceFit(device, capacity, weights, where, 0, 0, used)
    per_seq = sequence_bytes(arch, tokens, cache_dtype)
    max_batch = free // per_seq if per_seq else None
    # sequence_bytes is non-decreasing in T: the largest T whose batch fits, up to the model's context
    fits = _Fits(arch, batch, cache_dtype, free)
    max_context = bisect.bisect_right(fits, False, lo=0, hi=arch.max_context + 1) - 1
    return DeviceFit(device, capacity, weights, where, max(max_context, 0), max_batch, used)


class _Fits:
    """A lazy sequence over T: whether B sequences of T tokens do NOT fit (False, False, ..., True, True)."""

    def __init__(self, arch: Architecture, batch: int, cache_dtype: str, free: int):
        self.arch, self.batch, self.cache_dtype, self.free = arch, batch, cache_dtype, free

    def __getitem__(self, tokens: int) -> bool:
        return self.batch * sequence_bytes(self.arch, tokens, self.cache_dtype) > self.free

    def __len__(self) -> int:
        return self.arch.max_context + 1


def kv_ledger(model: str | Architecture, tokens: int, batch: int = 1, cache_dtype: str = "bfloat16",
              device: str | None = None, weight_bytes: int | None = None, measure: bool = True,
              weights_format: str | None = None, mtp: bool = False) -> Ledger:
    """The per-layer KV-cache ledger of `model` (a catalogue name, config.json path,
    .gguf path or Architecture).

    The device fit sizes the weights from `weight_bytes`, else a GGUF's tensor bytes, else the parameter count
    in `weights_format` (default: the published checkpoint's format the catalogue names, else bf16, and says
    which). `mtp=True` counts the model's multi-token-prediction layers as an engine drafting with them caches
    them (one more layer each, vLLM's deepseek_mtp rule: `Architecture.with_mtp_layers`); plain decoding
    caches none.
    """
    plain = model if isinstance(model, Architecture) else load_architecture(model)
    arch = plain.with_mtp_layers() if mtp else plain
    tokens, batch = positive_int("tokens", tokens), positive_int("batch", batch)
    if cache_dtype not in CACHE_DTYPES:
        raise ValueError(f"cache_dtype: expected one of {', '.join(CACHE_DTYPES)}, got {cache_dtype!r}")
    if tokens > arch.max_context:
        raise ValueError(f"tokens: {arch.name} reads at most max_position_embeddings = {arch.max_context:,} "
                         f"tokens, got {tokens:,}")
    rows = [_row(layer, tokens, batch, cache_dtype) for layer in arch.layers]
    rows = [dataclasses.replace(r, read_bytes=rows[layer.shares].bytes) if layer.kind == "shared" else r
            for r, layer in zip(rows, arch.layers, strict=True)]  # stored once, read again by each sharer
    if measure:
        measured = _measured(arch.layers, tokens, batch, cache_dtype)
        rows = [r if m < 0 else dataclasses.replace(r, measured_bytes=m)
                for r, m in zip(rows, measured, strict=True)]
    total = sum(r.bytes for r in rows)
    measured_total = sum(r.bytes if r.derived else (r.measured_bytes or 0) for r in rows)
    per_token = sequence_bytes(arch, tokens + 1, cache_dtype) - sequence_bytes(arch, tokens, cache_dtype)
    naive, naive_formula = _naive(plain, tokens, batch, cache_dtype)  # what a calculator counts: no MTP
    fit = None if device is None else _fit(arch, tokens, batch, cache_dtype, device, weight_bytes,
                                           weights_format)
    return Ledger(arch.name, arch.source, tokens, batch, cache_dtype, arch.max_context, tuple(rows), total,
                  measured_total if measure else total, per_token, naive, naive_formula,
                  _gap_terms(arch, tokens, cache_dtype), arch.notes + _mtp_notes(plain, mtp), fit)


def _mtp_notes(arch: Architecture, counted: bool) -> tuple[str, ...]:
    n = arch.mtp_layers
    if not n:
        return ()
    if counted:
        return (f"the last {n} row(s) are multi-token-prediction layers (num_nextn_predict_layers = {n}), "
                "as an engine drafting with them caches them (vLLM's deepseek_mtp: one more latent layer "
                "each)",)
    return (f"{n} multi-token-prediction layer(s) (num_nextn_predict_layers) not counted: plain decoding "
            "caches none (transformers, llama.cpp, vLLM without MTP drafting); mtp=True counts them as "
            "vLLM's drafting does",)


def with_working_model(ledger: Ledger, model: str | Architecture, guard: int = MEMORY_GUARD) -> Ledger:
    """The ledger with every row's `measured_bytes` read from the cache a working model of the architecture
    decoded with (dantinox/accounting/working_model.py), and a DeepSeek-V3.2 row's `measured_read_bytes` from
    the arrays its last decode step read; ValueError in one line for a kind the working model
    does not build (a recurrent state)."""
    arch = model if isinstance(model, Architecture) else load_architecture(model)
    run = measure_working_model(arch, ledger.tokens, ledger.batch, ledger.cache_dtype, guard)
    rows = tuple(dataclasses.replace(r, measured_bytes=m, measured_read_bytes=read)
                 for r, m, read in zip(ledger.rows, run.layer_bytes, run.read_bytes, strict=True))
    return dataclasses.replace(ledger, rows=rows, measured_bytes=run.total_bytes,
                               measured_from=f"working model {run.source}")
