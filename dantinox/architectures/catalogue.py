"""Published architectures as per-layer cache geometry: a strict reader of config.json,
GGUF metadata and the catalogue.

    arch = dantinox.architectures.catalogue.load_architecture("gemma-3-27b")  # or a config.json / .gguf path
    arch.layers[5]  # LayerGeometry(index=5, kind='full', kv_heads=16, head_size=128, ...)

A layer is one of nine kinds, each decided by named config fields:
  full      every token of the context (slots = T)
  sliding   a ring of the last W tokens (slots = min(T, W))            sliding_window, layer_types
  chunked   the current chunk of C tokens only (slots = min(T, C))      attention_chunk_size (Llama 4)
  latent    MLA: one latent of C + R elements per token, no K/V pair    kv_lora_rank, qk_rope_head_dim
            (+ the lightning indexer's key of I elements per token      index_head_dim (DeepSeek-V3.2))
  shared    reads another layer's cache, stores nothing                num_kv_shared_layers (Gemma 3n, 4)
  linear    a recurrent state whose size does not grow with T           linear_* (Gated DeltaNet: Qwen3-Next,
                                                                        Qwen3.5); linear_attn_config (Kimi)
  mamba     a Mamba-2 state, constant in T                              hybrid_override_pattern 'M'
                                                                        (Nemotron-H), layer_types (Granite)
  conv      a short convolution's last inputs, constant in T            conv_L_cache, full_attn_idxs (LFM2)
  mlp       an MLP or MoE block with no token mixer: no cache           hybrid_override_pattern '-', 'E'
Fields a config leaves out take the default of the model's Hugging Face transformers configuration class
(named where it is applied). A field that changes the cache in a way this reader does not model is refused in
one line, never guessed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from dantinox.architectures.gguf_header import gguf_config

KINDS = ("full", "sliding", "chunked", "latent", "shared", "linear", "mamba", "conv", "mlp")
CATALOGUE_FILE = "real_models.json"  # package data: dantinox/data/real_models.json

# Fields that change a model's cache. A config that sets one its model_type does not read is refused.
CACHE_FIELDS = frozenset({
    "sliding_window", "use_sliding_window", "max_window_layers", "sliding_window_pattern", "layer_types",
    "attention_chunk_size", "no_rope_layers", "no_rope_layer_interval", "num_kv_shared_layers",
    "kv_sharing_modes", "kv_lora_rank", "qk_rope_head_dim", "full_attention_interval", "linear_num_key_heads",
    "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
    "global_head_dim", "num_global_key_value_heads", "attention_k_eq_v", "hybrid_override_pattern",
    "layers_block_type", "attn_layer_indices", "attn_layer_period", "attn_layer_offset",
    "cross_attention_layers", "sliding_window_size", "interleaved_sliding_window", "swa_layers",
    "num_nextn_predict_layers_kv", "index_head_dim", "linear_attn_config", "full_attn_idxs", "conv_L_cache",
    "compress_ratios", "use_bidirectional_attention",
})


@dataclasses.dataclass(frozen=True)
class LayerGeometry:
    """What one layer caches per sequence; None where the kind has no such field."""

    index: int
    kind: str  # one of KINDS
    kv_heads: int | None = None  # K of a K/V layer
    head_size: int | None = None  # H of a K/V layer (keys and values alike)
    window: int | None = None  # W (sliding) or C (chunked)
    latent: int | None = None  # C, MLA's latent width
    rope: int | None = None  # R, MLA's decoupled RoPE key width
    shares: int | None = None  # the layer whose cache a shared layer reads
    state_elements: int | None = None  # a linear or mamba layer's constant state, elements per sequence
    # a linear layer's V value heads (its K key heads are kv_heads, of head_size)
    value_heads: int | None = None
    value_size: int | None = None  # a linear layer's value head size
    conv: int | None = None  # a linear or conv layer's convolution width (inputs it keeps)
    channels: int | None = None  # a conv or mamba layer's convolution channels
    state_size: int | None = None  # N, a mamba layer's state size (value_heads heads of value_size channels)
    indexer: int | None = None  # I, a latent layer's lightning-indexer key width (DeepSeek-V3.2), one head
    index_topk: int | None = None  # k, the latents each query of an indexed layer reads (index_topk)
    state_formula: str | None = None  # how state_elements follows from the config
    learned_sinks: bool = False  # a sink logit per query head in the softmax (gpt-oss): a weight, 0 bytes
    # a linear layer's gate: "head" (Gated DeltaNet: one decay per value head) or "channel" (Kimi Delta
    # Attention: one per key channel); it changes the update, not the state's size
    decay: str | None = None
    # a linear layer's recurrent-state dtype a config asks engines for (Qwen3.5's mamba_ssm_dtype); None: the
    # cache dtype. transformers keeps the state in float32 either way; vLLM follows it
    state_dtype: str | None = None

    @property
    def ssm_groups(self) -> int | None:
        """A mamba layer's groups of heads sharing one B and C: its convolution's channels are x (heads · P),
        then B and C (N each per group)."""
        if self.kind != "mamba":
            return None
        return (self.channels - self.value_heads * self.value_size) // (2 * self.state_size)


@dataclasses.dataclass(frozen=True)
class Architecture:
    """A model's cache geometry, layer by layer, and where it was read from."""

    name: str
    model_type: str
    layers: tuple[LayerGeometry, ...]
    d_model: int  # D, hidden_size
    n_heads: int  # N, num_attention_heads
    config_kv_heads: int  # num_key_value_heads as the config gives it (what a naive calculator reads)
    max_context: int  # max_position_embeddings
    source: str  # catalogue URL or file path
    parameters: int | None = None  # weight count, when known (catalogue), for the device fit
    weight_bytes: int | None = None  # bytes of the weights, when the file says (GGUF)
    weights_format: str | None = None  # the published checkpoint's storage (accounting.memory.WEIGHT_FORMATS)
    weights_format_source: str | None = None  # where that format is stated
    notes: tuple[str, ...] = ()  # facts about the cache the rows do not show (learned sinks)
    mtp_layers: int = 0  # multi-token-prediction layers (num_nextn_predict_layers): cached only when drafting

    def count(self, kind: str) -> int:
        return sum(layer.kind == kind for layer in self.layers)

    def with_mtp_layers(self) -> Architecture:
        """The architecture as an engine that drafts with the model's own MTP module caches it: each of its
        `mtp_layers` is one more decoder layer of the last layer's geometry, after the others.

        Plain decoding caches none of them: transformers' DeepseekV3Model runs num_hidden_layers layers (its
        MTP-assisted generation keeps a separate MtpCache), llama.cpp's converter drops them from
        DeepSeek-V2/V3 GGUF files (convert_hf_to_gguf.py, DeepseekV2Model.skip_mtp), and vLLM builds them only
        for speculative decoding with method "deepseek_mtp" (vllm/model_executor/models/deepseek_mtp.py: one
        DeepseekV2DecoderLayer per MTP layer, layer index num_hidden_layers + i, whose attention gets its own
        KV cache).
        """
        last = self.layers[-1]
        extra = tuple(dataclasses.replace(last, index=len(self.layers) + i) for i in range(self.mtp_layers))
        return dataclasses.replace(self, layers=self.layers + extra, mtp_layers=0)


class _Reader:
    """One config dict, read field by field with one-line errors; remembers which fields were read."""

    def __init__(self, data: Any, where: str):
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
        self.data, self.where, self.read = data, where, set()

    def _fail(self, key: str, what: str, got: Any) -> ValueError:
        return ValueError(f"{self.where}: {key}: expected {what}, got {got!r}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def int(self, key: str, default: Any = ..., minimum: int = 1) -> Any:
        self.read.add(key)
        value = self.data.get(key)
        if value is None:
            if default is ...:
                raise ValueError(f"{self.where}: {key}: required, missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._fail(key, "a positive integer" if minimum == 1 else f"an integer >= {minimum}", value)
        return value

    def bool(self, key: str, default: bool) -> bool:
        self.read.add(key)
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self._fail(key, "true or false", value)
        return value

    def str_list(self, key: str, length: int, allowed: tuple[str, ...]) -> list[str] | None:
        self.read.add(key)
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) != length:
            raise self._fail(key, f"a list of {length} layer types", value if not isinstance(value, list)
                             else f"a list of {len(value)}")
        for i, item in enumerate(value):
            if item not in allowed:
                raise ValueError(f"{self.where}: {key}[{i}]: expected one of {', '.join(allowed)}, got "
                                 f"{item!r}")
        return value

    def int_list(self, key: str, length: int) -> list[int] | None:
        self.read.add(key)
        value = self.data.get(key)
        if value is None or value == []:
            return None
        if not isinstance(value, list) or len(value) != length or any(v not in (0, 1) for v in value):
            raise self._fail(key, f"a list of {length} zeros and ones", value)
        return value

    def refuse_unread(self) -> None:
        """A cache field that is set but was not read would change the answer: refuse it by name."""
        for key in sorted(CACHE_FIELDS - self.read):
            if self.data.get(key) not in (None, [], False):
                raise ValueError(f"{self.where}: {key}: this field changes the cache of a model_type "
                                 f"{self.data.get('model_type')!r} in a way the ledger does not model; "
                                 "it is not guessed")


def _heads(r: _Reader, head_key: str = "head_dim") -> tuple[int, int, int, int]:
    """D, N, K, H of a K/V attention config (head_dim defaults to hidden_size / num_attention_heads)."""
    d, n = r.int("hidden_size"), r.int("num_attention_heads")
    k = r.int("num_key_value_heads", n)
    if r.has(head_key):
        h = r.int(head_key)
    elif d % n:
        raise ValueError(f"{r.where}: head_dim: missing, and hidden_size {d} is not a multiple of "
                         f"num_attention_heads {n}")
    else:
        r.read.add("head_dim")
        h = d // n
    if n % k:
        raise ValueError(f"{r.where}: num_key_value_heads: expected a divisor of num_attention_heads ({n}), "
                         f"got {k}")
    return d, n, k, h


TYPE_NAMES = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked",
              "linear_attention": "linear", "conv": "conv"}


HYBRID_BLOCKS = {"M": "mamba", "*": "full", "-": "mlp", "E": "mlp"}  # Nemotron-H's hybrid_override_pattern


def _layer_kinds(r: _Reader, L: int, model_type: str) -> list[str]:
    """Per layer: one of KINDS but latent and shared, from layer_types or from the model type's own rule."""
    if model_type == "granitemoehybrid":  # GraniteMoeHybridConfig: a Mamba-2 or an attention mixer per layer
        names = {"mamba": "mamba", "attention": "full", "linear_attention": "mamba", "full_attention": "full"}
        return [names[t] for t in r.str_list("layer_types", L, tuple(names)) or ["linear_attention"] * L]
    other = {"llama4_text": "chunked_attention", "qwen3_next": "linear_attention",
             "qwen3_5_text": "linear_attention", "lfm2": "conv"}.get(model_type, "sliding_attention")
    given = r.str_list("layer_types", L, ("full_attention", other))
    if given is not None:
        r.read.add("full_attn_idxs")  # Lfm2Config reads it only without layer_types
        return [TYPE_NAMES[t] for t in given]
    if model_type == "gemma2":  # Gemma2Config: even layers local, odd layers global
        return ["sliding" if i % 2 == 0 else "full" for i in range(L)]
    if model_type == "gemma4_text":  # Gemma4TextConfig: one global layer in 6, and the last one global
        return ["full" if (i + 1) % 6 == 0 or i == L - 1 else "sliding" for i in range(L)]
    if model_type == "gemma3_text":  # Gemma3TextConfig: one global layer after every (pattern - 1) local ones
        period = r.int("sliding_window_pattern", 6)
        return ["full" if (i + 1) % period == 0 else "sliding" for i in range(L)]
    # Llama4TextConfig: RoPE layers are chunked, every 4th (NoPE) layer is global
    if model_type == "llama4_text":
        rope = r.int_list("no_rope_layers", L)
        if rope is None:
            interval = r.int("no_rope_layer_interval", 4)
            rope = [int((i + 1) % interval != 0) for i in range(L)]
        return ["chunked" if uses_rope else "full" for uses_rope in rope]
    if model_type == "nemotron_h":  # one character per layer: M Mamba-2, * attention, - MLP, E MoE
        pattern = r.data.get("hybrid_override_pattern")
        r.read.add("hybrid_override_pattern")
        if not isinstance(pattern, str) or len(pattern) != L or set(pattern) - set(HYBRID_BLOCKS):
            raise r._fail("hybrid_override_pattern", f"{L} characters from {''.join(HYBRID_BLOCKS)}", pattern)
        return [HYBRID_BLOCKS[c] for c in pattern]
    if model_type == "lfm2":  # Lfm2Config: attention at full_attn_idxs, a short convolution elsewhere
        idxs = r.data.get("full_attn_idxs")
        r.read.add("full_attn_idxs")
        if not isinstance(idxs, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < L
                                             for i in idxs):
            raise r._fail("full_attn_idxs", f"a list of layer indices below {L}", idxs)
        return ["full" if i in idxs else "conv" for i in range(L)]
    if model_type == "smollm3":  # SmolLM3Config: sliding only when enabled, on its NoPE layers
        rope = r.int_list("no_rope_layers", L)
        if rope is None:
            interval = r.int("no_rope_layer_interval", 4)
            rope = [int((i + 1) % interval != 0) for i in range(L)]
        if r.bool("use_sliding_window", False) and r.has("sliding_window"):
            return ["full" if uses_rope else "sliding" for uses_rope in rope]
        r.read.add("sliding_window")  # present but switched off
        return ["full"] * L
    if model_type in ("qwen3_next", "qwen3_5_text"):  # full attention every full_attention_interval-th layer
        interval = r.int("full_attention_interval", 4)
        return ["full" if (i + 1) % interval == 0 else "linear" for i in range(L)]
    if model_type in ("qwen2", "qwen3"):  # Qwen2Config: sliding only when enabled, from max_window_layers on
        if r.bool("use_sliding_window", False) and r.has("sliding_window"):
            first = r.int("max_window_layers", L, minimum=0)
            return ["sliding" if i >= first else "full" for i in range(L)]
        r.read.update({"sliding_window", "max_window_layers"})  # present but switched off
        return ["full"] * L
    if model_type in ("mistral", "mixtral", "phi3"):  # a sliding_window makes every layer sliding
        return ["sliding" if r.has("sliding_window") else "full"] * L
    return ["full"] * L


def _ministral3_kinds(r: _Reader, L: int) -> list[str]:
    """Ministral3Config: one sliding_window for every layer (null in the published Ministral 3 files). It has
    no layer_types: transformers warns and its model ignores them, so a config that sets them is refused."""
    return ["sliding" if r.has("sliding_window") else "full"] * L


DENSE_TYPES = ("llama", "mistral", "mixtral", "phi3", "qwen2", "qwen3", "gemma2", "gemma3_text",
               "gemma3n_text", "gemma4_text", "llama4_text", "gpt_oss", "qwen3_next", "qwen3_5_text",
               "nemotron_h", "granitemoehybrid", "smollm3", "lfm2", "ministral3")
LATENT_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_linear")
# Multimodal wrappers: the cache is the text decoder's, in text_config; the model_type it has when the file
# leaves it out (as the wrapper's transformers class has it: Mistral3Config's text_config is a MistralConfig)
WRAPPERS = {"gemma3": "gemma3_text", "gemma3n": "gemma3n_text", "gemma4": "gemma4_text",
            "llama4": "llama4_text", "qwen3_5": "qwen3_5_text", "mistral3": "mistral"}
SUPPORTED_TYPES = DENSE_TYPES + LATENT_TYPES + tuple(WRAPPERS)


def parse_config(data: Any, where: str, name: str | None = None,
                 parameters: int | None = None) -> Architecture:
    """An Architecture from a Hugging Face config.json dict;
    ValueError naming `where` and the field otherwise."""
    outer = _Reader(data, where)
    model_type = data.get("model_type")
    if model_type in WRAPPERS:
        inner = data.get("text_config")
        r = _Reader(inner, f"{where}: text_config")
        r.data = {"model_type": WRAPPERS[model_type], **inner}
        model_type = r.data["model_type"]
        outer.read.update(CACHE_FIELDS)  # the wrapper's own fields are its vision tower's
    else:
        r = outer
    if model_type not in DENSE_TYPES + LATENT_TYPES:
        raise ValueError(f"{r.where}: model_type: expected one of {', '.join(SUPPORTED_TYPES)}, got "
                         f"{model_type!r}")
    L = r.int("num_hidden_layers")
    # KimiLinearConfig reads the context from model_max_length (max_position_embeddings is its alias)
    kimi_context = model_type == "kimi_linear" and r.has("model_max_length")
    if kimi_context and r.has("max_position_embeddings"):
        raise ValueError(f"{r.where}: model_max_length: Kimi Linear reads it as max_position_embeddings too; "
                         "give one of them")
    context = r.int("model_max_length" if kimi_context else "max_position_embeddings")
    notes, mtp = [], 0
    if model_type in LATENT_TYPES:
        d, n = r.int("hidden_size"), r.int("num_attention_heads")
        k = r.int("num_key_value_heads", n)
        c, rope = r.int("kv_lora_rank"), r.int("qk_rope_head_dim")
        indexer = r.int("index_head_dim") if model_type == "deepseek_v32" else None
        topk = r.int("index_topk", 2048) if indexer else None  # DeepseekV32Config's default
        latent = LayerGeometry(0, "latent", latent=c, rope=rope, indexer=indexer, index_topk=topk)
        kinds = _kimi_kinds(r, L) if model_type == "kimi_linear" else ["latent"] * L
        state = _kimi_state(r) if "linear" in kinds else None
        layers = tuple(dataclasses.replace(latent, index=i) if kind == "latent" else
                       LayerGeometry(i, kind, state_elements=state[0], state_formula=state[1], **state[2])
                       for i, kind in enumerate(kinds))
        # DeepseekV3Config's default is one MTP layer (num_mtp_layers = num_nextn_predict_layers); V2's and
        # DeepseekV32Config have no such field (0 unless the config gives it)
        if model_type in ("deepseek_v2", "deepseek_v3", "deepseek_v32"):
            mtp = r.int("num_nextn_predict_layers", 1 if model_type == "deepseek_v3" else 0, minimum=0)
        if indexer:
            notes.append(f"lightning indexer: each layer also stores one key of {indexer} elements per "
                         f"token, and a step reads the latents of only index_topk = {topk} selected tokens")
    else:
        d, n, k, h = _heads(r, "attention_head_dim" if model_type == "nemotron_h" else "head_dim")
        kinds = _ministral3_kinds(r, L) if model_type == "ministral3" else _layer_kinds(r, L, model_type)
        window = r.int("sliding_window") if "sliding" in kinds else None
        chunk = r.int("attention_chunk_size") if "chunked" in kinds else None
        state = (_linear_state(r) if "linear" in kinds else
                 _mamba_state(r, model_type) if "mamba" in kinds else None)
        conv = r.int("conv_L_cache") if "conv" in kinds else None
        glob = _gemma4_global(r, k, h) if model_type == "gemma4_text" else (k, h)
        layers = []
        for i, kind in enumerate(kinds):
            if kind == "conv":
                layers.append(LayerGeometry(i, kind, state_elements=d * conv, conv=conv, channels=d,
                                            state_formula=f"hidden_size·conv_L_cache = {d}·{conv}"))
            elif kind in ("linear", "mamba"):
                layers.append(LayerGeometry(i, kind, state_elements=state[0], state_formula=state[1],
                                            **state[2]))
            elif kind == "mlp":
                layers.append(LayerGeometry(i, kind))
            else:
                ring = {"sliding": window, "chunked": chunk}.get(kind)
                kv, size = glob if kind == "full" else (k, h)
                layers.append(LayerGeometry(i, kind, kv_heads=kv, head_size=size, window=ring))
        layers = tuple(_share(r, layers, L) if model_type in ("gemma3n_text", "gemma4_text") else layers)
        if model_type == "gpt_oss":  # every attention layer (GptOssAttention.sinks, one per query head)
            layers = tuple(dataclasses.replace(layer, learned_sinks=True) for layer in layers)
            notes.append("attention sinks: gpt-oss learns one sink logit per head, a parameter added to the "
                         "softmax denominator; it caches 0 bytes (StreamingLLM's 'sinks' are kept tokens, "
                         "which do cost bytes)")
    r.refuse_unread()
    if r is not outer:
        outer.refuse_unread()
    return Architecture(name or str(where), model_type, layers, d, n, k, context, str(where), parameters,
                        notes=tuple(notes), mtp_layers=mtp)


def _linear_state(r: _Reader) -> tuple[int, str, dict]:
    """Gated DeltaNet's per-sequence state as transformers' LinearAttentionLayer holds it for Qwen3-Next: a
    d_k x d_v float32 matrix per value head, and the short convolution's last `kernel` inputs."""
    hk, hv = r.int("linear_num_key_heads"), r.int("linear_num_value_heads")
    dk, dv = r.int("linear_key_head_dim"), r.int("linear_value_head_dim")
    kernel = r.int("linear_conv_kernel_dim")
    state_dtype = r.data.get("mamba_ssm_dtype")
    r.read.add("mamba_ssm_dtype")
    if state_dtype not in (None, "float32", "bfloat16", "float16"):
        raise r._fail("mamba_ssm_dtype", "float32, bfloat16 or float16", state_dtype)
    conv_dim = 2 * hk * dk + hv * dv  # q, k and v channels go through the convolution
    elements = hv * dk * dv + conv_dim * kernel
    formula = (f"H_v·d_k·d_v float32 + (2·H_k·d_k + H_v·d_v)·kernel activations = "
               f"{hv}·{dk}·{dv} × 4 B + ({2 * hk * dk} + {hv * dv})·{kernel}")
    return elements, formula, dict(kv_heads=hk, head_size=dk, value_heads=hv, value_size=dv, conv=kernel,
                                   decay="head", state_dtype=state_dtype)


def _kimi_kinds(r: _Reader, L: int) -> list[str]:
    """Kimi Linear: MLA at linear_attn_config.full_attn_layers, Kimi Delta Attention at its kda_layers
    (1-based)."""
    config = r.data.get("linear_attn_config")
    r.read.add("linear_attn_config")
    if not isinstance(config, dict):
        raise r._fail("linear_attn_config", "an object", config)
    kinds: list[str | None] = [None] * L
    for key, kind in (("full_attn_layers", "latent"), ("kda_layers", "linear")):
        for layer in config.get(key) or []:
            if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer <= L \
                    or kinds[layer - 1]:
                raise r._fail(f"linear_attn_config.{key}", f"distinct 1-based layer numbers up to {L}", layer)
            kinds[layer - 1] = kind
    if None in kinds:
        raise ValueError(f"{r.where}: linear_attn_config: layer {kinds.index(None) + 1} is in neither "
                         "full_attn_layers nor kda_layers")
    return kinds


def _kimi_state(r: _Reader) -> tuple[int, str, dict]:
    """Kimi Delta Attention's per-sequence state: a d x d float32 matrix per head and the short convolution's
    last `kernel` inputs of q, k and v, as transformers' KimiDeltaAttention keeps them (one gate per channel,
    not per head, changes the update, not the state's size)."""
    config = _Reader(r.data["linear_attn_config"], f"{r.where}: linear_attn_config")
    heads, size = config.int("num_heads"), config.int("head_dim")
    kernel = config.int("short_conv_kernel_size")
    elements = heads * size * size + 3 * heads * size * kernel
    formula = (f"H·d·d float32 + 3·H·d·kernel activations = {heads}·{size}·{size} × 4 B + "
               f"{3 * heads * size}·{kernel}")
    return elements, formula, dict(kv_heads=heads, head_size=size, value_heads=heads, value_size=size,
                                   conv=kernel, decay="channel")


# Mamba-2 fields: heads, head size, state size, groups, convolution width (Nemotron-H's, Granite 4.0-H's)
MAMBA_FIELDS = {
    "nemotron_h": ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel"),
    "granitemoehybrid": ("mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv"),
}


def _mamba_state(r: _Reader, model_type: str) -> tuple[int, str, dict]:
    """A Mamba-2 layer's per-sequence state (Dao & Gu, arXiv 2405.21060) as transformers allocates it: an
    N x P float32 matrix per head (state size N, head size P), and the short causal convolution's last
    `kernel` inputs over x, B and C in the activation dtype."""
    names = MAMBA_FIELDS[model_type]
    heads = r.int(names[0])
    if model_type == "granitemoehybrid" and r.data.get(names[1], "auto") == "auto":  # expand·hidden / heads
        r.read.add(names[1])
        inner = r.int("mamba_expand", 2) * r.int("hidden_size")
        if inner % heads:
            raise r._fail(names[0], f"a divisor of mamba_expand · hidden_size ({inner})", heads)
        p = inner // heads
    else:
        p = r.int(names[1])
    n, groups, kernel = r.int(names[2]), r.int(names[3]), r.int(names[4])
    conv_dim = heads * p + 2 * groups * n  # x, then B and C for each group
    elements = heads * p * n + conv_dim * kernel
    formula = (f"heads·P·N float32 + (heads·P + 2·groups·N)·kernel activations = "
               f"{heads}·{p}·{n} × 4 B + ({heads * p} + {2 * groups * n})·{kernel}")
    return elements, formula, dict(value_heads=heads, value_size=p, state_size=n, conv=kernel,
                                   channels=conv_dim)


def _gemma4_global(r: _Reader, k: int, h: int) -> tuple[int, int]:
    """Gemma 4's global layers: K and H of their own (Gemma4TextConfig: head size global_head_dim, default
    512; K = num_global_key_value_heads where attention_k_eq_v, whose keys double as values before their
    norms, so both are still cached). Returns (K, H) of a full layer."""
    size = r.int("global_head_dim", 512)
    r.read.add("use_bidirectional_attention")
    if r.data.get("use_bidirectional_attention") == "all":  # Gemma4TextConfig then halves the window (+1)
        raise ValueError(f"{r.where}: use_bidirectional_attention: 'all' changes the sliding window in a way "
                         "the ledger does not model (a bidirectional encoder); it is not guessed")
    r.read.add("num_global_key_value_heads")
    if r.bool("attention_k_eq_v", False) and r.has("num_global_key_value_heads"):
        k = r.int("num_global_key_value_heads")
    n = r.int("num_attention_heads")
    if n % k:
        raise ValueError(f"{r.where}: num_global_key_value_heads: expected a divisor of num_attention_heads "
                         f"({n}), got {k}")
    return k, size


def _share(r: _Reader, layers: list[LayerGeometry], L: int) -> list[LayerGeometry]:
    """Gemma 3n, Gemma 4: the last num_kv_shared_layers layers read the cache of the last earlier layer of
    their kind."""
    shared = r.int("num_kv_shared_layers", 0, minimum=0)
    if shared >= L:
        raise ValueError(f"{r.where}: num_kv_shared_layers: expected fewer than num_hidden_layers ({L}), got "
                         f"{shared}")
    first = L - shared
    out = list(layers)
    for i in range(first, L):
        source = max((j for j in range(first) if layers[j].kind == layers[i].kind), default=None)
        if source is None:
            raise ValueError(f"{r.where}: num_kv_shared_layers: layer {i} ({layers[i].kind}) has no earlier "
                             f"{layers[i].kind} layer to share")
        out[i] = dataclasses.replace(layers[i], kind="shared", shares=source)
    return out


# ---- the catalogue ---------------------------------------------------------------------------------------

_CATALOGUE_KEYS = {"title": str, "config_url": str, "checked_against": str, "config": dict}
_OPTIONAL_KEYS = {"mirror_url": str, "parameters": int, "parameters_source": str, "weights_format": str,
                  "weights_format_source": str}


def _read_catalogue(text: str, where: str) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or set(data) != {"about", "models"} or not isinstance(data["models"], dict):
        raise ValueError(f"{where}: expected an object with exactly 'about' and 'models'")
    for name, entry in data["models"].items():
        at = f"{where}: models.{name}"
        if not isinstance(name, str) or name != name.lower() or " " in name:
            raise ValueError(f"{at}: the name must be lower case with dashes")
        if not isinstance(entry, dict):
            raise ValueError(f"{at}: expected an object")
        unknown = sorted(set(entry) - set(_CATALOGUE_KEYS) - set(_OPTIONAL_KEYS))
        if unknown:
            known = ", ".join([*_CATALOGUE_KEYS, *_OPTIONAL_KEYS])
            raise ValueError(f"{at}.{unknown[0]}: unknown field (expected {known})")
        for key, kind in {**_CATALOGUE_KEYS, **_OPTIONAL_KEYS}.items():
            if key not in entry:
                if key in _CATALOGUE_KEYS:
                    raise ValueError(f"{at}.{key}: required, missing")
                continue
            if not isinstance(entry[key], kind) or isinstance(entry[key], bool) or entry[key] in ("", {}):
                raise ValueError(f"{at}.{key}: expected a non-empty {kind.__name__}, got {entry[key]!r}")
        for key in ("config_url", "mirror_url"):
            url = entry.get(key)
            if url is not None and not (url.startswith("https://") and url.endswith("config.json")):
                raise ValueError(f"{at}.{key}: expected the https URL of a config.json, got {url!r}")
        if ("parameters" in entry) != ("parameters_source" in entry):
            raise ValueError(f"{at}.parameters: a parameter count needs its parameters_source, "
                             "and the other way round")
        if ("weights_format" in entry) != ("weights_format_source" in entry):
            raise ValueError(f"{at}.weights_format: a checkpoint format needs its weights_format_source, and "
                             "the other way round")
        parse_config(entry["config"], f"{at}.config", name)  # every entry must read as an architecture
    return data["models"]


def catalogue() -> dict[str, dict[str, Any]]:
    """The catalogue's entries by name, validated (ValueError naming the file and field on any fault)."""
    return _catalogue_cached()


_CACHE: dict[str, Any] = {}


def _catalogue_cached() -> dict[str, dict[str, Any]]:
    if "models" not in _CACHE:
        text = resources.files("dantinox").joinpath("data", CATALOGUE_FILE).read_text(encoding="utf-8")
        _CACHE["models"] = _read_catalogue(text, f"dantinox/data/{CATALOGUE_FILE}")
    return _CACHE["models"]


def catalogue_architecture(name: str) -> Architecture:
    models = catalogue()
    if name not in models:
        raise ValueError(f"model: {name!r} is not in the catalogue (dantinox kv --list); expected one of "
                         f"{', '.join(models)}, a config.json path or a .gguf path")
    entry = models[name]
    arch = parse_config(entry["config"], f"dantinox/data/{CATALOGUE_FILE}: models.{name}.config", name,
                        entry.get("parameters"))
    return dataclasses.replace(arch, source=entry["config_url"], weights_format=entry.get("weights_format"),
                               weights_format_source=entry.get("weights_format_source"))


def load_architecture(source: str | os.PathLike) -> Architecture:
    """A catalogue name (`dantinox kv --list`), a Hugging Face config.json path, or a .gguf path
    (metadata only)."""
    text = os.fspath(source)
    path = Path(text)
    if text.endswith(".gguf"):
        if not path.is_file():
            raise ValueError(f"model: {text} is not a file")
        config, weights = gguf_config(path)
        arch = parse_config(config, f"{path} (GGUF metadata)", path.name)
        return dataclasses.replace(arch, weight_bytes=weights)
    if text.endswith(".json") or path.is_dir():
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"model: {file} is not a file")
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{file}: not valid JSON ({e})") from None
        return parse_config(data, str(file), file.parent.name or file.name)
    return catalogue_architecture(text)
