"""Model configuration: the architecture (ModelConfig, a LayerSpec per layer) and the cache (CacheConfig),
frozen dataclasses; named presets; the validation rules.

Dimension alphabet used across dantinox (names and einsum strings):
B batch, T query length, S key length, D model width, F MLP width, N query heads, K KV heads,
G = N/K query heads per KV head, H head size, L layers, V vocab, C latent width (MLA), R RoPE key width (MLA).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from dantinox.architectures.config_upgrade import upgrade
from dantinox.architectures.windows import local_layers
from dantinox.checks import positive_int

ATTENTION_KINDS = ("heads", "latent")
ATTENTION_VARIANTS = ("mha", "gqa", "mqa", "mla")  # derived labels (ModelConfig.variant), not stored
PARADIGMS = ("autoregressive", "diffusion")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# Quantized cache storage (dantinox/cache/quant.py): code dtype; a float32 scale per token and head sits
# beside the codes.
QUANT_CACHE_DTYPES = {"int8": jnp.int8, "fp8_e4m3": jnp.float8_e4m3fn}
# KIVI-style low-bit storage (dantinox/cache/kivi.py): bits per code; codes packed into uint8,
# float16 scales and zeros.
KIVI_CACHE_DTYPES = {"kivi4": 4, "kivi2": 2}
MLA_DECODE_PATHS = ("absorbed", "materialized")
INDEX_FIELDS = ("index_heads", "index_head_size", "index_topk")  # DeepSeek-V3.2's lightning indexer
# the gate's activation: silu (Llama, SmolLM2) or tanh-approximated gelu (Gemma)
MLP_KINDS = ("swiglu", "geglu")
CACHE_LAYOUTS = ("contiguous", "paged")
EVICTIONS = ("h2o",)  # score-based eviction policies (dantinox/cache/eviction.py)
# Which keys a layer's queries read (LayerSpec.kind); the names of dantinox.architectures.catalogue.KINDS.
LAYER_KINDS = ("full", "sliding", "chunked", "shared", "state", "conv", "mamba", "mlp")
# Layers whose cache is a state of constant size, rewritten by each call: Gated DeltaNet ("state"), LFM2's
# gated short convolution ("conv") and Mamba-2 ("mamba"); dantinox/cache/state.py holds their payloads.
RECURRENT_KINDS = ("state", "conv", "mamba")
# a 'state' layer's gate (LayerSpec.decay): one decay per value head, or one per key channel
STATE_DECAYS = ("head", "channel")


def heads_fields(variant: str, n_heads: int, kv_heads: int | None = None) -> dict[str, Any]:
    """The stored fields (attention, kv_heads) for a variant label: 'mha' (K = N), 'mqa' (K = 1), 'gqa' (K
    given), 'mla' (a latent). The one place a label turns back into fields: run directories written before
    kv_heads was the stored fact, and the labs' variant menus, call it."""
    if variant not in ATTENTION_VARIANTS:
        raise ValueError(f"attention: expected one of {', '.join(ATTENTION_VARIANTS)}, got {variant!r}")
    if variant == "mla":
        return dict(attention="latent", kv_heads=None)
    if variant == "gqa":
        if kv_heads is None:
            raise ValueError(f"kv_heads: gqa needs kv_heads, a divisor of n_heads ({n_heads})")
        return dict(attention="heads", kv_heads=kv_heads)
    return dict(attention="heads", kv_heads=None if variant == "mha" else 1)


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One layer's attention: which keys its queries read, and the shapes where real models differ per layer.

    The cached payload (K/V heads or an MLA latent, `ModelConfig.attention`) is the other axis: a sliding
    layer of an MLA model caches W latents. In `ModelConfig.layer_specs` a None field means the model-wide
    value; `ModelConfig.layers` gives every layer's spec with each field filled in.
    """

    # "full" | "sliding" (window W) | "chunked" (chunk C) | "shared" (layer j's cache) | "state" (Gated
    # DeltaNet) | "conv" (LFM2's gated short convolution) | "mamba" (a Mamba-2 mixer) | "mlp" (no token mixer)
    kind: str = "full"
    # W of a sliding layer (the current token and W - 1 before it), C of a chunked one
    window: int | None = None
    kv_heads: int | None = None  # K of this layer, a divisor of n_heads
    head_size: int | None = None  # H of this layer's queries, keys and values
    rope_base: float | None = None  # RoPE wavelength base of this layer (Gemma 3: 10k local, 1M global)
    source: int | None = None  # "shared": the earlier layer whose cache this one reads (Gemma 3n)
    # "state": value heads of the recurrent state (default: kv_heads, its key heads); "mamba": its SSM heads
    # (head_size channels each)
    value_heads: int | None = None
    conv: int | None = None  # "state", "conv", "mamba": width of the short causal convolution (default 4)
    ssm_state: int | None = None  # "mamba": N, the state size of each SSM head (ssm_state_size)
    ssm_groups: int | None = None  # "mamba": groups of heads that share one B and C projection (n_groups)
    channels: int | None = None  # "conv": channels of its convolution (default d_model, as in LFM2)
    # "state": the gate's granularity, one decay per value head ("head", Gated DeltaNet, the default) or one
    # per key channel of each head ("channel", Kimi Delta Attention); it changes the update, not the state
    decay: str | None = None
    # MLA with partial RoPE (a converted model, MHA2MLA): per RoPE key head, the frequency pairs i its keys
    # keep, each turning at base^(-2i / head width); None: the RoPE key's own pairs
    # 0 .. R / rope heads / 2 - 1
    rope_pairs: tuple[tuple[int, ...], ...] | None = None
    # gpt-oss's learned attention sinks: one logit per query head joins the softmax's denominator (the
    # weights over real keys sum to less than 1); a parameter of the layer, nothing in its cache
    learned_sinks: bool = False

    def __post_init__(self) -> None:
        # JSON gives lists: stored as the tuples they mean (hashable)
        if isinstance(self.rope_pairs, list | tuple):
            object.__setattr__(self, "rope_pairs",
                               tuple(tuple(int(i) for i in head) for head in self.rope_pairs))


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """What fixes a KV cache and not the weights: its storage, addressing, KIVI, eviction and sinks.

    A model decodes with any cache config its architecture allows (`ModelConfig.with_cache` checks the pair):
    `dantinox.init_cache(cfg.with_cache(cache_layout="paged"), B)`, `generate(..., cache_layout=...)`.
    """

    cache_dtype: str = "float32"  # storage of cached keys/values (compute stays in the model's `dtype`)
    # addressing of the full layers: "contiguous" rows, or "paged" (page table)
    cache_layout: str = "contiguous"
    page_size: int = 16  # token slots per page of a paged cache
    # G: tokens per key group (per-channel scales) and channels per value group (kivi4/kivi2)
    kivi_group: int = 32
    kivi_residual: int = 128  # R: most recent tokens also kept in full precision (kivi4/kivi2); at least G
    attention_sinks: int = 0  # S: first tokens every sliding-window layer keeps forever (StreamingLLM)
    # N: slots per layer under eviction; the latest N // 2 plus the heavy hitters
    cache_budget: int | None = None
    eviction: str | None = None  # "h2o": evict the non-recent token with the least accumulated attention

    def __post_init__(self) -> None:
        known = [*DTYPES, *QUANT_CACHE_DTYPES, *KIVI_CACHE_DTYPES]
        if self.cache_dtype not in known:
            raise ValueError(f"cache_dtype: expected one of {', '.join(known)}, got {self.cache_dtype!r}")
        if self.cache_layout not in CACHE_LAYOUTS:
            raise ValueError(f"cache_layout: expected one of {', '.join(CACHE_LAYOUTS)}, got "
                             f"{self.cache_layout!r}")
        positive_int("page_size", self.page_size)
        g, r = positive_int("kivi_group", self.kivi_group), positive_int("kivi_residual", self.kivi_residual)
        if self.kivi_bits is not None and r < g:
            raise ValueError(f"kivi_residual: a key group is quantized once complete, so the full-precision "
                             f"window must hold at least kivi_group ({g}) tokens, got {r}")
        positive_int("attention_sinks", self.attention_sinks, minimum=0)
        if (self.cache_budget is None) != (self.eviction is None):
            raise ValueError("eviction: a budget and a policy go together (cache_budget=N with "
                             f"eviction='h2o'), got cache_budget={self.cache_budget!r}, "
                             f"eviction={self.eviction!r}")
        if self.eviction is not None:
            if self.eviction not in EVICTIONS:
                raise ValueError(f"eviction: expected one of {', '.join(EVICTIONS)}, got {self.eviction!r}")
            positive_int("cache_budget", self.cache_budget, minimum=2)

    def replace(self, **changes: Any) -> CacheConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @property
    def quantized_cache(self) -> bool:
        """Whether the cache stores low-bit codes with scales (cache_dtype in QUANT_CACHE_DTYPES)."""
        return self.cache_dtype in QUANT_CACHE_DTYPES

    @property
    def kivi_bits(self) -> int | None:
        """Bits per code of a KIVI cache (cache_dtype "kivi4" / "kivi2"), else None."""
        return KIVI_CACHE_DTYPES.get(self.cache_dtype)

    @property
    def recent_budget(self) -> int | None:
        """Of an eviction budget N, the slots kept for the most recent tokens (N // 2, H2O's even split)."""
        return None if self.cache_budget is None else self.cache_budget // 2

    @property
    def cache_jnp_dtype(self) -> Any:
        """Storage dtype of cached values: the float dtype, or the code dtype of a quantized cache."""
        if self.kivi_bits is not None:
            return jnp.uint8  # packed codes: 8 // bits per byte
        return QUANT_CACHE_DTYPES[self.cache_dtype] if self.quantized_cache else DTYPES[self.cache_dtype]

    @property
    def cache_itemsize(self) -> int:
        """Bytes per cached element (per code for a quantized cache, which also stores float32 scales)."""
        return jnp.dtype(self.cache_jnp_dtype).itemsize


CACHE_FIELDS = tuple(f.name for f in dataclasses.fields(CacheConfig))
# a KVCache carries its config as static structure: one trace per config
jax.tree_util.register_static(CacheConfig)


def _from_cache(name: str) -> property:
    """ModelConfig.<name>: read through to its cache config (the fact is stored there, once)."""
    return property(lambda self: getattr(self.cache, name),
                    doc=f"The cache config's {name} (ModelConfig.cache).")


def _flat_cache_fields(cls: type) -> type:
    """Let ModelConfig(...), preset and replace take the cache's fields flat (cache_dtype="int8"), as before
    the split: they go into its `cache`."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args: Any, cache: CacheConfig | dict | None = None, **fields: Any) -> None:
        flat = {name: fields.pop(name) for name in CACHE_FIELDS if name in fields}
        cache = CacheConfig(**cache) if isinstance(cache, dict) else CacheConfig() if cache is None else cache
        if not isinstance(cache, CacheConfig):
            raise ValueError(f"cache: expected a dantinox.CacheConfig, got {type(cache).__name__}")
        init(self, *args, cache=cache.replace(**flat) if flat else cache, **fields)

    cls.__init__ = __init__
    return cls


@_flat_cache_fields
@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What fixes the weights and shapes of a dantinox model (its architecture, layer by layer), and `cache`,
    the config of the KV caches it makes by default (a model decodes with others too: see CacheConfig)."""

    vocab_size: int = 259  # 256 bytes + <bos>, <eos>, <mask>
    d_model: int = 256  # D, residual stream width
    n_layers: int = 12  # L
    n_heads: int = 8  # N, query heads
    head_size: int = 32  # H
    attention: str = "heads"  # "heads" caches K/V heads; "latent" caches an MLA latent (see kv_latent_dim)
    kv_heads: int | None = None  # K, a divisor of n_heads; None means n_heads (MHA). 1 is MQA; see variant
    max_context: int = 1024  # longest sequence the static cache holds
    dtype: str = "float32"  # activations and the matmuls' compute
    param_dtype: str | None = None  # storage of the weights (converted to `dtype` where used); None: `dtype`
    mlp_width: int = 768  # F, the gated MLP's hidden width
    mlp: str = "swiglu"  # "swiglu": down(silu(gate) · up); "geglu": down(gelu(gate) · up), Gemma's
    rope_base: float = 10_000.0  # RoPE wavelength base
    norm_eps: float = 1e-6  # RMSNorm epsilon
    qk_norm: bool = False  # RMSNorm on every query and key head before RoPE (Gemma 3, OLMo 2); K/V heads only
    tie_embeddings: bool = True  # output head reuses the token embedding matrix
    scale_embeddings: bool = False  # the embedding rows times sqrt(D) before the first layer (Gemma)
    # RMSNorm on the attention's and the MLP's outputs before each joins the residual (Gemma 2 and 3)
    post_norms: bool = False
    # a tied head divides logits by sqrt(D) (dantinox's init); Llama's does not
    scale_tied_logits: bool = True
    # Multi-head latent attention (attention="latent").
    kv_latent_dim: int | None = None  # C, width of the cached KV latent
    rope_head_dim: int | None = None  # R, width of the decoupled RoPE key shared by all heads
    q_latent_dim: int | None = None  # optional low-rank query compression width
    mla_decode: str = "absorbed"  # "absorbed" folds up-projections into q/out; "materialized" forms K, V
    mla_rope_on_latent: bool = False  # teaching switch: rotate the compressed keys (breaks absorption)
    # RoPE key heads: 1 shares k_R [R] by all heads; K: a group each (a converted GQA)
    mla_rope_heads: int = 1
    mla_nope_dim: int | None = None  # width of each head's unrotated query and key; None: head_size
    # RMSNorm on the latent (DeepSeek-V2); a converted latent is a plain projection
    mla_latent_norm: bool = True
    # DeepSeek-V3.2's sparse attention (DSA) on a latent model: a lightning indexer with one cached key per
    # token picks the index_topk tokens each query reads (dantinox/cache/indexer.py); all three or none
    index_heads: int | None = None  # the indexer's query heads (index_n_heads)
    index_head_size: int | None = None  # I, its cached key's and query heads' width (index_head_dim)
    index_topk: int | None = None  # k, cached tokens each query attends to (index_topk); None: dense MLA
    # Local layers (dantinox/cache/ring.py), one entry per layer; None: every layer global. See local_layers.
    # W per layer: sees the current token and W - 1 before
    sliding_windows: tuple[int | None, ...] | None = None
    attention_chunks: tuple[int | None, ...] | None = None  # C per layer: sees only its own chunk (Llama 4)
    # Per-layer specs (kind, window, K, H, RoPE base), instead of sliding_windows / attention_chunks
    # (see layers).
    layer_specs: tuple[LayerSpec, ...] | None = None  # one per layer, None fields: the model-wide value
    # Generation paradigm.
    paradigm: str = "autoregressive"  # "autoregressive" (causal) | "diffusion" (bidirectional, masked)
    # The KV cache the model's caches get by default (init_cache, generate); its fields also read flat, below.
    cache: CacheConfig = CacheConfig()

    cache_dtype = _from_cache("cache_dtype")
    cache_layout = _from_cache("cache_layout")
    page_size = _from_cache("page_size")
    kivi_group = _from_cache("kivi_group")
    kivi_residual = _from_cache("kivi_residual")
    attention_sinks = _from_cache("attention_sinks")
    cache_budget = _from_cache("cache_budget")
    eviction = _from_cache("eviction")
    quantized_cache = _from_cache("quantized_cache")
    kivi_bits = _from_cache("kivi_bits")
    recent_budget = _from_cache("recent_budget")
    cache_jnp_dtype = _from_cache("cache_jnp_dtype")
    cache_itemsize = _from_cache("cache_itemsize")

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "head_size", "max_context", "mlp_width"):
            positive_int(name, getattr(self, name))
        if self.attention not in ATTENTION_KINDS:
            label = {"mha": "attention='heads'", "gqa": "attention='heads' with kv_heads=K",
                     "mqa": "attention='heads' with kv_heads=1",
                     "mla": "attention='latent'"}.get(self.attention)
            hint = f" ({self.attention} is {label})" if label else ""
            raise ValueError(f"attention: expected one of {', '.join(ATTENTION_KINDS)}, got "
                             f"{self.attention!r}{hint}")
        if self.paradigm not in PARADIGMS:
            raise ValueError(f"paradigm: expected one of {', '.join(PARADIGMS)}, got {self.paradigm!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.param_dtype is not None and self.param_dtype not in DTYPES:
            raise ValueError(f"param_dtype: expected one of {', '.join(DTYPES)} (or None: stored in dtype), "
                             f"got {self.param_dtype!r}")
        if self.head_size % 2:
            raise ValueError("head_size: RoPE rotates pairs of channels, so it must be even, got "
                             f"{self.head_size}")
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"mlp: expected one of {', '.join(MLP_KINDS)}, got {self.mlp!r}")
        if self.rope_base <= 1:
            raise ValueError(f"rope_base: must be greater than 1, got {self.rope_base}")
        if self.qk_norm and self.attention == "latent":
            raise ValueError("qk_norm: normalizes K/V-heads queries and keys; attention='latent' normalizes "
                             "its latent (kv_norm) instead")
        self._check_kv_heads()
        self._check_mla()
        self._check_layer_specs()
        self._check_local_layers()
        self._check_cache()

    def _check_cache(self) -> None:
        """The cache config against this architecture: what each storage and addressing can hold."""
        if self.attention_sinks and self.sliding_window is None:
            raise ValueError(f"attention_sinks: kept beside a sliding window's ring; set sliding_windows, "
                             f"got attention_sinks={self.attention_sinks} without one")
        # Diffusion's DualCache splits and joins linear slots; the other layouts are autoregressive caches.
        if self.paradigm != "autoregressive":
            for name, value, plain in (("cache_dtype", self.cache_dtype, self.cache_dtype in DTYPES),
                                       ("cache_layout", self.cache_layout, self.cache_layout == "contiguous"),
                                       ("sliding_windows", self.layer_windows, self.sliding_window is None),
                                       ("attention_chunks", self.layer_chunks,
                                        self.attention_chunk_size is None),
                                       ("attention_sinks", self.attention_sinks, self.attention_sinks == 0),
                                       ("layer_specs", self.layer_specs, not self.shared_layers
                                        and not self.state_layers)):
                if not plain:
                    raise ValueError(f"{name}: paradigm={self.paradigm!r} caches float keys in linear slots "
                                     f"(its DualCache splits and joins them), got {value!r}")
        self._check_kivi()
        self._check_eviction()

    def _check_eviction(self) -> None:
        if self.eviction is None:
            return
        for name, value, plain in (("attention", self.attention, self.attention == "heads"),
                                   ("cache_dtype", self.cache_dtype, self.cache_dtype in DTYPES),
                                   ("cache_layout", self.cache_layout, self.cache_layout == "contiguous"),
                                   ("sliding_windows", self.layer_windows, self.sliding_window is None),
                                   ("attention_chunks", self.layer_chunks, self.attention_chunk_size is None),
                                   ("layer_specs", self.layer_specs,
                                    self.uniform_heads and not self.shared_layers
                                    and not self.state_layers),
                                   ("paradigm", self.paradigm, self.paradigm == "autoregressive")):
            if not plain:
                raise ValueError(f"{name}: eviction={self.eviction!r} keeps float K/V heads in budget slots "
                                 "of a contiguous autoregressive cache (no latent, quantized, paged, window "
                                 f"or chunk layout), got {value!r}")

    def _check_kivi(self) -> None:
        g = self.kivi_group
        if self.kivi_bits is None:
            return
        for name, value, plain in (("attention", self.attention, self.attention == "heads"),
                                   ("cache_layout", self.cache_layout, self.cache_layout == "contiguous"),
                                   ("sliding_windows", self.layer_windows, self.sliding_window is None),
                                   ("attention_chunks", self.layer_chunks, self.attention_chunk_size is None),
                                   ("layer_specs", self.layer_specs,
                                    self.uniform_heads and not self.shared_layers
                                    and not self.state_layers)):
            if not plain:
                raise ValueError(f"{name}: cache_dtype={self.cache_dtype!r} is a contiguous K/V-heads layout "
                                 f"(no latent, paged, window or chunk; one K and H), got {value!r}")
        if self.head_size % g or (self.head_size * self.kivi_bits) % 8:
            raise ValueError(f"kivi_group: values are quantized in groups of kivi_group channels, so it must "
                             f"divide head_size ({self.head_size}), got {g}")

    def _check_kv_heads(self) -> None:
        n, k = self.n_heads, self.kv_heads
        if k is None:
            return
        positive_int("kv_heads", k)
        if self.attention == "latent":
            raise ValueError("kv_heads: attention='latent' caches a shared latent, not KV heads; leave "
                             f"kv_heads unset, got {k}")
        if n % k:
            raise ValueError(f"kv_heads: must divide n_heads ({n}), got {k}")
        if k == n:  # as many KV heads as query heads is MHA: stored one way, as None
            object.__setattr__(self, "kv_heads", None)

    def _check_mla(self) -> None:
        mla_fields = ("kv_latent_dim", "rope_head_dim")
        if self.attention != "latent":
            unset = dict.fromkeys((*mla_fields, "q_latent_dim", "mla_nope_dim", *INDEX_FIELDS))
            for name, default in {**unset, "mla_rope_heads": 1, "mla_latent_norm": True}.items():
                if getattr(self, name) != default:
                    raise ValueError(f"{name}: only used with attention='latent', got "
                                     f"attention={self.attention!r}")
            return
        for name in mla_fields:
            if getattr(self, name) is None:
                raise ValueError(f"{name}: attention='latent' needs a positive integer {name}")
            positive_int(name, getattr(self, name))
        if self.rope_head_dim % 2:
            raise ValueError(f"rope_head_dim: RoPE rotates pairs of channels, so it must be even, "
                             f"got {self.rope_head_dim}")
        if self.q_latent_dim is not None:
            positive_int("q_latent_dim", self.q_latent_dim)
        heads = positive_int("mla_rope_heads", self.mla_rope_heads)
        if self.n_heads % heads or self.rope_head_dim % (2 * heads):
            raise ValueError(f"mla_rope_heads: must divide n_heads ({self.n_heads}) and leave each RoPE key "
                             f"head an even share of rope_head_dim ({self.rope_head_dim}), got {heads}")
        if self.mla_nope_dim is not None:
            positive_int("mla_nope_dim", self.mla_nope_dim)
        index = [getattr(self, name) for name in INDEX_FIELDS]
        if index != [None] * 3:
            if None in index:
                given = dict(zip(INDEX_FIELDS, index, strict=True))
                raise ValueError(f"{INDEX_FIELDS[index.index(None)]}: the indexer (DeepSeek-V3.2's sparse "
                                 f"attention) needs all of {', '.join(INDEX_FIELDS)}, got {given}")
            for name in INDEX_FIELDS:
                positive_int(name, getattr(self, name))
            if self.index_head_size % 2 or self.index_head_size < self.rope_head_dim:
                raise ValueError(f"index_head_size: the indexer's keys rotate their first rope_head_dim "
                                 f"({self.rope_head_dim}) channels, so it must be even and at least that, "
                                 f"got {self.index_head_size}")
        if self.mla_decode not in MLA_DECODE_PATHS:
            raise ValueError(f"mla_decode: expected one of {', '.join(MLA_DECODE_PATHS)}, got "
                             f"{self.mla_decode!r}")

    def _check_local_layers(self) -> None:
        for name in ("sliding_windows", "attention_chunks"):
            sizes = getattr(self, name)
            if sizes is None:
                continue
            if isinstance(sizes, list):  # JSON and hand-written lists: stored as the tuple they mean
                object.__setattr__(self, name, sizes := tuple(sizes))
            if not isinstance(sizes, tuple) or len(sizes) != self.n_layers:
                raise ValueError(f"{name}: expected one entry per layer ({self.n_layers}), each a positive "
                                 "integer or None (see dantinox.architectures.windows.local_layers), got "
                                 f"{sizes!r}")
            for i, size in enumerate(sizes):
                if size is not None:
                    positive_int(f"{name}[{i}]", size)
            if all(size is None for size in sizes):  # no local layer: one way to say it
                object.__setattr__(self, name, None)
        windows, chunks = (sizes or (None,) * self.n_layers
                           for sizes in (self.sliding_windows, self.attention_chunks))
        both = [i for i, (w, c) in enumerate(zip(windows, chunks, strict=True)) if w and c]
        if both:
            raise ValueError("attention_chunks: a layer is either sliding-window or chunked; layer "
                             f"{both[0]} has window {windows[both[0]]} and chunk {chunks[both[0]]}")

    def _check_layer_specs(self) -> None:
        specs = self.layer_specs
        if specs is None:
            return
        # JSON gives a list of dicts: stored as the tuple of specs they mean
        if isinstance(specs, list | tuple):
            specs = tuple(LayerSpec(**s) if isinstance(s, dict) else s for s in specs)
        if (not isinstance(specs, tuple) or len(specs) != self.n_layers
                or not all(isinstance(s, LayerSpec) for s in specs)):
            raise ValueError(f"layer_specs: expected one dantinox.LayerSpec per layer ({self.n_layers}), got "
                             f"{specs!r}")
        for name in ("sliding_windows", "attention_chunks"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name}: layer_specs gives every layer's window; set one of them, not both")
        model_wide = dict(kv_heads=self.n_kv_heads, head_size=self.head_size, rope_base=self.rope_base)
        kept = []
        for i, spec in enumerate(specs):
            at = f"layer_specs[{i}]"
            if spec.kind not in LAYER_KINDS:
                raise ValueError(f"{at}.kind: expected one of {', '.join(LAYER_KINDS)}, got {spec.kind!r}")
            if (spec.window is None) == (spec.kind in ("sliding", "chunked")):
                raise ValueError(f"{at}.window: a sliding or chunked layer needs a positive window, a full "
                                 f"or shared layer none; got kind={spec.kind!r}, window={spec.window!r}")
            if spec.window is not None:
                positive_int(f"{at}.window", spec.window)
            if spec.kind == "shared":
                self._check_source(specs, i, spec)
            elif spec.source is not None:
                raise ValueError(f"{at}.source: only a 'shared' layer reads another layer's cache, got "
                                 f"{spec.source}")
            if spec.kind in RECURRENT_KINDS:
                self._check_state(at, spec)
            elif (spec.value_heads, spec.conv, spec.ssm_state, spec.ssm_groups, spec.channels,
                  spec.decay) != (None,) * 6:
                raise ValueError(f"{at}.value_heads: value_heads, conv, ssm_state, ssm_groups, channels and "
                                 f"decay describe a recurrent layer's state ({', '.join(RECURRENT_KINDS)}), "
                                 f"got kind={spec.kind!r}")
            if spec.kv_heads is not None:
                positive_int(f"{at}.kv_heads", spec.kv_heads)
                if self.n_heads % spec.kv_heads and spec.kind != "state":  # a state layer has its own heads
                    raise ValueError(f"{at}.kv_heads: must divide n_heads ({self.n_heads}), got "
                                     f"{spec.kv_heads}")
            if spec.head_size is not None and positive_int(f"{at}.head_size", spec.head_size) % 2:
                raise ValueError(f"{at}.head_size: RoPE rotates pairs of channels, so it must be even, "
                                 f"got {spec.head_size}")
            if spec.rope_base is not None and spec.rope_base <= 1:
                raise ValueError(f"{at}.rope_base: must be greater than 1, got {spec.rope_base}")
            if spec.rope_pairs is not None:
                self._check_rope_pairs(at, spec.rope_pairs)
            if not isinstance(spec.learned_sinks, bool):
                raise ValueError(f"{at}.learned_sinks: expected True or False, got {spec.learned_sinks!r}")
            if spec.learned_sinks and (self.attention == "latent" or spec.kind in (*RECURRENT_KINDS, "mlp")):
                kind = "attention='latent'" if self.attention == "latent" else f"kind={spec.kind!r}"
                raise ValueError(f"{at}.learned_sinks: a sink logit per query head joins a K/V-heads "
                                 f"attention's softmax (gpt-oss); got {kind}")
            # a value equal to the model-wide one is stored once, as None
            same = {k: None for k, v in model_wide.items() if getattr(spec, k) == v}
            spec = dataclasses.replace(spec, **same)
            if (self.attention == "latent" and spec.kind != "state"  # a state layer has its own heads
                    and (spec.kv_heads, spec.head_size) != (None, None)):
                raise ValueError(f"{at}.kv_heads: attention='latent' caches one latent per layer; per-layer "
                                 f"kv_heads and head_size are for K/V-heads layers, got {spec}")
            kept.append(spec)
        # no layer differs from the model-wide fields: one way to say it
        object.__setattr__(self, "layer_specs", None if all(s == LayerSpec() for s in kept) else tuple(kept))

    def _check_source(self, specs: tuple[LayerSpec, ...], i: int, spec: LayerSpec) -> None:
        """A shared layer (Gemma 3n's KV sharing) reads the keys and values of an earlier layer that stores
        them, so it has that layer's K and H; it stores nothing itself."""
        at, j = f"layer_specs[{i}]", spec.source
        if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < i:
            raise ValueError(f"{at}.source: a shared layer reads an earlier layer's cache, expected a layer "
                             f"index in 0..{i - 1}, got {j!r}")
        if specs[j].kind in ("shared", "mlp"):
            raise ValueError(f"{at}.source: layer {j} is itself shared and stores nothing; name the layer it "
                             f"reads ({specs[j].source})")
        if specs[j].kind in RECURRENT_KINDS:
            raise ValueError(f"{at}.source: layer {j} keeps a recurrent state, not keys and values to read")
        if self.attention == "latent":
            raise ValueError(f"{at}.kind: shared layers read K/V heads; "
                             "attention='latent' is not built with them")
        for name in ("kv_heads", "head_size"):
            theirs = getattr(specs[j], name) or getattr(self, "n_kv_heads" if name == "kv_heads" else name)
            if getattr(spec, name) not in (None, theirs):
                raise ValueError(f"{at}.{name}: a shared layer reads layer {j}'s keys, so it has its {name} "
                                 f"({theirs}); leave it out, got {getattr(spec, name)}")

    def _check_state(self, at: str, spec: LayerSpec) -> None:
        """A recurrent layer: Gated DeltaNet ('state': key heads (kv_heads) of head_size channels, value heads
        a multiple of them), LFM2's short convolution ('conv': its channels, default d_model) or Mamba-2
        ('mamba': value_heads SSM heads of head_size channels, ssm_state, ssm_groups dividing the heads); each
        with a short convolution; float storage, no latent."""
        if self.attention == "latent" and spec.kind != "state":  # Kimi Linear: delta-rule layers beside MLA
            raise ValueError(f"{at}.kind: {spec.kind!r} layers are built beside K/V-heads layers; "
                             f"attention='latent' is built beside 'state' layers only")
        if spec.decay is not None and (spec.kind != "state" or spec.decay not in STATE_DECAYS):
            raise ValueError(f"{at}.decay: a 'state' layer's gate is one of {', '.join(STATE_DECAYS)}, got "
                             f"decay={spec.decay!r} on kind={spec.kind!r}")
        if spec.conv is not None:
            positive_int(f"{at}.conv", spec.conv)
        if spec.kind != "mamba" and (spec.ssm_state, spec.ssm_groups) != (None, None):
            raise ValueError(f"{at}.ssm_state: ssm_state and ssm_groups size a 'mamba' layer, got "
                             f"kind={spec.kind!r}")
        if spec.kind != "conv" and spec.channels is not None:
            raise ValueError(f"{at}.channels: channels size a 'conv' layer's convolution, got "
                             f"kind={spec.kind!r}")
        if spec.kind == "conv":
            given = [n for n in ("kv_heads", "head_size", "value_heads") if getattr(spec, n) is not None]
            if given:
                raise ValueError(f"{at}.{given[0]}: a 'conv' layer convolves its channels with no heads; "
                                 f"leave it out")
            if spec.channels is not None:
                positive_int(f"{at}.channels", spec.channels)
            return
        if spec.kind == "mamba":
            if spec.kv_heads is not None:
                raise ValueError(f"{at}.kv_heads: a 'mamba' layer has SSM heads (value_heads), not key heads")
            heads = (self.n_heads if spec.value_heads is None
                     else positive_int(f"{at}.value_heads", spec.value_heads))
            for name in ("ssm_state", "ssm_groups"):
                if getattr(spec, name) is not None:
                    positive_int(f"{at}.{name}", getattr(spec, name))
            if heads % (spec.ssm_groups or 1):
                raise ValueError(f"{at}.ssm_groups: each group serves the same number of heads, so it must "
                                 f"divide value_heads ({heads}), got {spec.ssm_groups}")
            return
        k = spec.kv_heads or self.n_kv_heads
        if spec.value_heads is not None and positive_int(f"{at}.value_heads", spec.value_heads) % k:
            raise ValueError(f"{at}.value_heads: each key head serves the same number of value heads, so it "
                             f"must be a multiple of kv_heads ({k}), got {spec.value_heads}")

    @property
    def state_layers(self) -> tuple[int, ...]:
        """The recurrent layers (RECURRENT_KINDS), whose cache is a state of constant size."""
        return tuple(i for i, s in enumerate(self.layer_specs or ()) if s.kind in RECURRENT_KINDS)

    @property
    def shared_layers(self) -> tuple[int, ...]:
        """The layers that read another layer's cache and store none."""
        return tuple(i for i, s in enumerate(self.layer_specs or ()) if s.kind == "shared")

    def _check_rope_pairs(self, at: str, pairs: tuple[tuple[int, ...], ...]) -> None:
        """A layer's kept RoPE pairs: one tuple per RoPE key head,
        each as many distinct pairs as its channels hold."""
        if self.attention != "latent":
            raise ValueError(f"{at}.rope_pairs: partial RoPE is a latent layer's (attention='latent'), got "
                             f"attention={self.attention!r}")
        per_head = self.rope_head_dim // self.mla_rope_heads
        half = (self.qk_nope_dim + per_head) // 2
        fits = len(pairs) == self.mla_rope_heads and all(
            len(head) == per_head // 2 and len(set(head)) == len(head) and all(0 <= i < half for i in head)
            for head in pairs)
        if not fits:
            raise ValueError(f"{at}.rope_pairs: expected {self.mla_rope_heads} tuple(s) (mla_rope_heads) of "
                             f"{per_head // 2} distinct pair indices in 0..{half - 1}, got {pairs!r}")

    # Helpers that fill the per-layer tuples from one size.
    def with_sliding_window(self, window: int | None, local_per_global: int | None = None) -> ModelConfig:
        """A copy whose local layers attend within `window` (None: every layer global); see local_layers."""
        windows = None if window is None else local_layers(self.n_layers, window, local_per_global)
        return self.replace(sliding_windows=windows)

    def with_attention_chunks(self, chunk: int | None, local_per_global: int | None = None) -> ModelConfig:
        """A copy whose local layers attend within their own chunk of `chunk` positions; see local_layers."""
        chunks = None if chunk is None else local_layers(self.n_layers, chunk, local_per_global)
        return self.replace(attention_chunks=chunks)

    # Derived values.
    @property
    def layers(self) -> tuple[LayerSpec, ...]:
        """Every layer's spec, each field filled in (the model-wide value where layer_specs leaves it None);
        without layer_specs, a full, sliding or chunked layer per sliding_windows and attention_chunks."""
        specs = self.layer_specs
        if specs is None:
            windows, chunks = (sizes or (None,) * self.n_layers for sizes in (self.sliding_windows,
                                                                              self.attention_chunks))
            specs = tuple(LayerSpec("sliding", w) if w else LayerSpec("chunked", c) if c else LayerSpec()
                          for w, c in zip(windows, chunks, strict=True))
        fill = dict(kv_heads=self.n_kv_heads, head_size=self.head_size, rope_base=self.rope_base)
        filled = [dataclasses.replace(s, **{k: v for k, v in fill.items() if getattr(s, k) is None})
                  for s in specs]
        for i, s in enumerate(specs):  # a shared layer has the K and H of the layer whose keys it reads
            if s.kind == "shared":
                source = filled[s.source]
                filled[i] = dataclasses.replace(filled[i], kv_heads=source.kv_heads,
                                                head_size=source.head_size)
            elif s.kind == "state":
                filled[i] = dataclasses.replace(filled[i], value_heads=s.value_heads or filled[i].kv_heads,
                                                conv=s.conv or 4, decay=s.decay or "head")
            elif s.kind == "conv":  # no heads: every d_model channel has its own kernel
                filled[i] = dataclasses.replace(filled[i], kv_heads=None, head_size=None, conv=s.conv or 4,
                                                channels=s.channels or self.d_model)
            elif s.kind == "mamba":  # defaults: transformers' Mamba2Config (ssm_state_size 128, n_groups 1)
                filled[i] = dataclasses.replace(filled[i], kv_heads=None,
                                                value_heads=s.value_heads or self.n_heads, conv=s.conv or 4,
                                                ssm_state=s.ssm_state or 128, ssm_groups=s.ssm_groups or 1)
        return tuple(filled)

    @property
    def uniform_heads(self) -> bool:
        """Whether every layer has the model-wide K and H (what the one-geometry cache formulas assume)."""
        return all(s.kv_heads is None and s.head_size is None for s in self.layer_specs or ())

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Per layer, its sliding window W (a local layer) or None (a global layer, full causal attention)."""
        return tuple(s.window if s.kind == "sliding" else None for s in self.layers)

    @property
    def layer_chunks(self) -> tuple[int | None, ...]:
        """Per layer, its chunk size C (a chunked layer, Llama 4) or None."""
        return tuple(s.window if s.kind == "chunked" else None for s in self.layers)

    @property
    def sliding_window(self) -> int | None:
        """The largest sliding window of any layer, None when no layer has one
        (the ring of the widest layer)."""
        return max((w for w in self.layer_windows if w), default=None)

    @property
    def attention_chunk_size(self) -> int | None:
        """The largest attention chunk of any layer, None when no layer is chunked."""
        return max((c for c in self.layer_chunks if c), default=None)

    @property
    def local_per_global(self) -> int | None:
        """n when the local layers follow local_layers' n-local-then-one-global placement with one size;
        0 when every layer is local; None when no layer is local or the placement is another."""
        if self.sliding_window is not None and self.attention_chunk_size is not None:
            return None  # sliding and chunked layers in one model: no single placement
        sizes = self.layer_windows if self.sliding_window is not None else self.layer_chunks
        if self.sliding_window is None and self.attention_chunk_size is None:
            return None
        size = max(s for s in sizes if s)
        if sizes == (size,) * self.n_layers:
            return 0
        n = next((n for n in range(1, self.n_layers) if local_layers(self.n_layers, size, n) == sizes), None)
        return n

    @property
    def variant(self) -> str:
        """The label of the arrangement: 'mha' (K = N), 'mqa' (K = 1), 'gqa' (1 < K < N) or 'mla'
        (a latent)."""
        if self.attention == "latent":
            return "mla"
        k = self.n_kv_heads
        return "mha" if k == self.n_heads else "mqa" if k == 1 else "gqa"

    @property
    def n_kv_heads(self) -> int:
        """K: KV heads the cache stores per layer (kv_heads, or N when unset,
        as for MLA's materialized heads)."""
        return self.n_heads if self.kv_heads is None else self.kv_heads

    @property
    def groups(self) -> int:
        """G: query heads that share one KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def jnp_dtype(self) -> Any:
        """Compute dtype of activations and matmuls."""
        return DTYPES[self.dtype]

    @property
    def weights_dtype(self) -> str:
        """The dtype the weights are stored in: param_dtype, or dtype when that is None."""
        return self.dtype if self.param_dtype is None else self.param_dtype

    @property
    def param_jnp_dtype(self) -> Any:
        return DTYPES[self.weights_dtype]

    @property
    def qk_nope_dim(self) -> int:
        """Width of each head's unrotated query and key part in a latent layer: mla_nope_dim,
        else head_size."""
        return self.head_size if self.mla_nope_dim is None else self.mla_nope_dim

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        """Cached elements one token adds to one layer: 2·K·H, or C + R for MLA."""
        if self.attention == "latent":  # and the indexer's key, where there is one
            return self.kv_latent_dim + self.rope_head_dim + (self.index_head_size or 0)
        return 2 * self.n_kv_heads * self.head_size

    @property
    def causal(self) -> bool:
        return self.paradigm == "autoregressive"

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (every other field, kv_heads included, as it was); the cache's
        fields may be given flat (cache_dtype="int8")."""
        return dataclasses.replace(self, **changes)

    def with_cache(self, cache: CacheConfig | None = None, **changes: Any) -> ModelConfig:
        """This architecture with another cache config (or this one's with `changes`), checked against it:
        the weights are the same, so one model decodes with either."""
        cache = self.cache if cache is None else cache
        cache = cache.replace(**changes) if changes else cache
        return self if cache == self.cache else self.replace(cache=cache)

    def to_dict(self) -> dict[str, Any]:
        """The fields as given, the cache's nested under "cache", numpy scalars as Python numbers (JSON)."""
        def plain(v: Any) -> Any:
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            return v.item() if hasattr(v, "item") else v
        return {k: plain(v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """A config from to_dict's dict, or from one written by an earlier dantinox
        (dantinox/architectures/config_upgrade.py)."""
        data = upgrade(data, cls, ATTENTION_VARIANTS, CACHE_FIELDS, heads_fields)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"config: unknown field(s) {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A named preset from PRESETS, with optional field overrides."""
        if name not in PRESETS:
            raise ValueError(f"preset: expected one of {', '.join(PRESETS)}, got {name!r}")
        return cls(**{**PRESETS[name], **overrides})


PRESETS: dict[str, dict[str, Any]] = {
    # The reference model of the docs and benchmarks.
    "reference": dict(d_model=256, n_layers=12, n_heads=8, head_size=32, max_context=1024, mlp_width=768),
    # Small enough to train in a couple of minutes on two CPU cores; the shipped run uses it.
    "tiny": dict(d_model=128, n_layers=4, n_heads=4, head_size=32, max_context=256, mlp_width=384),
    # For unit tests: compiles and runs in well under a second.
    "test": dict(d_model=32, n_layers=2, n_heads=4, head_size=8, max_context=64, mlp_width=64),
    # SmolLM2-135M's geometry (its K = 3 is the lab's GQA choice); tests/test_pretrained.py checks it against
    # the file that dantinox.load_pretrained("smollm2-135m") reads.
    "smollm2-135m": dict(vocab_size=49_152, d_model=576, n_layers=30, n_heads=9, head_size=64,
                         max_context=8192, mlp_width=1536, rope_base=100_000.0, norm_eps=1e-5,
                         scale_tied_logits=False),
}
