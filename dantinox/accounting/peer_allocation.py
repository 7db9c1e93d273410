"""The peers' allocation rules: how vLLM and llama.cpp would allocate a model's KV cache, derived from their
sources (derived, not measured). Not dantinox's own serving engine (dantinox/engine/).

    dantinox.accounting.peer_allocation.vllm_column(arch, tokens, batch, "bfloat16", budget_bytes=...)
    dantinox.accounting.peer_allocation.llama_cpp_column(arch, n_ctx, "float16")

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
  context         n_ctx rounded up to a multiple of 256 (src/llama-context.cpp:290)
  tensors         per layer K [n_embd_k_gqa, kv_size] and V [n_embd_v_gqa, kv_size] of type_k / type_v
                  (src/llama-kv-cache.cpp:233-234), f16 by default (src/llama-context.cpp:3780-3781); layers
                  without their own KV (shared) get none (src/llama-kv-cache.cpp:166)
  SWA layers      a second cache of GGML_PAD(min(n_ctx, n_swa + n_ubatch), 256) cells
                  (src/llama-kv-cache-iswa.cpp:73), unless swa_full, which sizes it like the base cache
                  (iswa.cpp:76-81); the library's default is swa_full = true (src/llama-context.cpp:3788)
  the log line    "llama_kv_cache: CPU KV buffer size = X MiB", one per cache (src/llama-kv-cache.cpp:291)
"""

from __future__ import annotations

import dataclasses

from dantinox.architectures.catalogue import Architecture
from dantinox.architectures.config import DTYPES

VLLM_PAGE = 16
LLAMA_CPP_PAD = 256
LLAMA_CPP_UBATCH = 512  # llama_context_default_params().n_ubatch


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _float_size(cache_dtype: str, engine: str) -> int:
    if cache_dtype not in DTYPES:
        raise ValueError(f"cache_dtype: the {engine} column is derived for float caches "
                         f"({', '.join(DTYPES)}); its quantized caches keep their scales differently, got "
                         f"{cache_dtype!r}")
    return {"float32": 4, "bfloat16": 2, "float16": 2}[cache_dtype]


@dataclasses.dataclass(frozen=True)
class EngineColumn:
    engine: str
    per_layer_bytes: tuple[int, ...]  # for the batch, per layer
    total_bytes: int
    log_line: str | None  # what the engine would print, where derived
    notes: tuple[str, ...]


def vllm_column(arch: Architecture, tokens: int, batch: int, cache_dtype: str = "bfloat16",
                hybrid_allocator: bool = True, budget_bytes: int | None = None) -> EngineColumn:
    """Pages vLLM holds for B sequences of T tokens (16-token pages),
    and its "GPU KV cache size" for a budget."""
    s = _float_size(cache_dtype, "vLLM")
    pages, page_bytes, notes = [], [], []
    for layer in arch.layers:
        if layer.kind == "latent":
            page = VLLM_PAGE * (layer.latent + layer.rope) * s
        elif layer.kind in ("full", "sliding", "chunked"):
            page = VLLM_PAGE * layer.kv_heads * 2 * layer.head_size * s
        else:
            page = 0
        if layer.kind in ("full", "latent") or (layer.kind == "sliding" and not hybrid_allocator):
            n = _ceil(tokens, VLLM_PAGE)
        elif layer.kind == "sliding":
            n = min(_ceil(tokens, VLLM_PAGE), _ceil(layer.window - 1, VLLM_PAGE) + 1)
        elif layer.kind == "chunked":
            n = _ceil(min(layer.window, tokens), VLLM_PAGE)
        else:
            n = 0
        pages.append(n)
        page_bytes.append(page)
    per_layer = [batch * n * p for n, p in zip(pages, page_bytes, strict=True)]
    if arch.count("mamba"):
        notes.append("Mamba-2 layers: vLLM keeps each sequence's state in one page of its own (MambaSpec); "
                     "not counted in this column")
    if any(layer.indexer for layer in arch.layers):
        notes.append("lightning-indexer keys (DeepSeek-V3.2): vLLM keeps them in a cache of their own; not "
                     "counted in this column")
    if arch.count("conv"):
        notes.append("short-convolution layers: vLLM keeps each sequence's state in one page of its own; not "
                     "counted in this column")
    if arch.count("linear"):
        notes.append("linear-attention layers: vLLM keeps each sequence's state in one page of its own "
                     "(vllm/v1/kv_cache_interface.py:1094, MambaSpec); not counted in this column")
    log = None
    kinds = {layer.kind for layer in arch.layers}
    if budget_bytes is not None:
        if len(kinds) == 1 and kinds <= {"full", "latent"}:
            per_page = sum(page_bytes)  # one page in every layer
            n_pages = budget_bytes // per_page
            per_request = _ceil(arch.max_context, VLLM_PAGE)
            log = f"GPU KV cache size: {int(n_pages / per_request * arch.max_context):,} tokens"
        else:
            notes.append("the log line for a hybrid model depends on how vLLM groups its layers; "
                         "not derived here")
    return EngineColumn("vLLM", tuple(per_layer), sum(per_layer), log, tuple(notes))


def llama_cpp_column(arch: Architecture, n_ctx: int, cache_dtype: str = "float16",
                     swa_full: bool = True) -> EngineColumn:
    """llama.cpp's KV buffers for one sequence at context n_ctx (padded), and its "KV buffer size" lines."""
    s = _float_size(cache_dtype, "llama.cpp")
    if any(arch.count(kind) for kind in ("latent", "linear", "chunked", "mamba", "conv")):
        raise ValueError(f"{arch.name}: the llama.cpp column is derived for full, sliding and shared layers "
                         "only (beside MLP blocks)")
    size = _ceil(n_ctx, LLAMA_CPP_PAD) * LLAMA_CPP_PAD
    windows = {layer.window for layer in arch.layers if layer.kind == "sliding"}
    swa = size if swa_full or not windows else _ceil(min(size, max(windows) + LLAMA_CPP_UBATCH),
                                                     LLAMA_CPP_PAD) * LLAMA_CPP_PAD
    per_layer = []
    base = swa_cache = 0
    for layer in arch.layers:
        if layer.kind in ("shared", "mlp"):
            per_layer.append(0)
            continue
        cells = swa if layer.kind == "sliding" else size
        nbytes = 2 * layer.kv_heads * layer.head_size * cells * s
        per_layer.append(nbytes)
        if layer.kind == "sliding":
            swa_cache += nbytes
        else:
            base += nbytes
    lines = [f"llama_kv_cache: CPU KV buffer size = {base / 2**20:8.2f} MiB"]
    if windows:
        lines.append(f"llama_kv_cache: CPU KV buffer size = {swa_cache / 2**20:8.2f} MiB  (the SWA cache, "
                     f"{swa:,} cells{', swa_full' if swa_full else ''})")
    return EngineColumn("llama.cpp", tuple(per_layer), sum(per_layer), "\n".join(lines),
                        (f"n_ctx {n_ctx:,} padded to {size:,} cells",))
