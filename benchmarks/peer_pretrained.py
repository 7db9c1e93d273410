"""Peer for benchmarks/pretrained_reference.py: Hugging Face's answers on the checkpoints dantinox loads.

Runs inside benchmarks/.peer-venv (torch, transformers, gguf, accelerate, jinja2), never in the project's
environment. `python peer_pretrained.py SPEC_JSON` writes the tiny random checkpoints (when asked) and
prints one JSON object: per model, the prompts' ids, a slice of float32 logits, per-position argmax and
64 greedy tokens (after the chat prompt, for the real model); for the GGUF file also its tokenizer's ids
on the test strings and chat ids.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen3Config

TINY = ("tiny-llama", "tiny-mistral", "tiny-qwen3", "tiny-gemma3")


def tiny_checkpoints(out: Path, names: list[str]) -> None:
    """Tiny random models, saved by Hugging Face in bfloat16 (weights exact in float32 on both sides)."""
    shared = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  head_dim=8, max_position_embeddings=256, initializer_range=0.3, bos_token_id=1, eos_token_id=2)
    configs = {
        # untied head, GQA, a non-default RoPE base and epsilon
        "tiny-llama": LlamaConfig(**shared, num_key_value_heads=2, tie_word_embeddings=False, rms_norm_eps=1e-5,
                                  rope_parameters={"rope_type": "default", "rope_theta": 50_000.0}),
        # tied embeddings, one KV head, a sliding window shorter than the prompts
        "tiny-mistral": MistralConfig(**shared, num_key_value_heads=1, tie_word_embeddings=True, sliding_window=16,
                                      rms_norm_eps=1e-6),
        # QK-norm, GQA, untied head
        "tiny-qwen3": Qwen3Config(**shared, num_key_value_heads=2, tie_word_embeddings=False, rms_norm_eps=1e-6,
                                  rope_parameters={"rope_type": "default", "rope_theta": 20_000.0}),
        # sliding (window 16, RoPE base 10k) and global (1M) layers, QK-norm, GeGLU, scaled embeddings,
        # (1 + w) norms before and after attention and MLP, a query scale apart from the head size
        "tiny-gemma3": Gemma3TextConfig(
            **{**shared, "num_hidden_layers": 3}, num_key_value_heads=2, sliding_window=16,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"], query_pre_attn_scalar=16,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}),
    }
    for i, (name, cfg) in enumerate(configs.items()):
        if name not in names:
            continue
        torch.manual_seed(i)
        model = AutoModelForCausalLM.from_config(cfg)
        with torch.no_grad():  # norm weights start at 1 (or 0 for Gemma's 1 + w): random, so a mix-up shows
            for key, w in model.named_parameters():
                if "norm" in key:
                    w.add_(0.3 * torch.randn_like(w))
        model = model.to(torch.bfloat16)
        model.save_pretrained(out / name)
        for extra in ("generation_config.json",):  # not read by dantinox
            (out / name / extra).unlink(missing_ok=True)


def greedy(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens, every step a full forward over everything so far (no cache to get wrong)."""
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids):]


def answers(model, prompts: list[list[int]], n_greedy: int, n_ids: int, greedy_prompt: int) -> dict:
    """Per prompt: ids, logits at a few positions for the top and some fixed vocabulary ids, argmax, greedy."""
    out = []
    rs = np.random.RandomState(0)
    for k, ids in enumerate(prompts):
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
        T = len(ids)
        positions = sorted({0, T // 3, 2 * T // 3, T - 1})
        rows = []
        for p in positions:
            top = np.argsort(-logits[p])[: n_ids // 2]
            pick = np.unique(np.concatenate([top, rs.choice(logits.shape[1], n_ids // 2, replace=False)]))
            rows.append(dict(position=p, vocab_ids=pick.tolist(), logits=logits[p, pick].tolist()))
        out.append(dict(ids=ids, logit_rows=rows, argmax=logits.argmax(-1).tolist(),
                        greedy=greedy(model, ids, n_greedy) if k == greedy_prompt else None))
    return out


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(spec["threads"])
    data = Path(spec["data_dir"])
    tiny = spec["tiny"]
    tiny_checkpoints(data, [name for name in tiny if spec["write_checkpoints"] or not (data / name).is_dir()])
    result = {"torch": torch.__version__, "transformers": transformers.__version__, "models": {}}
    rs = np.random.RandomState(1)
    for name in TINY:  # every model's prompts drawn in order, whichever run: each keeps its own
        prompts = [rs.randint(0, 256, size=n).tolist() for n in (120, 104)]
        if name in tiny:
            model = AutoModelForCausalLM.from_pretrained(data / name, dtype=torch.float32).eval()
            result["models"][name] = answers(model, prompts, spec["greedy"], 32, 0)
    if spec["gguf"] is None:  # only some tiny models asked for
        print(json.dumps(result))
        return
    gguf = Path(spec["gguf"])
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    prompts = [tok.encode(t, add_special_tokens=False) for t in spec["texts"]]
    prompts.append(tok.apply_chat_template(spec["chats"][0], add_generation_prompt=True, tokenize=True,
                                           return_dict=False))
    result["models"]["smollm2-135m"] = answers(model, prompts, spec["greedy"], 64, len(prompts) - 1)  # the chat
    result["tokenizer"] = {
        "strings": {s: tok.encode(s, add_special_tokens=False) for s in spec["strings"]},
        "chats": [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False)
                  for c in spec["chats"]],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
