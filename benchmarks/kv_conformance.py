"""What Hugging Face transformers allocates for every catalogue model: the fixture of tests/test_kv_ledger.py.

Runs in the peer venv (torch + transformers), never in the unit tests:

    benchmarks/.peer-venv/bin/python benchmarks/kv_conformance.py   # writes tests/data/kv_conformance.json

For each model of dantinox/data/real_models.json it builds the model on PyTorch's `meta` device (shapes, no
memory), reads each attention layer's K and head sizes from transformers' own modules (k_proj's width and
head_dim, or DeepSeek's expanded heads) and builds `StaticCache(config, max_cache_len=T)` at several T below
and above each window (the model's other fields keep transformers' defaults: they do not change the cache).
Its lazily initialised layers are initialised with meta tensors of those shapes, and the fixture records the
key/value shapes each layer then holds (run-length encoded).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, StaticCache

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = ROOT / "dantinox" / "data" / "real_models.json"
OUT = ROOT / "tests" / "data" / "kv_conformance.json"
BATCH = 2
DTYPE = torch.bfloat16


def hf_config(entry: dict):
    config = dict(entry["config"])
    model_type = config.pop("model_type")
    config.pop("architectures", None)
    full = AutoConfig.for_model(model_type, **config)
    return full.get_text_config(decoder=True)


def attention_shapes(model, config) -> list[tuple[int, int, int] | None]:
    """Per layer, (K, key head size, value head size) as transformers' attention module computes them."""
    out = []
    for layer in model.model.layers:
        attn = getattr(layer, "self_attn", None)
        if attn is None or getattr(attn, "is_kv_shared_layer", False):  # linear attention, or a shared layer
            out.append(None)
            continue
        if hasattr(attn, "kv_b_proj"):  # DeepSeek: transformers caches the expanded per-head K and V
            out.append((config.num_attention_heads, attn.qk_head_dim, attn.v_head_dim))
            continue
        head = attn.head_dim
        if hasattr(attn, "qkv_proj"):  # Phi-3's fused projection: N query heads, then K key and K value heads
            k = (attn.qkv_proj.out_features // head - config.num_attention_heads) // 2
            out.append((k, head, head))
            continue
        k = attn.k_proj.out_features // head
        v_proj = getattr(attn, "v_proj", None)  # absent where keys double as values
        out.append((k, head, head if v_proj is None else v_proj.out_features // k))
    return out


def linear_state(model) -> dict | None:
    """Gated DeltaNet's state sizes as transformers' module holds them (conv inputs, recurrent matrix)."""
    for layer in model.model.layers:
        net = getattr(layer, "linear_attn", None)
        if net is not None:
            return {"conv_dim": net.conv_dim, "conv_kernel_size": net.conv_kernel_size,
                    "recurrent": [net.num_v_heads, net.head_k_dim, net.head_v_dim]}
    return None


def token_counts(config) -> list[int]:
    windows = {w for w in (getattr(config, "sliding_window", None), getattr(config, "attention_chunk_size", None)) if w}
    ts = {1, 100}
    for w in windows:
        ts |= {w - 1, w, w + 1, 2 * w + 5}
    if not windows:
        ts.add(4096)
    return sorted(t for t in ts if 1 <= t <= config.max_position_embeddings)


def rle(rows: list) -> list:
    out = []
    for row in rows:
        if out and out[-1][1:] == row:
            out[-1][0] += 1
        else:
            out.append([1, *row])
    return out


def main() -> None:
    warnings.filterwarnings("ignore")
    models = json.loads(CATALOGUE.read_text())["models"]
    result = {"about": (f"transformers {transformers.__version__} StaticCache(config, max_cache_len=T) at batch "
                        f"{BATCH} in bfloat16, written by benchmarks/kv_conformance.py in the peer venv; per model "
                        "and T, run-length encoded rows [count, layer class, slots, K, key head, value head, bytes], "
                        "and the Gated DeltaNet state sizes of transformers' module where the model has one"),
              "transformers": transformers.__version__, "batch": BATCH, "models": {}}
    for name, entry in models.items():
        config = hf_config(entry)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        shapes = attention_shapes(model, config)
        per_t = {}
        for T in token_counts(config):
            cache = StaticCache(config=config, max_cache_len=T)
            rows = []
            for layer, shape in zip(cache.layers, shapes, strict=True):
                kind = type(layer).__name__
                if shape is None or kind in ("DummyLayer", "LinearAttentionLayer"):
                    rows.append([kind, 0, 0, 0, 0, 0])
                    continue
                k, hk, hv = shape
                layer.lazy_initialization(torch.empty(BATCH, k, 1, hk, device="meta", dtype=DTYPE),
                                          torch.empty(BATCH, k, 1, hv, device="meta", dtype=DTYPE))
                keys, values = layer.keys, layer.values
                assert keys.shape[0] == BATCH and keys.shape[1] == k
                nbytes = (keys.numel() + values.numel()) * keys.element_size()
                rows.append([kind, keys.shape[2], k, hk, hv, nbytes])
            per_t[str(T)] = rle(rows)
        result["models"][name] = {"model_class": type(model).__name__, "tokens": per_t,
                                  "linear_state": linear_state(model)}
        print(f"{name}: {type(model).__name__}, T = {', '.join(per_t)}", file=sys.stderr)
        del model
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
