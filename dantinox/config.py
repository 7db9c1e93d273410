"""Model configuration: one frozen dataclass, named presets, and the validation rules.

Dimension alphabet used across dantinox (names and einsum strings):
B batch, T query length, S key length, D model width, F MLP width, N query heads, K KV heads,
G = N/K query heads per KV head, H head size, L layers, V vocab, C latent width (MLA), R RoPE key width (MLA).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from dantinox.checks import positive_int

ATTENTION_VARIANTS = ("mha", "gqa", "mqa", "mla")
PARADIGMS = ("autoregressive", "diffusion")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# Quantized cache storage (dantinox/quant.py): code dtype; a float32 scale per token and head sits beside the codes.
QUANT_CACHE_DTYPES = {"int8": jnp.int8, "fp8_e4m3": jnp.float8_e4m3fn}
# KIVI-style low-bit storage (dantinox/kivi.py): bits per code; codes packed into uint8, float16 scales and zeros.
KIVI_CACHE_DTYPES = {"kivi4": 4, "kivi2": 2}
MLA_DECODE_PATHS = ("absorbed", "materialized")
CACHE_LAYOUTS = ("contiguous", "paged")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Everything that fixes the shapes of a dantinox model and its KV cache."""

    vocab_size: int = 259  # 256 bytes + <bos>, <eos>, <mask>
    d_model: int = 256  # D, residual stream width
    n_layers: int = 12  # L
    n_heads: int = 8  # N, query heads
    head_size: int = 32  # H
    attention: str = "mha"  # "mha" | "gqa" | "mqa" | "mla"
    kv_heads: int | None = None  # K as given: required for gqa, optional for mha (= N) and mqa (= 1); see n_kv_heads
    max_context: int = 1024  # longest sequence the static cache holds
    dtype: str = "float32"  # parameters and activations
    cache_dtype: str = "float32"  # storage of cached keys/values (compute stays in `dtype`)
    kivi_group: int = 32  # G: tokens per key group (per-channel scales) and channels per value group (kivi4/kivi2)
    kivi_residual: int = 128  # R: most recent tokens also kept in full precision (kivi4/kivi2); at least G
    mlp_width: int = 768  # F, SwiGLU hidden width
    rope_base: float = 10_000.0  # RoPE wavelength base
    norm_eps: float = 1e-6  # RMSNorm epsilon
    tie_embeddings: bool = True  # output head reuses the token embedding matrix
    scale_tied_logits: bool = True  # a tied head divides logits by sqrt(D) (dantinox's init); Llama's does not
    # Multi-head latent attention (attention="mla").
    kv_latent_dim: int | None = None  # C, width of the cached KV latent
    rope_head_dim: int | None = None  # R, width of the decoupled RoPE key shared by all heads
    q_latent_dim: int | None = None  # optional low-rank query compression width
    mla_decode: str = "absorbed"  # "absorbed" folds up-projections into q/out; "materialized" forms K, V
    mla_rope_on_latent: bool = False  # teaching switch: rotate the compressed keys (breaks absorption)
    # Sliding-window attention (dantinox/ring.py); see layer_windows for where the global layers go.
    sliding_window: int | None = None  # W: a local layer attends to the current token and the W - 1 before it
    window_pattern: str = "local"  # "local" (every layer) or "n:1" (n local layers per global one)
    attention_sinks: int = 0  # S: first tokens a sliding-window layer keeps forever (StreamingLLM); needs a window
    attention_chunk_size: int | None = None  # C: chunked layers see only their chunk (Llama 4); placed as windows are
    # Cache addressing of the global layers (dantinox/cache.py): "contiguous" rows, or "paged" through a block table.
    cache_layout: str = "contiguous"
    block_size: int = 16  # token slots per page of a paged cache
    # Generation paradigm.
    paradigm: str = "autoregressive"  # "autoregressive" (causal) | "diffusion" (bidirectional, masked)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "head_size", "max_context", "mlp_width"):
            positive_int(name, getattr(self, name))
        if self.attention not in ATTENTION_VARIANTS:
            raise ValueError(f"attention: expected one of {', '.join(ATTENTION_VARIANTS)}, got {self.attention!r}")
        if self.paradigm not in PARADIGMS:
            raise ValueError(f"paradigm: expected one of {', '.join(PARADIGMS)}, got {self.paradigm!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        known = [*DTYPES, *QUANT_CACHE_DTYPES, *KIVI_CACHE_DTYPES]
        if self.cache_dtype not in known:
            raise ValueError(f"cache_dtype: expected one of {', '.join(known)}, got {self.cache_dtype!r}")
        if self.head_size % 2:
            raise ValueError(f"head_size: RoPE rotates pairs of channels, so it must be even, got {self.head_size}")
        if self.rope_base <= 1:
            raise ValueError(f"rope_base: must be greater than 1, got {self.rope_base}")
        self._check_kv_heads()
        self._check_mla()
        self._check_window()
        self._check_kivi()

    def _check_kivi(self) -> None:
        g, r = positive_int("kivi_group", self.kivi_group), positive_int("kivi_residual", self.kivi_residual)
        if self.kivi_bits is None:
            return
        for name, value, plain in (("attention", self.attention, self.attention != "mla"),
                                   ("cache_layout", self.cache_layout, self.cache_layout == "contiguous"),
                                   ("sliding_window", self.sliding_window, self.sliding_window is None),
                                   ("attention_chunk_size", self.attention_chunk_size,
                                    self.attention_chunk_size is None)):
            if not plain:
                raise ValueError(f"{name}: cache_dtype={self.cache_dtype!r} is a contiguous K/V-heads layout "
                                 f"(no mla, paged, window or chunk), got {value!r}")
        if self.head_size % g or (self.head_size * self.kivi_bits) % 8:
            raise ValueError(f"kivi_group: values are quantized in groups of kivi_group channels, so it must "
                             f"divide head_size ({self.head_size}), got {g}")
        if r < g:
            raise ValueError(f"kivi_residual: a key group is quantized once complete, so the full-precision "
                             f"window must hold at least kivi_group ({g}) tokens, got {r}")

    def _check_kv_heads(self) -> None:
        n, k = self.n_heads, self.kv_heads
        if k is not None:
            positive_int("kv_heads", k)
        if self.attention == "mha":
            if k is not None and k != n:
                raise ValueError(f"kv_heads: attention='mha' uses one KV head per query head, so kv_heads must "
                                 f"equal n_heads ({n}), got {k}")
        elif self.attention == "mqa":
            if k is not None and k != 1:
                raise ValueError(f"kv_heads: attention='mqa' shares one KV head across all query heads, "
                                 f"so kv_heads must be 1, got {k}")
        elif self.attention == "gqa":
            if k is None:
                raise ValueError(f"kv_heads: attention='gqa' needs kv_heads, a divisor of n_heads ({n})")
            if n % k:
                raise ValueError(f"kv_heads: attention='gqa' needs kv_heads to divide n_heads ({n}), got {k}")
        elif self.attention == "mla" and k is not None and k != n:
            raise ValueError(f"kv_heads: attention='mla' caches a shared latent, not KV heads; leave kv_heads "
                             f"unset, got {k}")

    def _check_mla(self) -> None:
        mla_fields = ("kv_latent_dim", "rope_head_dim")
        if self.attention != "mla":
            for name in (*mla_fields, "q_latent_dim"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: only used with attention='mla', got attention={self.attention!r}")
            return
        for name in mla_fields:
            if getattr(self, name) is None:
                raise ValueError(f"{name}: attention='mla' needs a positive integer {name}")
            positive_int(name, getattr(self, name))
        if self.rope_head_dim % 2:
            raise ValueError(f"rope_head_dim: RoPE rotates pairs of channels, so it must be even, "
                             f"got {self.rope_head_dim}")
        if self.q_latent_dim is not None:
            positive_int("q_latent_dim", self.q_latent_dim)
        if self.mla_decode not in MLA_DECODE_PATHS:
            raise ValueError(f"mla_decode: expected one of {', '.join(MLA_DECODE_PATHS)}, got {self.mla_decode!r}")

    def _check_window(self) -> None:
        if self.cache_layout not in CACHE_LAYOUTS:
            raise ValueError(f"cache_layout: expected one of {', '.join(CACHE_LAYOUTS)}, got {self.cache_layout!r}")
        positive_int("block_size", self.block_size)
        # Diffusion's DualCache splits and joins linear slots; the other layouts are autoregressive caches.
        if self.paradigm != "autoregressive":
            for name, value, plain in (("cache_dtype", self.cache_dtype, self.cache_dtype in DTYPES),
                                       ("cache_layout", self.cache_layout, self.cache_layout == "contiguous"),
                                       ("sliding_window", self.sliding_window, self.sliding_window is None),
                                       ("attention_sinks", self.attention_sinks, self.attention_sinks == 0),
                                       ("attention_chunk_size", self.attention_chunk_size,
                                        self.attention_chunk_size is None)):
                if not plain:
                    raise ValueError(f"{name}: paradigm={self.paradigm!r} caches float keys in linear slots "
                                     f"(its DualCache splits and joins them), got {value!r}")
        if self.sliding_window is not None and self.attention_chunk_size is not None:
            raise ValueError("attention_chunk_size: a layer is either sliding-window or chunked; set one of "
                             f"sliding_window ({self.sliding_window}) and attention_chunk_size "
                             f"({self.attention_chunk_size})")
        if self.attention_chunk_size is not None:
            positive_int("attention_chunk_size", self.attention_chunk_size)
        positive_int("attention_sinks", self.attention_sinks, minimum=0)
        if self.attention_sinks and self.sliding_window is None:
            raise ValueError(f"attention_sinks: kept beside a sliding window's ring; set sliding_window, "
                             f"got attention_sinks={self.attention_sinks} without one")
        if self.sliding_window is None and self.attention_chunk_size is None:
            if self.window_pattern != "local":
                raise ValueError(f"window_pattern: only used with a sliding_window, got {self.window_pattern!r}")
            return
        if self.sliding_window is not None:
            positive_int("sliding_window", self.sliding_window)
        head, _, tail = self.window_pattern.partition(":")
        if self.window_pattern != "local" and not (head.isdigit() and int(head) >= 1 and tail == "1"):
            raise ValueError(f"window_pattern: expected 'local' or 'n:1' with n >= 1 (e.g. '1:1', '5:1'), "
                             f"got {self.window_pattern!r}")

    # Derived values.
    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Per layer, its window W (a local layer) or None (a global layer, full causal attention).

        "n:1" makes every (n + 1)-th layer global, counting from 1: layer i is global when (i + 1) % (n + 1) == 0.
        That is how Gemma 2 alternates ("1:1": layers 0, 2, ... local; 1, 3, ... global) and Gemma 3 places one
        global layer after five local ones ("5:1"), as in Hugging Face transformers' Gemma 2 and Gemma 3 configs
        (https://github.com/huggingface/transformers/blob/main/src/transformers/models/gemma3/configuration_gemma3.py).
        """
        return self._local_layers(self.sliding_window)

    @property
    def layer_chunks(self) -> tuple[int | None, ...]:
        """Per layer, its chunk size C (a chunked layer, Llama 4) or None; placed by window_pattern like windows."""
        return self._local_layers(self.attention_chunk_size)

    def _local_layers(self, size: int | None) -> tuple[int | None, ...]:
        if size is None:
            return (None,) * self.n_layers
        if self.window_pattern == "local":
            return (size,) * self.n_layers
        period = int(self.window_pattern.split(":")[0]) + 1
        return tuple(None if (i + 1) % period == 0 else size for i in range(self.n_layers))

    @property
    def quantized_cache(self) -> bool:
        """Whether the cache stores low-bit codes with scales (cache_dtype in QUANT_CACHE_DTYPES)."""
        return self.cache_dtype in QUANT_CACHE_DTYPES

    @property
    def kivi_bits(self) -> int | None:
        """Bits per code of a KIVI cache (cache_dtype "kivi4" / "kivi2"), else None."""
        return KIVI_CACHE_DTYPES.get(self.cache_dtype)

    @property
    def n_kv_heads(self) -> int:
        """K: KV heads the cache stores per layer (N for mha, and for mla's materialized heads; 1 for mqa)."""
        if self.attention == "gqa":
            return self.kv_heads
        return 1 if self.attention == "mqa" else self.n_heads

    @property
    def groups(self) -> int:
        """G: query heads that share one KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def jnp_dtype(self) -> Any:
        return DTYPES[self.dtype]

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

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        """Cached elements one token adds to one layer: 2·K·H, or C + R for MLA."""
        if self.attention == "mla":
            return self.kv_latent_dim + self.rope_head_dim
        return 2 * self.n_kv_heads * self.head_size

    @property
    def causal(self) -> bool:
        return self.paradigm == "autoregressive"

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed; switching to a variant other than gqa drops a kv_heads not given."""
        if "attention" in changes and "kv_heads" not in changes and changes["attention"] != "gqa":
            changes["kv_heads"] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as given, numpy scalars as Python numbers (so the dict is JSON)."""
        return {k: v.item() if hasattr(v, "item") else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"config: unknown field(s) {', '.join(unknown)}")
        if "mlp_width" in data and data["mlp_width"] is None:  # written when the width defaulted to 3 * d_model
            data = {**data, "mlp_width": 3 * data.get("d_model", cls.d_model)}
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
    # SmolLM2-135M's geometry (its K = 3 is the lab's GQA choice); tests/test_pretrained.py checks it against the
    # file that dantinox.load_pretrained("smollm2-135m") reads.
    "smollm2-135m": dict(vocab_size=49_152, d_model=576, n_layers=30, n_heads=9, head_size=64, max_context=8192,
                         mlp_width=1536, rope_base=100_000.0, norm_eps=1e-5, scale_tied_logits=False),
}
