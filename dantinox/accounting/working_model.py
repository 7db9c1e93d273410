"""A working dantinox model with a published model's cache geometry,
and the bytes of the cache it decodes with.

    arch = dantinox.architectures.catalogue.load_architecture("gemma-3-27b")  # or a config.json / .gguf path
    run = measure_working_model(arch, tokens=4096, batch=1, cache_dtype="bfloat16")
    run.layer_bytes, run.source, run.lengths        # per layer, from the arrays; "arrays"; [5]

What is real: the number of layers and their order, each layer's kind (full, sliding ring of W, chunked ring
of C, MLA latent with DeepSeek-V3.2's indexer key and top-k where the config has them, Gated DeltaNet state,
LFM2 convolution, Mamba-2 state, MLP-only block), its K and H (or C and R, or its state's sizes), the cache
dtype, T and B. What is scaled down, and why the cache does not depend on it: the residual width D (64), the
MLP width (64) and the vocabulary (256 byte tokens) set the weights, not the cache (an LFM2 convolution keeps
its real channel count, the hidden size, since its state is that many channels wide; its projections go from
and to the narrow D); the query heads are the least common multiple of the layers' K (each query head reads
one KV head; queries are never cached), and an MLA model keeps 2 query heads of 16 channels (its cache is the
latent C plus the RoPE key R whatever the heads) and 2 indexer query heads (only the indexer's key is cached).
The weights are random. gpt-oss's learned sink logits run (random, one per query head, in every attention
layer: they are weights, and its cache is the same bytes). Other features that shape the logits but store
nothing (QK-norm, per-layer RoPE bases, Llama 4's and SmolLM3's NoPE layers, Gemma 4's values taken from its
global layers' key projection) are left out: the same cache runs without them. Not built, each refused in one
line naming the layer (their ledger rows are derived from the formula): a linear layer whose values are wider
than its keys, and MLA beside layers of kinds other than linear attention (Kimi Linear's MLA layers run beside
its Kimi Delta Attention layers, the Gated DeltaNet kind with one decay per key channel).

The cache is allocated for T slots per full layer (as transformers' StaticCache(max_cache_len=T) is), the
model prefills a short prompt into it and decodes a few tokens, and each layer's bytes are read from the
arrays it returns; an indexed-latent layer's read bytes from the arrays its last decode step read (the
latents its top-k selection gathered, the indexer keys it scored). Above the memory guard nothing is
allocated: the same run is traced with `jax.eval_shape` and the bytes are those of the shapes it returns
(source "shapes").
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dantinox.architectures.catalogue import Architecture
from dantinox.architectures.config import DTYPES, QUANT_CACHE_DTYPES, LayerSpec, ModelConfig
from dantinox.architectures.model import Transformer
from dantinox.cache import IndexedLatentCache, cache_shapes, init_cache, tree_nbytes
from dantinox.checks import positive_int

# bytes: the labs' allocation budget (widgets/readings.py); larger caches are traced
MEMORY_GUARD = 256 * 2**20
D_MODEL, MLP_WIDTH, VOCAB = 64, 64, 256  # the scaled-down widths: they size the weights, never the cache
MLA_QUERY_HEADS, MLA_HEAD_SIZE = 2, 16
PROMPT, DECODE = 3, 2  # tokens prefilled in one call, then decoded one at a time
BUILT_KINDS = ("full", "sliding", "chunked", "latent", "shared", "linear", "conv", "mamba", "mlp")
INDEX_QUERY_HEADS = 2  # the indexer's query heads (DeepSeek-V3.2 has 64): they cache nothing


@dataclasses.dataclass(frozen=True)
class WorkingRun:
    """What a working model's decode left in its cache."""

    config: ModelConfig
    layer_bytes: tuple[int, ...]  # per layer, bytes of its payload's arrays (or shapes) after the decode
    # "arrays" (allocated and decoded) | "shapes" (jax.eval_shape of the same run, over the guard)
    source: str
    lengths: tuple[int, ...]  # tokens each sequence holds after the run (the cache's own fill)
    prompt: int  # tokens prefilled in one call
    decoded: int  # tokens decoded one at a time after it
    # per layer, bytes the last decode step read where a layer reads other than it stores (DeepSeek-V3.2's
    # indexed latents: what its top-k selection gathered, and the indexer keys it scored); None elsewhere,
    # or where no step was decoded
    read_bytes: tuple[int | None, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(self.layer_bytes)


def working_config(arch: Architecture, tokens: int, cache_dtype: str = "bfloat16") -> ModelConfig:
    """A dantinox config with `arch`'s per-layer cache geometry and a cache of `tokens` slots
    (see the module)."""
    tokens = positive_int("tokens", tokens)
    if cache_dtype not in (*DTYPES, *QUANT_CACHE_DTYPES):
        raise ValueError(f"cache_dtype: expected one of {', '.join((*DTYPES, *QUANT_CACHE_DTYPES))}, "
                         f"got {cache_dtype!r}")
    for layer in arch.layers:
        if layer.kind not in BUILT_KINDS:
            raise ValueError(f"{arch.name}: layer {layer.index} is {layer.kind!r}, which the working model "
                             f"does not build; its ledger row is derived from the formula")
        if layer.kind == "linear" and layer.value_size != layer.head_size:
            raise ValueError(f"{arch.name}: layer {layer.index} has keys of {layer.head_size} and values of "
                             f"{layer.value_size} channels; the working model's Gated DeltaNet builds "
                             "equal ones")
    activations = cache_dtype if cache_dtype in DTYPES else "bfloat16"  # a state layer's convolution inputs
    common = dict(vocab_size=VOCAB, d_model=D_MODEL, n_layers=len(arch.layers), mlp_width=MLP_WIDTH,
                  max_context=tokens, cache_dtype=cache_dtype, dtype=activations)
    specs = tuple(_spec(layer) for layer in arch.layers)
    latent = [layer for layer in arch.layers if layer.kind == "latent"]
    if latent:
        widths = {(layer.latent, layer.rope, layer.indexer, layer.index_topk) for layer in latent}
        # beside the latent layers: Kimi Linear's delta-rule layers; no other kind
        others = sum(layer.kind not in ("shared", "mlp", "linear") for layer in arch.layers) - len(latent)
        if len(widths) > 1 or others:
            raise ValueError(f"{arch.name}: the working model builds MLA only with one latent width in every "
                             f"layer, got {sorted(widths, key=str)} beside {others} layers of other kinds")
        (c, r, size, topk), = widths  # and DeepSeek-V3.2's indexer on every layer, or on none
        indexer = {} if size is None else dict(index_heads=INDEX_QUERY_HEADS, index_head_size=size,
                                               index_topk=topk)
        return ModelConfig(**common, n_heads=MLA_QUERY_HEADS, head_size=MLA_HEAD_SIZE, attention="latent",
                           kv_latent_dim=c, rope_head_dim=r, layer_specs=specs, **indexer)
    heads = [layer for layer in arch.layers if layer.kind in ("full", "sliding", "chunked")]
    return ModelConfig(**common, n_heads=math.lcm(*(layer.kv_heads for layer in heads)),
                       kv_heads=heads[0].kv_heads, head_size=heads[0].head_size, layer_specs=specs)


def _spec(layer) -> LayerSpec:
    if layer.kind == "shared":
        return LayerSpec(kind="shared", source=layer.shares)
    if layer.kind == "latent":
        return LayerSpec()
    if layer.kind == "linear":  # Gated DeltaNet: K key heads of H channels, V value heads, a convolution;
        # Kimi Delta Attention: the same with a decay per key channel
        return LayerSpec(kind="state", kv_heads=layer.kv_heads, head_size=layer.head_size,
                         value_heads=layer.value_heads, conv=layer.conv, decay=layer.decay)
    if layer.kind == "conv":  # LFM2: its real channels (the state's width), from and to the narrow D
        return LayerSpec(kind="conv", conv=layer.conv, channels=layer.channels)
    if layer.kind == "mamba":  # Mamba-2: its real heads, head size, state size, groups and convolution
        return LayerSpec(kind="mamba", value_heads=layer.value_heads, head_size=layer.value_size,
                         conv=layer.conv, ssm_state=layer.state_size, ssm_groups=layer.ssm_groups)
    if layer.kind == "mlp":  # an MLP or MoE block with no token mixer
        return LayerSpec(kind="mlp")
    return LayerSpec(kind=layer.kind, window=layer.window, kv_heads=layer.kv_heads, head_size=layer.head_size,
                     learned_sinks=layer.learned_sinks)


@functools.lru_cache(maxsize=16)
def measure_working_model(arch: Architecture, tokens: int, batch: int = 1, cache_dtype: str = "bfloat16",
                          guard: int = MEMORY_GUARD, seed: int = 0) -> WorkingRun:
    """Build `arch`'s working model, prefill and decode with a cache of `tokens` slots,
    and measure each layer. The run is deterministic (its weights come from `seed`), so the last few are kept
    by their arguments: the command's text and JSON answers and the ledger beside them read one run."""
    cfg = working_config(arch, tokens, cache_dtype)
    batch = positive_int("batch", batch)
    guard = positive_int("guard", guard, minimum=0)
    model = Transformer(cfg, rngs=nnx.Rngs(seed))  # dantinox's own random init
    prompt = min(PROMPT, tokens)
    decoded = min(DECODE, tokens - prompt)
    ids = (np.arange(batch * prompt).reshape(batch, prompt) * 7 + 1) % VOCAB

    def run():
        cache = init_cache(cfg, batch, tokens)
        logits, cache = model.forward(jnp.asarray(ids, jnp.int32), cache)  # eager: one dispatch per op, each
        views = (None,) * cfg.n_layers  # what each layer read, from the last one-token step
        for _ in range(decoded):  # compiled once per shape, so the real layer count costs no long compile
            next_B1 = jnp.argmax(logits[:, -1:], axis=-1).astype(jnp.int32)
            logits, cache, views = model.forward(next_B1, cache, with_views=True)
        return logits, cache, tuple(map(_step_reads, cache.layers, views))

    if tree_nbytes(cache_shapes(cfg, batch, tokens)) > guard:
        _, shapes, reads = jax.eval_shape(run)  # the same run, traced: shapes and dtypes, no buffer allocated
        return WorkingRun(cfg, tuple(tree_nbytes(layer) for layer in shapes.layers), "shapes",
                          (prompt + decoded,) * batch, prompt, decoded, _nbytes(reads))
    logits, cache, reads = run()
    if not bool(jnp.all(jnp.isfinite(logits))):
        raise ValueError(f"{arch.name}: the working model's logits are not finite")
    return WorkingRun(cfg, tuple(tree_nbytes(layer) for layer in cache.layers), "arrays",
                      tuple(int(n) for n in np.asarray(cache.lengths)), prompt, decoded, _nbytes(reads))


def _step_reads(layer_cache, view) -> tuple | None:
    """The arrays a decode step of an indexed-latent layer (DeepSeek-V3.2) read: the latents and scales its
    top-k selection gathered (the View its attention read: min(k, slots) rows per query, slots the layer
    holds, filled or not, as the formula counts a step at T) and the indexer keys it scored (every slot).
    None for a layer that reads what it stores, or where no step was decoded."""
    if view is None or not isinstance(layer_cache, IndexedLatentCache):
        return None
    return view.payload, (layer_cache.idx_k, layer_cache.idx_scale)


def _nbytes(reads: tuple) -> tuple[int | None, ...]:
    return tuple(None if r is None else tree_nbytes(r) for r in reads)
