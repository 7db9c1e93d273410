"""What Hugging Face transformers allocates for every catalogue model: the fixture of tests/test_kv_ledger.py.

Runs in the peer venv (torch CPU + transformers), never in the unit tests:

    python -m venv benchmarks/.peer-venv
    benchmarks/.peer-venv/bin/pip install torch==2.13.0 transformers==5.25.0
    benchmarks/.peer-venv/bin/python benchmarks/kv_conformance.py   # writes tests/data/kv_conformance.json

For each model of dantinox/data/real_models.json it builds the model on PyTorch's `meta` device (shapes and
dtypes, no memory, bfloat16 weights), makes `StaticCache(config, max_cache_len=T)` at several T below and
above each window, and runs the model's own forward over a short prompt into it: every cache layer is then
initialised by the model's own code (K/V, MLA latents, DeepSeek-V3.2's indexer keys, the conv and recurrent
states of linear-attention, Mamba-2 and short-convolution layers). The fixture records, per layer, the cache
class and the shape, dtype and bytes of every tensor it holds. The feed-forward blocks are replaced by the
identity: they hold no cache, and MoE routing cannot run on meta tensors. The other config fields keep
transformers' defaults (they do not change the cache).
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
PROMPT = 3  # tokens of the forward that fills the cache (fewer when T is smaller)
DTYPE = torch.bfloat16
FEED_FORWARD = ("mlp", "block_sparse_moe", "feed_forward", "moe")  # attribute names of the blocks skipped


class Identity(torch.nn.Module):
    """Stands in for a feed-forward block: returns its input (Llama 4's MoE: flat rows and router logits)."""

    def __init__(self, flat: bool):
        super().__init__()
        self.flat = flat

    def forward(self, x, *args, **kwargs):
        return (x.reshape(-1, x.shape[-1]), None) if self.flat else x


def hf_config(entry: dict):
    config = dict(entry["config"])
    model_type = config.pop("model_type")
    config.pop("architectures", None)
    full = AutoConfig.for_model(model_type, **config)
    return full.get_text_config(decoder=True)


def meta_model(config):
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPE)
    for layer in model.model.layers:
        for attr in FEED_FORWARD:
            block = getattr(layer, attr, None)
            if isinstance(block, torch.nn.Module):
                setattr(layer, attr, Identity(type(block).__name__ == "Llama4TextMoe"))
    return model


def tensors(layer) -> dict[str, list]:
    """Every tensor a cache layer holds, by attribute (states by index): [shape, dtype, bytes]."""
    out = {}
    for key, value in sorted(vars(layer).items()):
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for index, t in items:
            if isinstance(t, torch.Tensor) and t.dim() > 1:
                name = key if index is None else f"{key}[{index}]"
                out[name] = [list(t.shape), str(t.dtype).removeprefix("torch."), t.numel() * t.element_size()]
    return out


def token_counts(config) -> list[int]:
    windows = {w for w in (getattr(config, "sliding_window", None), getattr(config, "attention_chunk_size", None))
               if w}
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
    transformers.logging.set_verbosity_error()
    models = json.loads(CATALOGUE.read_text())["models"]
    result = {"about": (f"transformers {transformers.__version__} (torch {torch.__version__}): "
                        f"StaticCache(config, max_cache_len=T) at batch {BATCH}, filled by the model's own "
                        "bfloat16 forward on the meta device, written by benchmarks/kv_conformance.py in the peer "
                        "venv; per model and T, run-length encoded rows [count, cache layer class, "
                        "{tensor: [shape, dtype, bytes]}]"),
              "transformers": transformers.__version__, "torch": torch.__version__, "batch": BATCH, "models": {}}
    names = sys.argv[1:] or list(models)
    for name in names:
        config = hf_config(models[name])
        model = meta_model(config)
        per_t = {}
        for T in token_counts(config):
            cache = StaticCache(config=config, max_cache_len=T)
            ids = torch.zeros((BATCH, min(PROMPT, T)), dtype=torch.long, device="meta")
            with torch.no_grad():
                model(input_ids=ids, cache=cache, use_cache=True)
            per_t[str(T)] = rle([[type(layer).__name__, tensors(layer)] for layer in cache.layers])
        result["models"][name] = {"model_class": type(model).__name__, "tokens": per_t}
        print(f"{name}: {type(model).__name__}, T = {', '.join(per_t)}", file=sys.stderr)
        del model
    if sys.argv[1:]:  # a partial run prints instead of overwriting the fixture
        print(json.dumps(result)[:4000])
        return
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
