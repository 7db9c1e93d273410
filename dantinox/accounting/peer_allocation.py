"""The peers' allocation rules: how vLLM and llama.cpp would allocate a model's KV cache, derived from their
sources (derived, not measured). Not dantinox's own serving engine (dantinox/engine/).

    dantinox.accounting.peer_allocation.vllm_column(arch, tokens, batch, "bfloat16", budget_bytes=...)
    dantinox.accounting.peer_allocation.llama_cpp_column(arch, n_ctx, "float16", n_seq=1)
    dantinox.accounting.peer_allocation.vllm_pool(arch, available_bytes).log_line
    dantinox.accounting.peer_allocation.llama_cpp_size_lines(arch, n_ctx, n_seq=4)["recurrent"]["mib"]

Read in vLLM 0.33.0 (the PyPI wheel's sources) and in llama.cpp as vendored by llama-cpp-python 0.3.36 (its
sdist); file:line below. Own code, own words: only the rules are carried over.

vLLM
  page            16 tokens (vllm/config/cache.py:185, CacheConfig.DEFAULT_BLOCK_SIZE)
  page bytes      16 · K · (H + H_v) · s per layer (vllm/v1/kv_cache_interface.py:586-600); MLA stores
                  one latent of C + R with H_v = 0 and K = 1 (kv_cache_interface.py:743)
  full layer      ceil(T / 16) pages (kv_cache_interface.py:648)
  sliding layer   with the hybrid allocator: ceil((W - 1) / 16) + 1 pages at decode, the + 1 because the
                  window need not start at a page boundary (kv_cache_interface.py:944); without it, a sliding
                  layer gets the pages of a full layer (kv_cache_interface.py:620-626)
  chunked layer   ceil(min(C, T) / 16) pages, the chunk in progress (kv_cache_interface.py:881)
  the log line    "GPU KV cache size: N tokens" is int(pages / pages per request at max_model_len ·
                  max_model_len) (vllm/v1/core/kv_cache_utils.py:1120-1128, 1061-1093), with pages (vLLM's
                  num_blocks) = available memory // bytes per page across layers (vllm/v1/core/
                  kv_cache_planning.py:681); derived here for models whose layers are all of one kind (one
                  KV-cache group, bytes per page across layers = L · page bytes)
llama.cpp
  context         n_ctx rounded up to a multiple of 256 (src/llama-context.cpp:290); releases of 2025
                  padded the cache to get_padding() = 256 with flash attention, 32 without (pad=32)
  tensors         per layer K [n_embd_k_gqa, kv_size] and V [n_embd_v_gqa, kv_size] of type_k / type_v
                  (src/llama-kv-cache.cpp:233-234), f16 by default (src/llama-context.cpp:3780-3781); layers
                  without their own KV (shared) get none (src/llama-kv-cache.cpp:166)
  SWA layers      a second cache of GGML_PAD(min(n_ctx, n_swa + n_ubatch), 256) cells
                  (src/llama-kv-cache-iswa.cpp:73), unless swa_full, which sizes it like the base cache
                  (iswa.cpp:76-81); the library's default is swa_full = true (src/llama-context.cpp:3788)
  the log line    "llama_kv_cache: CPU KV buffer size = X MiB", one per cache (src/llama-kv-cache.cpp:291)
  state layers    llama_memory_recurrent (src/llama-memory-recurrent.cpp, https://github.com/ggml-org/
                  llama.cpp/blob/master/src/llama-memory-recurrent.cpp): one cell per sequence
                  (n_seq_max), holding per state layer an R tensor of n_embd_r = (d_conv - 1) · conv
                  channels and an S tensor of n_embd_s elements (Mamba-2: d_state · d_inner; Gated
                  DeltaNet: d_k · d_v per value head), both f32 by default; its size line counts every
                  layer of the model, its bytes only the state layers
  several seqs    with a unified cache (kv_unified, `4/1 seqs` in the size line) the n_ctx cells are shared by
                  the sequences; the SWA cache holds n_swa · n_seq_max + n_ubatch cells, padded to 256
                  (src/llama-kv-cache-iswa.cpp, https://github.com/ggml-org/llama.cpp/blob/master/src/
                  llama-kv-cache-iswa.cpp)

vLLM's pool (vllm_pool; vllm/v1/core/kv_cache_utils.py, https://github.com/vllm-project/vllm/blob/main/vllm/
v1/core/kv_cache_utils.py, get_kv_cache_config / _get_kv_cache_groups_uniform_page_size)
  one page size   every KV-cache group's page holds the same bytes: a layer kind whose token is smaller gets
                  a proportionally larger block (gemma-4's global layers, 4 × 512 against 16 × 256:
                  32 tokens)
  groups          the layers of each kind are cut into groups of group_size = the smallest kind's layer count
                  (the largest's, when it is under 1.25 × the smallest), the last group of a kind padded; one
                  tensor per group position is shared by one layer of every group, so a pool page costs
                  page bytes · group_size, and a sliding layer's share of the pool is a full layer's
  the log line    in the releases the published logs in docs/engine_logs.md came from, "GPU KV cache size:
                  N tokens" with N = num_blocks // groups · min block size (_report_kv_cache_config; the
                  rule vLLM PR #40384 discusses): for a hybrid model it counts the pool as if every layer
                  held every token; 0.33.0 prints max concurrency · max_model_len (above; also
                  https://github.com/vllm-project/vllm/issues/51041)
  state layers    MambaSpec (vllm/v1/kv_cache_interface.py, page_size_bytes): one page per sequence, holding
                  the convolution window ((d_conv - 1) · channels; all an LFM2 convolution keeps) and the
                  recurrent state, constant in T, in the cache dtype (mamba_ssm_cache_dtype "auto"), the
                  recurrent state in the config's mamba_ssm_dtype where it gives one (Qwen3.5: float32)

vLLM's pages beside state layers (vllm_hybrid_block; vllm/model_executor/models/config.py,
HybridAttentionMambaModelConfig.verify_and_update_config, read at commit
0144dd5b0d2d9ef9ac2651a3ab6efa83d0497ea9, https://github.com/vllm-project/vllm/blob/0144dd5b0d2d9ef9ac2651a3ab6e
fa83d0497ea9/vllm/model_executor/models/config.py)
  one page        the state's page and the attention page must be equal: the attention block grows to
                  B = 16 · ceil(state page / (16 · attention bytes per token)) tokens (a larger --block-size
                  is kept), and the state page is padded to B · attention bytes per token ("Setting attention
                  block size to B tokens", "Padding mamba page size by P%" in its log)
  the pool        the group rule above with the state layers as one more kind: a pool page costs B · attention
                  bytes per token · group_size, and "GPU KV cache size" = blocks // groups · B (a state
                  group's block is max_model_len, never the smallest)
"""

from __future__ import annotations

import dataclasses
import math

from dantinox.architectures.catalogue import Architecture, LayerGeometry
from dantinox.architectures.config import DTYPES

VLLM_PAGE = 16
LLAMA_CPP_PAD = 256
LLAMA_CPP_UBATCH = 512  # llama_context_default_params().n_ubatch


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _float_size(cache_dtype: str, engine: str) -> int:
    if cache_dtype not in DTYPES:
        raise ValueError(f"cache_dtype: the {engine} column is derived for float caches "
                         f"({', '.join(DTYPES)}); its quantized caches keep their scales differently, got "
                         f"{cache_dtype!r}")
    return DTYPE_BYTES[cache_dtype]


def conv_channels(layer: LayerGeometry) -> int:
    """The channels a state layer's short convolution keeps: Gated DeltaNet convolves q, k and v
    (2·K·d_k + V·d_v), Mamba-2 its x, B and C (the config's conv channels)."""
    if layer.kind == "linear":
        return 2 * layer.kv_heads * layer.head_size + layer.value_heads * layer.value_size
    return layer.channels


def state_elements(layer: LayerGeometry) -> int:
    """Elements one sequence's state holds in the engines: d_conv - 1 convolution inputs and the recurrent
    state (Gated DeltaNet: V heads of d_k × d_v; Mamba-2: V heads of head size × N)."""
    if layer.kind not in ("linear", "mamba"):
        raise ValueError(f"layer {layer.index}: a {layer.kind} layer keeps no recurrent state")
    depth = layer.head_size if layer.kind == "linear" else layer.state_size
    return (layer.conv - 1) * conv_channels(layer) + layer.value_heads * layer.value_size * depth


STATE_KINDS = ("linear", "mamba", "conv")
ATTENTION_KINDS = ("full", "sliding", "chunked", "latent")


def vllm_state_bytes(layer: LayerGeometry, itemsize: int) -> int:
    """One sequence's state page in vLLM before padding (MambaSpec.page_size_bytes): a Gated DeltaNet or
    Mamba-2 layer's convolution window and recurrent state; an LFM2 convolution's conv - 1 inputs."""
    if layer.kind == "conv":
        return (layer.conv - 1) * layer.channels * itemsize
    window = (layer.conv - 1) * conv_channels(layer) * itemsize
    state = state_elements(layer) - (layer.conv - 1) * conv_channels(layer)
    # mamba_ssm_cache_dtype: the config's (Qwen3.5: float32), else "auto", the cache dtype
    return window + state * (DTYPE_BYTES[layer.state_dtype] if layer.state_dtype else itemsize)


def _token_bytes(layer: LayerGeometry, itemsize: int) -> int:
    """Bytes of one token in an attention layer's vLLM page: K and V heads, or MLA's latent and RoPE key."""
    if layer.kind == "latent":
        return (layer.latent + layer.rope) * itemsize
    return 2 * layer.kv_heads * layer.head_size * itemsize


@dataclasses.dataclass(frozen=True)
class VllmHybridBlock:
    """The attention block vLLM picks beside state layers, and the padding of their state page."""
    block_tokens: int  # B, the attention block (vLLM's cache_config.block_size)
    token_bytes: int  # one token in one attention layer's page
    state_bytes: int  # one state page before padding
    page_bytes: int  # B · token_bytes: every page, the state's padded to it

    @property
    def padding_percent(self) -> float:
        """What vLLM logs as "Padding mamba page size by P%"."""
        return 100 * (self.page_bytes - self.state_bytes) / self.state_bytes


def vllm_hybrid_block(arch: Architecture, cache_dtype: str = "bfloat16",
                      block_size: int | None = None) -> VllmHybridBlock:
    """vLLM's attention block and page for a model with state layers beside attention layers (the rule in the
    module docstring); `block_size` is a --block-size the user gave (kept when it is large enough)."""
    s = _float_size(cache_dtype, "vLLM")
    states = {vllm_state_bytes(layer, s) for layer in arch.layers if layer.kind in STATE_KINDS}
    tokens = {_token_bytes(layer, s) for layer in arch.layers if layer.kind in ATTENTION_KINDS}
    if not states or not tokens:
        raise ValueError(f"{arch.name}: vLLM pads a state page to the attention page in a model with both")
    if arch.count("latent"):
        raise ValueError(f"{arch.name}: vLLM's page for MLA beside linear layers is not derived here (its "
                         "Kimi Delta Attention state keeps q, k and v windows and a float32 state)")
    if len(states) > 1 or len(tokens) > 1:
        raise ValueError(f"{arch.name}: vLLM sizes one state page and one attention token for the model; its "
                         f"layers differ ({sorted(states)} B states, {sorted(tokens)} B tokens)")
    (state,), (token,) = states, tokens
    block = VLLM_PAGE * _ceil(state, VLLM_PAGE * token)
    if block_size is not None and block_size >= block:
        block = block_size
    return VllmHybridBlock(block, token, state, block * token)


@dataclasses.dataclass(frozen=True)
class EngineColumn:
    engine: str
    per_layer_bytes: tuple[int, ...]  # for the batch, per layer
    total_bytes: int
    log_line: str | None  # what the engine would print, where derived
    notes: tuple[str, ...]


def vllm_column(arch: Architecture, tokens: int, batch: int, cache_dtype: str = "bfloat16",
                hybrid_allocator: bool = True, budget_bytes: int | None = None) -> EngineColumn:
    """Pages vLLM holds for B sequences of T tokens (16-token pages; beside state layers, the larger block
    that makes the attention page equal the state's), and its "GPU KV cache size" for a budget."""
    s = _float_size(cache_dtype, "vLLM")
    notes = []
    hybrid = None
    if any(arch.count(kind) for kind in STATE_KINDS):
        try:
            hybrid = vllm_hybrid_block(arch, cache_dtype)
        except ValueError as e:
            notes.append(f"state layers: one page per sequence, not padded here: {e}")
        else:
            notes.append(f"state layers: one page per sequence (MambaSpec) of {hybrid.state_bytes:,} B, "
                         f"padded by {hybrid.padding_percent:.2f}% to the attention page of "
                         f"{hybrid.block_tokens} tokens ({hybrid.page_bytes:,} B), as vLLM's hybrid config "
                         "does")
    block = VLLM_PAGE if hybrid is None else hybrid.block_tokens
    pages, page_bytes = [], []
    for layer in arch.layers:
        if layer.kind in ATTENTION_KINDS:
            page = block * _token_bytes(layer, s)
        elif layer.kind in STATE_KINDS:  # one page per sequence, constant in T
            page = vllm_state_bytes(layer, s) if hybrid is None else hybrid.page_bytes
        else:
            page = 0
        if layer.kind in STATE_KINDS:
            n = 1
        elif layer.kind in ("full", "latent") or (layer.kind == "sliding" and not hybrid_allocator):
            n = _ceil(tokens, block)
        elif layer.kind == "sliding":
            n = min(_ceil(tokens, block), _ceil(layer.window - 1, block) + 1)
        elif layer.kind == "chunked":
            n = _ceil(min(layer.window, tokens), block)
        else:
            n = 0
        pages.append(n)
        page_bytes.append(page)
    per_layer = [batch * n * p for n, p in zip(pages, page_bytes, strict=True)]
    if any(layer.indexer for layer in arch.layers):
        notes.append("lightning-indexer keys (DeepSeek-V3.2): vLLM keeps them in a cache of their own; not "
                     "counted in this column")
    log = None
    kinds = {layer.kind for layer in arch.layers}
    if budget_bytes is not None:
        if len(kinds) == 1 and kinds <= {"full", "latent"}:
            per_page = sum(page_bytes)  # one page in every layer
            n_pages = budget_bytes // per_page
            per_request = _ceil(arch.max_context, VLLM_PAGE)
            log = f"GPU KV cache size: {int(n_pages / per_request * arch.max_context):,} tokens"
        else:
            try:
                log = vllm_pool(arch, budget_bytes, cache_dtype).log_line
            except ValueError as e:
                notes.append(f"no log line: {e}")
            else:
                notes.append("the log line for a hybrid model: the blocks // groups rule of the releases "
                              "before 0.33.0 (vllm_pool)")
    return EngineColumn("vLLM", tuple(per_layer), sum(per_layer), log, tuple(notes))


def llama_cpp_column(arch: Architecture, n_ctx: int, cache_dtype: str = "float16",
                     swa_full: bool = True, n_seq: int = 1, pad: int = LLAMA_CPP_PAD) -> EngineColumn:
    """llama.cpp's KV buffers at context n_ctx (padded) for n_seq sequences sharing one unified cache, its
    recurrent states (one cell per sequence, f32) and its "KV buffer size" lines."""
    s = _float_size(cache_dtype, "llama.cpp")
    if any(arch.count(kind) for kind in ("latent", "chunked", "conv")):
        raise ValueError(f"{arch.name}: the llama.cpp column is derived for full, sliding, shared, "
                         "Gated DeltaNet and Mamba-2 layers only (beside MLP blocks)")
    if not isinstance(n_seq, int) or n_seq < 1:
        raise ValueError(f"n_seq: expected a positive int (llama.cpp's n_seq_max), got {n_seq!r}")
    if pad not in (32, 256):
        raise ValueError(f"pad: expected 256 (llama.cpp) or 32 (releases before, without flash attention), "
                         f"got {pad!r}")
    size = _ceil(n_ctx, pad) * pad
    windows = {layer.window for layer in arch.layers if layer.kind == "sliding"}
    swa = size if swa_full or not windows else _ceil(min(size, max(windows) * n_seq + LLAMA_CPP_UBATCH),
                                                     pad) * pad
    per_layer = []
    base = swa_cache = state = 0
    for layer in arch.layers:
        if layer.kind in ("shared", "mlp"):
            per_layer.append(0)
            continue
        if layer.kind in ("linear", "mamba"):
            nbytes = n_seq * state_elements(layer) * 4  # R and S in f32
            state += nbytes
        else:
            cells = swa if layer.kind == "sliding" else size
            nbytes = 2 * layer.kv_heads * layer.head_size * cells * s
            if layer.kind == "sliding":
                swa_cache += nbytes
            else:
                base += nbytes
        per_layer.append(nbytes)
    lines = [f"llama_kv_cache: CPU KV buffer size = {base / 2**20:8.2f} MiB"]
    if windows:
        lines.append(f"llama_kv_cache: CPU KV buffer size = {swa_cache / 2**20:8.2f} MiB  (the SWA cache, "
                     f"{swa:,} cells{', swa_full' if swa_full else ''})")
    if state:
        lines.append(f"llama_memory_recurrent: CPU RS buffer size = {state / 2**20:8.2f} MiB")
    return EngineColumn("llama.cpp", tuple(per_layer), sum(per_layer), "\n".join(lines),
                        (f"n_ctx {n_ctx:,} padded to {size:,} cells",))


def llama_cpp_size_lines(arch: Architecture, n_ctx: int, cache_dtype: str = "float16",
                         swa_full: bool = True, n_seq: int = 1, pad: int = LLAMA_CPP_PAD) -> dict[str, dict]:
    """The numbers of llama.cpp's `size = X MiB (C cells, L layers, ...)` lines: per cache ("kv", "swa",
    "recurrent") its MiB, cells and the layers it names."""
    column = llama_cpp_column(arch, n_ctx, cache_dtype, swa_full, n_seq, pad)
    size = _ceil(n_ctx, pad) * pad
    out: dict[str, dict] = {}
    for cache, kinds in (("kv", ("full",)), ("swa", ("sliding",)), ("recurrent", ("linear", "mamba"))):
        layers = [i for i, layer in enumerate(arch.layers) if layer.kind in kinds]
        if not layers:
            continue
        nbytes = sum(column.per_layer_bytes[i] for i in layers)
        if cache == "recurrent":
            cells, named = n_seq, len(arch.layers)  # its line names every layer of the model
        elif cache == "swa":
            one = arch.layers[layers[0]]
            cells, named = nbytes // (len(layers) * 2 * one.kv_heads * one.head_size
                                      * _float_size(cache_dtype, "llama.cpp")), len(layers)
        else:
            cells, named = size, len(layers)
        out[cache] = {"mib": nbytes / 2**20, "bytes": nbytes, "cells": cells, "layers": named}
    return out


@dataclasses.dataclass(frozen=True)
class VllmPool:
    """vLLM's KV-cache pool for a budget: its groups, the unified page, the blocks it holds, its log line."""
    page_bytes: int  # one page of one layer, the same in every group
    group_size: int  # layers per group (padded)
    groups: tuple[tuple[str, int], ...]  # (layer kind, tokens per block) per group
    num_blocks: int
    tokens: int  # the "GPU KV cache size: N tokens" number
    log_line: str


def vllm_pool(arch: Architecture, available_bytes: int, cache_dtype: str = "bfloat16") -> VllmPool:
    """The pool vLLM's hybrid allocator builds in `available_bytes` ("Available KV cache memory") and the
    "GPU KV cache size" it logs (the group rule in the module docstring; beside state layers, the page of
    vllm_hybrid_block, the state layers one more kind whose block is never the smallest)."""
    s = _float_size(cache_dtype, "vLLM")
    hybrid = vllm_hybrid_block(arch, cache_dtype) if any(arch.count(k) for k in STATE_KINDS) else None
    token_bytes: dict[str, int] = {}
    counts: dict[str, int] = {}
    for layer in arch.layers:
        if layer.kind in STATE_KINDS:
            key, t = "state", 0
        elif layer.kind in ATTENTION_KINDS:
            t = _token_bytes(layer, s)
            key = f"{layer.kind}:{t}:{layer.window}"
        else:
            continue  # shared layers read another layer's pages; MLP blocks keep none
        token_bytes[key] = t
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        raise ValueError(f"{arch.name}: no layer keeps a KV cache")
    attention = {key: t for key, t in token_bytes.items() if key != "state"}
    page = hybrid.page_bytes if hybrid else max(VLLM_PAGE * t for t in attention.values())
    blocks = {}
    for key, t in attention.items():
        if page % t:
            raise ValueError(f"{arch.name}: vLLM cannot give {key.split(':')[0]} layers of {t} B per token "
                             f"a page of {page} B")
        blocks[key] = page // t
    group_size = min(counts.values())
    if max(counts.values()) < 1.25 * group_size:
        group_size = max(counts.values())
    groups = tuple((key.split(":")[0], blocks.get(key, 0)) for key in counts
                   for _ in range(_ceil(counts[key], group_size)))
    num_blocks = available_bytes // (page * group_size)
    tokens = num_blocks // len(groups) * min(b for kind, b in groups if kind != "state")
    return VllmPool(page, group_size, groups, num_blocks, tokens, f"GPU KV cache size: {tokens:,} tokens")


def vllm_concurrency(arch: Architecture, available_bytes: int, max_model_len: int,
                     cache_dtype: str = "bfloat16") -> float:
    """vLLM's "Maximum concurrency for max_model_len tokens per request": the pool's blocks over the blocks
    one request of max_model_len holds, for a model whose layers are all full (one group)."""
    pool = vllm_pool(arch, available_bytes, cache_dtype)
    if len(pool.groups) != 1 or pool.groups[0][0] not in ("full", "latent"):
        raise ValueError(f"{arch.name}: the concurrency line is derived here for one group of full layers")
    return pool.num_blocks / math.ceil(max_model_len / pool.groups[0][1])
