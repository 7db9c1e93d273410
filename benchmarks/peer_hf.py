"""Peer for benchmarks/decode.py: Hugging Face LlamaForCausalLM with its static cache, torch on CPU.

A random reference-sized model, or (spec "gguf") a published model read from its GGUF file.

Runs inside benchmarks/.peer-venv (torch==2.13.0 + transformers), never in the project's environment.
Prints one JSON object: {"variant/batch": tokens_per_second, ...}.
"""

import json
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    out = {"torch": torch.__version__}
    import transformers

    out["transformers"] = transformers.__version__
    if "gguf" in spec:  # a published model: transformers dequantizes the GGUF file to float32 weights
        from pathlib import Path

        from transformers import AutoModelForCausalLM

        gguf = Path(spec["gguf"])
        models = {spec["name"]: AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                                     dtype=torch.float32).eval()}
    else:
        models = {}
        for variant, kv_heads in spec["variants"].items():
            cfg = LlamaConfig(vocab_size=spec["vocab"], hidden_size=spec["d_model"], intermediate_size=spec["mlp"],
                              num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
                              num_key_value_heads=kv_heads, head_dim=spec["head_size"],
                              max_position_embeddings=spec["max_context"], tie_word_embeddings=True,
                              rms_norm_eps=1e-6)
            models[variant] = LlamaForCausalLM(cfg).eval()
    if spec.get("serve"):  # interleaved with dantinox: one timed generate() per request read from stdin
        return serve(models, spec, out)
    for name, model in models.items():
        for batch in spec["batches"]:
            out[f"{name}/{batch}"] = tokens_per_second(model, spec, batch)
    print(json.dumps(out))


def serve(models: dict, spec: dict, versions: dict) -> None:
    """Warm up every model at every batch size, print the versions as the "ready" line, then answer each stdin
    line "NAME B" with one timed generate() call's tok/s."""
    for model in models.values():
        for batch in spec["batches"]:
            tokens_per_second(model, {**spec, "repeats": 0}, batch)
    print(json.dumps(versions), flush=True)
    for line in sys.stdin:
        name, batch = line.rsplit(maxsplit=1)
        print(json.dumps(tokens_per_second(models[name], {**spec, "repeats": 1}, int(batch), warmup=False)),
              flush=True)


def tokens_per_second(model, spec: dict, batch: int, warmup: bool = True) -> float:
    """Best of spec["repeats"] generate() calls of spec["new"] greedy tokens with the static cache."""
    ids = torch.randint(0, 256, (batch, spec["prompt"]))
    kw = dict(do_sample=False, cache_implementation="static", pad_token_id=0)
    with torch.inference_mode():
        if warmup:
            model.generate(ids, max_new_tokens=8, min_new_tokens=8, **kw)
        best = float("inf")
        for _ in range(spec["repeats"]):
            start = time.perf_counter()
            model.generate(ids, max_new_tokens=spec["new"], min_new_tokens=spec["new"], **kw)
            best = min(best, time.perf_counter() - start)
    return batch * spec["new"] / best if spec["repeats"] else 0.0


if __name__ == "__main__":
    main()
